// SPDX-License-Identifier: Apache-2.0
/**
 * Per-message commits at batch speed (COMMIT-1). `msg.commit()` marks "processed through this
 * message" for its partition; one durable offsets write is in flight per subscription at a
 * time, and every mark made meanwhile joins the next one. A mark nobody waits for yet (the
 * README loop's `void msg.commit()`) may wait up to `lingerMs` for others to share its write:
 * at a trickle each message would otherwise cost a durable write of its own (measured on
 * `sluice serve` at one message per wake-up: commits were ~40% of the server's CPU time and
 * half its context switches). Awaiting a mark (`await`, `.then`, `Promise.all`), running out
 * of room (`maxPending`) or closing starts the write at once. A mark's promise resolves once a
 * durable write that covers it returned, so `await msg.commit()` still means "durable"; a loop
 * that does not await it runs at the speed of processing, and the consumer stops being handed
 * messages while `maxPending` marks are not yet durable (`room()`), which bounds what is
 * redelivered after a crash (docs/guarantees.md).
 *
 * Used by the embedded member (src/streams/subscription.ts, writes through the engine) and by
 * the network client's member (src/client/subscription.ts, writes with one COMMIT request).
 * The promises returned never cause an unhandled rejection: a caller that does not await a
 * commit has nothing to handle (a failed write is retried while the mark's ownership period
 * lasts; a mark of a revoked period is dropped, and its messages are redelivered to the new
 * owner, as with any uncommitted message).
 */
import { BrokerError, NotAssignedError, ValidationError } from "../errors.js";

/** "Processed through `offset`" in one partition, within one ownership period. */
export interface CommitMark {
  offset: number;
  /** Group generation the message was delivered in (sent with the write for fencing). */
  generation: number;
  /** The ownership period: aborted when the partition is revoked or the member closes. */
  signal: AbortSignal;
}

/** Writes marks durably; returns per-partition refusals (e.g. not assigned) or throws for all. */
export type CommitWriter = (marks: Map<number, CommitMark>) => Promise<Map<number, Error> | void>;

/**
 * A mark's promise. Its `then` (which `await`, `.catch`, `.finally` and `Promise.all` call)
 * tells the coalescer that someone waits for it, so its write starts without lingering.
 * Derived promises are plain ones (species).
 */
class CommitPromise extends Promise<void> {
  static override get [Symbol.species](): PromiseConstructor {
    return Promise;
  }
  onWait: (() => void) | null = null;
  override then<R1 = void, R2 = never>(
    onfulfilled?: ((value: void) => R1 | PromiseLike<R1>) | null,
    onrejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
    const w = this.onWait;
    if (w !== null) {
      this.onWait = null;
      w();
    }
    return super.then(onfulfilled, onrejected);
  }
}

const ignore = (): void => {};

interface Pending {
  mark: CommitMark;
  /** Marks merged into this entry (each a message processed but not yet durably committed). */
  count: number;
  promise: CommitPromise;
  resolve: () => void;
  reject: (e: Error) => void;
}

/** Default bound on marks not yet durable per subscription (the redelivery bound after a crash). */
export const DEFAULT_MAX_PENDING_COMMITS = 10_000;
/**
 * How long the group members (embedded and network) let a mark nobody waits for linger so
 * that later marks share its write: at 2,000 messages/s about ten share one write. Bounds
 * what a crash or a revocation adds to redelivery beyond what is in flight.
 */
export const COMMIT_LINGER_MS = 5;
const RETRY_MIN_MS = 50;

/** Validates the `maxPendingCommits` subscribe option (both the embedded and the network member). */
export function maxPendingCommitsOption(v: number | undefined): number {
  if (v === undefined) return DEFAULT_MAX_PENDING_COMMITS;
  if (!Number.isInteger(v) || v < 1 || v > 1_000_000) throw new ValidationError("maxPendingCommits must be an integer in [1, 1000000]");
  return v;
}
const RETRY_MAX_MS = 5_000;

function revokedError(partition: number): NotAssignedError {
  return new NotAssignedError(`partition ${partition} was revoked from this member (or the subscription closed) before its commit was written; the new owner resumes from the last commit`);
}

export class CommitCoalescer {
  private pending = new Map<number, Pending>();
  private writing: Promise<void> | null = null;
  /** Marks not yet durable, neither written nor given up (bounded by `maxPending` via room()). */
  private unsettled = 0;
  private roomWaiters: (() => void)[] = [];
  private retryTimer: NodeJS.Timeout | null = null;
  private retryMs = RETRY_MIN_MS;
  private lingerTimer: NodeJS.Timeout | null = null;
  /** A pending mark is awaited (or the consumer waits for room): the next write starts at once. */
  private hurry = false;
  private readonly onWait = (): void => this.wanted();
  private readonly onLinger = (): void => {
    this.lingerTimer = null;
    if (this.writing === null && this.retryTimer === null && this.pending.size > 0) this.start();
  };

  /**
   * @param lingerMs how long a write of marks nobody waits for may be put off so that later
   *   marks share it (0: at once, as soon as no write is in flight)
   */
  constructor(
    private readonly write: CommitWriter,
    readonly maxPending: number = DEFAULT_MAX_PENDING_COMMITS,
    private readonly lingerMs = 0,
  ) {}

  /** Marks not yet durable. */
  get pendingMarks(): number {
    return this.unsettled;
  }

  /**
   * Marks `partition` processed through `m.offset`; resolves once a durable write covers it.
   * The last mark of a partition wins (as consecutive commits do); a mark of a new ownership
   * period replaces one of an older period, which is refused (NotAssignedError). `messages`:
   * how many messages the mark covers that were not committed before (a batch's count).
   */
  mark(partition: number, m: CommitMark, messages = 1): Promise<void> {
    if (m.signal.aborted) {
      const p = Promise.reject(revokedError(partition));
      p.catch(() => {});
      return p;
    }
    let e = this.pending.get(partition);
    if (e !== undefined && e.mark.signal !== m.signal) {
      this.pending.delete(partition);
      this.giveUp(e, revokedError(partition));
      e = undefined;
    }
    if (e === undefined) {
      e = this.entry(m, 0);
      this.pending.set(partition, e);
    } else e.mark = m;
    e.count += messages;
    this.unsettled += messages;
    if (this.writing === null && this.retryTimer === null) this.schedule();
    return e.promise;
  }

  /** Resolves when the consumer may take another message (fewer than maxPending not durable). */
  room(): Promise<void> | null {
    if (this.unsettled < this.maxPending) return null;
    this.wanted();
    return new Promise((r) => this.roomWaiters.push(r));
  }

  /** Starts the next write now, or lingers `lingerMs` unless someone waits (see the class doc). */
  private schedule(): void {
    if (this.lingerMs <= 0 || this.hurry) {
      this.start();
      return;
    }
    if (this.lingerTimer === null) this.lingerTimer = setTimeout(this.onLinger, this.lingerMs);
  }

  /** Someone waits for a pending mark: no lingering for it (nor for the next write, if one is in flight). */
  private wanted(): void {
    this.hurry = true;
    if (this.lingerTimer !== null && this.writing === null && this.retryTimer === null) this.start();
  }

  private stopLinger(): void {
    if (this.lingerTimer !== null) clearTimeout(this.lingerTimer);
    this.lingerTimer = null;
  }

  /**
   * Removes and returns the pending marks of `partitions` (not yet handed to a write): a
   * member losing them writes them itself before letting them go (see GroupSubscription.revoke).
   */
  take(partitions: readonly number[]): Map<number, { mark: CommitMark; settle: (err: Error | null) => void }> {
    const out = new Map<number, { mark: CommitMark; settle: (err: Error | null) => void }>();
    for (const p of partitions) {
      const e = this.pending.get(p);
      if (e === undefined) continue;
      this.pending.delete(p);
      out.set(p, { mark: e.mark, settle: (err) => (err === null ? this.done(e) : this.giveUp(e, err)) });
    }
    return out;
  }

  /** Resolves once the write in flight (if any) has settled. */
  async idle(): Promise<void> {
    if (this.writing !== null) await this.writing;
  }

  /**
   * Writes what is pending now (and waits for the write in flight); one attempt, no retry
   * loop: used when closing, where a stuck disk must not hold the close forever.
   */
  async flush(): Promise<void> {
    this.hurry = true;
    this.stopLinger();
    if (this.retryTimer !== null) {
      clearTimeout(this.retryTimer);
      this.retryTimer = null;
    }
    // A write that ends may start the next one (what was marked meanwhile): wait for all.
    while (this.writing !== null) await this.writing;
    if (this.pending.size > 0) {
      this.start(false);
      while (this.writing !== null) await this.writing;
    }
  }

  /** Refuses every pending mark (the member ended); their messages are redelivered. */
  abandon(err: Error): void {
    this.stopLinger();
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const e of all) this.giveUp(e, err);
  }

  private entry(mark: CommitMark, count: number): Pending {
    let resolve!: () => void;
    let reject!: (e: Error) => void;
    const promise = new CommitPromise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // Handled: a caller need not await its commit. The builtin then: this is not a wait.
    Promise.prototype.then.call(promise, undefined, ignore);
    if (this.lingerMs > 0) promise.onWait = this.onWait;
    return { mark, count, promise, resolve, reject };
  }

  private start(retry = true): void {
    this.stopLinger();
    this.hurry = false;
    const batch = this.pending;
    this.pending = new Map();
    const w = this.run(batch, retry).finally(() => {
      if (this.writing === w) this.writing = null;
      if (this.pending.size > 0 && this.writing === null && this.retryTimer === null) this.schedule();
    });
    this.writing = w;
  }

  private async run(batch: Map<number, Pending>, retry: boolean): Promise<void> {
    const marks = new Map<number, CommitMark>();
    for (const [p, e] of batch) {
      if (e.mark.signal.aborted) this.giveUp(e, revokedError(p));
      else marks.set(p, e.mark);
    }
    if (marks.size === 0) return;
    let refused: Map<number, Error> | void;
    try {
      refused = await this.write(marks);
    } catch (err) {
      this.failed(batch, marks, err as Error, retry);
      return;
    }
    this.retryMs = RETRY_MIN_MS;
    for (const p of marks.keys()) {
      const e = batch.get(p)!;
      const r = refused?.get(p);
      if (r === undefined) this.done(e);
      else this.giveUp(e, r);
    }
  }

  /**
   * A write failed as a whole: its callers see the error (an ambiguous commit, as in Kafka), and
   * a retriable failure is retried after a backoff unless a newer mark replaced it, so the
   * position is still saved; marks keep counting against maxPending until then.
   */
  private failed(batch: Map<number, Pending>, marks: Map<number, CommitMark>, err: Error, retry: boolean): void {
    const retriable = retry && err instanceof BrokerError && err.retriable;
    for (const p of marks.keys()) {
      const e = batch.get(p)!;
      e.reject(err);
      const newer = this.pending.get(p);
      if (retriable && !e.mark.signal.aborted && newer === undefined) this.pending.set(p, this.entry(e.mark, e.count));
      else if (retriable && newer !== undefined && newer.mark.signal === e.mark.signal) newer.count += e.count; // covered by the newer mark
      else this.release(e.count);
    }
    if (retriable && this.pending.size > 0 && this.retryTimer === null) {
      this.retryTimer = setTimeout(() => {
        this.retryTimer = null;
        if (this.writing === null && this.pending.size > 0) this.start();
      }, this.retryMs);
      this.retryTimer.unref();
      this.retryMs = Math.min(RETRY_MAX_MS, this.retryMs * 2);
    }
  }

  private done(e: Pending): void {
    e.resolve();
    this.release(e.count);
  }

  private giveUp(e: Pending, err: Error): void {
    e.reject(err);
    this.release(e.count);
  }

  private release(n: number): void {
    this.unsettled -= n;
    if (this.unsettled < this.maxPending && this.roomWaiters.length > 0) for (const r of this.roomWaiters.splice(0)) r();
  }
}
