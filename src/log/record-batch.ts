// SPDX-License-Identifier: Apache-2.0
/**
 * Record batch format, version 1 (byte layout in docs/storage-format.md).
 *
 * A batch is the unit of write, checksum and index. Its CRC-32C covers the length field, the
 * base offset and every other header field as well as the records, so a batch that was written
 * to the wrong place (wrong offset) fails verification just like one with a flipped bit
 * (invariant LOG-2). The decoder never allocates from a size it read: every length is checked
 * against the bytes actually present before it is used (invariant LOG-5).
 */
import { InvalidBatchError, RecordTooLargeError, ValidationError } from "../errors.js";
import { crc32c, crc32cPatch } from "./crc32c.js";

export const BATCH_MAGIC = 1;
export const HEADER_SIZE = 56;
/** Smallest possible encoded record: length varint, attributes, ts delta, value len, header count. */
export const MIN_RECORD_SIZE = 4;
/** Hard ceiling on one batch, whatever the config says (64 MiB). */
export const MAX_BATCH_BYTES = 64 * 1024 * 1024;

// Header field offsets.
const O_LENGTH = 0; // u32 total batch bytes incl. header
const O_CRC = 4; // u32 CRC-32C of [0,4) ++ [8,length)
const O_MAGIC = 8; // u8
const O_ATTR = 9; // u8 (reserved, 0)
const O_COUNT = 12; // u32 record count (>= 1)
const O_BASE = 16; // i64 base offset
const O_FIRST_TS = 24; // i64 first timestamp
const O_MAX_TS = 32; // i64 max timestamp
const O_PID = 40; // i64 producer id (-1: none)
const O_EPOCH = 48; // i16 producer epoch (-1: none)
const O_SEQ = 52; // i32 base sequence (-1: none)

export type ValueKind = 0 | 1 | 2; // bytes | utf8 string | JSON

/**
 * Buffer's UTF-8 writer without `buf.write()`'s argument handling (Node's own fast path, not in
 * its typings): one call per text value encoded, so its overhead counts per record.
 */
const utf8Write = (Buffer.prototype as unknown as { utf8Write(this: Buffer, s: string, offset: number, length: number): number }).utf8Write;

const ATTR_KEY_NULL = 0x04;
const ATTR_VALUE_NULL = 0x08;

/** A record ready to be encoded: user values already turned into bytes. */
export interface PreparedRecord {
  key: Buffer | null;
  value: Buffer | null;
  valueKind: ValueKind;
  timestamp: number;
  headers: [string, Buffer][] | null;
  /**
   * Optional: the value as text (valueKind 1 or 2); its UTF-8 encoding is the value, and
   * `valueTextBytes` its length. When set, sizes and encoding use it instead of `value` (which
   * must still read as those bytes): the embedded publish() keeps a string or a JSON value as
   * text and the encoder writes it straight into the batch, with no Buffer per record.
   */
  readonly valueText?: string;
  readonly valueTextBytes?: number;
}

export interface StoredRecord {
  offset: number;
  timestamp: number;
  key: Buffer | null;
  value: Buffer | null;
  valueKind: ValueKind;
  headers: [string, Buffer][] | null;
}

export interface BatchHeader {
  length: number;
  crc: number;
  magic: number;
  attributes: number;
  count: number;
  baseOffset: number;
  firstTimestamp: number;
  maxTimestamp: number;
  producerId: number;
  producerEpoch: number;
  baseSequence: number;
}

/** Converts a user value into bytes plus the kind needed to give the same kind back. */
export function prepareValue(v: unknown): { value: Buffer | null; valueKind: ValueKind } {
  if (v === null || v === undefined) return { value: null, valueKind: 0 };
  if (Buffer.isBuffer(v)) return { value: v, valueKind: 0 };
  if (v instanceof Uint8Array) return { value: Buffer.from(v.buffer, v.byteOffset, v.byteLength), valueKind: 0 };
  if (typeof v === "string") return { value: Buffer.from(v, "utf8"), valueKind: 1 };
  const json = JSON.stringify(v);
  if (json === undefined) throw new ValidationError(`value of type ${typeof v} cannot be published`);
  return { value: Buffer.from(json, "utf8"), valueKind: 2 };
}

export function decodeValue(value: Buffer | null, kind: ValueKind): unknown {
  if (value === null) return null;
  if (kind === 1) return value.toString("utf8");
  if (kind === 2) return JSON.parse(value.toString("utf8"));
  return value;
}

/** Buffer's UTF-8 reader without `toString()`'s argument handling (Node's own fast path). */
const utf8Slice = (Buffer.prototype as unknown as { utf8Slice(this: Buffer, start: number, end: number): string }).utf8Slice;

/**
 * The value stored in buf[start, end) as `decodeValue` gives it, without a Buffer view for a
 * string or JSON value (one per record on the consume path). Bounds: the caller checked them.
 */
export function decodeValueAt(buf: Buffer, start: number, end: number, kind: ValueKind): unknown {
  if (kind === 1) return utf8Slice.call(buf, start, end);
  if (kind === 2) return JSON.parse(utf8Slice.call(buf, start, end));
  return buf.subarray(start, end);
}

export function varintSize(n: number): number {
  // n is a non-negative safe integer below 2^35 here (lengths, deltas are bounded).
  let s = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    s++;
  }
  return s;
}

export function writeVarint(buf: Buffer, pos: number, n: number): number {
  while (n >= 0x80) {
    buf[pos++] = (n & 0x7f) | 0x80;
    n = Math.floor(n / 128);
  }
  buf[pos++] = n;
  return pos;
}

function zigzag(n: number): number {
  return n >= 0 ? n * 2 : -n * 2 - 1;
}

export function unzigzag(n: number): number {
  return n % 2 === 0 ? n / 2 : -(n + 1) / 2;
}

/** Encoded size of one record's body (everything after its length varint). */
function recordBodySize(r: PreparedRecord, firstTs: number): number {
  let s = 1 + varintSize(zigzag(r.timestamp - firstTs));
  if (r.key !== null) s += varintSize(r.key.length) + r.key.length;
  if (r.valueText !== undefined) {
    const n = r.valueTextBytes!;
    s += varintSize(n) + n;
  } else if (r.value !== null) s += varintSize(r.value.length) + r.value.length;
  const h = r.headers;
  if (h === null) s += 1;
  else {
    s += varintSize(h.length);
    for (let i = 0; i < h.length; i++) {
      const kl = Buffer.byteLength(h[i][0], "utf8");
      s += varintSize(kl) + kl + varintSize(h[i][1].length) + h[i][1].length;
    }
  }
  return s;
}

/**
 * The log's checks of one record: `recordSize()` (here from its body size with a zero
 * timestamp delta, `zeroDeltaBody`) against `max`, then its timestamp.
 */
function checkRecord(r: PreparedRecord, zeroDeltaBody: number, max: number): void {
  const size = varintSize(zeroDeltaBody) + zeroDeltaBody;
  if (size > max) throw new RecordTooLargeError(size, max);
  if (!Number.isSafeInteger(r.timestamp) || r.timestamp < 0) throw new ValidationError(`invalid timestamp ${r.timestamp}`);
}

/** Size of a single record as it would be stored, for `maxMessageBytes` checks. */
export function recordSize(r: PreparedRecord): number {
  const b = recordBodySize(r, r.timestamp);
  return varintSize(b) + b;
}

export interface ProducerInfo {
  producerId: number;
  producerEpoch: number;
  baseSequence: number;
}

/**
 * Encodes records into one batch with base offset 0 and no CRC. `stampBatch` sets the real
 * offset and the checksum when the log assigns offsets (that must happen in append order).
 * With `maxRecordBytes`, every record is also validated in the size pass, in record order, as
 * the log's append does (its `recordSize()` against the limit, then its timestamp), so the
 * records are walked once for both.
 */
export function encodeBatch(records: readonly PreparedRecord[], producer?: ProducerInfo, maxRecordBytes?: number): Buffer {
  if (records.length === 0) throw new ValidationError("a batch needs at least one record");
  const firstTs = records[0].timestamp;
  let maxTs = firstTs;
  let total = HEADER_SIZE;
  const sizes = new Array<number>(records.length);
  for (let i = 0; i < records.length; i++) {
    const r = records[i];
    if (r.timestamp > maxTs) maxTs = r.timestamp;
    const b = recordBodySize(r, firstTs);
    if (maxRecordBytes !== undefined) checkRecord(r, b - varintSize(zigzag(r.timestamp - firstTs)) + 1, maxRecordBytes);
    sizes[i] = b;
    total += varintSize(b) + b;
  }
  if (total > MAX_BATCH_BYTES) throw new ValidationError(`batch of ${total} bytes exceeds ${MAX_BATCH_BYTES}`);
  const buf = Buffer.allocUnsafe(total);
  buf.writeUInt32BE(total, O_LENGTH);
  buf.writeUInt32BE(0, O_CRC);
  buf[O_MAGIC] = BATCH_MAGIC;
  buf[O_ATTR] = 0;
  buf.writeUInt16BE(0, 10);
  buf.writeUInt32BE(records.length, O_COUNT);
  writeI64(buf, O_BASE, 0);
  writeI64(buf, O_FIRST_TS, firstTs);
  writeI64(buf, O_MAX_TS, maxTs);
  writeI64(buf, O_PID, producer ? producer.producerId : -1);
  buf.writeInt16BE(producer ? producer.producerEpoch : -1, O_EPOCH);
  buf.writeUInt16BE(0, 50);
  buf.writeInt32BE(producer ? producer.baseSequence : -1, O_SEQ);
  let pos = HEADER_SIZE;
  for (let i = 0; i < records.length; i++) {
    const r = records[i];
    pos = writeVarint(buf, pos, sizes[i]);
    const text = r.valueText;
    let attr = r.valueKind & 0x03;
    if (r.key === null) attr |= ATTR_KEY_NULL;
    if (text === undefined && r.value === null) attr |= ATTR_VALUE_NULL;
    buf[pos++] = attr;
    pos = writeVarint(buf, pos, zigzag(r.timestamp - firstTs));
    if (r.key !== null) {
      pos = writeVarint(buf, pos, r.key.length);
      pos += r.key.copy(buf, pos);
    }
    if (text !== undefined) {
      const n = r.valueTextBytes!;
      pos = writeVarint(buf, pos, n);
      // A short write (valueTextBytes wrong) is caught by the size check below.
      pos += utf8Write.call(buf, text, pos, n);
    } else if (r.value !== null) {
      pos = writeVarint(buf, pos, r.value.length);
      pos += r.value.copy(buf, pos);
    }
    const h = r.headers;
    if (h === null) buf[pos++] = 0;
    else {
      pos = writeVarint(buf, pos, h.length);
      for (let j = 0; j < h.length; j++) {
        const kl = Buffer.byteLength(h[j][0], "utf8");
        pos = writeVarint(buf, pos, kl);
        pos += buf.write(h[j][0], pos, "utf8");
        pos = writeVarint(buf, pos, h[j][1].length);
        pos += h[j][1].copy(buf, pos);
      }
    }
  }
  // Invariant: the size pass and the write pass agree byte for byte.
  if (pos !== total) throw new Error(`encodeBatch size mismatch: ${pos} != ${total}`);
  return buf;
}

/**
 * Header attribute bit set only by the cleaner (cleaner.ts) on the batches it writes: offsets
 * between the previous batch's end and this batch's base were removed by key compaction, so
 * readers accept a base offset *above* the expected one for this batch (CMP-2). Clients can not
 * set it (validateEncodedBatch refuses non-zero attributes); the CRC covers it.
 */
export const BATCH_ATTR_COMPACTED = 0x01;
/**
 * Header attribute bit set only by the cleaner: the batch keeps the offset span of the batch it
 * was cut from (`baseOffset`, and `count` = offsets spanned, as the producer's sequences do)
 * but holds only the records compaction kept, as runs of consecutive offsets (SparseRuns),
 * CMP-2. Removing records from a batch costs a few bytes per run instead of a header per run,
 * and a kept record's bytes are copied as they were.
 */
export const BATCH_ATTR_SPARSE = 0x02;
/**
 * Header attribute bit set only by the log's append pipeline for an `encrypted` topic or queue:
 * the records section is an AES-256-GCM envelope (batch-crypto.ts, ENC-1, ENC-2). Readers
 * decrypt it before decodeRecords; clients can not set it (validateEncodedBatch).
 */
export const BATCH_ATTR_ENCRYPTED = 0x04;
const KNOWN_BATCH_ATTRS = BATCH_ATTR_COMPACTED | BATCH_ATTR_SPARSE | BATCH_ATTR_ENCRYPTED;

/** stampBatch for a batch written by the cleaner: marks it BATCH_ATTR_COMPACTED first (CMP-2). */
export function stampCompactedBatch(buf: Buffer, baseOffset: number): void {
  buf[O_ATTR] |= BATCH_ATTR_COMPACTED; // a sparse batch stays sparse
  stampBatch(buf, baseOffset);
}

/** Sets the base offset and computes the CRC. After this the batch must not change. */
export function stampBatch(buf: Buffer, baseOffset: number): void {
  writeI64(buf, O_BASE, baseOffset);
  buf.writeUInt32BE(batchCrc(buf, 0, buf.readUInt32BE(O_LENGTH)), O_CRC);
}

/**
 * Sets the base offset of a batch whose stored CRC is valid for its current bytes (it passed
 * verifyBatch), patching the CRC algebraically instead of re-reading the records: the batch
 * stays covered end to end by the checksum computed where it was encoded (the client), and
 * the broker touches each record byte once (to verify it). Result equals stampBatch's.
 */
export function restampBatch(buf: Buffer, baseOffset: number): void {
  const length = buf.readUInt32BE(O_LENGTH);
  const before = Buffer.from(buf.subarray(O_BASE, O_BASE + 8));
  writeI64(buf, O_BASE, baseOffset);
  // The CRC message is [0,4) ++ [8,length): the base offset field ends `length - O_BASE - 8`
  // bytes before the end of it.
  const crc = crc32cPatch(buf.readUInt32BE(O_CRC), before, buf.subarray(O_BASE, O_BASE + 8), length - O_BASE - 8);
  buf.writeUInt32BE(crc, O_CRC);
}

/** What validateEncodedBatch learned about a batch built elsewhere (by a client). */
export interface EncodedBatchInfo {
  header: BatchHeader;
  /** Size of the largest record as stored (length varint included). */
  maxRecordBytes: number;
}

/**
 * Validates a complete batch built outside the broker (the client encodes batches in the
 * storage format so the broker stores them without re-encoding). Beyond verifyBatch (magic,
 * lengths, CRC) it walks every record without allocating: structure, attributes, lengths,
 * timestamps (each >= 0, the header's maxTimestamp is their maximum), record count, no
 * trailing bytes, and every record at most `maxRecordBytes`. The base offset must be 0 (the
 * broker assigns offsets). Anything a reader could later choke on is refused here, so a
 * stored batch always decodes (invariant LOG-5 holds for client bytes too).
 */
export function validateEncodedBatch(buf: Buffer, maxRecordBytes: number): EncodedBatchInfo {
  const h = verifyBatch(buf, 0, buf.length, MAX_BATCH_BYTES);
  if (h.length !== buf.length) throw new InvalidBatchError(`${buf.length - h.length} bytes follow the batch`);
  if (h.baseOffset !== 0) throw new InvalidBatchError(`a batch to append must have base offset 0, not ${h.baseOffset}`);
  if (h.attributes !== 0 || buf.readUInt16BE(10) !== 0 || buf.readUInt16BE(50) !== 0) throw new InvalidBatchError("reserved header bytes are not zero");
  if (h.producerId < 0 ? h.producerId !== -1 || h.producerEpoch !== -1 || h.baseSequence !== -1 : h.producerEpoch < 0 || h.baseSequence < 0)
    throw new InvalidBatchError("inconsistent producer fields");
  const end = h.length;
  let p = HEADER_SIZE;
  let maxTs = -1;
  let maxRec = 0;
  for (let i = 0; i < h.count; i++) {
    const recStart = p;
    const bodyLen = varintAt(buf, p, end);
    p = varintEnd;
    const recEnd = p + bodyLen;
    if (bodyLen < 3 || recEnd > end) throw new InvalidBatchError(`record ${i} length ${bodyLen} runs past the batch`);
    if (recEnd - recStart > maxRec) maxRec = recEnd - recStart;
    const attr = buf[p++];
    if ((attr & 0x03) === 3 || attr > 0x0f) throw new InvalidBatchError(`record ${i} has unknown attributes ${attr}`);
    const ts = h.firstTimestamp + unzigzag(varintAt(buf, p, recEnd));
    p = varintEnd;
    if (!Number.isSafeInteger(ts) || ts < 0) throw new InvalidBatchError(`record ${i} has an invalid timestamp`);
    if (ts > maxTs) maxTs = ts;
    if ((attr & ATTR_KEY_NULL) === 0) {
      const kl = varintAt(buf, p, recEnd);
      p = varintEnd + kl;
      if (p > recEnd) throw new InvalidBatchError(`record ${i} key runs past the record`);
    }
    if ((attr & ATTR_VALUE_NULL) === 0) {
      const vl = varintAt(buf, p, recEnd);
      p = varintEnd + vl;
      if (p > recEnd) throw new InvalidBatchError(`record ${i} value runs past the record`);
    }
    const hc = varintAt(buf, p, recEnd);
    p = varintEnd;
    if (hc > (recEnd - p) / 2) throw new InvalidBatchError(`record ${i} header count ${hc} is implausible`);
    for (let j = 0; j < hc; j++) {
      const kl = varintAt(buf, p, recEnd);
      p = varintEnd + kl;
      if (p > recEnd) throw new InvalidBatchError(`record ${i} header key runs past the record`);
      const vl = varintAt(buf, p, recEnd);
      p = varintEnd + vl;
      if (p > recEnd) throw new InvalidBatchError(`record ${i} header value runs past the record`);
    }
    if (p !== recEnd) throw new InvalidBatchError(`record ${i} has ${recEnd - p} trailing bytes`);
  }
  if (p !== end) throw new InvalidBatchError(`batch has ${end - p} bytes after its ${h.count} records`);
  if (maxTs !== h.maxTimestamp) throw new InvalidBatchError(`header maxTimestamp ${h.maxTimestamp} is not the records' maximum ${maxTs}`);
  if (maxRec > maxRecordBytes) throw new RecordTooLargeError(maxRec, maxRecordBytes);
  return { header: h, maxRecordBytes: maxRec };
}

/** End position of the varint read by the last varintAt call (avoids a tuple per varint). */
let varintEnd = 0;
/** Where the varint read by the last varintAt call ended. */
export function lastVarintEnd(): number {
  return varintEnd;
}
/** Reads a varint at buf[pos] (never past `end`, else InvalidBatchError); see lastVarintEnd(). */
export function varintAt(buf: Uint8Array, pos: number, end: number): number {
  let result = 0;
  let mul = 1;
  for (let i = 0; i < 6; i++) {
    if (pos >= end) throw new InvalidBatchError("varint runs past the record");
    const byte = buf[pos++];
    result += (byte & 0x7f) * mul;
    if ((byte & 0x80) === 0) {
      varintEnd = pos;
      return result;
    }
    mul *= 128;
  }
  throw new InvalidBatchError("varint too long");
}

function batchCrc(buf: Uint8Array, start: number, length: number): number {
  const c = crc32c(buf, start, start + 4);
  return crc32c(buf, start + 8, start + length, c);
}

export function writeI64(buf: Buffer, pos: number, v: number): void {
  // Safe integers only (|v| < 2^53): offsets, timestamps and producer ids are all far below.
  const hi = Math.floor(v / 4294967296);
  buf.writeInt32BE(hi, pos);
  buf.writeUInt32BE(v - hi * 4294967296, pos + 4);
}

function readI64(buf: Uint8Array, pos: number): number {
  const b = buf as Buffer;
  return b.readInt32BE(pos) * 4294967296 + b.readUInt32BE(pos + 4);
}

export function readBatchLength(buf: Uint8Array, pos: number): number {
  return (buf as Buffer).readUInt32BE(pos + O_LENGTH);
}

/** Parses the fixed header at buf[pos..]; the caller guarantees HEADER_SIZE bytes are present. */
export function readHeader(buf: Uint8Array, pos: number): BatchHeader {
  const b = buf as Buffer;
  return {
    length: b.readUInt32BE(pos + O_LENGTH),
    crc: b.readUInt32BE(pos + O_CRC),
    magic: b[pos + O_MAGIC],
    attributes: b[pos + O_ATTR],
    count: b.readUInt32BE(pos + O_COUNT),
    baseOffset: readI64(b, pos + O_BASE),
    firstTimestamp: readI64(b, pos + O_FIRST_TS),
    maxTimestamp: readI64(b, pos + O_MAX_TS),
    producerId: readI64(b, pos + O_PID),
    producerEpoch: b.readInt16BE(pos + O_EPOCH),
    baseSequence: b.readInt32BE(pos + O_SEQ),
  };
}

/**
 * Checks that buf[pos..] holds one complete, intact batch and returns its header.
 * Throws InvalidBatchError naming what is wrong. `maxBytes` bounds the accepted length.
 */
export function verifyBatch(buf: Uint8Array, pos: number, end: number, maxBytes = MAX_BATCH_BYTES): BatchHeader {
  if (end - pos < HEADER_SIZE) throw new InvalidBatchError(`truncated header: ${end - pos} bytes`);
  const h = readHeader(buf, pos);
  if (h.magic !== BATCH_MAGIC) throw new InvalidBatchError(`unknown batch format version ${h.magic}`);
  if (h.length < HEADER_SIZE + MIN_RECORD_SIZE || h.length > maxBytes)
    throw new InvalidBatchError(`implausible batch length ${h.length}`);
  if (h.length > end - pos) throw new InvalidBatchError(`truncated batch: ${end - pos} of ${h.length} bytes`);
  const crc = batchCrc(buf, pos, h.length);
  if (crc !== h.crc) throw new InvalidBatchError(`checksum mismatch (stored ${h.crc}, computed ${crc})`);
  if ((h.attributes & ~KNOWN_BATCH_ATTRS) !== 0) throw new InvalidBatchError(`unknown batch attributes ${h.attributes}`);
  // A sparse batch's count is the offsets it spans, not the records it holds (CMP-2).
  if (h.count < 1 || ((h.attributes & BATCH_ATTR_SPARSE) === 0 && h.count > (h.length - HEADER_SIZE) / MIN_RECORD_SIZE))
    throw new InvalidBatchError(`implausible record count ${h.count}`);
  if (h.baseOffset < 0 || h.firstTimestamp < 0 || h.maxTimestamp < h.firstTimestamp)
    throw new InvalidBatchError("implausible offsets or timestamps");
  return h;
}

/** Cheap pre-check used when scanning for the next batch after corruption (no CRC). */
export function plausibleHeader(buf: Uint8Array, pos: number, end: number, minBaseOffset: number): boolean {
  if (end - pos < HEADER_SIZE) return false;
  if (buf[pos + O_MAGIC] !== BATCH_MAGIC) return false;
  const b = buf as Buffer;
  const len = b.readUInt32BE(pos + O_LENGTH);
  if (len < HEADER_SIZE + MIN_RECORD_SIZE || len > end - pos) return false;
  const base = readI64(b, pos + O_BASE);
  return base >= minBaseOffset && base < minBaseOffset + 2 ** 40;
}

function readVarint(buf: Uint8Array, pos: number, end: number): [number, number] {
  let result = 0;
  let mul = 1;
  for (let i = 0; i < 6; i++) {
    if (pos >= end) throw new InvalidBatchError("varint runs past the record");
    const byte = buf[pos++];
    result += (byte & 0x7f) * mul;
    if ((byte & 0x80) === 0) return [result, pos];
    mul *= 128;
  }
  throw new InvalidBatchError("varint too long");
}

/**
 * Decodes the records of a verified batch (call verifyBatch first). Records are views into
 * `buf`; records with offset < `minOffset` are skipped.
 */
export function decodeRecords(buf: Buffer, pos: number, h: BatchHeader, minOffset = 0, out: StoredRecord[] = []): StoredRecord[] {
  // ENC-1: ciphertext is never parsed as records (BatchCipher.open first).
  if ((h.attributes & BATCH_ATTR_ENCRYPTED) !== 0) throw new InvalidBatchError("encrypted batch read without its key");
  const end = pos + h.length;
  let p = pos + HEADER_SIZE;
  const runs = (h.attributes & BATCH_ATTR_SPARSE) !== 0 ? new SparseRuns(h) : null;
  for (let i = 0; runs !== null ? p < end : i < h.count; i++) {
    if (runs !== null && runs.left === 0) p = runs.next(buf, p, end);
    const offset = runs !== null ? runs.take() : h.baseOffset + i;
    let bodyLen: number;
    [bodyLen, p] = readVarint(buf, p, end);
    const recEnd = p + bodyLen;
    if (bodyLen < 3 || recEnd > end) throw new InvalidBatchError(`record ${i} length ${bodyLen} runs past the batch`);
    if (offset < minOffset) {
      p = recEnd;
      continue;
    }
    const attr = buf[p++];
    if ((attr & 0x03) === 3 || attr > 0x0f) throw new InvalidBatchError(`record ${i} has unknown attributes ${attr}`);
    let tsz: number;
    [tsz, p] = readVarint(buf, p, recEnd);
    let key: Buffer | null = null;
    if ((attr & ATTR_KEY_NULL) === 0) {
      let kl: number;
      [kl, p] = readVarint(buf, p, recEnd);
      if (p + kl > recEnd) throw new InvalidBatchError(`record ${i} key runs past the record`);
      key = buf.subarray(p, p + kl);
      p += kl;
    }
    let value: Buffer | null = null;
    if ((attr & ATTR_VALUE_NULL) === 0) {
      let vl: number;
      [vl, p] = readVarint(buf, p, recEnd);
      if (p + vl > recEnd) throw new InvalidBatchError(`record ${i} value runs past the record`);
      value = buf.subarray(p, p + vl);
      p += vl;
    }
    let hc: number;
    [hc, p] = readVarint(buf, p, recEnd);
    let headers: [string, Buffer][] | null = null;
    if (hc > 0) {
      // Each header needs at least 2 bytes, so hc is bounded by the bytes present.
      if (hc > (recEnd - p) / 2) throw new InvalidBatchError(`record ${i} header count ${hc} is implausible`);
      headers = [];
      for (let j = 0; j < hc; j++) {
        let kl: number;
        [kl, p] = readVarint(buf, p, recEnd);
        if (p + kl > recEnd) throw new InvalidBatchError(`record ${i} header key runs past the record`);
        const k = buf.toString("utf8", p, p + kl);
        p += kl;
        let vl: number;
        [vl, p] = readVarint(buf, p, recEnd);
        if (p + vl > recEnd) throw new InvalidBatchError(`record ${i} header value runs past the record`);
        headers.push([k, buf.subarray(p, p + vl)]);
        p += vl;
      }
    }
    if (p !== recEnd) throw new InvalidBatchError(`record ${i} has ${recEnd - p} trailing bytes`);
    out.push({ offset, timestamp: h.firstTimestamp + unzigzag(tsz), key, value, valueKind: (attr & 0x03) as ValueKind, headers });
  }
  if (p !== end) throw new InvalidBatchError(`batch has ${end - p} trailing bytes`);
  if (runs !== null) runs.finish();
  return out;
}

/**
 * The offsets of a sparse batch's records (BATCH_ATTR_SPARSE, CMP-2): its body is a sequence
 * of runs, each `gap` (varint: offsets skipped since the previous run's end, or since
 * baseOffset), `length` (varint, >= 1: records in the run, at consecutive offsets), then those
 * records. Every offset stays inside the batch's span [baseOffset, baseOffset + count).
 */
export class SparseRuns {
  /** Records left in the current run. */
  left = 0;
  private offset: number;
  private readonly end: number;

  constructor(h: BatchHeader) {
    this.offset = h.baseOffset;
    this.end = h.baseOffset + h.count;
  }

  /** Reads the run header at buf[p] (no record left in the current run); returns where its records start. */
  next(buf: Uint8Array, p: number, end: number): number {
    const gap = varintAt(buf, p, end);
    const length = varintAt(buf, varintEnd, end);
    this.offset += gap;
    if (length < 1 || this.offset + length > this.end) throw new InvalidBatchError(`sparse run of ${length} records at offset ${this.offset} leaves the batch's span (ends at ${this.end})`);
    this.left = length;
    return varintEnd;
  }

  /** The offset of the next record. */
  take(): number {
    this.left--;
    return this.offset++;
  }

  /** At the end of the batch: the last run must be complete. */
  finish(): void {
    if (this.left !== 0) throw new InvalidBatchError(`sparse batch ends ${this.left} records short of its last run`);
  }
}
