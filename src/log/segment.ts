// SPDX-License-Identifier: Apache-2.0
/**
 * One segment of a partition: `<baseOffset>.log` plus two sparse indexes,
 * `<baseOffset>.index` (relative offset → byte position, 8 bytes an entry) and
 * `<baseOffset>.timeindex` (timestamp, relative offset, position; 16 bytes an entry).
 *
 * Indexes are hints, never the source of truth: they are validated when loaded and rebuilt
 * from the log when missing or inconsistent (invariant IDX-1). A sealed segment's time index
 * ends with a "seal" entry (max timestamp, end offset, size) so opening a partition does not
 * scan sealed data.
 */
import { join } from "node:path";
import type { FileHandle, FileSystem } from "./io.js";
import { HEADER_SIZE, MAX_BATCH_BYTES, type BatchHeader } from "./record-batch.js";
import { BatchCursor, resync, SCAN_CHUNK, type CorruptRange } from "./batch-cursor.js";

export const INDEX_INTERVAL_BYTES = 4096;
const OFFSET_ENTRY = 8;
const TIME_ENTRY = 16;

export function segmentFileName(baseOffset: number, ext: string): string {
  return `${String(baseOffset).padStart(20, "0")}.${ext}`;
}

/** Growable sparse index kept in typed arrays (no per-entry objects). */
export class SparseIndex {
  rel = new Uint32Array(64);
  pos = new Uint32Array(64);
  ts = new Float64Array(64); // max timestamp of all records *before* this entry's batch
  n = 0;
  push(rel: number, pos: number, tsBefore: number): void {
    if (this.n === this.rel.length) {
      const grow = <A extends Uint32Array | Float64Array>(a: A): A => {
        const b = new (a.constructor as { new (n: number): A })(a.length * 2);
        b.set(a);
        return b;
      };
      this.rel = grow(this.rel);
      this.pos = grow(this.pos);
      this.ts = grow(this.ts);
    }
    this.rel[this.n] = rel;
    this.pos[this.n] = pos;
    this.ts[this.n] = tsBefore;
    this.n++;
  }
  /** Index of the last entry with rel <= target, or -1. */
  floor(target: number): number {
    let lo = 0;
    let hi = this.n - 1;
    let ans = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      if (this.rel[mid] <= target) {
        ans = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return ans;
  }
  /** Index of the last entry whose ts (max before it) is < target, or -1. */
  floorTime(target: number): number {
    let lo = 0;
    let hi = this.n - 1;
    let ans = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      if (this.ts[mid] < target) {
        ans = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return ans;
  }
  truncateToPosition(size: number): void {
    while (this.n > 0 && this.pos[this.n - 1] >= size) this.n--;
  }
  get bytes(): number {
    return this.n * (OFFSET_ENTRY + TIME_ENTRY);
  }
}

export interface ScanCallbacks {
  onBatch(h: BatchHeader, pos: number): void;
  /** A batch that fails verification at `pos`; `next` is where a valid batch resumes (or null). */
  onCorrupt(pos: number, expectedOffset: number, detail: string, next: { pos: number; offset: number } | null): "skip" | "stop";
}

/**
 * A background zero fill of the active segment (preallocation, LOG-8): zeros are written at
 * [start, end) and then fdatasync'ed, so later appends overwrite allocated, already-sized blocks
 * and their fdatasync has no inode size change to journal.
 */
export interface ZeroFill {
  start: number;
  end: number;
  /** Settles when the zero write returned (ok or not): appends into [start, end) wait for it. */
  written: Promise<void>;
  /** Settles when the whole fill (write and fdatasync) is over; never rejects. */
  done: Promise<void>;
}

export class Segment {
  readonly logPath: string;
  readonly indexPath: string;
  readonly timeIndexPath: string;
  /**
   * Bytes that belong to the segment: the end of its last batch (the *logical* size). For the
   * active segment this can be less than the file size (see `fileEnd`); a sealed segment's file
   * is exactly this long (LOG-4).
   */
  size = 0;
  /**
   * Upper bound of the log file's length (active segment). Bytes in [size, fileEnd) are zeros
   * written by preallocation, or unacknowledged bytes of a failed write (LOG-8).
   */
  fileEnd = 0;
  /** The zero fill running on this segment, if any. */
  fill: ZeroFill | null = null;
  /** Set when the segment is being sealed or closed: no new zero fill may start. */
  noFill = false;
  /** Next offset after the last record in this segment. */
  endOffset: number;
  maxTimestamp = -1;
  /** False for a sealed segment whose indexes were never loaded (maxTimestamp unknown). */
  maxTimestampKnown = false;
  index: SparseIndex | null = null;
  bytesSinceIndex = 0;
  sealed = false;
  deleted = false;
  /** Wall time of the first record, for roll by age (segmentMs); null while empty. */
  createdAtMs: number | null = null;
  handle: FileHandle | null = null;
  /** A read handle being opened (PartitionLog.acquire): concurrent readers share it. */
  opening: Promise<FileHandle> | null = null;
  refs = 0;
  lastUsed = 0;
  /** Ranges [offset, nextOffset) known to be unreadable; reported, never served. */
  corrupt: CorruptRange[] = [];

  constructor(readonly fs: FileSystem, readonly dir: string, readonly baseOffset: number) {
    this.logPath = join(dir, segmentFileName(baseOffset, "log"));
    this.indexPath = join(dir, segmentFileName(baseOffset, "index"));
    this.timeIndexPath = join(dir, segmentFileName(baseOffset, "timeindex"));
    this.endOffset = baseOffset;
  }

  /** Removes the segment's files (a missing one is fine: an interrupted earlier deletion). */
  async unlinkFiles(): Promise<void> {
    for (const p of [this.logPath, this.indexPath, this.timeIndexPath]) {
      await this.fs.unlink(p).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== "ENOENT") throw e;
      });
    }
  }

  /** Records one appended batch in the in-memory index. */
  noteBatch(baseOffset: number, count: number, pos: number, length: number, maxTs: number): void {
    if (this.index === null) this.index = new SparseIndex();
    if (this.createdAtMs === null) this.createdAtMs = Date.now();
    // Invariant IDX-2: the first batch of a segment is always indexed, later ones every
    // INDEX_INTERVAL_BYTES, so a lookup never scans more than ~4 KiB plus one batch.
    if (this.index.n === 0 || this.bytesSinceIndex >= INDEX_INTERVAL_BYTES) {
      // The first entry is always (0, 0): after compaction the first batch may start above the
      // segment's base (CMP-2), and a read of an offset in that gap starts at byte 0.
      this.index.push(this.index.n === 0 ? 0 : baseOffset - this.baseOffset, pos, this.maxTimestamp);
      this.bytesSinceIndex = 0;
    }
    this.bytesSinceIndex += length;
    this.size = pos + length;
    this.endOffset = baseOffset + count;
    if (maxTs > this.maxTimestamp) this.maxTimestamp = maxTs;
    this.maxTimestampKnown = true;
  }

  /** Writes both index files with the seal entry. They are rebuildable, so no fsync. */
  async writeIndexes(): Promise<void> {
    const idx = this.index ?? new SparseIndex();
    const ob = Buffer.allocUnsafe(idx.n * OFFSET_ENTRY);
    const tb = Buffer.allocUnsafe((idx.n + 1) * TIME_ENTRY);
    for (let i = 0; i < idx.n; i++) {
      ob.writeUInt32BE(idx.rel[i], i * OFFSET_ENTRY);
      ob.writeUInt32BE(idx.pos[i], i * OFFSET_ENTRY + 4);
      tb.writeDoubleBE(idx.ts[i], i * TIME_ENTRY);
      tb.writeUInt32BE(idx.rel[i], i * TIME_ENTRY + 8);
      tb.writeUInt32BE(idx.pos[i], i * TIME_ENTRY + 12);
    }
    const s = idx.n * TIME_ENTRY;
    tb.writeDoubleBE(this.maxTimestamp, s);
    tb.writeUInt32BE(this.endOffset - this.baseOffset, s + 8);
    tb.writeUInt32BE(this.size, s + 12);
    for (const [path, buf] of [[this.indexPath, ob], [this.timeIndexPath, tb]] as const) {
      const fh = await this.fs.open(path, "create");
      try {
        await fh.truncate(0);
        await fh.write([buf], 0);
      } finally {
        await fh.close();
      }
    }
  }

  /**
   * Loads the index files if they are consistent with a log of `size` bytes ending at
   * `endOffset` (null: unknown). Returns false when they must be rebuilt.
   */
  async loadIndexes(size: number, endOffset: number | null): Promise<boolean> {
    const [os, ts] = await Promise.all([this.fs.stat(this.indexPath), this.fs.stat(this.timeIndexPath)]);
    if (os === null || ts === null) return false;
    if (os.size % OFFSET_ENTRY !== 0 || ts.size % TIME_ENTRY !== 0) return false;
    const n = os.size / OFFSET_ENTRY;
    if (ts.size !== (n + 1) * TIME_ENTRY || n > size / HEADER_SIZE + 1) return false;
    const ob = await this.fs.readFile(this.indexPath);
    const tb = await this.fs.readFile(this.timeIndexPath);
    if (ob.length !== os.size || tb.length !== ts.size) return false;
    const idx = new SparseIndex();
    let prevRel = -1;
    let prevPos = -1;
    let prevTs = -Infinity;
    for (let i = 0; i < n; i++) {
      const rel = ob.readUInt32BE(i * OFFSET_ENTRY);
      const pos = ob.readUInt32BE(i * OFFSET_ENTRY + 4);
      const t = tb.readDoubleBE(i * TIME_ENTRY);
      if (rel <= prevRel || pos <= prevPos || pos >= size || t < prevTs) return false;
      if (tb.readUInt32BE(i * TIME_ENTRY + 8) !== rel || tb.readUInt32BE(i * TIME_ENTRY + 12) !== pos) return false;
      if (i === 0 && (rel !== 0 || pos !== 0)) return false;
      idx.push(rel, pos, t);
      prevRel = rel;
      prevPos = pos;
      prevTs = t;
    }
    const s = n * TIME_ENTRY;
    const maxTs = tb.readDoubleBE(s);
    const endRel = tb.readUInt32BE(s + 8);
    const sealSize = tb.readUInt32BE(s + 12);
    if (sealSize !== size || endRel <= prevRel || (endOffset !== null && endRel !== endOffset - this.baseOffset)) return false;
    if (n === 0 && size !== 0) return false;
    if (!Number.isFinite(maxTs) || maxTs < prevTs) return false;
    this.index = idx;
    this.maxTimestamp = maxTs;
    this.maxTimestampKnown = true;
    this.endOffset = this.baseOffset + endRel;
    this.size = size;
    return true;
  }

  /**
   * Walks the batches of a segment file from `pos` (expected to hold `expectedOffset`) up to
   * `limit`, verifying each (LOG-2, through BatchCursor). Reads in bounded chunks; memory stays
   * O(chunk + largest batch).
   */
  static async scan(fh: FileHandle, pos: number, expectedOffset: number, limit: number, cb: ScanCallbacks): Promise<{ pos: number; offset: number }> {
    const c = new BatchCursor(fh, pos, expectedOffset, limit, SCAN_CHUNK);
    for (;;) {
      const step = await c.next();
      if (step.kind === "end") return { pos: c.pos, offset: c.expected };
      if (step.kind === "batch") {
        cb.onBatch(step.h, c.pos);
        c.advance(step.h);
        continue;
      }
      const next = await resync(fh, c.pos, c.expected, limit, MAX_BATCH_BYTES);
      if (cb.onCorrupt(c.pos, c.expected, step.detail, next) === "stop" || next === null) return { pos: c.pos, offset: c.expected };
      c.jump(next.pos, next.offset);
    }
  }
}
