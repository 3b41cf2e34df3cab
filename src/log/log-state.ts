// SPDX-License-Identifier: Apache-2.0
/**
 * The in-memory state of one partition, shared by its parts: the loader builds it
 * (log-loader.ts), the writer moves its write side (group-commit.ts: next offset, high
 * watermark, readable end, the active segment), readers and retention read it
 * (log-reader.ts, retention.ts). Only the writer changes `nextOffset`, `hwm`,
 * `readableSize` and the active segment; only retention removes segments from the front.
 */
import type { BatchCipher } from "./batch-crypto.js";
import { StorageError, type StorageFullError } from "../errors.js";
import type { FileSystem } from "./io.js";
import type { Logger, Telemetry } from "../observability/telemetry.js";
import { METRICS } from "../observability/metrics.js";
import { ProducerStateManager } from "./producer-state.js";
import type { Segment } from "./segment.js";
import type { CleanupPolicy } from "./compaction-policy.js";

export type Durability = "always" | "interval" | "never";

export interface LogConfig {
  segmentBytes: number;
  segmentMs: number;
  maxMessageBytes: number;
  durability: Durability;
  flushIntervalMs: number;
  retentionMs: number;
  retentionBytes: number;
  /** Key compaction (cleaner.ts); absent: "delete", as before compaction existed. */
  cleanupPolicy?: CleanupPolicy;
  minCompactionLagMs?: number;
  deleteRetentionMs?: number;
}

/** What every part of a partition knows about where and what it is. */
export interface LogContext {
  readonly fs: FileSystem;
  readonly dir: string;
  readonly topic: string;
  readonly partition: number;
  readonly config: LogConfig;
  readonly logger: Logger;
  /** Metrics and clock (the logger above is the telemetry's, or a test's own). */
  readonly telemetry: Telemetry;
  /** Encryption at rest of this log's batches (batch-crypto.ts); null: not encrypted. */
  readonly cipher: BatchCipher | null;
}

/** A reader waiting for `offset` to become readable (LogState.waitFor). */
interface Waiter {
  offset: number;
  /** performance.now() when the wait ends with false (real time, as the timer's). */
  deadline: number;
  resolve: (readable: boolean) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | null;
}

export class LogState {
  /** Segments in offset order; the last one is the active segment (LOG-1: contiguous). */
  segments: Segment[] = [];
  logStart = 0;
  /** Next offset to assign (LOG-1: assigned by the writer alone). */
  nextOffset = 0;
  /** Readable, durable-per-policy end (LOG-3). */
  hwm = 0;
  /** Byte position in the active segment matching hwm. */
  readableSize = 0;
  /** Bytes in the active segment known to be on disk (fdatasync'ed). */
  syncedSize = 0;
  /** Monotonic ms (telemetry clock) of the last publish (LOG-10: recent tail bytes are in the page cache). */
  publishedAtMs = 0;
  readonly producers = new ProducerStateManager();
  /** Set once an I/O error leaves the files in doubt: refuses appends until reopened (see `fault`). */
  faulted: StorageError | null = null;
  /** Set while a failed append is rolled back (LOG-11): refuses appends meanwhile. */
  fence: StorageError | StorageFullError | null = null;
  closed = false;
  private waiters = new Set<Waiter>();
  /** The one timer of the waiters' deadlines (see waitFor), due at `timerDue` (monotonic ms). */
  private deadlineTimer: NodeJS.Timeout | null = null;
  private timerDue = 0;

  constructor(
    readonly ctx: LogContext,
    private readonly onFault: ((err: StorageError) => void) | null,
  ) {}

  get active(): Segment {
    return this.segments[this.segments.length - 1];
  }

  /** The segment holding `offset` (the first one for offsets below it). */
  findSegment(offset: number): Segment {
    let lo = 0;
    let hi = this.segments.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (this.segments[mid].baseOffset <= offset) lo = mid;
      else hi = mid - 1;
    }
    return this.segments[lo];
  }

  checkWritable(): void {
    if (this.closed) throw new StorageError(`partition ${this.ctx.topic}/${this.ctx.partition} is closed`);
    if (this.faulted) throw this.faulted;
    if (this.fence) throw this.fence;
  }

  /**
   * The partition is unwritable until it is reopened from disk: after a failed fdatasync the
   * page cache no longer tells what is on disk (PostgreSQL's "fsyncgate"), so only recovery
   * can. Appends are refused with a retriable StorageError meanwhile; the owner is told once.
   */
  fault(cause: unknown, what: string): void {
    if (this.faulted !== null) return;
    const { topic, partition, logger } = this.ctx;
    const err = new StorageError(
      `partition ${topic}/${partition} is unwritable after an I/O error (${what}: ${(cause as Error)?.message ?? String(cause)}); it is being recovered from disk, retry`,
      cause,
    );
    this.faulted = err;
    logger.error({ err: cause, topic, partition }, `${what}; partition is read-only until it is recovered from disk`);
    this.ctx.telemetry.metrics.count(METRICS.partitionFaults.name, 1, { topic });
    this.onFault?.(err);
  }

  /**
   * Resolves true once a record at `offset` is readable, false on timeout, abort or close.
   *
   * A caught-up consumer waits once per record it is handed (thousands of times a second at a
   * trickle), and nearly every wait ends by data, not by its deadline: so a wait creates no
   * timer of its own. The waiters are in one set, and one timer per partition is armed for
   * the earliest deadline when it is earlier than the armed one (and stays armed while the
   * partition is open); when it fires it ends the waits that are due and arms itself for the
   * next deadline (a wait that ended earlier just leaves the set).
   */
  waitFor(offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    if (this.hwm > offset) return Promise.resolve(true);
    if (maxWaitMs <= 0 || this.closed) return Promise.resolve(false);
    if (signal?.aborted) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const w: Waiter = { offset, deadline: performance.now() + maxWaitMs, resolve, signal, onAbort: null };
      if (signal !== undefined) {
        w.onAbort = () => this.endWait(w);
        signal.addEventListener("abort", w.onAbort, { once: true });
      }
      this.waiters.add(w);
      if (this.deadlineTimer === null || w.deadline < this.timerDue) this.armDeadline(w.deadline);
      else if (this.waiters.size === 1) this.deadlineTimer.ref();
    });
  }

  private endWait(w: Waiter): void {
    if (!this.waiters.delete(w)) return;
    // A wait keeps the process alive (as a timer of its own would); an armed timer without
    // waiters does not.
    if (this.waiters.size === 0) this.deadlineTimer?.unref();
    if (w.onAbort !== null) w.signal!.removeEventListener("abort", w.onAbort);
    w.resolve(this.hwm > w.offset);
  }

  private armDeadline(due: number): void {
    if (this.deadlineTimer !== null) clearTimeout(this.deadlineTimer);
    this.timerDue = due;
    this.deadlineTimer = setTimeout(this.onDeadline, Math.max(1, due - performance.now()));
    if (this.waiters.size === 0) this.deadlineTimer.unref();
  }

  private readonly onDeadline = (): void => {
    this.deadlineTimer = null;
    const now = performance.now();
    let next = Infinity;
    for (const w of [...this.waiters]) {
      if (w.deadline <= now) this.endWait(w);
      else if (w.deadline < next) next = w.deadline;
    }
    if (next !== Infinity) this.armDeadline(next);
  };

  wakeWaiters(): void {
    if (this.waiters.size > 0) for (const w of [...this.waiters]) if (this.hwm > w.offset || this.closed) this.endWait(w);
    // The deadline timer stays armed while the partition is open (re-arming it per wait is
    // what waitFor avoids); closing drops it.
    if (this.closed && this.deadlineTimer !== null) {
      clearTimeout(this.deadlineTimer);
      this.deadlineTimer = null;
    }
  }
}
