// SPDX-License-Identifier: Apache-2.0
/**
 * The one verified walk over the batches of a segment file, used by every reader: record
 * reads (`PartitionLog.read`), raw batch reads for the server's push (`readRaw`), recovery
 * and index rebuilds (`Segment.scan`).
 *
 * Invariant LOG-2 is enforced here and nowhere else: a batch is handed out only if its length
 * is plausible, its CRC-32C (which covers its base offset) matches and its base offset is the
 * one that must follow the previous batch. Anything else is "damage" at the cursor's position,
 * which the caller reports (CorruptRecordError) or skips past (`locateIntact`).
 *
 * Memory: a refill always reads into a fresh buffer of at most `chunkBytes` (or one batch), so
 * views handed out of an earlier buffer stay valid and memory is bounded by the chunk size.
 */
import { InvalidBatchError } from "../errors.js";
import type { FileHandle } from "./io.js";
import { BATCH_ATTR_COMPACTED, HEADER_SIZE, MAX_BATCH_BYTES, plausibleHeader, readBatchLength, verifyBatch, type BatchHeader } from "./record-batch.js";

/** Reads `length` bytes at `pos` into buf[0..]; returns the bytes read (short only at EOF). */
export type ReadAt = (fh: FileHandle, buf: Buffer, length: number, pos: number) => Promise<number> | number;

export type CursorStep =
  /** A verified batch at the cursor's position: buf[at, at + h.length). */
  | { kind: "batch"; h: BatchHeader; buf: Buffer; at: number }
  /** The bytes at the cursor's position are not the batch that must come next. */
  | { kind: "damage"; detail: string }
  /** The cursor reached its limit. */
  | { kind: "end" };

const END: CursorStep = { kind: "end" };
const EMPTY = Buffer.alloc(0);

export async function readFully(fh: FileHandle, buf: Buffer, length: number, position: number): Promise<number> {
  let got = 0;
  while (got < length) {
    const n = await fh.read(buf, got, length - got, position + got);
    if (n === 0) break;
    got += n;
  }
  return got;
}

export class BatchCursor {
  private buf: Buffer = EMPTY;
  private bufStart: number;
  private bufLen = 0;

  /**
   * @param pos byte position of a batch boundary (the segment start or an index entry)
   * @param expected the base offset the batch at `pos` must have
   * @param limit bytes of the file that may be read (the readable end)
   * @param read how the first read of a chunk is done (tail reads may be synchronous, LOG-10);
   *   the rest of a batch that straddles a chunk is always read with readFully
   */
  constructor(
    private readonly fh: FileHandle,
    public pos: number,
    public expected: number,
    private readonly limit: number,
    private readonly chunkBytes: number,
    private readonly read: ReadAt = readFully,
  ) {
    this.bufStart = pos;
  }

  /** Length of the batch at the cursor if its header is already buffered, else -1 (no I/O). */
  bufferedLength(): number {
    const at = this.pos - this.bufStart;
    if (this.pos < this.bufStart || at + HEADER_SIZE > this.bufLen) return -1;
    return readBatchLength(this.buf, at);
  }

  /** True if `length` bytes from the cursor are already buffered (no refill needed). */
  isBuffered(length: number): boolean {
    return this.pos >= this.bufStart && this.pos + length <= this.bufStart + this.bufLen;
  }

  /** The batch at the cursor, verified (LOG-2); the cursor does not move (see `advance`). */
  async next(): Promise<CursorStep> {
    const { pos, limit } = this;
    if (pos >= limit) return END;
    if (!this.isBuffered(HEADER_SIZE)) {
      const want = Math.min(this.chunkBytes, Math.max(limit - pos, HEADER_SIZE));
      this.buf = Buffer.allocUnsafe(want);
      this.bufStart = pos;
      this.bufLen = await this.read(this.fh, this.buf, Math.min(want, limit - pos), pos);
    }
    if (pos + HEADER_SIZE > this.bufStart + this.bufLen) return { kind: "damage", detail: `truncated header (${limit - pos} bytes left)` };
    const len = readBatchLength(this.buf, pos - this.bufStart);
    if (len < HEADER_SIZE || len > MAX_BATCH_BYTES || len > limit - pos) return { kind: "damage", detail: `implausible batch length ${len}` };
    if (!this.isBuffered(len)) {
      this.buf = Buffer.allocUnsafe(Math.max(len, Math.min(this.chunkBytes, limit - pos)));
      this.bufStart = pos;
      this.bufLen = await readFully(this.fh, this.buf, Math.min(this.buf.length, limit - pos), pos);
    }
    const at = pos - this.bufStart;
    let h: BatchHeader;
    try {
      h = verifyBatch(this.buf, at, this.bufLen, MAX_BATCH_BYTES);
    } catch (e) {
      if (!(e instanceof InvalidBatchError)) throw e;
      return { kind: "damage", detail: e.message };
    }
    // CMP-2: only a batch the cleaner wrote may start above the expected offset (a gap left by
    // compaction); never below it, and an ordinary batch must start exactly there (LOG-2).
    if (h.baseOffset !== this.expected && !(h.baseOffset > this.expected && (h.attributes & BATCH_ATTR_COMPACTED) !== 0)) return { kind: "damage", detail: `batch claims offset ${h.baseOffset}, expected ${this.expected} (misplaced batch)` };
    return { kind: "batch", h, buf: this.buf, at };
  }

  /** Moves past a batch returned by `next`. */
  advance(h: BatchHeader): void {
    this.pos += h.length;
    this.expected = h.baseOffset + h.count;
  }

  /** Continues at another batch boundary (after damage). */
  jump(pos: number, offset: number): void {
    this.pos = pos;
    this.expected = offset;
    this.bufLen = 0;
  }
}

/** A range known to be unreadable, remembered per segment so damage is searched for once. */
export interface CorruptRange {
  offset: number;
  nextOffset: number;
  pos: number;
  /** Where the next intact batch starts, -1 if none follows in the segment. */
  nextPos: number;
}

/** Bound on remembered corrupt ranges per segment. */
export const MAX_CORRUPT_RANGES = 1000;

/**
 * Where reading can resume after damage at `pos` (where offset `expected` should be): the
 * remembered range, or a resync scan whose result is remembered. `segEnd` is the segment's
 * end offset (the offset after the damage when no intact batch follows).
 */
export async function locateIntact(
  corrupt: CorruptRange[],
  fh: FileHandle,
  pos: number,
  expected: number,
  limit: number,
  segEnd: number,
): Promise<{ next: { pos: number; offset: number } | null; nextOffset: number }> {
  const known = corrupt.find((c) => c.offset === expected);
  let next: { pos: number; offset: number } | null;
  if (known) next = known.nextPos >= 0 ? { pos: known.nextPos, offset: known.nextOffset } : null;
  else {
    next = await resync(fh, pos, expected, limit, MAX_BATCH_BYTES);
    if (corrupt.length < MAX_CORRUPT_RANGES) corrupt.push({ offset: expected, nextOffset: next?.offset ?? segEnd, pos, nextPos: next?.pos ?? -1 });
  }
  return { next, nextOffset: next?.offset ?? segEnd };
}

const SCAN_CHUNK = 1 << 20;
const ZERO_BLOCK = 4096;
const ZEROS = Buffer.alloc(ZERO_BLOCK);

export function isZero(buf: Buffer, from: number, to: number): boolean {
  for (let at = from; at < to; at += ZERO_BLOCK) {
    const end = Math.min(to, at + ZERO_BLOCK);
    if (buf.compare(ZEROS, 0, end - at, at, end) !== 0) return false;
  }
  return true;
}

/**
 * After a bad batch at `pos`, finds the next intact batch whose offset follows
 * `expectedOffset`, scanning byte by byte from pos+1 (bounded by the segment; plausibility is
 * checked before the CRC so garbage is skipped cheaply).
 */
export async function resync(fh: FileHandle, pos: number, expectedOffset: number, limit: number, maxBatchBytes: number): Promise<{ pos: number; offset: number } | null> {
  const window = Buffer.allocUnsafe(Math.min(SCAN_CHUNK + HEADER_SIZE, Math.max(0, limit - pos)));
  let start = pos + 1;
  while (start + HEADER_SIZE <= limit) {
    const n = await readFully(fh, window, Math.min(window.length, limit - start), start);
    const scanEnd = Math.min(n - HEADER_SIZE + 1, SCAN_CHUNK);
    for (let i = 0; i < scanEnd; i++) {
      // A batch starts with a length >= HEADER_SIZE, so no batch starts at i when the 4 bytes
      // there are zero. Skip whole zero blocks natively: a preallocated tail (LOG-8) is MiBs
      // of zeros, which a byte-by-byte search would crawl through on every recovery.
      if (window[i] === 0 && (i & (ZERO_BLOCK - 1)) === 0 && i + ZERO_BLOCK <= n && isZero(window, i, i + ZERO_BLOCK)) {
        i += ZERO_BLOCK - 4; // the last 3 bytes of the block may begin a length field
        continue;
      }
      // plausibleHeader bounds the length by the bytes left in the segment, not the window.
      if (!plausibleHeader(window, i, limit - start, expectedOffset)) continue;
      const len = readBatchLength(window, i);
      if (len > maxBatchBytes) continue;
      const cand = i + len <= n ? window : Buffer.allocUnsafe(len);
      const at = cand === window ? i : 0;
      if (cand !== window && (await readFully(fh, cand, len, start + i)) < len) continue;
      try {
        const h = verifyBatch(cand, at, at + len, maxBatchBytes);
        return { pos: start + i, offset: h.baseOffset };
      } catch {
        // not a batch boundary; keep looking
      }
    }
    if (n < window.length) break;
    start += SCAN_CHUNK;
  }
  return null;
}

/**
 * The position just past the last non-zero byte in [from, to) of the file, or `from` if the
 * range is all zeros. Reads backwards in bounded chunks (memory O(SCAN_CHUNK)).
 */
export async function endOfNonZero(fh: FileHandle, from: number, to: number): Promise<number> {
  const buf = Buffer.allocUnsafe(Math.min(SCAN_CHUNK, Math.max(0, to - from)));
  let end = to;
  while (end > from) {
    const start = Math.max(from, end - buf.length);
    const n = await readFully(fh, buf, end - start, start);
    if (n < end - start) {
      // The file is shorter than assumed: only what exists can be non-zero.
      end = start + n;
      if (n === 0) continue;
    }
    if (!isZero(buf, 0, end - start)) {
      let i = end - start - 1;
      while (buf[i] === 0) i--;
      return start + i + 1;
    }
    end = start;
  }
  return from;
}

export { SCAN_CHUNK };
