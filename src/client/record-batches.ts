// SPDX-License-Identifier: Apache-2.0
/**
 * Client side of PUSH_RECORD_BATCHES: the body holds record batches exactly as the server
 * stored them (format: docs/storage-format.md, encoder: src/log/record-batch.ts), verified
 * (CRC included) by the server's reader before they were sent.
 *
 * `scanPushedBatches` checks the whole body once when the frame arrives -- every header for
 * plausibility, every record's lengths against its batch, as `decodeRecords` does -- and keeps
 * only three numbers per record in typed arrays (position, offset, timestamp). A message is
 * built from them when the application takes it (`recordAt`), so records that wait in the
 * subscription's window cost no objects: the garbage collector never copies them, which is
 * what dominated the client's time when every pushed record became objects on arrival.
 *
 * Invariant (hostile input): nothing is allocated from a length read here before it has been
 * checked against the bytes present; any inconsistency is a ProtocolError.
 */
import { ProtocolError } from "../errors.js";
import { BATCH_ATTR_COMPACTED, BATCH_ATTR_SPARSE, BATCH_MAGIC, HEADER_SIZE, MIN_RECORD_SIZE, decodeValueAt, type ValueKind } from "../log/record-batch.js";

const ATTR_KEY_NULL = 0x04;
const ATTR_VALUE_NULL = 0x08;

/** Shared by messages without headers (frozen, as the embedded broker's: one handler cannot add to another's). */
const NO_HEADERS: Record<string, Uint8Array> = Object.freeze({}) as Record<string, Uint8Array>;

/** The records at or after `from` of one push frame. */
export interface RecordTable {
  readonly buf: Buffer;
  readonly count: number;
  /** Position of each record's body (after its length varint) in `buf`. */
  readonly pos: Int32Array;
  readonly offset: Float64Array;
  readonly timestamp: Float64Array;
}

/** What `readRecordInto` sets (a message under construction: no intermediate object). */
export interface RecordFields {
  key: Uint8Array | null;
  value: unknown;
  headers: Record<string, Uint8Array>;
}

// Varint reader without a tuple per call: the position after the last varint read.
let vEnd = 0;

function varint(buf: Buffer, p: number, end: number): number {
  let result = 0;
  let mul = 1;
  for (let i = 0; i < 6; i++) {
    if (p >= end) throw new ProtocolError("record varint runs past its record");
    const b = buf[p++];
    result += (b & 0x7f) * mul;
    if ((b & 0x80) === 0) {
      vEnd = p;
      return result;
    }
    mul *= 128;
  }
  throw new ProtocolError("record varint is too long");
}

function i64(buf: Buffer, p: number): number {
  return buf.readInt32BE(p) * 4294967296 + buf.readUInt32BE(p + 4);
}

/** Validates a PUSH_RECORD_BATCHES body and indexes its records with offset >= `from`. */
export function scanPushedBatches(buf: Buffer, from: number): RecordTable {
  // Bound on records before allocating the tables: every record needs MIN_RECORD_SIZE bytes.
  const cap = Math.floor(buf.length / MIN_RECORD_SIZE);
  let pos = new Int32Array(Math.min(cap, 1024));
  let offset = new Float64Array(pos.length);
  let timestamp = new Float64Array(pos.length);
  let n = 0;
  let at = 0;
  let expected = -1;
  while (at < buf.length) {
    if (buf.length - at < HEADER_SIZE) throw new ProtocolError(`truncated record batch header (${buf.length - at} bytes)`);
    const length = buf.readUInt32BE(at);
    const count = buf.readUInt32BE(at + 12);
    const base = i64(buf, at + 16);
    const firstTs = i64(buf, at + 24);
    if (buf[at + 8] !== BATCH_MAGIC) throw new ProtocolError(`unknown record batch format version ${buf[at + 8]}`);
    if (length < HEADER_SIZE + MIN_RECORD_SIZE || length > buf.length - at) {
      throw new ProtocolError(`record batch length ${length} does not fit the ${buf.length - at} bytes left`);
    }
    const attrs = buf[at + 9];
    if ((attrs & ~(BATCH_ATTR_COMPACTED | BATCH_ATTR_SPARSE)) !== 0) throw new ProtocolError(`unknown record batch attributes ${attrs}`);
    // A sparse batch's count is the offsets it spans, not the records it holds (CMP-2).
    const sparse = (attrs & BATCH_ATTR_SPARSE) !== 0;
    if (count < 1 || (!sparse && count > (length - HEADER_SIZE) / MIN_RECORD_SIZE)) throw new ProtocolError(`implausible record count ${count}`);
    if (base < 0 || base + count > Number.MAX_SAFE_INTEGER || (expected >= 0 && base !== expected && !(base > expected && (buf[at + 9] & BATCH_ATTR_COMPACTED) !== 0))) {
      // A gap is allowed only before a batch the cleaner wrote (CMP-2).
      throw new ProtocolError(`record batch at offset ${base} is out of sequence (expected ${expected})`);
    }
    const end = at + length;
    let p = at + HEADER_SIZE;
    // A sparse batch: runs of (gap, length) then that many records (SparseRuns in record-batch.ts).
    let off = base - 1;
    let runLeft = 0;
    for (let i = 0; sparse ? p < end : i < count; i++) {
      if (sparse) {
        if (runLeft === 0) {
          off += 1 + varint(buf, p, end);
          runLeft = varint(buf, vEnd, end);
          p = vEnd;
          if (runLeft < 1 || off + runLeft > base + count) throw new ProtocolError(`sparse run of ${runLeft} records at offset ${off} of batch ${base} leaves its span`);
        } else off++;
        runLeft--;
      } else off = base + i;
      const bodyLen = varint(buf, p, end);
      p = vEnd;
      const recEnd = p + bodyLen;
      if (bodyLen < 3 || recEnd > end) throw new ProtocolError(`record ${i} of batch ${base} runs past the batch`);
      const body = p;
      const attr = buf[p++];
      if ((attr & 0x03) === 3 || attr > 0x0f) throw new ProtocolError(`record ${i} of batch ${base} has unknown attributes ${attr}`);
      const tsz = varint(buf, p, recEnd);
      p = vEnd;
      if ((attr & ATTR_KEY_NULL) === 0) {
        const kl = varint(buf, p, recEnd);
        p = vEnd + kl;
      }
      if ((attr & ATTR_VALUE_NULL) === 0) {
        if (p > recEnd) throw new ProtocolError(`record ${i} of batch ${base}: key runs past the record`);
        const vl = varint(buf, p, recEnd);
        p = vEnd + vl;
      }
      if (p > recEnd) throw new ProtocolError(`record ${i} of batch ${base}: value runs past the record`);
      const hc = varint(buf, p, recEnd);
      p = vEnd;
      if (hc > (recEnd - p) / 2) throw new ProtocolError(`record ${i} of batch ${base}: implausible header count ${hc}`);
      for (let j = 0; j < hc; j++) {
        const kl = varint(buf, p, recEnd);
        p = vEnd + kl;
        if (p > recEnd) throw new ProtocolError(`record ${i} of batch ${base}: header runs past the record`);
        const vl = varint(buf, p, recEnd);
        p = vEnd + vl;
        if (p > recEnd) throw new ProtocolError(`record ${i} of batch ${base}: header runs past the record`);
      }
      if (p !== recEnd) throw new ProtocolError(`record ${i} of batch ${base} has ${recEnd - p} trailing bytes`);
      if (off >= from) {
        if (n === pos.length) {
          const size = Math.min(cap, pos.length * 2);
          const np = new Int32Array(size);
          np.set(pos);
          pos = np;
          const no = new Float64Array(size);
          no.set(offset);
          offset = no;
          const nt = new Float64Array(size);
          nt.set(timestamp);
          timestamp = nt;
        }
        pos[n] = body;
        offset[n] = off;
        timestamp[n] = firstTs + (tsz % 2 === 0 ? tsz / 2 : -(tsz + 1) / 2);
        n++;
      }
    }
    if (p !== end) throw new ProtocolError(`record batch ${base} has ${end - p} trailing bytes`);
    if (runLeft !== 0) throw new ProtocolError(`sparse record batch ${base} ends inside a run`);
    expected = base + count;
    at = end;
  }
  return { buf, count: n, pos, offset, timestamp };
}

/**
 * Sets key, value and headers of the record whose body starts at `p` (a position from a table
 * built by scanPushedBatches, which checked every length) on `into`. Key, bytes values and
 * header values are views of the frame (no copies), like the embedded broker's, which are
 * views of its read buffer; strings and JSON are decoded here.
 */
export function readRecordInto(into: RecordFields, buf: Buffer, p: number): void {
  const attr = buf[p++];
  varint(buf, p, buf.length);
  p = vEnd;
  let key: Buffer | null = null;
  if ((attr & ATTR_KEY_NULL) === 0) {
    const kl = varint(buf, p, buf.length);
    p = vEnd;
    key = buf.subarray(p, p + kl);
    p += kl;
  }
  // A string or JSON value is decoded straight from the frame (no Buffer view per record);
  // a bytes value is a view of it.
  let valueStart = -1;
  let valueEnd = -1;
  if ((attr & ATTR_VALUE_NULL) === 0) {
    const vl = varint(buf, p, buf.length);
    p = vEnd;
    valueStart = p;
    valueEnd = p + vl;
    p += vl;
  }
  let headers: Record<string, Uint8Array> = NO_HEADERS;
  const hc = varint(buf, p, buf.length);
  p = vEnd;
  if (hc > 0) headers = {};
  for (let j = 0; j < hc; j++) {
    const kl = varint(buf, p, buf.length);
    p = vEnd;
    const k = buf.toString("utf8", p, p + kl);
    p += kl;
    const vl = varint(buf, p, buf.length);
    p = vEnd;
    headers[k] = buf.subarray(p, p + vl);
    p += vl;
  }
  into.key = key;
  into.headers = headers;
  try {
    into.value = valueStart < 0 ? null : decodeValueAt(buf, valueStart, valueEnd, (attr & 0x03) as ValueKind);
  } catch (e) {
    throw new ProtocolError(`record value of kind json is not valid JSON: ${(e as Error).message}`);
  }
}
