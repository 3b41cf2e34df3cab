// SPDX-License-Identifier: Apache-2.0
/**
 * One partition: an ordered list of segments, the append pipeline with group commit, reads,
 * recovery, retention and idempotent-producer state.
 *
 * Invariants (docs/ARCHITECTURE.md):
 *  LOG-1 offsets are contiguous: segment[i+1].baseOffset === segment[i].endOffset.
 *  LOG-3 with durability "always", an append resolves only after an fdatasync covering it,
 *        and readers never see past the durable end (highWatermark), so a record a consumer
 *        saw can never vanish in a crash and its offset is never reused.
 *  LOG-4 a sealed segment was truncated to its last batch and fdatasync'ed before its
 *        successor was created.
 *  LOG-6 logStartOffset is written durably before any segment below it is deleted.
 *  LOG-8 past the last batch, the active segment's file holds only zeros written by
 *        preallocation or unacknowledged bytes; recovery cuts both.
 *  LOG-9 an fdatasync that returns success covers every byte written to the file before it
 *        was issued (it writes back dirty pages and waits for pages under writeback started
 *        by others), so it publishes older rounds whose own fdatasyncs are still running.
 *        Concurrent fdatasyncs use distinct file descriptors so each one reports a writeback
 *        error (Linux reports an error once per open file description).
 */
import { join } from "node:path";
import {
  CorruptRecordError,
  InvalidBatchError,
  OffsetOutOfRangeError,
  RecordTooLargeError,
  StorageError,
  StorageFullError,
  ValidationError,
  AbortedError,
} from "../errors.js";
import { readJsonFile, writeFileAtomic, type FileHandle, type FileSystem } from "./io.js";
import { silentLogger, type Logger } from "./logger.js";
import {
  decodeRecords,
  encodeBatch,
  HEADER_SIZE,
  MAX_BATCH_BYTES,
  readBatchLength,
  recordSize,
  stampBatch,
  restampBatch,
  validateEncodedBatch,
  verifyBatch,
  type BatchHeader,
  type PreparedRecord,
  type ProducerInfo,
  type StoredRecord,
} from "./record-batch.js";
import { endOfNonZero, readFully, Segment, segmentFileName, SparseIndex, type ZeroFill } from "./segment.js";
import { ProducerStateManager, type ProducerBatch, type ProducerSnapshot } from "./producer-state.js";

export type Durability = "always" | "interval" | "never";

export interface LogConfig {
  segmentBytes: number;
  segmentMs: number;
  maxMessageBytes: number;
  durability: Durability;
  flushIntervalMs: number;
  retentionMs: number;
  retentionBytes: number;
}

/**
 * Preallocation of the active segment (LOG-8): "auto" zero-fills ahead of the write position
 * while the partition appends at a steady, moderate rate with durability "always" (every ack
 * waits for an fdatasync, which is cheaper when it has no file size change to journal); "off"
 * never; "always" whenever there is room, whatever the rate (tests).
 */
export type PreallocateMode = "auto" | "always" | "off";

export interface PartitionLogOptions {
  fs: FileSystem;
  dir: string;
  topic: string;
  partition: number;
  config: LogConfig;
  logger?: Logger;
  /** Default "auto". */
  preallocate?: PreallocateMode;
  /**
   * Called once when the partition faults (an I/O error after which only recovery can tell
   * what is on disk): the owner reopens it from disk (src/store/disk-engine.ts).
   */
  onFault?: (err: StorageError) => void;
}

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
  resolve(r: AppendResult): void;
  reject(e: unknown): void;
}

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
/**
 * Tail reads (LOG-10): a read that starts in the last TAIL_READ_SYNC_BYTES of the active
 * segment, within TAIL_READ_SYNC_MS of the last publish, is served by a synchronous pread:
 * those bytes were just written, so they are in the page cache and the read is a memory copy
 * of at most 64 KiB, far cheaper than a hand-off to the thread pool and back -- a hand-off
 * that, on a loaded machine, costs a consumer at the live end milliseconds of latency.
 */
const TAIL_READ_SYNC_BYTES = 64 * 1024;
const TAIL_READ_SYNC_MS = 2000;
/** Bound on open read handles of sealed segments per partition. */
const MAX_OPEN_SEALED = 4;
/** Bound on sparse indexes of sealed segments held in memory per partition (LRU). */
const MAX_LOADED_INDEXES = 16;
/** Bound on remembered corrupt ranges per segment. */
const MAX_CORRUPT_RANGES = 1000;
/** Bound on bytes waiting to be written; appends beyond it wait (back-pressure). */
const MAX_PENDING_BYTES = 256 * 1024 * 1024;
/**
 * Preallocation ("auto"): keep about PREALLOC_HORIZON_MS of appends zero-filled ahead, between
 * PREALLOC_MIN_AHEAD and PREALLOC_MAX_AHEAD, refilled when half is used. Below
 * PREALLOC_MIN_RATE a partition is not worth the disk space (10,000 idle partitions must not
 * hold MiBs of zeros each); above PREALLOC_MAX_RATE rounds are large, the saved journal commit
 * is small next to the data, and writing every byte twice (zeros, then data) would cost
 * throughput. The rate is measured over windows of at least RATE_WINDOW_MS.
 */
const PREALLOC_HORIZON_MS = 2000;
const PREALLOC_MIN_AHEAD = 64 * 1024;
const PREALLOC_MAX_AHEAD = 4 * 1024 * 1024;
const PREALLOC_MIN_RATE = 32 * 1024;
const PREALLOC_MAX_RATE = 64 * 1024 * 1024;
const RATE_WINDOW_MS = 500;
/** A new fill starting at the write position leaves this much room (at most) for appends. */
const PREALLOC_GAP = 64 * 1024;
/** After a failed zero write, appends extend the file for this long before the next try. */
const PREALLOC_RETRY_MS = 30_000;
const ZERO_CHUNK = Buffer.alloc(1024 * 1024);

interface PartitionMeta {
  logStartOffset: number;
}

export class PartitionLog {
  readonly fs: FileSystem;
  readonly dir: string;
  readonly topic: string;
  readonly partition: number;
  config: LogConfig;
  private readonly logger: Logger;
  private segments: Segment[] = [];
  private _logStart = 0;
  /** Next offset to assign. */
  private nextOffset = 0;
  /** Readable, durable-per-policy end (LOG-3). */
  private hwm = 0;
  /** Byte position in the active segment matching hwm. */
  private readableSize = 0;
  /** performance.now() of the last publish (LOG-10: recent tail bytes are in the page cache). */
  private publishedAtMs = 0;
  /** Bytes in the active segment known to be on disk (fdatasync'ed). */
  private syncedSize = 0;
  private pending: PendingAppend[] = [];
  private pendingBytes = 0;
  private flushing = false;
  /** Set while the writer waits on fdatasyncs with room for another: a new append wakes it. */
  private appendWaker: (() => void) | null = null;
  /** Set once an I/O error leaves the files in doubt: refuses appends until reopened (see `fault`). */
  private faulted: StorageError | null = null;
  /** Set while a failed append is rolled back (LOG-11): refuses appends meanwhile. */
  private fence: StorageError | StorageFullError | null = null;
  private closed = false;
  private readonly producers = new ProducerStateManager();
  private waiters = new Set<{ offset: number; wake: () => void }>();
  private spaceWaiters: (() => void)[] = [];
  private flushTimer: NodeJS.Timeout | null = null;
  /**
   * Rounds whose fdatasync is running (durability "always"), oldest first, at most
   * MAX_CONCURRENT_SYNCS. A round is published when its own fdatasync or a later one returns
   * (invariant LOG-9: an fdatasync that returns covers every byte written before it was issued).
   */
  private syncs: InflightSync[] = [];
  /** Extra descriptors of the active segment, one per concurrent fdatasync (see LOG-9). */
  private syncHandles: FileHandle[] = [];
  private syncTurn = 0;
  /** Per descriptor slot, its last fdatasync (settles, never rejects): one at a time per fd. */
  private slotBusy: Promise<void>[] = [];
  private loadedIndexes = new Set<Segment>();
  private dirty = false;
  private metaLock: Promise<void> = Promise.resolve();
  private readonly preallocate: PreallocateMode;
  private readonly onFault: ((err: StorageError) => void) | null;
  /** Append rate (bytes/s) of the last complete window, and the window being counted. */
  private appendRate = 0;
  private rateBytes = 0;
  private rateSince = performance.now();
  private preallocRetryAt = 0;

  private constructor(opts: PartitionLogOptions) {
    this.fs = opts.fs;
    this.dir = opts.dir;
    this.topic = opts.topic;
    this.partition = opts.partition;
    this.config = opts.config;
    this.logger = opts.logger ?? silentLogger;
    this.preallocate = opts.preallocate ?? "auto";
    this.onFault = opts.onFault ?? null;
  }

  get logStartOffset(): number {
    return this._logStart;
  }
  get logEndOffset(): number {
    return this.nextOffset;
  }
  get highWatermark(): number {
    return this.hwm;
  }
  get sizeBytes(): number {
    let s = 0;
    for (const seg of this.segments) s += seg.size;
    return s;
  }
  get segmentCount(): number {
    return this.segments.length;
  }
  private get active(): Segment {
    return this.segments[this.segments.length - 1];
  }

  // ───────────────────────────── open / recovery ─────────────────────────────

  static async open(opts: PartitionLogOptions): Promise<PartitionLog> {
    const log = new PartitionLog(opts);
    await log.recover();
    return log;
  }

  private async recover(): Promise<void> {
    const { fs, dir } = this;
    await fs.mkdir(dir);
    const meta = await readJsonFile<PartitionMeta>(fs, join(dir, "partition.json"));
    this._logStart = meta?.logStartOffset ?? 0;
    const names = await fs.readdir(dir);
    const cleanPath = join(dir, ".clean");
    const clean = names.includes(".clean");
    for (const n of names) if (n.endsWith(".tmp")) await fs.unlink(join(dir, n));
    const bases = names
      .filter((n) => /^\d{20}\.log$/.test(n))
      .map((n) => Number(n.slice(0, 20)))
      .sort((a, b) => a - b);
    // Segments wholly below the log start are leftovers of an interrupted deletion (LOG-6).
    while (bases.length > 1 && bases[1] <= this._logStart) {
      const b = bases.shift()!;
      await this.unlinkSegmentFiles(new Segment(fs, dir, b));
    }
    if (clean) {
      // The marker is removed durably before any new write, so a later crash is never
      // mistaken for a clean shutdown.
      await fs.unlink(cleanPath);
      await fs.fsyncDir(dir);
    }
    if (bases.length === 0) bases.push(this._logStart);
    for (let i = 0; i < bases.length; i++) {
      const seg = new Segment(fs, dir, bases[i]);
      const st = await fs.stat(seg.logPath);
      seg.size = st?.size ?? 0;
      if (i < bases.length - 1) {
        seg.sealed = true;
        seg.endOffset = bases[i + 1];
      }
      this.segments.push(seg);
    }
    if (this._logStart < this.segments[0].baseOffset) this._logStart = this.segments[0].baseOffset;

    const active = this.active;
    active.handle = await fs.open(active.logPath, "create");
    active.size = await active.handle.size();
    // A clean close truncated the file to its last batch, so its size is the logical size.
    const trusted = clean && (await active.loadIndexes(active.size, null));
    if (!trusted) await this.recoverActive(active);
    active.fileEnd = active.size;
    // The age of a recovered segment counts from its first record (as Kafka's segment.ms),
    // not from this open, so restarts cannot keep a segment (and its data) alive forever.
    active.createdAtMs = active.size > 0 ? await this.firstTimestamp(active) : null;
    active.bytesSinceIndex = active.index && active.index.n > 0 ? active.size - active.index.pos[active.index.n - 1] : active.size;
    this.nextOffset = this.hwm = active.endOffset;
    this.readableSize = this.syncedSize = active.size;
    if (this._logStart > this.nextOffset) this._logStart = this.nextOffset;
    await this.recoverProducers(clean);
    if (this.config.durability === "interval") this.startFlushTimer();
  }

  private async firstTimestamp(seg: Segment): Promise<number> {
    const head = Buffer.alloc(HEADER_SIZE);
    if ((await readFully(seg.handle!, head, HEADER_SIZE, 0)) < HEADER_SIZE) return Date.now();
    const ts = head.readInt32BE(24) * 4294967296 + head.readUInt32BE(28);
    return Math.min(ts, Date.now());
  }

  /** Scans the active segment after an unclean shutdown, truncating a torn tail (LOG-7). */
  private async recoverActive(seg: Segment): Promise<void> {
    seg.index = null;
    seg.maxTimestamp = -1;
    seg.endOffset = seg.baseOffset;
    seg.bytesSinceIndex = 0;
    let validEnd = 0;
    let tornAt: number | null = null;
    let tornDetail = "";
    const fileSize = seg.size;
    const end = await Segment.scan(seg.handle!, 0, seg.baseOffset, fileSize, {
      onBatch: (h, pos) => {
        seg.noteBatch(h.baseOffset, h.count, pos, h.length, h.maxTimestamp);
        validEnd = pos + h.length;
      },
      onCorrupt: (pos, expected, detail, next) => {
        if (next === null) {
          tornAt = pos;
          tornDetail = detail;
          return "stop";
        }
        // Intact batches follow: this is damage inside acknowledged data, not a torn write.
        // Never drop it silently: keep the bytes, record the range, serve a typed error.
        this.logger.error({ file: seg.logPath, position: pos, offset: expected, nextOffset: next.offset, detail }, "corrupt batch inside active segment");
        if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next.offset, pos, nextPos: next.pos });
        seg.endOffset = next.offset;
        return "skip";
      },
    });
    if (tornAt !== null) {
      // Past the last intact batch: zeros of preallocation (LOG-8), possibly after the torn
      // remains of a write the crash interrupted. Neither was acknowledged; both are cut.
      const nonZeroEnd = await endOfNonZero(seg.handle!, tornAt, fileSize);
      const dropped = fileSize - tornAt;
      if (nonZeroEnd > tornAt)
        this.logger.warn(
          { file: seg.logPath, position: tornAt, bytesDropped: dropped, tornBytes: nonZeroEnd - tornAt, detail: tornDetail },
          "truncating torn tail of active segment",
        );
      else this.logger.info({ file: seg.logPath, position: tornAt, bytesDropped: dropped }, "dropping preallocated zero tail of active segment");
      await seg.handle!.truncate(tornAt);
      await seg.handle!.datasync();
      seg.size = tornAt;
    } else seg.size = end.pos;
    if (validEnd > seg.size) throw new Error("recovery invariant: valid end beyond size");
    seg.endOffset = end.offset;
  }

  /**
   * Producer state: the snapshot, if it describes a prefix of this log (PROD-1: it never names
   * a batch at or past its offset, and its offset must not lie beyond the recovered end), then
   * the producer fields of every batch from there to the end, replayed in offset order.
   */
  private async recoverProducers(clean: boolean): Promise<void> {
    const snap = await readJsonFile<ProducerSnapshot>(this.fs, join(this.dir, "producers.json")).catch((e: unknown) => {
      this.logger.warn({ err: e, dir: this.dir }, "ignoring unreadable producer snapshot; rebuilding producer state from the log");
      return null;
    });
    let from = this._logStart;
    if (snap && snap.offset >= this._logStart && snap.offset <= this.nextOffset) {
      this.producers.load(snap);
      from = snap.offset;
    } else if (snap) {
      this.logger.warn({ dir: this.dir, snapshotOffset: snap.offset, logStartOffset: this._logStart, logEndOffset: this.nextOffset }, "producer snapshot does not describe this log; rebuilding producer state from the log");
    }
    if (clean && from === this.nextOffset) return;
    // Replay the producer fields of batches written after the snapshot (each batch is verified).
    for (const seg of this.segments) {
      if (seg.endOffset <= from && seg !== this.active) continue;
      if (seg.baseOffset >= this.nextOffset) break;
      const fh = seg === this.active ? seg.handle! : await this.fs.open(seg.logPath, "r");
      try {
        await Segment.scan(fh, 0, seg.baseOffset, seg === this.active ? this.readableSize : seg.size, {
          onBatch: (h) => {
            if (h.baseOffset >= from && h.producerId >= 0) this.producers.replay(h.producerId, h.producerEpoch, h.baseSequence, h.count, h.baseOffset, h.maxTimestamp);
          },
          onCorrupt: () => "skip",
        });
      } finally {
        if (seg !== this.active) await fh.close();
      }
    }
  }

  // ───────────────────────────────── append ──────────────────────────────────

  /**
   * Appends records as one batch. With durability "always" it resolves after fdatasync; many
   * concurrent appends share one fdatasync (group commit).
   */
  async append(records: readonly PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult> {
    this.checkWritable();
    if (records.length === 0) throw new ValidationError("append needs at least one record");
    for (const r of records) {
      const size = recordSize(r);
      if (size > this.config.maxMessageBytes) throw new RecordTooLargeError(size, this.config.maxMessageBytes);
      if (!Number.isSafeInteger(r.timestamp) || r.timestamp < 0) throw new ValidationError(`invalid timestamp ${r.timestamp}`);
    }
    // Refuse invalid producer fields before encoding them (appendBatch checks sequences).
    if (producer) ProducerStateManager.validate(producer, records.length);
    return this.appendBatch(encodeBatch(records, producer), records.length, producer, signal, false);
  }

  /**
   * Appends a batch encoded elsewhere (the client encodes in the storage format, so the server
   * stores it without decoding and re-encoding). The batch is fully validated first
   * (validateEncodedBatch: CRC, structure, record sizes); its producer fields come from its
   * header. Offsets are then set by patching the verified CRC (restampBatch), so every record
   * byte is read once on this path.
   */
  async appendEncoded(buf: Buffer, signal?: AbortSignal): Promise<AppendResult> {
    this.checkWritable();
    const { header: h } = validateEncodedBatch(buf, this.config.maxMessageBytes);
    const producer = h.producerId >= 0 ? { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence } : undefined;
    return this.appendBatch(buf, h.count, producer, signal, true);
  }

  /** Common tail of both appends: idempotence check, memory bound, then offsets (enqueueBatch). */
  private async appendBatch(buf: Buffer, count: number, producer: ProducerInfo | undefined, signal: AbortSignal | undefined, crcValid: boolean): Promise<AppendResult> {
    if (producer) {
      const c = this.producers.check(producer, count);
      if (c.duplicate) return this.duplicateOf(c.batch, signal);
    }
    while (this.pendingBytes + buf.length > MAX_PENDING_BYTES && this.pendingBytes > 0) {
      await new Promise<void>((r) => this.spaceWaiters.push(r));
      this.checkWritable();
    }
    if (producer) {
      // Re-check after waiting: another append of the same producer may have gone first.
      const c = this.producers.check(producer, count);
      if (c.duplicate) return this.duplicateOf(c.batch, signal);
    }
    return this.enqueueBatch(buf, count, producer ?? null, crcValid);
  }

  /**
   * A retry of a remembered batch: its original offsets, once the original is published. If
   * the original is still in flight this waits for its outcome and shares it: a retry is
   * never answered with offsets of a batch that was not stored (PROD-1).
   */
  private async duplicateOf(b: ProducerBatch, signal: AbortSignal | undefined): Promise<AppendResult> {
    if (b.outcome !== undefined) {
      if (signal === undefined) await b.outcome;
      else {
        signal.throwIfAborted();
        let onAbort!: () => void;
        const aborted = new Promise<never>((_, reject) => {
          onAbort = () => reject(new AbortedError("append aborted while waiting for the original batch", signal.reason));
          signal.addEventListener("abort", onAbort, { once: true });
        });
        try {
          await Promise.race([b.outcome, aborted]);
        } finally {
          signal.removeEventListener("abort", onAbort);
        }
      }
    }
    return { baseOffset: b.baseOffset, duplicate: true, synced: this.config.durability === "always" };
  }

  private enqueueBatch(buf: Buffer, count: number, producer: ProducerInfo | null, crcValid: boolean): Promise<AppendResult> {
    const baseOffset = this.nextOffset;
    // Invariant LOG-1: offsets are assigned in append order, here and nowhere else.
    if (crcValid) restampBatch(buf, baseOffset);
    else stampBatch(buf, baseOffset);
    this.nextOffset += count;
    const maxTs = buf.readInt32BE(32) * 4294967296 + buf.readUInt32BE(36);
    const done = new Promise<AppendResult>((resolve, reject) => {
      this.pending.push({ buf, baseOffset, count, maxTs, producer, resolve, reject });
      this.pendingBytes += buf.length;
      if (!this.flushing) {
        this.flushing = true;
        // Start on a microtask so appends made in the same tick share the first write.
        queueMicrotask(() => void this.flushLoop());
      } else if (this.appendWaker !== null) {
        // On a microtask too, so appends made in the same tick share one write and one sync.
        const wake = this.appendWaker;
        this.appendWaker = null;
        queueMicrotask(wake);
      }
    });
    // Recorded at once, so a retry arriving before this batch is durable waits for it (PROD-1).
    if (producer !== null) this.producers.assign(producer, count, baseOffset, maxTs, done);
    return done;
  }

  private checkWritable(): void {
    if (this.closed) throw new StorageError(`partition ${this.topic}/${this.partition} is closed`);
    if (this.faulted) throw this.faulted;
    if (this.fence) throw this.fence;
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
      this.logger.error({ err: e, topic: this.topic, partition: this.partition }, "append pipeline failed unexpectedly");
      const unpublished = [...this.syncs.flatMap((x) => x.items), ...this.pending];
      this.syncs = [];
      this.pending = [];
      this.pendingBytes = 0;
      this.producers.dropUnpublished();
      this.nextOffset = this.hwm;
      this.fault(e, "append pipeline failed");
      const err = new StorageError(`internal error while appending to ${this.topic}/${this.partition}: ${(e as Error)?.message}`, e);
      for (const it of unpublished) it.reject(err);
      this.wakeSpaceWaiters();
    } finally {
      this.appendWaker = null;
      this.flushing = false;
    }
  }

  private async flushRounds(): Promise<void> {
    {
      for (;;) {
        if (this.pending.length > 0 && this.syncs.length < MAX_CONCURRENT_SYNCS) {
          await this.writeRound(this.takeRound());
          continue;
        }
        if (this.syncs.length === 0) break;
        if (this.pending.length === 0 && this.syncs.length < EAGER_SYNCS) {
          // Room for another fdatasync: an append that arrives now is written and synced at
          // once, concurrently with the running ones (LOG-9), instead of waiting for them to
          // return first. At a steady trickle this takes a whole fdatasync off its latency.
          const syncDone = Promise.race(this.syncs.map((x) => x.promise));
          const appended = new Promise<void>((resolve) => (this.appendWaker = resolve));
          const woke = await Promise.race([syncDone.then(() => "sync" as const), appended.then(() => "append" as const)]);
          this.appendWaker = null;
          if (woke === "append") continue;
        }
        await this.completeSync([]);
      }
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
   * The partition is unwritable until it is reopened from disk: after a failed fdatasync the
   * page cache no longer tells what is on disk (PostgreSQL's "fsyncgate"), so only recovery
   * can. Appends are refused with a retriable StorageError meanwhile; the owner is told once.
   */
  private fault(cause: unknown, what: string): void {
    if (this.faulted !== null) return;
    const err = new StorageError(
      `partition ${this.topic}/${this.partition} is unwritable after an I/O error (${what}: ${(cause as Error)?.message ?? String(cause)}); it is being recovered from disk, retry`,
      cause,
    );
    this.faulted = err;
    this.logger.error({ err: cause, topic: this.topic, partition: this.partition }, `${what}; partition is read-only until it is recovered from disk`);
    this.onFault?.(err);
  }

  /**
   * Waits until an fdatasync in flight returns, then publishes every round it covers: its own
   * and all older ones (LOG-9), even if their own fdatasyncs are still running. On any failure
   * the partition is faulted and every unpublished round, `alsoUnsynced` and everything
   * pending are failed; returns false.
   */
  private async completeSync(alsoUnsynced: PendingAppend[]): Promise<boolean> {
    if (this.syncs.length === 0) return true;
    await Promise.race(this.syncs.map((s) => s.promise));
    let newest = -1;
    let err: unknown = null;
    for (let i = 0; i < this.syncs.length; i++) {
      const s = this.syncs[i];
      if (s.state === "failed") err ??= s.err;
      else if (s.state === "ok") newest = i;
    }
    if (err !== null) {
      const unpublished = this.syncs.flatMap((s) => s.items);
      this.syncs = [];
      await this.failItems([...unpublished, ...alsoUnsynced], err, true);
      return false;
    }
    const covered = this.syncs.splice(0, newest + 1);
    for (const s of covered) {
      // Older fdatasyncs still running are covered by this one; a late failure of one of them
      // still faults the partition (their descriptors report the error), it just does not
      // take back what this one made durable.
      if (s.state === "running") s.promise.then(() => (s.state === "failed" ? this.lateSyncFailure(s.err) : undefined));
    }
    const last = covered[covered.length - 1];
    if (last.endPos > this.syncedSize) this.syncedSize = last.endPos;
    const items = covered.length === 1 ? covered[0].items : covered.flatMap((s) => s.items);
    this.publish(items, true, last.endPos);
    return true;
  }

  private lateSyncFailure(err: unknown): void {
    this.fault(err, "fdatasync failed after a later one covered its data");
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
    const k = this.syncTurn++ % MAX_CONCURRENT_SYNCS;
    let fh: FileHandle;
    if (k === 0) fh = seg.handle!;
    else {
      while (this.syncHandles.length < k) this.syncHandles.push(await this.fs.open(seg.logPath, "rw"));
      fh = this.syncHandles[k - 1];
    }
    // A descriptor is reused only after its previous fdatasync returned (at most one per fd,
    // including ones already covered by a later fdatasync and no longer in `syncs`).
    const busy = this.slotBusy[k];
    if (busy) await busy;
    const s: InflightSync = { items, endPos, fh, state: "running", err: null, promise: Promise.resolve() };
    s.promise = fh.datasync().then(
      () => {
        s.state = "ok";
      },
      (e: unknown) => {
        s.state = "failed";
        s.err = e ?? new Error("fdatasync failed");
      },
    );
    this.slotBusy[k] = s.promise;
    this.syncs.push(s);
  }

  /** Closes the extra fdatasync descriptors (the active segment changes or the log closes). */
  private async closeSyncHandles(): Promise<void> {
    await Promise.all(this.slotBusy);
    const hs = this.syncHandles;
    this.syncHandles = [];
    this.syncTurn = 0;
    this.slotBusy = [];
    for (const h of hs) await h.close().catch(() => {});
  }

  private async writeRound(round: PendingAppend[]): Promise<void> {
    let done = 0; // items of `round` already published (before a roll)
    let chunkStart = 0;
    let seg = this.active;
    const chunkBufs: Buffer[] = [];
    try {
      for (let i = 0; i <= round.length; i++) {
        const item = round[i];
        const mustRoll = item !== undefined && this.shouldRoll(seg, item.buf.length, chunkBufs);
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
          seg = this.active;
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
    if (this.config.durability === "always") {
      try {
        await this.startSync(seg, items, seg.size);
      } catch (e) {
        // Could not open a descriptor for the fdatasync: nothing of this round is acknowledged.
        if (!(await this.drainSyncs(items))) return;
        await this.failItems(items, e, false);
        return;
      }
      this.maybePreallocate();
    } else {
      this.dirty = true;
      this.publish(items, false, seg.size);
      if (this.config.durability === "never") this.syncedSize = this.readableSize;
    }
  }

  private shouldRoll(seg: Segment, incoming: number, chunk: Buffer[]): boolean {
    let size = seg.size;
    for (const b of chunk) size += b.length;
    if (size === 0) return false;
    return size + incoming > this.config.segmentBytes || (seg.createdAtMs !== null && Date.now() - seg.createdAtMs >= this.config.segmentMs);
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
    this.rateBytes += bytes;
    await seg.handle!.write(bufs, pos);
    for (const it of items) {
      seg.noteBatch(it.baseOffset, it.count, pos, it.buf.length, it.maxTs);
      pos += it.buf.length;
    }
  }

  /**
   * Starts a zero fill of the active segment if it is worth it (see PREALLOC_*): zeros are
   * written past everything written or being written, then fdatasync'ed, in the background.
   * Appends never wait for it unless they reach the region being written (writeChunk).
   */
  private maybePreallocate(): void {
    const seg = this.active;
    if (this.preallocate === "off" || this.config.durability !== "always" || this.closed || this.faulted) return;
    if (seg.sealed || seg.noFill || seg.fill !== null) return;
    const now = performance.now(); // monotonic: a wall clock step must not skew the rate
    if (now - this.rateSince >= RATE_WINDOW_MS) {
      this.appendRate = (this.rateBytes * 1000) / (now - this.rateSince);
      this.rateBytes = 0;
      this.rateSince = now;
    }
    if (now < this.preallocRetryAt) return;
    let ahead = PREALLOC_MAX_AHEAD;
    if (this.preallocate === "auto") {
      if (this.appendRate < PREALLOC_MIN_RATE || this.appendRate > PREALLOC_MAX_RATE) return;
      ahead = Math.min(PREALLOC_MAX_AHEAD, Math.max(PREALLOC_MIN_AHEAD, (this.appendRate * PREALLOC_HORIZON_MS) / 1000));
    }
    // Appends stay within segmentBytes (a roll comes first), so zeros past it would only be cut;
    // small segments get proportionally small fills.
    const cap = this.config.segmentBytes;
    ahead = Math.min(ahead, Math.max(4096, Math.floor(cap / 4)));
    if (seg.fileEnd - seg.size >= ahead / 2) return;
    const gap = Math.min(PREALLOC_GAP, Math.floor(ahead / 8));
    const start = Math.max(seg.fileEnd, seg.size + gap);
    const end = Math.min(cap, Math.ceil((start + ahead) / 4096) * 4096);
    if (end - start < 4096) return;
    let markWritten!: () => void;
    const fill: ZeroFill = { start, end, written: new Promise<void>((r) => (markWritten = r)), done: Promise.resolve() };
    seg.fill = fill;
    this.logger.debug({ file: seg.logPath, start, end, logicalSize: seg.size }, "preallocating segment space");
    fill.done = this.runFill(seg, fill, markWritten);
  }

  private async runFill(seg: Segment, fill: ZeroFill, markWritten: () => void): Promise<void> {
    let fh: FileHandle | null = null;
    let written = false;
    try {
      // A handle of its own: on Linux an fsync error is reported once per open file, so a sync
      // here sharing the writer's handle could take an error that belongs to an append's
      // fdatasync, which would then succeed for data that never reached the disk (fsyncgate).
      fh = await this.fs.open(seg.logPath, "rw");
      const bufs: Buffer[] = [];
      for (let at = fill.start; at < fill.end; at += ZERO_CHUNK.length) bufs.push(ZERO_CHUNK.subarray(0, Math.min(ZERO_CHUNK.length, fill.end - at)));
      try {
        await fh.write(bufs, fill.start);
        written = true;
      } finally {
        // Even a failed write may have extended the file: fileEnd stays an upper bound.
        if (fill.end > seg.fileEnd) seg.fileEnd = fill.end;
        markWritten();
      }
      await fh.datasync();
    } catch (e) {
      markWritten();
      if (written) {
        // The zeros' fdatasync failed: what is on disk is unknown. Same rule as for appends.
        this.fault(e, `fdatasync of preallocated space in ${seg.logPath} failed`);
      } else {
        this.preallocRetryAt = performance.now() + PREALLOC_RETRY_MS;
        this.logger.warn({ err: e, file: seg.logPath }, "could not preallocate segment space; appends extend the file");
      }
    } finally {
      await fh?.close().catch(() => {});
      seg.fill = null;
    }
    if (written) this.maybePreallocate();
  }

  /** Stops preallocation on `seg` and waits for a running fill (before truncating or sealing). */
  private async stopFill(seg: Segment): Promise<void> {
    seg.noFill = true;
    while (seg.fill !== null) await seg.fill.done;
  }

  private async syncActive(): Promise<void> {
    const seg = this.active;
    const size = seg.size;
    await seg.handle!.datasync();
    if (seg === this.active && size > this.syncedSize) this.syncedSize = size;
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
    if (hwm < this.hwm || items[0].baseOffset !== this.hwm) throw new Error(`invariant: publish out of order (${items[0].baseOffset} after hwm ${this.hwm})`);
    if (readableEnd > this.active.size) throw new Error("invariant: readable end beyond written data");
    this.hwm = hwm;
    this.readableSize = readableEnd;
    this.publishedAtMs = performance.now();
    for (const it of items) if (it.producer !== null) this.producers.publish(it.producer, it.count, it.baseOffset, it.maxTs, hwm);
    for (const it of items) it.resolve({ baseOffset: it.baseOffset, duplicate: false, synced });
    this.wakeWaiters();
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
      ? new StorageFullError(`disk full while appending to ${this.topic}/${this.partition}`, cause)
      : new StorageError(`I/O error while appending to ${this.topic}/${this.partition}: ${(cause as Error)?.message}`, cause);
    if (this.syncs.length > 0) throw new Error("invariant: rollback with fdatasyncs in flight");
    const seg = this.active;
    const keepSize = this.readableSize;
    // Fence (LOG-11), synchronously.
    this.fence = err;
    this.nextOffset = this.hwm;
    this.producers.dropUnpublished();
    seg.size = keepSize;
    seg.endOffset = this.hwm;
    seg.index?.truncateToPosition(keepSize);
    this.syncedSize = Math.min(this.syncedSize, keepSize);
    let rolledBack = false;
    try {
      await this.stopFill(seg);
      seg.noFill = false;
      await seg.handle!.truncate(keepSize);
      seg.fileEnd = keepSize;
      await seg.handle!.datasync();
      rolledBack = true;
    } catch (e) {
      this.logger.error({ err: e, topic: this.topic, partition: this.partition }, "could not roll back after an I/O error");
    }
    this.fence = null;
    if (!rolledBack || fault || !full) this.fault(cause, rolledBack ? "append failed" : "append failed and could not be rolled back");
    for (const f of failed) f.reject(err);
    this.wakeSpaceWaiters();
  }

  /**
   * First half of a roll: the active segment is cut to its last batch and made durable
   * (LOG-4), before anything of its successor exists. On failure the active segment is
   * unchanged (the caller rolls back the round).
   */
  private async sealActive(): Promise<void> {
    const old = this.active;
    await this.stopFill(old);
    // Invariant LOG-4: a sealed segment ends with its last batch (no preallocated zeros; its
    // file size is its size on the next open) and is durable before its successor exists.
    if (old.fileEnd > old.size) {
      await old.handle!.truncate(old.size);
      old.fileEnd = old.size;
    }
    await old.handle!.datasync();
    if (old.size > this.syncedSize) this.syncedSize = old.size;
  }

  /**
   * Second half of a roll: creates the next segment at the high watermark. Called only after
   * everything in the sealed segment is published (LOG-11: a new segment's base offset is the
   * high watermark, so a rollback never has to reach back into a sealed segment). Index files
   * and the producer snapshot written afterwards are rebuildable: their failures are logged.
   */
  private async openNextSegment(): Promise<void> {
    const old = this.active;
    if (old.endOffset !== this.hwm || this.readableSize !== old.size) throw new Error(`invariant: roll at ${old.endOffset} with high watermark ${this.hwm}`);
    await this.closeSyncHandles();
    const seg = new Segment(this.fs, this.dir, old.endOffset);
    try {
      seg.handle = await this.fs.open(seg.logPath, "create");
      await this.fs.fsyncDir(this.dir);
    } catch (e) {
      // Leave no file behind that recovery would take for the active segment (LOG-1).
      if (seg.handle) await seg.handle.close().catch(() => {});
      await this.fs.unlink(seg.logPath).catch(() => {});
      old.noFill = false;
      throw e;
    }
    // Invariant LOG-4: `old` was truncated and fdatasync'ed (sealActive) before its successor exists.
    old.sealed = true;
    old.lastUsed = Date.now();
    this.touchIndex(old);
    this.segments.push(seg);
    this.syncedSize = 0;
    this.readableSize = 0;
    // Captured now, at the high watermark (PROD-1: only published batches, all in the sealed,
    // durable segment), although written after the index files.
    const snap = this.producers.snapshot(this.hwm);
    await old.writeIndexes().catch((e) => this.logger.warn({ err: e, file: old.indexPath }, "could not write index"));
    await this.writeProducerSnapshot(snap).catch((e) => this.logger.warn({ err: e }, "could not write producer snapshot"));
    this.trimOpenHandles();
  }

  private async writeProducerSnapshot(snap: ProducerSnapshot): Promise<void> {
    await writeFileAtomic(this.fs, join(this.dir, "producers.json"), JSON.stringify(snap));
  }

  private startFlushTimer(): void {
    this.flushTimer = setInterval(() => {
      if (!this.dirty || this.closed || this.faulted) return;
      this.dirty = false;
      this.syncActive().catch((e) => this.fault(e, "interval fdatasync failed"));
    }, this.config.flushIntervalMs);
    this.flushTimer.unref();
  }

  // ────────────────────────────────── read ───────────────────────────────────

  private findSegment(offset: number): Segment {
    let lo = 0;
    let hi = this.segments.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (this.segments[mid].baseOffset <= offset) lo = mid;
      else hi = mid - 1;
    }
    return this.segments[lo];
  }

  /**
   * A read handle of `seg`, counted in `seg.refs` until `release`. Handle lifetimes have one
   * owner (this class) and change only in synchronous code: concurrent readers of a closed
   * sealed segment share one open (`seg.opening`), and eviction picks and detaches its
   * handles before its first await (trimOpenHandles), so no two callers ever act on one
   * handle.
   */
  private async acquire(seg: Segment): Promise<FileHandle> {
    seg.refs++;
    seg.lastUsed = Date.now();
    if (seg.handle !== null) return seg.handle;
    try {
      if (seg.opening === null) {
        const opening = this.fs.open(seg.logPath, "r");
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

  private async release(seg: Segment): Promise<void> {
    seg.refs--;
    if (seg.deleted && seg.refs === 0 && seg.handle) {
      const h = seg.handle;
      seg.handle = null;
      await h.close();
    }
  }

  /** Closes the least recently used idle handles of sealed segments beyond MAX_OPEN_SEALED. */
  private trimOpenHandles(): void {
    const open = this.segments.filter((s) => s.sealed && s.handle !== null && s.refs === 0).sort((a, b) => a.lastUsed - b.lastUsed);
    const closing: FileHandle[] = [];
    while (open.length > MAX_OPEN_SEALED) {
      const s = open.shift()!;
      closing.push(s.handle!);
      s.handle = null;
    }
    for (const h of closing) h.close().catch((e: unknown) => this.logger.warn({ err: e, file: h.path }, "could not close segment handle"));
  }

  /** Loads (or rebuilds) the index of a sealed segment. */
  private async ensureIndex(seg: Segment, fh: FileHandle): Promise<void> {
    if (seg.index !== null) {
      this.touchIndex(seg);
      return;
    }
    if (await seg.loadIndexes(seg.size, seg.endOffset)) {
      this.touchIndex(seg);
      return;
    }
    this.logger.warn({ file: seg.logPath }, "rebuilding index of sealed segment");
    const endOffset = seg.endOffset;
    seg.maxTimestamp = -1;
    seg.bytesSinceIndex = 0;
    const sealedSize = seg.size;
    seg.corrupt = [];
    await Segment.scan(fh, 0, seg.baseOffset, sealedSize, {
      onBatch: (h, pos) => seg.noteBatch(h.baseOffset, h.count, pos, h.length, h.maxTimestamp),
      onCorrupt: (pos, expected, detail, next) => {
        if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next?.offset ?? endOffset, pos, nextPos: next?.pos ?? -1 });
        this.logger.error({ file: seg.logPath, position: pos, offset: expected, detail }, "corrupt batch in sealed segment");
        return "skip";
      },
    });
    seg.size = sealedSize;
    seg.endOffset = endOffset;
    if (seg.index === null) seg.index = new SparseIndex();
    seg.maxTimestampKnown = true;
    this.touchIndex(seg);
    await seg.writeIndexes().catch((e) => this.logger.warn({ err: e }, "could not write rebuilt index"));
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

  /** readFully, or a synchronous pread for a small read of the live end (LOG-10). */
  private readAt(seg: Segment, fh: FileHandle, buf: Buffer, length: number, pos: number): Promise<number> | number {
    if (seg === this.active && this.readableSize - pos <= TAIL_READ_SYNC_BYTES && performance.now() - this.publishedAtMs < TAIL_READ_SYNC_MS) {
      // The whole range is below readableSize (the caller's limit), so it was written and
      // published; a short read can only mean the file is shorter than our bookkeeping.
      const n = fh.readSync(buf, 0, length, pos);
      if (n !== length) throw new StorageError(`short read of ${seg.logPath} at ${pos}: ${n} of ${length} bytes`);
      return n;
    }
    return readFully(fh, buf, length, pos);
  }

  /**
   * Reads records from `offset`, about `maxBytes` of them (at least one batch if any exists).
   * Never returns a record that failed verification (LOG-2); a damaged batch at `offset` raises
   * CorruptRecordError with `nextOffset` where reading can resume.
   */
  async read(offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    if (!Number.isSafeInteger(offset)) throw new ValidationError(`invalid offset ${offset}`);
    if (offset < this._logStart || offset > this.hwm)
      throw new OffsetOutOfRangeError(this.topic, this.partition, offset, this._logStart, this.hwm);
    if (offset === this.hwm) return { records: [], nextOffset: offset };
    const seg = this.findSegment(offset);
    const fh = await this.acquire(seg);
    try {
      if (seg.sealed) await this.ensureIndex(seg, fh);
      const limit = seg === this.active ? this.readableSize : seg.size;
      const segEnd = seg === this.active ? this.hwm : seg.endOffset;
      const out: StoredRecord[] = [];
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
      let bytes = 0;
      const chunkSize = Math.max(64 * 1024, Math.min(maxBytes, 8 * 1024 * 1024));
      let buf = Buffer.alloc(0);
      let bufStart = pos;
      let bufLen = 0;
      while (pos < limit && (out.length === 0 || bytes < maxBytes)) {
        // Refills always use a fresh buffer: records handed out are views into the old one.
        if (!(pos >= bufStart && pos + HEADER_SIZE <= bufStart + bufLen)) {
          buf = Buffer.allocUnsafe(Math.min(chunkSize, Math.max(limit - pos, HEADER_SIZE)));
          bufStart = pos;
          bufLen = await this.readAt(seg, fh, buf, Math.min(buf.length, limit - pos), pos);
        }
        let h: BatchHeader | null = null;
        let detail = "";
        const len = bufLen - (pos - bufStart) >= HEADER_SIZE ? readBatchLength(buf, pos - bufStart) : 0;
        if (len < HEADER_SIZE || len > MAX_BATCH_BYTES || len > limit - pos) detail = `implausible batch length ${len}`;
        else {
          if (pos + len > bufStart + bufLen) {
            buf = Buffer.allocUnsafe(Math.max(len, Math.min(chunkSize, limit - pos)));
            bufStart = pos;
            bufLen = await readFully(fh, buf, Math.min(buf.length, limit - pos), pos);
          }
          try {
            h = verifyBatch(buf, pos - bufStart, bufLen, MAX_BATCH_BYTES);
            if (h.baseOffset !== expected) {
              detail = `batch claims offset ${h.baseOffset}, expected ${expected}`;
              h = null;
            }
          } catch (e) {
            if (!(e instanceof InvalidBatchError)) throw e;
            detail = e.message;
          }
        }
        if (h !== null) {
          const batchEnd = h.baseOffset + h.count;
          if (batchEnd > offset) {
            const before = out.length;
            try {
              // Records are views into `buf`, which is never overwritten (see refills above).
              decodeRecords(buf, pos - bufStart, h, offset, out);
            } catch (e) {
              if (!(e instanceof InvalidBatchError)) throw e;
              out.length = before;
              h = null;
              detail = e.message;
            }
            if (h !== null) bytes += h.length;
          }
          if (h !== null) {
            pos += h.length;
            expected = batchEnd;
            continue;
          }
        }
        // Damaged batch at `pos`, covering offsets from `expected`.
        if (out.length > 0) break; // hand out what precedes it; the next read reports it
        const known = seg.corrupt.find((c) => c.offset === expected);
        let next: { pos: number; offset: number } | null;
        if (known) next = known.nextPos >= 0 ? { pos: known.nextPos, offset: known.nextOffset } : null;
        else {
          next = await Segment.resync(fh, pos, expected, limit, MAX_BATCH_BYTES);
          if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next?.offset ?? segEnd, pos, nextPos: next?.pos ?? -1 });
        }
        const nextOffset = next?.offset ?? segEnd;
        if (offset < nextOffset) throw new CorruptRecordError(this.topic, this.partition, expected, seg.logPath, pos, detail, nextOffset);
        if (next === null) break;
        pos = next.pos;
        expected = next.offset;
        bufLen = 0;
      }
      if (out.length === 0 && pos >= limit && segEnd > offset && seg !== this.active) {
        // Nothing readable left in this segment from `offset`: continue in the next one.
        return { records: [], nextOffset: segEnd };
      }
      return { records: out, nextOffset: out.length > 0 ? out[out.length - 1].offset + 1 : offset };
    } finally {
      await this.release(seg);
    }
  }

  /**
   * Stored batches from `offset` as bytes, for a consumer that forwards them (the server's
   * subscription push): whole batches, contiguous as on disk, each verified exactly as `read`
   * verifies it (length, CRC, header, base offset in sequence: LOG-2), but not decoded. The
   * first batch may start below `offset` (a batch is never split); `records` counts only the
   * records at or after `offset`. At most `maxBytes` of batches and no batch beyond the one
   * that reaches `maxRecords` such records, but always at least one whole batch when one
   * exists. A damaged batch at `offset` raises CorruptRecordError with `nextOffset` (as
   * `read`); one after intact batches ends the result before it.
   */
  async readRaw(offset: number, maxBytes: number, maxRecords = Infinity): Promise<RawRead> {
    if (!Number.isSafeInteger(offset)) throw new ValidationError(`invalid offset ${offset}`);
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new ValidationError(`invalid maxBytes ${maxBytes}`);
    if (offset < this._logStart || offset > this.hwm)
      throw new OffsetOutOfRangeError(this.topic, this.partition, offset, this._logStart, this.hwm);
    if (offset === this.hwm) return { data: EMPTY_BYTES, nextOffset: offset, records: 0 };
    const seg = this.findSegment(offset);
    const fh = await this.acquire(seg);
    try {
      if (seg.sealed) await this.ensureIndex(seg, fh);
      const limit = seg === this.active ? this.readableSize : seg.size;
      const segEnd = seg === this.active ? this.hwm : seg.endOffset;
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
      // One read normally covers the lead-in from the index entry (IDX-2: ~4 KiB plus a
      // batch) and the result. The result is one view of one buffer, so once it has started
      // the buffer is never refilled: the result ends where the buffer ends.
      const chunkSize = Math.min(maxBytes, MAX_BATCH_BYTES) + 2 * 4096 + HEADER_SIZE;
      let buf = EMPTY_BYTES;
      let bufStart = pos;
      let bufLen = 0;
      let start = -1;
      let bytes = 0;
      let records = 0;
      while (pos < limit) {
        if (!(pos >= bufStart && pos + HEADER_SIZE <= bufStart + bufLen)) {
          if (start >= 0) break;
          buf = Buffer.allocUnsafe(Math.min(chunkSize, Math.max(limit - pos, HEADER_SIZE)));
          bufStart = pos;
          bufLen = await this.readAt(seg, fh, buf, Math.min(buf.length, limit - pos), pos);
        }
        let h: BatchHeader | null = null;
        let detail = "";
        const len = bufLen - (pos - bufStart) >= HEADER_SIZE ? readBatchLength(buf, pos - bufStart) : 0;
        if (len < HEADER_SIZE || len > MAX_BATCH_BYTES || len > limit - pos) detail = `implausible batch length ${len}`;
        else {
          if (start >= 0 && (bytes + len > maxBytes || records >= maxRecords || pos + len > bufStart + bufLen)) break;
          if (pos + len > bufStart + bufLen) {
            buf = Buffer.allocUnsafe(Math.max(len, Math.min(chunkSize, limit - pos)));
            bufStart = pos;
            bufLen = await readFully(fh, buf, Math.min(buf.length, limit - pos), pos);
          }
          try {
            h = verifyBatch(buf, pos - bufStart, bufLen, MAX_BATCH_BYTES);
            if (h.baseOffset !== expected) {
              detail = `batch claims offset ${h.baseOffset}, expected ${expected}`;
              h = null;
            }
          } catch (e) {
            if (!(e instanceof InvalidBatchError)) throw e;
            detail = e.message;
          }
        }
        if (h !== null) {
          const batchEnd = h.baseOffset + h.count;
          if (batchEnd > offset) {
            if (start < 0) start = pos;
            records += batchEnd - Math.max(h.baseOffset, offset);
            bytes += h.length;
          }
          pos += h.length;
          expected = batchEnd;
          continue;
        }
        // Damaged batch at `pos`, covering offsets from `expected`.
        if (start >= 0) break; // hand out what precedes it; the next read reports it
        const known = seg.corrupt.find((c) => c.offset === expected);
        let next: { pos: number; offset: number } | null;
        if (known) next = known.nextPos >= 0 ? { pos: known.nextPos, offset: known.nextOffset } : null;
        else {
          next = await Segment.resync(fh, pos, expected, limit, MAX_BATCH_BYTES);
          if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next?.offset ?? segEnd, pos, nextPos: next?.pos ?? -1 });
        }
        const nextOffset = next?.offset ?? segEnd;
        if (offset < nextOffset) throw new CorruptRecordError(this.topic, this.partition, expected, seg.logPath, pos, detail, nextOffset);
        if (next === null) break;
        pos = next.pos;
        expected = next.offset;
        bufLen = 0;
      }
      if (start < 0) {
        // Nothing readable left in this sealed segment from `offset`: continue in the next one.
        if (pos >= limit && segEnd > offset && seg !== this.active) return { data: EMPTY_BYTES, nextOffset: segEnd, records: 0 };
        return { data: EMPTY_BYTES, nextOffset: offset, records: 0 };
      }
      return { data: buf.subarray(start - bufStart, pos - bufStart), nextOffset: expected, records };
    } finally {
      await this.release(seg);
    }
  }

  /** Resolves true once a record at `offset` is readable, false on timeout. */
  waitFor(offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    if (this.hwm > offset) return Promise.resolve(true);
    if (maxWaitMs <= 0 || this.closed) return Promise.resolve(false);
    if (signal?.aborted) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const w = {
        offset,
        wake: () => {
          cleanup();
          resolve(this.hwm > offset);
        },
      };
      const timer = setTimeout(w.wake, maxWaitMs);
      const onAbort = (): void => w.wake();
      const cleanup = (): void => {
        clearTimeout(timer);
        this.waiters.delete(w);
        signal?.removeEventListener("abort", onAbort);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.add(w);
    });
  }

  private wakeWaiters(): void {
    if (this.waiters.size === 0) return;
    for (const w of [...this.waiters]) if (this.hwm > w.offset || this.closed) w.wake();
  }

  /** First offset whose timestamp is >= ts; the high watermark if there is none. */
  async offsetForTimestamp(ts: number): Promise<number> {
    for (const seg of [...this.segments]) {
      if (seg.endOffset <= this._logStart && seg !== this.active) continue;
      if (seg.sealed) {
        const fh = await this.acquire(seg);
        try {
          await this.ensureIndex(seg, fh);
        } finally {
          await this.release(seg);
        }
      }
      if (seg.maxTimestamp < ts) continue;
      let start = Math.max(seg.baseOffset, this._logStart);
      const idx = seg.index;
      if (idx !== null) {
        const e = idx.floorTime(ts);
        if (e >= 0) start = Math.max(start, seg.baseOffset + idx.rel[e]);
      }
      const end = seg === this.active ? this.hwm : seg.endOffset;
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
    return this.hwm;
  }

  // ─────────────────────────────── retention ────────────────────────────────

  /** Durably moves the log start to `offset` and deletes whole sealed segments below it (LOG-6). */
  async advanceLogStart(offset: number): Promise<void> {
    if (offset <= this._logStart) return;
    if (offset > this.hwm) throw new ValidationError(`cannot move log start to ${offset} beyond ${this.hwm}`);
    const run = this.metaLock.then(async () => {
      await writeFileAtomic(this.fs, join(this.dir, "partition.json"), JSON.stringify({ logStartOffset: offset } satisfies PartitionMeta));
      this._logStart = Math.max(this._logStart, offset);
      while (this.segments.length > 1 && this.segments[0].endOffset <= this._logStart) {
        const seg = this.segments.shift()!;
        seg.deleted = true;
        await this.unlinkSegmentFiles(seg);
        if (seg.refs === 0 && seg.handle) {
          const h = seg.handle;
          seg.handle = null;
          await h.close();
        }
      }
      await this.fs.fsyncDir(this.dir);
    });
    this.metaLock = run.catch(() => {});
    return run;
  }

  private async unlinkSegmentFiles(seg: Segment): Promise<void> {
    for (const p of [seg.logPath, seg.indexPath, seg.timeIndexPath]) {
      await this.fs.unlink(p).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== "ENOENT") throw e;
      });
    }
  }

  /** Deletes whole sealed segments past retention by time or size; never the active one. */
  async enforceRetention(now = Date.now()): Promise<number> {
    const { retentionMs, retentionBytes } = this.config;
    let newStart = this._logStart;
    let total = this.sizeBytes;
    for (let i = 0; i < this.segments.length - 1; i++) {
      const seg = this.segments[i];
      if (seg.endOffset <= newStart) {
        total -= seg.size;
        continue;
      }
      let expired = false;
      if (retentionMs >= 0) {
        if (!seg.maxTimestampKnown) {
          const fh = await this.acquire(seg);
          try {
            await this.ensureIndex(seg, fh);
          } finally {
            await this.release(seg);
          }
        }
        if (seg.maxTimestamp < now - retentionMs) expired = true;
      }
      if (retentionBytes >= 0 && total - seg.size >= retentionBytes) expired = true;
      if (!expired) break;
      total -= seg.size;
      newStart = seg.endOffset;
    }
    if (newStart > this._logStart) {
      this.logger.info({ topic: this.topic, partition: this.partition, logStartOffset: newStart }, "retention moved log start");
      await this.advanceLogStart(newStart);
    }
    return this._logStart;
  }

  // ───────────────────────────────── close ───────────────────────────────────

  /** Flushes, syncs, writes indexes and the producer snapshot, then marks a clean shutdown. */
  async close(): Promise<void> {
    if (this.closed) return;
    while (this.flushing || this.pending.length > 0) await new Promise((r) => setImmediate(r));
    this.closed = true;
    if (this.flushTimer) clearInterval(this.flushTimer);
    for (const w of [...this.waiters]) w.wake();
    await this.metaLock;
    const active = this.active;
    await this.stopFill(active);
    await this.closeSyncHandles();
    if (!this.faulted) {
      try {
        // Cut preallocated zeros so that the file size is the logical size on the next open.
        if (active.fileEnd > active.size) {
          await active.handle!.truncate(active.size);
          active.fileEnd = active.size;
        }
        await active.handle!.datasync();
        await active.writeIndexes();
        await this.writeProducerSnapshot(this.producers.snapshot(this.hwm));
        const fh = await this.fs.open(join(this.dir, ".clean"), "create");
        await fh.close();
        await this.fs.fsyncDir(this.dir);
      } catch (e) {
        this.logger.error({ err: e }, "clean shutdown failed; next open will run recovery");
      }
    }
    for (const seg of this.segments) {
      if (seg.handle) {
        const h = seg.handle;
        seg.handle = null;
        await h.close().catch(() => {});
      }
    }
  }

  /** Used by tests and tools. */
  describeSegments(): { baseOffset: number; endOffset: number; size: number; sealed: boolean; file: string }[] {
    return this.segments.map((s) => ({ baseOffset: s.baseOffset, endOffset: s.endOffset, size: s.size, sealed: s.sealed, file: s.logPath }));
  }
}

export { segmentFileName };

interface InflightSync {
  items: PendingAppend[];
  /** Byte position in the active segment where this round ends. */
  endPos: number;
  fh: FileHandle;
  state: "running" | "ok" | "failed";
  err: unknown;
  /** Settles (never rejects) when the fdatasync returns; `state` tells how. */
  promise: Promise<void>;
}

/** Result of `readRaw`: whole verified batches (a view of one buffer) and where to go on. */
export interface RawRead {
  /** Concatenated stored batches; the first may hold records below the requested offset. */
  data: Buffer;
  /** Offset after the last returned batch (the offset to read next). */
  nextOffset: number;
  /** Records in `data` at or after the requested offset. */
  records: number;
}

const EMPTY_BYTES = Buffer.alloc(0);
