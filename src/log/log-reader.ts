// SPDX-License-Identifier: Apache-2.0
/**
 * Reads of one partition: records (`read`), whole stored batches (`readRaw`, the server's
 * push), offset by time; and the caches reads need, each with an explicit bound: open handles
 * of sealed segments (MAX_OPEN_SEALED) and their sparse indexes in memory (MAX_LOADED_INDEXES).
 *
 * Every batch handed out went through BatchCursor (LOG-2). Readers never see offsets at or
 * above the high watermark (LOG-3).
 */
import { CorruptRecordError, EncryptionKeyMissingError, InvalidBatchError, OffsetOutOfRangeError, ValidationError } from "../errors.js";
import { BatchCursor, locateIntact, MAX_CORRUPT_RANGES, readFully, type ReadAt } from "./batch-cursor.js";
import type { FileHandle } from "./io.js";
import type { LogState } from "./log-state.js";
import { BATCH_ATTR_ENCRYPTED, decodeRecords, HEADER_SIZE, MAX_BATCH_BYTES, type StoredRecord } from "./record-batch.js";
import { Segment, SparseIndex } from "./segment.js";
import { StorageError } from "../errors.js";

/**
 * Tail reads (LOG-10): a read that starts in the last TAIL_READ_SYNC_BYTES of the active
 * segment, within TAIL_READ_SYNC_MS of the last publish, is served by a synchronous pread:
 * those bytes were just written, so they are in the page cache and the read is a memory copy
 * of at most 64 KiB, far cheaper than a hand-off to the thread pool and back -- a hand-off
 * that, on a loaded machine, costs a consumer at the live end milliseconds of latency.
 * Such a read completes without returning to the event loop, so a caller polling in a loop
 * must yield now and then itself: the broker's public calls do (src/turn-yield.ts).
 */
const TAIL_READ_SYNC_BYTES = 64 * 1024;
const TAIL_READ_SYNC_MS = 2000;
/** Bound on open read handles of sealed segments per partition. */
export const MAX_OPEN_SEALED = 4;
/** Bound on sparse indexes of sealed segments held in memory per partition (LRU). */
const MAX_LOADED_INDEXES = 16;
const EMPTY_BYTES = Buffer.alloc(0);

/** Result of `readRaw`: whole verified batches (a view of one buffer) and where to go on. */
export interface RawRead {
  /** Concatenated stored batches; the first may hold records below the requested offset. */
  data: Buffer;
  /** Offset after the last returned batch (the offset to read next). */
  nextOffset: number;
  /** Records in `data` at or after the requested offset. */
  records: number;
}

/**
 * Where a recent read ended: the batch boundary at `offset` is at byte `pos` of `seg`. A
 * consumer at the live end reads from where its last read ended, once per record at a
 * trickle; starting there skips the lead-in from the index entry below it (IDX-2: up to
 * ~4 KiB of batches, each read and CRC-verified again for nothing).
 */
interface ResumeHint {
  seg: Segment;
  offset: number;
  pos: number;
}
/** Bound on resume hints per partition (one per consumer reading it, the latest ones). */
const MAX_RESUME_HINTS = 8;

/** Where a read of `offset` starts in `seg`: a resume hint, or the index entry at or below it (IDX-2). */
interface Start {
  seg: Segment;
  fh: FileHandle;
  /** Readable end in bytes (the active segment's is the readable size: LOG-3). */
  limit: number;
  /** Offset after the segment's last readable record. */
  segEnd: number;
  pos: number;
  expected: number;
  /** Index in `hints` of the hint used, -1 if none. */
  hint: number;
}

export class LogReader {
  private loadedIndexes = new Set<Segment>();
  private readonly hints: ResumeHint[] = [];
  private nextHint = 0;
  /** The tail-aware first read of a chunk (LOG-10), bound once. */
  private readonly readTail: (seg: Segment) => ReadAt;

  constructor(private readonly st: LogState) {
    this.readTail = (seg) => (fh, buf, length, pos) => this.readAt(seg, fh, buf, length, pos);
  }

  // ─────────────────────────────── handles and indexes ───────────────────────────────

  /**
   * A read handle of `seg`, counted in `seg.refs` until `release`. Handle lifetimes have one
   * owner (this class) and change only in synchronous code: concurrent readers of a closed
   * sealed segment share one open (`seg.opening`), and eviction picks and detaches its
   * handles before its first await (trimOpenHandles), so no two callers ever act on one
   * handle.
   */
  async acquire(seg: Segment): Promise<FileHandle> {
    seg.refs++;
    seg.lastUsed = this.st.ctx.telemetry.clock.monotonicMs();
    if (seg.handle !== null) return seg.handle;
    try {
      if (seg.opening === null) {
        const opening = this.st.ctx.fs.open(seg.logPath, "r");
        seg.opening = opening;
        void opening.then(
          (h) => {
            if (seg.opening === opening) seg.opening = null;
            seg.handle = h;
          },
          () => {
            if (seg.opening === opening) seg.opening = null;
          },
        );
      }
      const h = await seg.opening;
      // The open's own callback ran first (registered first), so this is seg.handle.
      this.trimOpenHandles();
      return h;
    } catch (e) {
      seg.refs--;
      throw e;
    }
  }

  async release(seg: Segment): Promise<void> {
    seg.refs--;
    if (seg.deleted && seg.refs === 0 && seg.handle) {
      const h = seg.handle;
      seg.handle = null;
      await h.close();
    }
  }

  /** Closes the least recently used idle handles of sealed segments beyond MAX_OPEN_SEALED. */
  trimOpenHandles(): void {
    const open = this.st.segments.filter((s) => s.sealed && s.handle !== null && s.refs === 0).sort((a, b) => a.lastUsed - b.lastUsed);
    const closing: FileHandle[] = [];
    while (open.length > MAX_OPEN_SEALED) {
      const s = open.shift()!;
      closing.push(s.handle!);
      s.handle = null;
    }
    for (const h of closing) h.close().catch((e: unknown) => this.st.ctx.logger.warn({ err: e, file: h.path }, "could not close segment handle"));
  }

  /** A segment was just sealed by the writer: its index joins the LRU, handles are trimmed. */
  sealed(seg: Segment): void {
    seg.lastUsed = this.st.ctx.telemetry.clock.monotonicMs();
    this.touchIndex(seg);
    this.trimOpenHandles();
  }

  /** Loads (or rebuilds) the index of a sealed segment. */
  async ensureIndex(seg: Segment, fh: FileHandle): Promise<void> {
    if (seg.index !== null) {
      this.touchIndex(seg);
      return;
    }
    if (await seg.loadIndexes(seg.size, seg.endOffset)) {
      this.touchIndex(seg);
      return;
    }
    const { logger } = this.st.ctx;
    logger.warn({ file: seg.logPath }, "rebuilding index of sealed segment");
    const endOffset = seg.endOffset;
    seg.maxTimestamp = -1;
    seg.bytesSinceIndex = 0;
    const sealedSize = seg.size;
    seg.corrupt = [];
    await Segment.scan(fh, 0, seg.baseOffset, sealedSize, {
      onBatch: (h, pos) => seg.noteBatch(h.baseOffset, h.count, pos, h.length, h.maxTimestamp),
      onCorrupt: (pos, expected, detail, next) => {
        if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next?.offset ?? endOffset, pos, nextPos: next?.pos ?? -1 });
        logger.error({ file: seg.logPath, position: pos, offset: expected, detail }, "corrupt batch in sealed segment");
        return "skip";
      },
    });
    seg.size = sealedSize;
    seg.endOffset = endOffset;
    if (seg.index === null) seg.index = new SparseIndex();
    seg.maxTimestampKnown = true;
    this.touchIndex(seg);
    await seg.writeIndexes().catch((e) => logger.warn({ err: e }, "could not write rebuilt index"));
  }

  /**
   * Keeps at most MAX_LOADED_INDEXES sealed-segment indexes in memory, least recently used
   * evicted first, so memory does not grow with the number of retained segments. Readers keep
   * their own reference to an index they are using, so eviction never disturbs a read.
   */
  private touchIndex(seg: Segment): void {
    this.loadedIndexes.delete(seg);
    this.loadedIndexes.add(seg);
    for (const s of this.loadedIndexes) {
      if (this.loadedIndexes.size <= MAX_LOADED_INDEXES) break;
      this.loadedIndexes.delete(s);
      if (s.sealed) s.index = null;
    }
  }

  /** Makes sure a sealed segment's max timestamp is known (loads its index). */
  async ensureTimestamps(seg: Segment): Promise<void> {
    if (!seg.sealed || seg.maxTimestampKnown) return;
    const fh = await this.acquire(seg);
    try {
      await this.ensureIndex(seg, fh);
    } finally {
      await this.release(seg);
    }
  }

  /** readFully, or a synchronous pread for a small read of the live end (LOG-10). */
  private readAt(seg: Segment, fh: FileHandle, buf: Buffer, length: number, pos: number): Promise<number> | number {
    const st = this.st;
    if (seg === st.active && st.readableSize - pos <= TAIL_READ_SYNC_BYTES && st.ctx.telemetry.clock.monotonicMs() - st.publishedAtMs < TAIL_READ_SYNC_MS) {
      // The whole range is below readableSize (the caller's limit), so it was written and
      // published; a short read can only mean the file is shorter than our bookkeeping.
      const n = fh.readSync(buf, 0, length, pos);
      if (n !== length) throw new StorageError(`short read of ${seg.logPath} at ${pos}: ${n} of ${length} bytes`);
      return n;
    }
    return readFully(fh, buf, length, pos);
  }

  // ──────────────────────────────────── reads ────────────────────────────────────

  private checkRange(offset: number): void {
    const st = this.st;
    if (!Number.isSafeInteger(offset)) throw new ValidationError(`invalid offset ${offset}`);
    if (offset < st.logStart || offset > st.hwm) throw new OffsetOutOfRangeError(st.ctx.topic, st.ctx.partition, offset, st.logStart, st.hwm);
  }

  /** Opens the segment of `offset` and finds the indexed batch boundary at or below it. */
  private async start(offset: number): Promise<Start> {
    const st = this.st;
    const seg = st.findSegment(offset);
    const fh = await this.acquire(seg);
    try {
      if (seg.sealed) await this.ensureIndex(seg, fh);
    } catch (e) {
      await this.release(seg);
      throw e;
    }
    const active = seg === st.active;
    const limit = active ? st.readableSize : seg.size;
    const segEnd = active ? st.hwm : seg.endOffset;
    for (let i = 0; i < this.hints.length; i++) {
      const h = this.hints[i];
      if (h.seg === seg && h.offset === offset && h.pos <= limit) return { seg, fh, limit, segEnd, pos: h.pos, expected: offset, hint: i };
    }
    let pos = 0;
    let expected = seg.baseOffset;
    const idx = seg.index;
    if (idx !== null && idx.n > 0) {
      const e = idx.floor(offset - seg.baseOffset);
      if (e >= 0) {
        pos = idx.pos[e];
        expected = seg.baseOffset + idx.rel[e];
      }
    }
    return { seg, fh, limit, segEnd, pos, expected, hint: -1 };
  }

  /** A read from `s` ended at the batch boundary `offset`, byte `pos`: remember it (see ResumeHint). */
  private noteEnd(s: Start, offset: number, pos: number): void {
    if (s.hint >= 0) {
      const h = this.hints[s.hint];
      h.offset = offset;
      h.pos = pos;
      return;
    }
    const h: ResumeHint = { seg: s.seg, offset, pos };
    if (this.hints.length < MAX_RESUME_HINTS) this.hints.push(h);
    else this.hints[this.nextHint++ % MAX_RESUME_HINTS] = h;
  }

  /**
   * Damage at the cursor (LOG-2): if `offset` lies in the damaged range, CorruptRecordError
   * with where reading can resume; otherwise the cursor jumps past it. Returns false when no
   * intact batch follows in the segment.
   */
  private async pastDamage(s: Start, c: BatchCursor, offset: number, detail: string): Promise<boolean> {
    const { next, nextOffset } = await locateIntact(s.seg.corrupt, s.fh, c.pos, c.expected, s.limit, s.segEnd);
    const { topic, partition } = this.st.ctx;
    if (offset < nextOffset) throw new CorruptRecordError(topic, partition, c.expected, s.seg.logPath, c.pos, detail, nextOffset);
    if (next === null) return false;
    c.jump(next.pos, next.offset);
    return true;
  }

  /**
   * Reads records from `offset`, about `maxBytes` of them (at least one batch if any exists).
   * Never returns a record that failed verification (LOG-2); a damaged batch at `offset` raises
   * CorruptRecordError with `nextOffset` where reading can resume.
   */
  async read(offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    this.checkRange(offset);
    if (offset === this.st.hwm) return { records: [], nextOffset: offset };
    const s = await this.start(offset);
    try {
      const out: StoredRecord[] = [];
      let bytes = 0;
      // Records are views into the cursor's buffers, which a refill never overwrites.
      const c = new BatchCursor(s.fh, s.pos, s.expected, s.limit, Math.max(64 * 1024, Math.min(maxBytes, 8 * 1024 * 1024)), this.readTail(s.seg));
      while (out.length === 0 || bytes < maxBytes) {
        const step = await c.next();
        if (step.kind === "end") break;
        if (step.kind === "batch") {
          const { h } = step;
          const before = out.length;
          let detail = "";
          if (h.baseOffset + h.count > offset) {
            try {
              // ENC-1: an encrypted log's batches are decrypted (and authenticated, ENC-2) first.
              if (this.st.ctx.cipher !== null && (h.attributes & BATCH_ATTR_ENCRYPTED) !== 0) {
                const o = this.st.ctx.cipher.open(step.buf, step.at, h);
                decodeRecords(o.buf, 0, o.h, offset, out);
              } else decodeRecords(step.buf, step.at, h, offset, out);
              bytes += h.length;
            } catch (e) {
              // A batch whose key is missing (ENC-2): hand out what precedes it; the next read reports it.
              if (e instanceof EncryptionKeyMissingError && before > 0) break;
              if (!(e instanceof InvalidBatchError)) throw e;
              out.length = before;
              detail = e.message;
            }
          }
          if (detail === "") {
            c.advance(h);
            continue;
          }
          if (out.length > 0) break; // hand out what precedes it; the next read reports it
          if (!(await this.pastDamage(s, c, offset, detail))) break;
          continue;
        }
        if (out.length > 0) break;
        if (!(await this.pastDamage(s, c, offset, step.detail))) break;
      }
      if (out.length === 0 && c.pos >= s.limit && s.segEnd > offset && s.seg !== this.st.active) {
        // Nothing readable left in this segment from `offset`: continue in the next one.
        return { records: [], nextOffset: s.segEnd };
      }
      const nextOffset = out.length > 0 ? out[out.length - 1].offset + 1 : offset;
      if (out.length > 0 && nextOffset === c.expected) this.noteEnd(s, nextOffset, c.pos);
      return { records: out, nextOffset };
    } finally {
      await this.release(s.seg);
    }
  }

  /**
   * Stored batches from `offset` as bytes, for a consumer that forwards them (the server's
   * subscription push): whole batches, contiguous as on disk, each verified exactly as `read`
   * verifies it (LOG-2), but not decoded. The first batch may start below `offset` (a batch is
   * never split); `records` counts only the records at or after `offset`. At most `maxBytes`
   * of batches and no batch beyond the one that reaches `maxRecords` such records, but always
   * at least one whole batch when one exists. A damaged batch at `offset` raises
   * CorruptRecordError with `nextOffset` (as `read`); one after intact batches ends the result.
   */
  async readRaw(offset: number, maxBytes: number, maxRecords = Infinity): Promise<RawRead> {
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new ValidationError(`invalid maxBytes ${maxBytes}`);
    this.checkRange(offset);
    if (offset === this.st.hwm) return { data: EMPTY_BYTES, nextOffset: offset, records: 0 };
    const s = await this.start(offset);
    try {
      // One read normally covers the lead-in from the index entry (IDX-2: ~4 KiB plus a
      // batch) and the result. The result is one view of one buffer, so once it has started
      // the cursor is never refilled: the result ends where the buffer ends.
      const c = new BatchCursor(s.fh, s.pos, s.expected, s.limit, rawChunkBytes(s, maxBytes, maxRecords), this.readTail(s.seg));
      let data: Buffer = EMPTY_BYTES;
      let first = -1; // index in `data` of the first returned batch
      let end = -1;
      let bytes = 0;
      let records = 0;
      for (;;) {
        if (first >= 0) {
          const len = c.bufferedLength();
          if (len < 0 || bytes + len > maxBytes || records >= maxRecords || !c.isBuffered(len)) break;
        }
        const step = await c.next();
        if (step.kind === "end") break;
        if (step.kind === "damage") {
          if (first >= 0) break; // hand out what precedes it; the next read reports it
          if (!(await this.pastDamage(s, c, offset, step.detail))) break;
          continue;
        }
        const { h } = step;
        const batchEnd = h.baseOffset + h.count;
        if (batchEnd > offset) {
          if (first < 0) {
            data = step.buf;
            first = step.at;
          }
          records += batchEnd - Math.max(h.baseOffset, offset);
          bytes += h.length;
          end = step.at + h.length;
        }
        c.advance(h);
      }
      if (first < 0) {
        // Nothing readable left in this sealed segment from `offset`: continue in the next one.
        if (c.pos >= s.limit && s.segEnd > offset && s.seg !== this.st.active) return { data: EMPTY_BYTES, nextOffset: s.segEnd, records: 0 };
        return { data: EMPTY_BYTES, nextOffset: offset, records: 0 };
      }
      this.noteEnd(s, c.expected, c.pos);
      return { data: data.subarray(first, end), nextOffset: c.expected, records };
    } finally {
      await this.release(s.seg);
    }
  }

  /** First offset whose timestamp is >= ts; the high watermark if there is none. */
  async offsetForTimestamp(ts: number): Promise<number> {
    const st = this.st;
    for (const seg of [...st.segments]) {
      if (seg.endOffset <= st.logStart && seg !== st.active) continue;
      if (seg.deleted) continue; // replaced by compaction meanwhile (CMP-3): its path holds the new file
      if (seg.sealed) {
        const fh = await this.acquire(seg);
        try {
          await this.ensureIndex(seg, fh);
        } finally {
          await this.release(seg);
        }
      }
      if (seg.maxTimestamp < ts) continue;
      let start = Math.max(seg.baseOffset, st.logStart);
      const idx = seg.index;
      if (idx !== null) {
        const e = idx.floorTime(ts);
        if (e >= 0) start = Math.max(start, seg.baseOffset + idx.rel[e]);
      }
      const end = seg === st.active ? st.hwm : seg.endOffset;
      let off = start;
      while (off < end) {
        let r: { records: StoredRecord[]; nextOffset: number };
        try {
          r = await this.read(off, 256 * 1024);
        } catch (e) {
          if (e instanceof CorruptRecordError && e.nextOffset !== undefined) {
            off = e.nextOffset;
            continue;
          }
          throw e;
        }
        for (const rec of r.records) if (rec.timestamp >= ts) return rec.offset;
        if (r.nextOffset <= off) break;
        off = r.nextOffset;
      }
    }
    return st.hwm;
  }
}

/**
 * Bytes to read for a raw read: enough for `maxBytes` of batches plus the lead-in, but when
 * the caller wants few records, about what they take at the segment's average record size
 * (with a margin), not maxBytes: a push of 1,000 small records then reads ~300 KiB, not 1 MiB.
 * Reading less only ends the result earlier (the caller reads again); the first batch is
 * always whole, however large.
 */
function rawChunkBytes(s: Start, maxBytes: number, maxRecords: number): number {
  const full = Math.min(maxBytes, MAX_BATCH_BYTES) + 2 * 4096 + HEADER_SIZE;
  const offsets = s.segEnd - s.seg.baseOffset;
  if (!Number.isFinite(maxRecords) || offsets <= 0) return full;
  const estimate = Math.ceil((maxRecords * s.limit * 1.25) / offsets) + 2 * 4096 + HEADER_SIZE;
  return Math.min(full, Math.max(64 * 1024, estimate));
}
