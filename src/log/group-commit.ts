// SPDX-License-Identifier: Apache-2.0
/**
 * The append pipeline of one partition (group commit): appends are queued with their offsets,
 * one writer loop takes them in rounds, writes each round with one writev at the end of the
 * active segment, rolls segments, and publishes rounds (high watermark, readers woken, appends
 * resolved) once durable per the topic's policy.
 *
 * Invariants (docs/ARCHITECTURE.md): LOG-1 offsets assigned here alone, in append order; LOG-3
 * publish in append order, only after an fdatasync covering the round with "always"; LOG-4 a
 * segment is sealed (truncated, fdatasync'ed) before its successor exists; LOG-9 an fdatasync
 * that returns publishes every older round too; LOG-11 a failed append fences the partition
 * before any await; PROD-1 producer state follows publication.
 */
import { join } from "node:path";
import { StorageError, StorageFullError } from "../errors.js";
import { writeFileAtomic, type FileHandle } from "./io.js";
import { PRODUCER_SNAPSHOT_FILE } from "./log-loader.js";
import type { LogState } from "./log-state.js";
import type { Preallocator } from "./preallocator.js";
import type { ProducerSnapshot } from "./producer-state.js";
import { stampBatch, restampBatch, type ProducerInfo } from "./record-batch.js";
import { Segment } from "./segment.js";
import { settledPrefix, SyncSlots, type InflightSync as Sync } from "./sync-slots.js";
import { METRICS } from "../observability/metrics.js";
import type { Clock, MetricLabels } from "../observability/telemetry.js";

export interface AppendResult {
  baseOffset: number;
  duplicate: boolean;
  synced: boolean;
}

interface PendingAppend {
  buf: Buffer;
  baseOffset: number;
  count: number;
  maxTs: number;
  producer: ProducerInfo | null;
  /** Monotonic ms when the append was queued (append latency metric). */
  queuedAt: number;
  resolve(r: AppendResult): void;
  reject(e: unknown): void;
}

type InflightSync = Sync<PendingAppend>;

/** Bound on bytes handed to one write (group commit round). */
const MAX_WRITE_BYTES = 4 * 1024 * 1024;
/**
 * fdatasyncs in flight per partition (durability "always"). With one, a round written while
 * an fdatasync is slow waits for it and then for its own; with several, the round's own
 * fdatasync starts at once and, when it returns first, publishes the slow one's round too
 * (LOG-9). Measured on this machine's disk (paced 2,000 appends/s): p99 3.2 -> 1.9 ms.
 */
const MAX_CONCURRENT_SYNCS = 4;
/**
 * An append that arrives while fewer than EAGER_SYNCS fdatasyncs run gets its own at once;
 * with more running it waits for one to return and shares the next (group commit). Eager
 * syncs take a whole fdatasync off a lone append's latency, but under load every extra
 * fdatasync costs the device a flush: with up to 4 eager ones the embedded queue benchmark
 * lost ~18% of its throughput, with 2 it keeps it.
 */
const EAGER_SYNCS = 2;
/** Bound on bytes waiting to be written; appends beyond it wait (back-pressure). */
const MAX_PENDING_BYTES = 256 * 1024 * 1024;

export class LogWriter {
  private pending: PendingAppend[] = [];
  private pendingBytes = 0;
  private flushing = false;
  /** Resolves the writer's sleep: a sync returned, or (with `wantsAppends`) an append arrived. */
  private kick: (() => void) | null = null;
  /** The writer sleeps with room for another eager sync: a new append wakes it too. */
  private wantsAppends = false;
  private spaceWaiters: (() => void)[] = [];
  private flushTimer: NodeJS.Timeout | null = null;
  /**
   * Rounds whose fdatasync is running (durability "always"), oldest first, at most
   * MAX_CONCURRENT_SYNCS. A round is published when its own fdatasync or a later one returns
   * (invariant LOG-9: an fdatasync that returns covers every byte written before it was issued).
   */
  private syncs: InflightSync[] = [];
  private readonly slots: SyncSlots;
  private dirty = false;

  /**
   * @param onRoll called with a segment just sealed (the readers' index and handle caches)
   */
  private readonly clock: Clock;
  private readonly labels: MetricLabels;

  constructor(
    private readonly st: LogState,
    private readonly prealloc: Preallocator,
    private readonly onRoll: (sealed: Segment) => void,
  ) {
    this.clock = st.ctx.telemetry.clock;
    this.slots = new SyncSlots(st.ctx.fs, MAX_CONCURRENT_SYNCS);
    this.labels = { topic: st.ctx.topic, partition: st.ctx.partition };
  }

  /**
   * Whether a batch of `bytes` fits under MAX_PENDING_BYTES now (a batch is always admitted
   * when nothing is pending). Synchronous on purpose: the caller's sequence check and its
   * enqueue must not be separated by a yield when there is room, or pipelined batches of one
   * producer would be checked before the earlier ones are recorded (PROD-1).
   */
  hasRoom(bytes: number): boolean {
    return this.pendingBytes + bytes <= MAX_PENDING_BYTES || this.pendingBytes === 0;
  }

  /** Waits until a batch of `bytes` fits (back-pressure); the caller checks again afterwards. */
  async waitForRoom(bytes: number): Promise<void> {
    while (!this.hasRoom(bytes)) {
      await new Promise<void>((r) => this.spaceWaiters.push(r));
      this.st.checkWritable();
    }
  }

  /** Resolves once nothing is queued or being written (before close). */
  async idle(): Promise<void> {
    while (this.flushing || this.pending.length > 0) await new Promise((r) => setImmediate(r));
  }

  /** Stops the interval flush timer and closes the extra fdatasync descriptors (close). */
  async close(): Promise<void> {
    if (this.flushTimer) clearInterval(this.flushTimer);
    this.flushTimer = null;
    await this.slots.closeAll();
  }

  /**
   * Gives a batch its offsets and queues it for the next write round; resolves once it is
   * published (durable with "always"). The caller checked writability and the producer's
   * sequence in the same synchronous step.
   */
  enqueue(buf: Buffer, count: number, producer: ProducerInfo | null, crcValid: boolean): Promise<AppendResult> {
    const baseOffset = this.st.nextOffset;
    // Invariant LOG-1: offsets are assigned in append order, here and nowhere else. ENC-1, ENC-2:
    // an encrypted log's batch is encrypted here, its offset bound into the authentication.
    const cipher = this.st.ctx.cipher;
    if (cipher !== null) buf = cipher.seal(buf, baseOffset);
    else if (crcValid) restampBatch(buf, baseOffset);
    else stampBatch(buf, baseOffset);
    this.st.nextOffset += count;
    const maxTs = buf.readInt32BE(32) * 4294967296 + buf.readUInt32BE(36);
    const done = new Promise<AppendResult>((resolve, reject) => {
      this.pending.push({ buf, baseOffset, count, maxTs, producer, queuedAt: this.clock.monotonicMs(), resolve, reject });
      this.pendingBytes += buf.length;
      if (!this.flushing) {
        this.flushing = true;
        // Start on a microtask so appends made in the same tick share the first write.
        queueMicrotask(() => void this.flushLoop());
      } else if (this.wantsAppends && this.kick !== null) {
        // On a microtask too, so appends made in the same tick share one write and one sync.
        this.wantsAppends = false;
        const k = this.kick;
        queueMicrotask(() => {
          if (this.kick === k) this.wakeWriter();
        });
      }
    });
    // Recorded at once, so a retry arriving before this batch is durable waits for it (PROD-1).
    if (producer !== null) this.st.producers.assign(producer, count, baseOffset, maxTs, done);
    return done;
  }

  /**
   * The writer: takes rounds of pending appends and writes them. With durability "always" it
   * pipelines: round N+1 is written to the page cache while round N's fdatasync runs, and
   * round N is published (hwm moves, promises resolve) only when its fdatasync has returned.
   */
  private async flushLoop(): Promise<void> {
    try {
      await this.flushRounds();
    } catch (e) {
      // Only a bug gets here (an invariant check, an unexpected throw): the in-memory state may
      // no longer match the files, so fault the partition (it is reopened from disk) and fail
      // everything unpublished. Never rethrow: a rejected loop would take the process down.
      this.st.ctx.logger.error({ err: e, topic: this.st.ctx.topic, partition: this.st.ctx.partition }, "append pipeline failed unexpectedly");
      const unpublished = [...this.syncs.flatMap((x) => x.items), ...this.pending];
      this.syncs = [];
      this.pending = [];
      this.pendingBytes = 0;
      this.st.producers.dropUnpublished();
      this.st.nextOffset = this.st.hwm;
      this.st.fault(e, "append pipeline failed");
      const err = new StorageError(`internal error while appending to ${this.st.ctx.topic}/${this.st.ctx.partition}: ${(e as Error)?.message}`, e);
      for (const it of unpublished) it.reject(err);
      this.wakeSpaceWaiters();
    } finally {
      this.kick = null;
      this.wantsAppends = false;
      this.flushing = false;
    }
  }

  /** The writer waits here for a sync to return (or an append, see `wantsAppends`): one promise per wait. */
  private sleep(wantsAppends: boolean): Promise<void> {
    this.wantsAppends = wantsAppends;
    return new Promise<void>((resolve) => (this.kick = resolve));
  }

  private wakeWriter(): void {
    const k = this.kick;
    this.kick = null;
    this.wantsAppends = false;
    k?.();
  }

  private async flushRounds(): Promise<void> {
    for (;;) {
      if (this.pending.length > 0 && this.syncs.length < MAX_CONCURRENT_SYNCS) {
        await this.writeRound(this.takeRound());
        continue;
      }
      if (this.syncs.length === 0) break;
      const ready = settledPrefix(this.syncs);
      if (ready !== 0) {
        await this.completeSync([]);
        continue;
      }
      // Nothing to publish yet. With room for another fdatasync, an append that arrives now
      // is written and synced at once, concurrently with the running ones (LOG-9), instead of
      // waiting for them to return first: at a steady trickle this takes a whole fdatasync off
      // its latency. Otherwise appends gather until a sync returns (group commit).
      await this.sleep(this.pending.length === 0 && this.syncs.length < EAGER_SYNCS);
    }
  }

  private takeRound(): PendingAppend[] {
    let bytes = 0;
    let n = 0;
    while (n < this.pending.length && (n === 0 || bytes + this.pending[n].buf.length <= MAX_WRITE_BYTES)) {
      bytes += this.pending[n].buf.length;
      n++;
    }
    const round = this.pending.splice(0, n);
    this.pendingBytes -= bytes;
    this.wakeSpaceWaiters();
    return round;
  }

  private wakeSpaceWaiters(): void {
    const ws = this.spaceWaiters;
    this.spaceWaiters = [];
    for (const w of ws) w();
  }

  /**
   * Waits until rounds in flight can be published, then publishes every round whose bytes are
   * durable: those whose own sync returned, and those an fdatasync that returned covers (LOG-9),
   * in append order. On any failure every unpublished round, `alsoUnsynced` and everything
   * pending are failed (see `failSyncs`); returns false.
   */
  private async completeSync(alsoUnsynced: PendingAppend[]): Promise<boolean> {
    let ready = settledPrefix(this.syncs);
    while (ready === 0) {
      await this.sleep(false);
      ready = settledPrefix(this.syncs);
    }
    if (ready < 0) return this.failSyncs(alsoUnsynced);
    const covered = this.syncs.splice(0, ready);
    for (const s of covered) {
      // Older fdatasyncs still running are covered by this one; a late failure of one of them
      // still faults the partition (their descriptors report the error), it just does not
      // take back what this one made durable.
      if (s.state === "running") s.promise.then(() => (s.state === "failed" ? this.lateSyncFailure(s.err) : undefined));
    }
    const last = covered[covered.length - 1];
    if (last.endPos > this.st.syncedSize) this.st.syncedSize = last.endPos;
    const items = covered.length === 1 ? covered[0].items : covered.flatMap((s) => s.items);
    this.publish(items, true, last.endPos);
    return true;
  }

  /**
   * A sync failed: the partition is faulted (an fdatasync failure, fsyncgate) or, for an
   * O_DSYNC write that found the disk full, fenced until rolled back, like a failed write.
   * Every write in flight settles first: a durable write landing after the rollback's
   * truncation could overwrite the appends that follow it.
   */
  private async failSyncs(alsoUnsynced: PendingAppend[]): Promise<false> {
    const failed = this.syncs.find((s) => s.state === "failed")!;
    const fault = failed.covers || !isDiskFull(failed.err);
    await Promise.all(this.syncs.map((s) => s.promise));
    const unpublished = this.syncs.flatMap((s) => s.items);
    this.syncs = [];
    await this.failItems([...unpublished, ...alsoUnsynced], failed.err, fault);
    return false;
  }

  private lateSyncFailure(err: unknown): void {
    this.st.fault(err, "fdatasync failed after a later one covered its data");
  }

  /** Waits for every fdatasync in flight and publishes their rounds (before a roll or a rollback). */
  private async drainSyncs(alsoUnsynced: PendingAppend[]): Promise<boolean> {
    while (this.syncs.length > 0) if (!(await this.completeSync(alsoUnsynced))) return false;
    return true;
  }

  /**
   * Starts the fdatasync for a round just written. Each concurrent fdatasync uses its own file
   * descriptor: Linux reports a writeback error once per open file description (errseq), so
   * two fdatasyncs sharing one could see only one of them report a failure, and the other
   * would make us publish data that never reached the disk.
   */
  private async startSync(seg: Segment, items: PendingAppend[], endPos: number): Promise<void> {
    const { fh, slot } = await this.slots.take(seg);
    this.track(slot, items, endPos, true, fh.datasync());
  }

  /** Records a sync in flight on descriptor `slot`; the writer is woken when it returns. */
  private track(slot: number, items: PendingAppend[], endPos: number, covers: boolean, op: Promise<void>): void {
    const s: InflightSync = { items, endPos, covers, state: "running", err: null, promise: Promise.resolve() };
    const started = this.clock.monotonicMs();
    s.promise = op.then(
      () => {
        s.state = "ok";
        this.st.ctx.telemetry.metrics.observe(METRICS.fsyncDuration.name, (this.clock.monotonicMs() - started) / 1000, this.labels);
        this.wakeWriter();
      },
      (e: unknown) => {
        s.state = "failed";
        s.err = e ?? new Error(covers ? "fdatasync failed" : "durable write failed");
        this.wakeWriter();
      },
    );
    this.slots.occupy(slot, s.promise);
    this.syncs.push(s);
  }

  private async writeRound(round: PendingAppend[]): Promise<void> {
    let done = 0; // items of `round` already published (before a roll)
    let chunkStart = 0;
    let seg = this.st.active;
    const chunkBufs: Buffer[] = [];
    try {
      for (let i = 0; i <= round.length; i++) {
        const item = round[i];
        const mustRoll = item !== undefined && this.shouldRoll(seg, item.buf.length, chunkBufs);
        if (item === undefined && chunkBufs.length > 0 && this.st.ctx.config.durability === "always" && this.prealloc.inDurableZeros(seg, seg.size, bytesOf(chunkBufs))) {
          // The last chunk overwrites zeros that are durable (LOG-8): one O_DSYNC write makes
          // it durable, in one I/O operation instead of a write and an fdatasync, and waits
          // for no other byte of the file (a zero fill being written back, say).
          await this.writeDurableChunk(seg, round.slice(chunkStart), chunkBufs);
          return;
        }
        if ((item === undefined || mustRoll) && chunkBufs.length > 0) {
          await this.writeChunk(seg, round.slice(chunkStart, i), chunkBufs);
          chunkBufs.length = 0;
          chunkStart = i;
        }
        if (mustRoll) {
          // The previous round must be published before the segment is sealed, so the high
          // watermark only ever moves forward, in append order.
          if (!(await this.drainSyncs(round.slice(done)))) return;
          await this.sealActive();
          // Everything before the roll is in the sealed, fdatasync'ed segment (LOG-4): publish
          // it before the next segment exists, so the active segment always holds exactly the
          // offsets from its base to the high watermark plus unpublished appends (LOG-11).
          this.publish(round.slice(done, i), true, seg.size);
          done = i;
          await this.openNextSegment();
          seg = this.st.active;
        }
        if (item !== undefined) chunkBufs.push(item.buf);
      }
    } catch (e) {
      // A write (or roll) failed. Let the previous rounds land first: they are unaffected.
      if (!(await this.drainSyncs(round.slice(done)))) return;
      await this.failItems(round.slice(done), e, false);
      return;
    }
    const items = done === 0 ? round : round.slice(done);
    if (items.length === 0) return;
    if (this.st.ctx.config.durability === "always") {
      try {
        await this.startSync(seg, items, seg.size);
      } catch (e) {
        // Could not open a descriptor for the fdatasync: nothing of this round is acknowledged.
        if (!(await this.drainSyncs(items))) return;
        await this.failItems(items, e, false);
        return;
      }
      this.prealloc.maybeStart();
    } else {
      this.dirty = true;
      this.publish(items, false, seg.size);
      if (this.st.ctx.config.durability === "never") this.st.syncedSize = this.st.readableSize;
    }
  }

  /**
   * Writes the round's last chunk (after any roll) with an O_DSYNC write on the next sync
   * descriptor, without waiting for it: the writer goes on (the next round, another sync) and
   * the round is published once the write returns and every older round is published. Only
   * inside durable preallocated zeros (`Preallocator.inDurableZeros`): no size or allocation
   * changes, so nothing else needs to be synced for the bytes to be readable after a crash.
   */
  private async writeDurableChunk(seg: Segment, items: PendingAppend[], bufs: Buffer[]): Promise<void> {
    if (items.length === 0) return;
    let pos = seg.size;
    const start = pos;
    const bytes = bytesOf(bufs);
    let slot: { fh: FileHandle; slot: number };
    try {
      slot = await this.slots.take(seg);
    } catch (e) {
      // Could not open a descriptor: nothing of this round was written or acknowledged.
      if (!(await this.drainSyncs(items))) return;
      await this.failItems(items, e, false);
      return;
    }
    this.prealloc.noteAppended(bytes);
    if (seg.createdAtMs === null) seg.createdAtMs = this.clock.now();
    // The position is taken now (the next round is written after this one, while this one's
    // write is in flight); readers see nothing of it before it is published (LOG-3).
    for (const it of items) {
      seg.noteBatch(it.baseOffset, it.count, pos, it.buf.length, it.maxTs);
      pos += it.buf.length;
    }
    if (pos !== start + bytes) throw new Error("invariant: durable chunk length");
    this.track(slot.slot, items, pos, false, slot.fh.writeDurable(bufs.slice(), start));
    this.prealloc.maybeStart();
  }

  private shouldRoll(seg: Segment, incoming: number, chunk: Buffer[]): boolean {
    let size = seg.size;
    for (const b of chunk) size += b.length;
    if (size === 0) return false;
    return size + incoming > this.st.ctx.config.segmentBytes || (seg.createdAtMs !== null && this.clock.now() - seg.createdAtMs >= this.st.ctx.config.segmentMs);
  }

  private async writeChunk(seg: Segment, items: PendingAppend[], bufs: Buffer[]): Promise<void> {
    let pos = seg.size;
    let bytes = 0;
    for (const b of bufs) bytes += b.length;
    const fill = seg.fill;
    // A zero fill must never land on appended bytes: wait until its write is over. This only
    // happens when appends outrun preallocation (a fill starts past the write position).
    if (fill !== null && pos < fill.end && pos + bytes > fill.start) await fill.written;
    // Reserve before writing: a fill that starts meanwhile begins past this write (LOG-8).
    if (pos + bytes > seg.fileEnd) seg.fileEnd = pos + bytes;
    this.prealloc.noteAppended(bytes);
    await seg.handle!.write(bufs, pos);
    // Segment age (segmentMs) counts from its first record, on the telemetry clock.
    if (seg.createdAtMs === null) seg.createdAtMs = this.clock.now();
    for (const it of items) {
      seg.noteBatch(it.baseOffset, it.count, pos, it.buf.length, it.maxTs);
      pos += it.buf.length;
    }
  }

  async syncActive(): Promise<void> {
    const seg = this.st.active;
    const size = seg.size;
    await seg.handle!.datasync();
    if (seg === this.st.active && size > this.st.syncedSize) this.st.syncedSize = size;
  }

  /**
   * Makes `items` readable and resolves them. `readableEnd` is the byte position in the active
   * segment where the last of them ends (0 right after a roll).
   */
  private publish(items: PendingAppend[], synced: boolean, readableEnd: number): void {
    if (items.length === 0) return;
    const last = items[items.length - 1];
    const hwm = last.baseOffset + last.count;
    // Invariant LOG-3: the high watermark moves forward only, in append order.
    if (hwm < this.st.hwm || items[0].baseOffset !== this.st.hwm) throw new Error(`invariant: publish out of order (${items[0].baseOffset} after hwm ${this.st.hwm})`);
    if (readableEnd > this.st.active.size) throw new Error("invariant: readable end beyond written data");
    this.st.hwm = hwm;
    this.st.readableSize = readableEnd;
    this.st.publishedAtMs = this.clock.monotonicMs();
    for (const it of items) if (it.producer !== null) this.st.producers.publish(it.producer, it.count, it.baseOffset, it.maxTs, hwm);
    const metrics = this.st.ctx.telemetry.metrics;
    const now = this.st.publishedAtMs;
    let records = 0;
    let bytes = 0;
    for (const it of items) {
      records += it.count;
      bytes += it.buf.length;
      metrics.observe(METRICS.appendDuration.name, (now - it.queuedAt) / 1000, this.labels);
      it.resolve({ baseOffset: it.baseOffset, duplicate: false, synced });
    }
    metrics.count(METRICS.appendedRecords.name, records, this.labels);
    metrics.count(METRICS.appendedBytes.name, bytes, this.labels);
    this.st.wakeWaiters();
  }

  /**
   * A write or sync failed: none of `items` (nor anything pending) was acknowledged. Cut the
   * active segment back to the readable end so no unacknowledged bytes stay behind. After an
   * fsync failure (`fault`) or an error other than a full disk, the partition faults (it is
   * reopened from disk, see `fault`); after a full disk it takes appends again once the
   * rollback is done.
   *
   * LOG-11: the partition is fenced before the first await: the next offset goes back to the
   * high watermark, unpublished producer state is dropped and appends are refused, so no
   * append arriving during the rollback can be given an offset or a file position that is
   * being cut.
   */
  private async failItems(items: PendingAppend[], cause: unknown, fault: boolean): Promise<void> {
    const code = (cause as NodeJS.ErrnoException)?.code;
    const failed = [...items, ...this.pending];
    this.pending = [];
    this.pendingBytes = 0;
    const full = code === "ENOSPC" || code === "EDQUOT";
    const err = full
      ? new StorageFullError(`disk full while appending to ${this.st.ctx.topic}/${this.st.ctx.partition}`, cause)
      : new StorageError(`I/O error while appending to ${this.st.ctx.topic}/${this.st.ctx.partition}: ${(cause as Error)?.message}`, cause);
    if (this.syncs.length > 0) throw new Error("invariant: rollback with fdatasyncs in flight");
    const seg = this.st.active;
    const keepSize = this.st.readableSize;
    // Fence (LOG-11), synchronously.
    this.st.fence = err;
    this.st.nextOffset = this.st.hwm;
    this.st.producers.dropUnpublished();
    seg.size = keepSize;
    seg.endOffset = this.st.hwm;
    seg.index?.truncateToPosition(keepSize);
    this.st.syncedSize = Math.min(this.st.syncedSize, keepSize);
    let rolledBack = false;
    try {
      await this.prealloc.stop(seg);
      seg.noFill = false;
      await seg.handle!.truncate(keepSize);
      seg.fileEnd = keepSize;
      await seg.handle!.datasync();
      rolledBack = true;
    } catch (e) {
      this.st.ctx.logger.error({ err: e, topic: this.st.ctx.topic, partition: this.st.ctx.partition }, "could not roll back after an I/O error");
    }
    this.st.fence = null;
    if (!rolledBack || fault || !full) this.st.fault(cause, rolledBack ? "append failed" : "append failed and could not be rolled back");
    for (const f of failed) f.reject(err);
    this.wakeSpaceWaiters();
  }

  /**
   * First half of a roll: the active segment is cut to its last batch and made durable
   * (LOG-4), before anything of its successor exists. On failure the active segment is
   * unchanged (the caller rolls back the round).
   */
  private async sealActive(): Promise<void> {
    const old = this.st.active;
    await this.prealloc.stop(old);
    // Invariant LOG-4: a sealed segment ends with its last batch (no preallocated zeros; its
    // file size is its size on the next open) and is durable before its successor exists.
    if (old.fileEnd > old.size) {
      await old.handle!.truncate(old.size);
      old.fileEnd = old.size;
    }
    await old.handle!.datasync();
    if (old.size > this.st.syncedSize) this.st.syncedSize = old.size;
  }

  /**
   * Second half of a roll: creates the next segment at the high watermark. Called only after
   * everything in the sealed segment is published (LOG-11: a new segment's base offset is the
   * high watermark, so a rollback never has to reach back into a sealed segment). Index files
   * and the producer snapshot written afterwards are rebuildable: their failures are logged.
   */
  private async openNextSegment(): Promise<void> {
    const old = this.st.active;
    if (old.endOffset !== this.st.hwm || this.st.readableSize !== old.size) throw new Error(`invariant: roll at ${old.endOffset} with high watermark ${this.st.hwm}`);
    await this.slots.closeAll();
    const seg = new Segment(this.st.ctx.fs, this.st.ctx.dir, old.endOffset);
    try {
      seg.handle = await this.st.ctx.fs.open(seg.logPath, "create");
      await this.st.ctx.fs.fsyncDir(this.st.ctx.dir);
    } catch (e) {
      // Leave no file behind that recovery would take for the active segment (LOG-1).
      if (seg.handle) await seg.handle.close().catch(() => {});
      await this.st.ctx.fs.unlink(seg.logPath).catch(() => {});
      old.noFill = false;
      throw e;
    }
    // Invariant LOG-4: `old` was truncated and fdatasync'ed (sealActive) before its successor exists.
    old.sealed = true;
    old.lastUsed = this.clock.monotonicMs();
    this.st.segments.push(seg);
    this.st.syncedSize = 0;
    this.st.readableSize = 0;
    // Captured now, at the high watermark (PROD-1: only published batches, all in the sealed,
    // durable segment), although written after the index files.
    const snap = this.st.producers.snapshot(this.st.hwm, this.clock.now());
    await old.writeIndexes().catch((e) => this.st.ctx.logger.warn({ err: e, file: old.indexPath }, "could not write index"));
    await this.writeProducerSnapshot(snap).catch((e) => this.st.ctx.logger.warn({ err: e }, "could not write producer snapshot"));
    this.onRoll(old);
  }

  private async writeProducerSnapshot(snap: ProducerSnapshot): Promise<void> {
    await writeFileAtomic(this.st.ctx.fs, join(this.st.ctx.dir, PRODUCER_SNAPSHOT_FILE), JSON.stringify(snap));
  }

  startFlushTimer(): void {
    this.flushTimer = setInterval(() => {
      if (!this.dirty || this.st.closed || this.st.faulted) return;
      this.dirty = false;
      this.syncActive().catch((e) => this.st.fault(e, "interval fdatasync failed"));
    }, this.st.ctx.config.flushIntervalMs);
    this.flushTimer.unref();
  }
}

function bytesOf(bufs: readonly Buffer[]): number {
  let n = 0;
  for (const b of bufs) n += b.length;
  return n;
}

function isDiskFull(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException)?.code;
  return code === "ENOSPC" || code === "EDQUOT";
}
