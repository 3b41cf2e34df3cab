// SPDX-License-Identifier: Apache-2.0
/**
 * Key compaction of one partition (Kafka's log cleaner): over the sealed segments whose
 * records are all at least `minCompactionLagMs` old (never the active segment), keep per key
 * only the record at its latest offset, and drop tombstones (null values) once they are older
 * than `deleteRetentionMs`.
 *
 * A pass: (1) build a key → latest offset map (offset-map.ts, bounded memory) over the dirty
 * range, from `firstDirty` (where the previous pass's map ended) up to where the cleanable
 * segments end or the map is full (`covered`); (2) walk the cleanable segments from the log
 * start up to `covered`, and rewrite each one that has something to drop (segment-swap.ts,
 * CMP-3). If the map was full, another pass continues from `covered`.
 *
 * Rules (invariants CMP-1..CMP-5 in docs/ARCHITECTURE.md):
 *  - a record at offset o with key k is dropped only if o < covered and the map holds a later
 *    offset of k (CMP-4: the latest record of every key is never dropped, except a tombstone);
 *  - a tombstone is dropped only if it is the latest of its key known to the pass and its
 *    timestamp is older than now - deleteRetentionMs (CMP-5). Segments are rewritten in offset
 *    order, so by the time a tombstone's segment is rewritten every older record of its key,
 *    all in earlier segments or earlier in this one, is gone (a crash between two segments
 *    leaves the tombstone, never a resurrected older value);
 *  - offsets never change: a batch that loses records becomes a sparse batch of the kept ones
 *    with its offset span, first timestamp and producer fields unchanged, each record carrying
 *    its offset delta (compacted-batch.ts); batches after a removed one are marked
 *    BATCH_ATTR_COMPACTED so readers accept the gap before them (CMP-2).
 *
 * Never blocks appends: it touches sealed segments only, reads through the reader's handles
 * (refs, so eviction and deletion wait for it), and pays every byte read or written to an
 * IoBudget (io-budget.ts). One pass at a time per partition.
 */
import { StorageError } from "../errors.js";
import { BatchCursor } from "./batch-cursor.js";
import { isCompacted } from "./compaction-policy.js";
import { IoBudget } from "./io-budget.js";
import { join, readJsonFile, writeFileAtomic } from "./io.js";
import type { LogReader } from "./log-reader.js";
import type { LogState } from "./log-state.js";
import { DEFAULT_CLEANER_MAP_BYTES, mapBytesFor, OffsetMap } from "./offset-map.js";
import { forEachRecordSpan, SparseBatchBuilder, type RecordSpan } from "./compacted-batch.js";
import { readHeader, stampCompactedBatch } from "./record-batch.js";
import { Segment, SparseIndex } from "./segment.js";
import { CLEANED_SUFFIX, commitSwap } from "./segment-swap.js";

/**
 * The background cleaner compacts a partition only once at least this share of its sealed
 * bytes is dirty (Kafka's min.cleanable.dirty.ratio): a pass reads the whole log from its
 * start, so running it for every newly sealed segment would read the log again and again.
 */
export const MIN_CLEANABLE_DIRTY_RATIO = 0.5;
const READ_CHUNK = 1 << 20;
const WRITE_CHUNK = 1 << 20;
const DEFAULT_DELETE_RETENTION_MS = 86_400_000;

export interface CleanResult {
  passes: number;
  segmentsRewritten: number;
  recordsRemoved: number;
  bytesReclaimed: number;
}

export interface CleanerStats {
  /** Bytes of sealed segments not yet covered by a pass, over all sealed bytes (0..1). */
  dirtyRatio: number;
  /** Bytes removed by compaction since the partition was opened. */
  bytesReclaimed: number;
  /** Clock time of the last completed pass, null if none since opening. */
  lastCleanedAt: number | null;
  /** Passes completed since the partition was opened. */
  passes: number;
  /**
   * Share (0..1) of the running pass's reading done, null when no pass runs: bytes of the
   * batches walked so far over the bytes the pass walks (its map over the dirty segments, then
   * its check of every segment below where the map ends; a rewrite's own reading not counted).
   */
  passProgress: number | null;
}

type Keep = (r: RecordSpan) => boolean;

/**
 * Where a partition's cleaner records how far its passes have covered (Kafka's
 * cleaner-offset-checkpoint), so a restart does not read the whole log again. Efficiency only
 * (CMP-6): a pass drops a record only for a later record of its key that the pass itself read,
 * so a checkpoint too high or too low never loses a latest value; it is clamped to the sealed
 * log when read, and a missing or damaged one means "everything is dirty".
 */
export const CLEANER_CHECKPOINT_FILE = "cleaner-checkpoint.json";

export class LogCleaner {
  /** Offsets below this were covered by a pass's map (CLEANER_CHECKPOINT_FILE after a reopen). */
  private firstDirty = 0;
  private lock: Promise<unknown> = Promise.resolve();
  private bytesReclaimed = 0;
  private lastCleanedAt: number | null = null;
  private passes = 0;
  /** Bytes walked / to walk by the running pass (stats only); null when none runs. */
  private progress: { done: number; total: number } | null = null;

  constructor(
    private readonly st: LogState,
    private readonly reader: LogReader,
    private readonly budget: IoBudget,
  ) {}

  /** Reads the checkpoint of an earlier run (CMP-6: a bad one only costs a full pass). */
  async loadCheckpoint(): Promise<void> {
    const { fs, dir, logger } = this.st.ctx;
    try {
      const c = await readJsonFile<{ firstDirty?: unknown }>(fs, join(dir, CLEANER_CHECKPOINT_FILE));
      const sealedEnd = this.st.segments[this.st.segments.length - 1].baseOffset;
      if (c !== null && Number.isSafeInteger(c.firstDirty) && (c.firstDirty as number) >= 0) this.firstDirty = Math.min(c.firstDirty as number, sealedEnd);
    } catch (e) {
      logger.warn({ err: e, dir }, "cleaner checkpoint unreadable; the next pass covers the whole log");
    }
  }

  private async saveCheckpoint(): Promise<void> {
    const { fs, dir, logger } = this.st.ctx;
    await writeFileAtomic(fs, join(dir, CLEANER_CHECKPOINT_FILE), JSON.stringify({ version: 1, firstDirty: this.firstDirty })).catch((e: unknown) =>
      logger.warn({ err: e, dir }, "could not write the cleaner checkpoint; a restart will compact from the log start"),
    );
  }

  /** Resolves when no pass is running (close). */
  idle(): Promise<unknown> {
    return this.lock;
  }

  stats(): CleanerStats {
    const st = this.st;
    let all = 0;
    let dirty = 0;
    for (let i = 0; i < st.segments.length - 1; i++) {
      const s = st.segments[i];
      all += s.size;
      if (s.endOffset > this.firstDirty) dirty += s.size;
    }
    const p = this.progress;
    const passProgress = p === null ? null : p.total <= 0 ? 0 : Math.min(1, p.done / p.total);
    return { dirtyRatio: all === 0 ? 0 : dirty / all, bytesReclaimed: this.bytesReclaimed, lastCleanedAt: this.lastCleanedAt, passes: this.passes, passProgress };
  }

  /** Cleans until the cleanable range is covered (several passes if the map fills up). */
  clean(now: number, mapBytes = DEFAULT_CLEANER_MAP_BYTES): Promise<CleanResult> {
    const run = this.lock.then(() => this.run(now, mapBytes));
    this.lock = run.catch(() => {});
    return run;
  }

  private stopped(): boolean {
    return this.st.closed || this.st.faulted !== null;
  }

  /** Closing does not wait for a whole segment: the pass stops between batches. */
  private checkStopped(): void {
    if (this.stopped()) throw new CleanerStoppedError();
  }

  private async run(now: number, mapBytes: number): Promise<CleanResult> {
    const total: CleanResult = { passes: 0, segmentsRewritten: 0, recordsRemoved: 0, bytesReclaimed: 0 };
    while (!this.stopped() && isCompacted(this.st.ctx.config.cleanupPolicy)) {
      let r: Awaited<ReturnType<LogCleaner["pass"]>>;
      try {
        r = await this.pass(now, mapBytes);
      } catch (e) {
        if (e instanceof CleanerStoppedError) break; // closed or faulted meanwhile: not an error
        throw e;
      } finally {
        this.progress = null;
      }
      if (r === null) break;
      total.passes++;
      total.segmentsRewritten += r.segmentsRewritten;
      total.recordsRemoved += r.recordsRemoved;
      total.bytesReclaimed += r.bytesReclaimed;
      if (r.done) break;
    }
    return total;
  }

  /** Sealed segments from the log start whose records are all older than the lag. */
  private async cleanable(now: number): Promise<Segment[]> {
    const st = this.st;
    const lag = st.ctx.config.minCompactionLagMs ?? 0;
    const segs = [...st.segments];
    const out: Segment[] = [];
    for (let i = 0; i < segs.length - 1; i++) {
      const seg = segs[i];
      if (seg.deleted || seg.endOffset <= st.logStart) continue;
      if (lag > 0) {
        // Without a lag every sealed segment qualifies, even one holding future timestamps.
        await this.reader.ensureTimestamps(seg);
        if (seg.maxTimestamp > now - lag) break;
      }
      out.push(seg);
    }
    return out;
  }

  private async pass(now: number, mapBytes: number): Promise<(CleanResult & { done: boolean }) | null> {
    const st = this.st;
    const segs = await this.cleanable(now);
    if (segs.length === 0) return null;
    const end = segs[segs.length - 1].endOffset;
    const from = Math.max(this.firstDirty, st.logStart);
    if (from >= end) return null;
    // Progress figures only: the map walks the segments ending past `from`, the check (2) at
    // most every cleanable segment; the total is corrected once the map knows where it ends.
    const sizes = (xs: Segment[]): number => xs.reduce((a, x) => a + x.size, 0);
    this.progress = { done: 0, total: sizes(segs.filter((x) => x.endOffset > from)) + sizes(segs) };
    // (1) The map over [from, covered).
    const map = new OffsetMap(mapBytesFor(end - from, mapBytes), from);
    let covered = from;
    for (const seg of segs) {
      if (seg.endOffset <= from) continue;
      const whole = await this.forEachRecord(seg, (r) => {
        if (r.offset < from || r.keyStart < 0) return true;
        if (!map.put(r.buf, r.keyStart, r.keyEnd, r.offset)) return false;
        covered = r.offset + 1;
        return true;
      });
      if (!whole) break;
      covered = seg.endOffset;
    }
    this.progress.total = this.progress.done + sizes(segs.filter((x) => x.baseOffset < covered));
    // (2) Rewrite, in offset order (CMP-5), the segments below `covered`.
    const horizon = now - (st.ctx.config.deleteRetentionMs ?? DEFAULT_DELETE_RETENTION_MS);
    const logStart = st.logStart;
    const keep: Keep = (r) => {
      if (r.offset >= covered || r.offset < logStart || r.keyStart < 0) return true;
      if (map.get(r.buf, r.keyStart, r.keyEnd) > r.offset) return false; // CMP-4
      return !(r.tombstone && r.timestamp < horizon); // CMP-5
    };
    const result: CleanResult & { done: boolean } = { passes: 1, segmentsRewritten: 0, recordsRemoved: 0, bytesReclaimed: 0, done: covered >= end };
    for (const seg of segs) {
      if (seg.baseOffset >= covered) break;
      if (this.stopped()) return null;
      // The decisions, one bit per record in segment order, so the rewrite does not hash again.
      const drops = new DropBits();
      let n = 0;
      await this.forEachRecord(seg, (r) => {
        if (!keep(r)) drops.set(n);
        n++;
        return true;
      });
      if (drops.count === 0) continue;
      const done = await this.rewrite(seg, drops);
      if (done === null) return null;
      result.segmentsRewritten++;
      result.recordsRemoved += done.removed;
      result.bytesReclaimed += done.reclaimed;
    }
    this.firstDirty = covered;
    if (!this.stopped()) await this.saveCheckpoint();
    this.lastCleanedAt = now;
    this.bytesReclaimed += result.bytesReclaimed;
    this.passes++;
    if (result.segmentsRewritten > 0) {
      const { topic, partition, logger } = st.ctx;
      logger.info({ topic, partition, segments: result.segmentsRewritten, records: result.recordsRemoved, bytes: result.bytesReclaimed }, "compacted");
    }
    return result;
  }

  /** Calls `fn` for every record of `seg` in offset order; false from `fn` stops (returns false). */
  private async forEachRecord(seg: Segment, fn: (r: RecordSpan) => boolean): Promise<boolean> {
    const fh = await this.reader.acquire(seg);
    try {
      const c = new BatchCursor(fh, 0, seg.baseOffset, seg.size, READ_CHUNK);
      for (;;) {
        const step = await c.next();
        if (step.kind === "end") return true;
        this.checkStopped();
        if (step.kind === "damage") throw new StorageError(`cleaner: damaged batch in ${seg.logPath} at byte ${c.pos} (${step.detail}); not compacting this partition`);
        await this.budget.take(step.h.length);
        if (this.progress !== null) this.progress.done += step.h.length;
        if (!forEachRecordSpan(step.buf, step.at, step.h, fn)) return false;
        c.advance(step.h);
      }
    } finally {
      await this.reader.release(seg);
    }
  }

  /**
   * Writes the kept records of `seg` as `<base>.log.cleaned`, swaps it in (CMP-3) and puts the
   * new segment in the old one's place. The old segment stays referenced (its handle open)
   * until then, so readers never open the new file with the old index. Null if abandoned.
   */
  private async rewrite(seg: Segment, drops: DropBits): Promise<{ removed: number; reclaimed: number } | null> {
    const st = this.st;
    const { fs, dir, logger } = st.ctx;
    const fresh = new Segment(fs, dir, seg.baseOffset);
    const cleanedPath = seg.logPath + CLEANED_SUFFIX;
    const fh = await this.reader.acquire(seg);
    try {
      try {
        await this.writeCleaned(seg, fh, fresh, cleanedPath, drops);
        await fs.fsyncDir(dir);
      } catch (e) {
        // Before the commit point the old segment is intact: drop the partial copy (a full disk
        // must not keep it), recovery would too (CMP-3).
        await fs.unlink(cleanedPath).catch(() => {});
        throw e;
      }
      if (this.stopped() || seg.deleted || !st.segments.includes(seg)) {
        await fs.unlink(cleanedPath).catch(() => {});
        return null;
      }
      try {
        await commitSwap(fs, dir, seg);
      } catch (e) {
        // Memory and disk may disagree now: reopening runs recovery, which finishes or
        // discards the swap (CMP-3).
        st.fault(e, "compaction swap failed");
        throw e;
      }
      fresh.sealed = true;
      fresh.endOffset = seg.endOffset; // LOG-1: the segment keeps its offset range
      if (fresh.index === null) fresh.index = new SparseIndex();
      fresh.maxTimestampKnown = true;
      const i = st.segments.indexOf(seg);
      if (i >= 0) st.segments[i] = fresh;
      seg.deleted = true; // the last release closes its handle
      if (i < 0) await fresh.unlinkFiles().catch(() => {}); // retention removed it meanwhile
      else await fresh.writeIndexes().catch((e: unknown) => logger.warn({ err: e, file: fresh.logPath }, "could not write the indexes of a compacted segment; they will be rebuilt"));
      return { removed: drops.count, reclaimed: seg.size - fresh.size };
    } finally {
      await this.reader.release(seg);
    }
  }

  /**
   * Step 1 of the swap: the cleaned log, written and fdatasync'ed. A batch that keeps every
   * record is copied as stored (re-marked only if a gap now precedes it); one that loses some
   * becomes a sparse batch of the kept records' bytes (compacted-batch.ts, CMP-2); one that
   * loses all is gone.
   */
  private async writeCleaned(seg: Segment, fh: Awaited<ReturnType<LogReader["acquire"]>>, fresh: Segment, path: string, drops: DropBits): Promise<void> {
    const out = await this.st.ctx.fs.open(path, "create");
    try {
      await out.truncate(0);
      let pos = 0;
      let pending: Buffer[] = [];
      let pendingBytes = 0;
      let expected = seg.baseOffset;
      const emit = (buf: Buffer, base: number, count: number, maxTs: number): void => {
        fresh.noteBatch(base, count, pos + pendingBytes, buf.length, maxTs);
        pending.push(buf);
        pendingBytes += buf.length;
        expected = base + count;
      };
      const flush = async (): Promise<void> => {
        if (pendingBytes === 0) return;
        await this.budget.take(pendingBytes);
        await out.write(pending, pos);
        pos += pendingBytes;
        pending = [];
        pendingBytes = 0;
      };
      const kept = new SparseBatchBuilder();
      let n = 0;
      const c = new BatchCursor(fh, 0, seg.baseOffset, seg.size, READ_CHUNK);
      for (;;) {
        const step = await c.next();
        if (step.kind === "end") break;
        this.checkStopped();
        if (step.kind === "damage") throw new StorageError(`cleaner: damaged batch in ${seg.logPath} at byte ${c.pos} (${step.detail})`);
        const h = step.h;
        await this.budget.take(h.length);
        let all = true;
        forEachRecordSpan(step.buf, step.at, h, (r) => {
          if (drops.has(n++)) all = false;
          else kept.add(r);
        });
        if (all) {
          kept.clear();
          const copy = Buffer.from(step.buf.subarray(step.at, step.at + h.length));
          if (h.baseOffset !== expected) stampCompactedBatch(copy, h.baseOffset);
          emit(copy, h.baseOffset, h.count, h.maxTimestamp);
        } else if (kept.size > 0) {
          const buf = kept.build(step.buf, step.at, h);
          emit(buf, h.baseOffset, h.count, readHeader(buf, 0).maxTimestamp);
        }
        c.advance(h);
        if (pendingBytes >= WRITE_CHUNK) await flush();
      }
      await flush();
      await out.datasync();
    } finally {
      await out.close();
    }
  }
}

/** One bit per record of a segment (the records to drop), grown as needed. */
class DropBits {
  private bits = new Uint8Array(1024);
  count = 0;

  set(i: number): void {
    const byte = i >>> 3;
    if (byte >= this.bits.length) {
      const grown = new Uint8Array(Math.max(this.bits.length * 2, byte + 1));
      grown.set(this.bits);
      this.bits = grown;
    }
    this.bits[byte] |= 1 << (i & 7);
    this.count++;
  }

  has(i: number): boolean {
    const byte = i >>> 3;
    return byte < this.bits.length && (this.bits[byte] & (1 << (i & 7))) !== 0;
  }
}

/** Thrown inside a pass when the partition closes or faults; ends the run quietly. */
class CleanerStoppedError extends Error {}
