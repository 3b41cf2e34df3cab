// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's view of a batch (cleaner.ts): its records as byte spans, and the sparse batch
 * (BATCH_ATTR_SPARSE, docs/storage-format.md "Compaction") that holds the spans it keeps.
 *
 * The cleaner never decodes values or headers: it needs each record's offset, key bytes,
 * whether it is a tombstone and its timestamp, and it copies a kept record's bytes as they are.
 * A kept record's timestamp delta stays valid because the sparse batch keeps the original
 * batch's `firstTimestamp`; its offset stays valid because it keeps `baseOffset` and `count`
 * (the span) and writes each record's delta from `baseOffset` before it (CMP-2).
 */
import { InvalidBatchError } from "../errors.js";
import {
  BATCH_ATTR_COMPACTED,
  BATCH_ATTR_SPARSE,
  HEADER_SIZE,
  SparseRuns,
  lastVarintEnd,
  stampBatch,
  unzigzag,
  varintAt,
  varintSize,
  writeI64,
  writeVarint,
  type BatchHeader,
} from "./record-batch.js";

const ATTR_KEY_NULL = 0x04;
const ATTR_VALUE_NULL = 0x08;
const O_LENGTH = 0;
const O_ATTR = 9;
const O_MAX_TS = 32;

/** One record of a batch, as positions in the batch's buffer. Valid only during the callback. */
export interface RecordSpan {
  buf: Buffer;
  offset: number;
  /** Position of the record's length varint (after its offset delta in a sparse batch). */
  start: number;
  end: number;
  /** The key's bytes are buf[keyStart, keyEnd); keyStart is -1 for a null key. */
  keyStart: number;
  keyEnd: number;
  tombstone: boolean;
  timestamp: number;
}

/**
 * Calls `fn` for each record of the verified batch at buf[pos] in offset order, with one reused
 * RecordSpan; `fn` returning false stops the walk (then false is returned).
 */
export function forEachRecordSpan(buf: Buffer, pos: number, h: BatchHeader, fn: (r: RecordSpan) => boolean | void): boolean {
  const end = pos + h.length;
  const runs = (h.attributes & BATCH_ATTR_SPARSE) !== 0 ? new SparseRuns(h) : null;
  const r: RecordSpan = { buf, offset: 0, start: 0, end: 0, keyStart: -1, keyEnd: -1, tombstone: false, timestamp: 0 };
  let p = pos + HEADER_SIZE;
  for (let i = 0; runs !== null ? p < end : i < h.count; i++) {
    if (runs !== null && runs.left === 0) p = runs.next(buf, p, end);
    r.offset = runs !== null ? runs.take() : h.baseOffset + i;
    r.start = p;
    const bodyLen = varintAt(buf, p, end);
    p = lastVarintEnd();
    r.end = p + bodyLen;
    if (bodyLen < 3 || r.end > end) throw new InvalidBatchError(`record ${i} length ${bodyLen} runs past the batch`);
    const attr = buf[p++];
    r.timestamp = h.firstTimestamp + unzigzag(varintAt(buf, p, r.end));
    p = lastVarintEnd();
    if ((attr & ATTR_KEY_NULL) === 0) {
      const kl = varintAt(buf, p, r.end);
      r.keyStart = lastVarintEnd();
      r.keyEnd = r.keyStart + kl;
      if (r.keyEnd > r.end) throw new InvalidBatchError(`record ${i} key runs past the record`);
    } else r.keyStart = r.keyEnd = -1;
    r.tombstone = (attr & ATTR_VALUE_NULL) !== 0;
    p = r.end;
    if (fn(r) === false) return false;
  }
  runs?.finish();
  return true;
}

/**
 * Collects the records kept from one batch and builds the sparse batch that holds them: the
 * original header (base offset, count, first timestamp, producer fields and base sequence
 * unchanged) with BATCH_ATTR_COMPACTED | BATCH_ATTR_SPARSE, its length, a max timestamp over
 * the kept records, and a new CRC; then per kept record its offset delta and its bytes.
 */
export class SparseBatchBuilder {
  private offsets: number[] = [];
  private starts: number[] = [];
  private ends: number[] = [];
  private maxTs = -1;

  get size(): number {
    return this.offsets.length;
  }

  add(r: RecordSpan): void {
    this.offsets.push(r.offset);
    this.starts.push(r.start);
    this.ends.push(r.end);
    if (r.timestamp > this.maxTs) this.maxTs = r.timestamp;
  }

  /** The sparse batch of the records added since the last build, cut from the batch at src[pos]. */
  build(src: Buffer, pos: number, h: BatchHeader): Buffer {
    const n = this.offsets.length;
    // Size pass: per run of consecutive offsets its gap and length varints, then its records.
    let total = HEADER_SIZE;
    let next = h.baseOffset;
    for (let i = 0; i < n; ) {
      let j = i + 1;
      while (j < n && this.offsets[j] === this.offsets[j - 1] + 1) j++;
      total += varintSize(this.offsets[i] - next) + varintSize(j - i);
      for (let k = i; k < j; k++) total += this.ends[k] - this.starts[k];
      next = this.offsets[j - 1] + 1;
      i = j;
    }
    const out = Buffer.allocUnsafe(total);
    src.copy(out, 0, pos, pos + HEADER_SIZE);
    out.writeUInt32BE(total, O_LENGTH);
    out[O_ATTR] = BATCH_ATTR_COMPACTED | BATCH_ATTR_SPARSE;
    // verifyBatch wants maxTimestamp >= firstTimestamp, which the dropped first record set.
    writeI64(out, O_MAX_TS, Math.max(this.maxTs, h.firstTimestamp));
    let p = HEADER_SIZE;
    next = h.baseOffset;
    for (let i = 0; i < n; ) {
      let j = i + 1;
      while (j < n && this.offsets[j] === this.offsets[j - 1] + 1) j++;
      p = writeVarint(out, p, this.offsets[i] - next);
      p = writeVarint(out, p, j - i);
      for (let k = i; k < j; k++) p += src.copy(out, p, this.starts[k], this.ends[k]);
      next = this.offsets[j - 1] + 1;
      i = j;
    }
    // Invariant: the size pass and the copy pass agree byte for byte.
    if (p !== total) throw new Error(`sparse batch size mismatch: ${p} != ${total}`);
    stampBatch(out, h.baseOffset);
    this.clear();
    return out;
  }

  /** Forgets the records added (a batch kept whole is copied as stored instead). */
  clear(): void {
    this.offsets = [];
    this.starts = [];
    this.ends = [];
    this.maxTs = -1;
  }
}
