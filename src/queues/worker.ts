// SPDX-License-Identifier: Apache-2.0
/**
 * An embedded worker: the leases it holds, how it receives jobs (iterator, `process()`'s push
 * mode, or the server's batch push mode) and what it does with unsettled jobs when it stops.
 *
 * Bounds (docs/queues.md, "Settling without awaiting"):
 *  - `prefetch` bounds the jobs handed to application code and not yet settled. In iterator and
 *    `process()` modes the worker also holds a lookahead (lookahead.ts) of granted, durable jobs
 *    not yet handed out, so a hand-out does not wait for a DELIVER fdatasync; the engine grants
 *    it at most `prefetch` + lookahead leases (`GrantRequest.upTo`). In the server's batch push
 *    mode `prefetch` is the grant cap itself (the server parks jobs on its own).
 *  - `maxPendingSettlements` bounds settlements issued and not yet durable (an un-awaited
 *    `job.ack()`): jobs handed out and not durably settled are at most `prefetch` +
 *    `maxPendingSettlements`; above that the worker takes and hands out no jobs. This is what a
 *    crash can deliver again (besides the parked lookahead, which no handler saw).
 * A job that never reached application code (buffered when the worker stops, or parked longer
 * than PARK_MAX_MS) goes back without counting an attempt.
 */
import { AbortedError } from "../errors.js";
import type { GrantedJob, Lease } from "../store/queue-store.js";
import { DEFAULT_MAX_PENDING_SETTLEMENTS, DEFAULT_PREFETCH, intOption, leaseOption, MAX_PENDING_SETTLEMENTS, MAX_PREFETCH, prefetchOption } from "./config.js";
import type { DeliveredJob, PushWorker } from "./host-api.js";
import { handled, LeasedJob, type JobOwner } from "./job.js";
import { LookaheadSizer, maxLookahead, MIN_LOOKAHEAD_LEASE_MS, PARK_MAX_MS } from "./lookahead.js";
import type { ProcessWorker } from "./process.js";
import { workerIterator } from "./iterate.js";
import type { QueueRuntime, RuntimeWorker } from "./runtime.js";
import type { ChildOutcome, Job, NackOptions, WorkOptions, Worker } from "./types.js";

let workerSeq = 0;

export interface QueueWorkerOptions extends WorkOptions {
  /** Batch push mode (the network server): each hand-out round in one call. */
  onJobs?: (jobs: DeliveredJob[]) => void;
  onLeaseLost?: (job: DeliveredJob, reason: unknown) => void;
}

export class QueueWorker<T> implements Worker<T>, RuntimeWorker, PushWorker, ProcessWorker<T>, JobOwner {
  readonly consumerId: string;
  readonly codeVersion: string | undefined;
  /** Jobs handed to application code and unsettled (batch push mode: leases held). */
  prefetch: number;
  private readonly maxPending: number;
  private leaseMsOption: number | undefined;
  private readonly onUnsettled: "nack" | "error";
  private runtime: QueueRuntime | null = null;
  /** Delivered and not yet handed out (iterator mode, and `process()`'s lookahead). */
  private buffer: LeasedJob<T>[] = [];
  /** Every delivered job whose lease has not ended (the buffer's included). */
  private readonly held = new Map<Lease, LeasedJob<unknown>>();
  /** Jobs of `held` handed to application code. */
  private handedOut = 0;
  /** Settlements issued through this worker and not yet durable (or failed). */
  private pending = 0;
  private lastSettle: Promise<void> | null = null;
  private lastGroup = { n: 0 };
  private settledWaiters: (() => void)[] = [];
  private readonly lookahead: LookaheadSizer | null;
  private parkTimer: NodeJS.Timeout | null = null;
  private drainQueued = false;
  private waiter: (() => void) | null = null;
  private stopWaiters: (() => void)[] = [];
  private receiving = true;
  private closed = false;
  private failure: Error | null = null;
  private readonly opened: Promise<void>;
  /** Push mode (`process()`): each job goes straight to this callback. */
  onJob: ((job: Job<T>) => void) | null = null;
  private readonly onJobs: ((jobs: DeliveredJob[]) => void) | null;
  private readonly onLeaseLost: ((job: DeliveredJob, reason: unknown) => void) | null;

  constructor(runtime: Promise<QueueRuntime>, opts: QueueWorkerOptions = {}) {
    this.prefetch = prefetchOption(opts.prefetch, "prefetch", DEFAULT_PREFETCH);
    const maxPending = intOption(opts.maxPendingSettlements, "maxPendingSettlements", 1, MAX_PENDING_SETTLEMENTS, DEFAULT_MAX_PENDING_SETTLEMENTS);
    // Batch push mode: the network client bounds its own pending settlements.
    this.maxPending = opts.onJobs === undefined ? maxPending : Infinity;
    this.leaseMsOption = opts.visibilityTimeoutMs === undefined ? undefined : leaseOption(opts.visibilityTimeoutMs, "visibilityTimeoutMs", 0);
    this.consumerId = opts.consumerId ?? `${process.pid}-worker-${++workerSeq}`;
    this.codeVersion = opts.codeVersion;
    this.onUnsettled = opts.onUnsettled ?? "nack";
    this.onJobs = opts.onJobs ?? null;
    this.onLeaseLost = opts.onLeaseLost ?? null;
    // The server's batch push mode parks jobs itself (src/server/remote-queue.ts).
    this.lookahead = this.onJobs === null ? new LookaheadSizer(maxLookahead(this.prefetch)) : null;
    const signal = opts.signal;
    this.opened = runtime.then(
      (rt) => {
        this.runtime = rt;
        if (this.receiving) rt.addWorker(this);
      },
      (e) => this.fail(e instanceof Error ? e : new Error(String(e))),
    );
    if (signal) {
      if (signal.aborted) this.receiving = false;
      else signal.addEventListener("abort", () => void this.close(), { once: true });
    }
  }

  /** Whether the queue keeps acks' results (known once it is open; jobs arrive after that). */
  get keepsResults(): boolean {
    return this.runtime?.keepsResults ?? false;
  }

  /** Whether the queue is encrypted at rest (known once it is open). */
  get encrypted(): boolean {
    return this.runtime?.settings.encrypted === true;
  }

  /** Lease length of this worker's grants (its option, else the queue's visibilityTimeoutMs). */
  get leaseMs(): number {
    return this.leaseMsOption ?? this.runtime?.settings.visibilityTimeoutMs ?? 0;
  }
  get visibilityTimeoutMs(): number {
    return this.leaseMs;
  }
  whenOpen(): Promise<void> {
    return this.opened;
  }
  /** Set when the queue could not be opened (the iterator throws it). */
  get openError(): Error | null {
    return this.runtime === null ? this.failure : null;
  }

  /** Leases the engine may grant to this worker now: prefetch plus the lookahead. */
  get grantCap(): number {
    if (this.lookahead === null || this.leaseMs < MIN_LOOKAHEAD_LEASE_MS) return this.prefetch;
    return this.prefetch + this.lookahead.size();
  }

  /** Whether the engine should grant to this worker now. */
  wantsJobs(): boolean {
    return this.receiving && this.pending < this.maxPending && this.held.size < this.grantCap;
  }

  setPrefetch(n: number): void {
    this.prefetch = Math.max(0, Math.min(MAX_PREFETCH, Math.floor(n)));
    this.lookahead?.setMax(maxLookahead(this.prefetch));
  }

  grantNow(): void {
    this.runtime?.dispatchNow();
  }

  // ─────────────────────────────── delivery ───────────────────────────────

  /** A hand-out round for this worker (durable grants, Q-1). */
  deliver(granted: GrantedJob[]): void {
    const rt = this.runtime!;
    if (!this.receiving) {
      for (const g of granted) rt.stored.release(g.lease, false);
      return;
    }
    const jobs = new Array<LeasedJob<T>>(granted.length);
    for (let i = 0; i < granted.length; i++) {
      const j = new LeasedJob<T>(this, granted[i]);
      this.held.set(j.lease, j);
      jobs[i] = j;
    }
    if (this.onJobs !== null) {
      this.onJobs(jobs);
      return;
    }
    const onJob = this.onJob;
    let k = 0;
    if (onJob !== null && this.buffer.length === 0) {
      // The common case: room for the whole round (no lease restart, no clock read per job).
      while (k < jobs.length && this.mayHandOut()) {
        this.handOut(jobs[k]);
        onJob(jobs[k++]);
      }
    }
    if (k === jobs.length) return;
    const now = performance.now();
    for (; k < jobs.length; k++) {
      jobs[k].bufferedAt = now;
      this.buffer.push(jobs[k]);
    }
    this.armParkTimer();
    if (onJob === null) this.wake();
    else this.drainSoon();
  }

  /** `prefetch` and `maxPendingSettlements` allow another job into application code. */
  private mayHandOut(): boolean {
    return this.handedOut < this.prefetch && this.handedOut + this.pending < this.prefetch + this.maxPending;
  }

  private handOut(j: LeasedJob<unknown>): void {
    j.handed = true;
    this.handedOut++;
    this.lookahead?.note(1);
  }

  /** The next buffered job for application code, if the bounds allow one. */
  private takeBuffered(): LeasedJob<T> | undefined {
    if (this.buffer.length === 0 || !this.receiving || !this.mayHandOut()) return undefined;
    const j = this.buffer.shift()!;
    // LEASE-1: the consumer gets the whole lease, however long the job waited here.
    this.runtime?.stored.restartLease(j.lease);
    this.handOut(j);
    return j;
  }

  /** Push mode: hands buffered jobs to `process()` while the bounds allow (on a microtask, so a
   * handler that settles synchronously does not recurse). */
  private drainSoon(): void {
    if (this.drainQueued || this.onJob === null || this.buffer.length === 0) return;
    this.drainQueued = true;
    queueMicrotask(() => {
      this.drainQueued = false;
      const onJob = this.onJob;
      if (onJob === null) return;
      for (let j = this.takeBuffered(); j !== undefined; j = this.takeBuffered()) onJob(j);
    });
  }

  /** Jobs parked longer than PARK_MAX_MS beyond `prefetch` go back without an attempt. */
  private armParkTimer(): void {
    if (this.parkTimer !== null || this.buffer.length === 0 || this.held.size <= this.prefetch) return;
    const wait = Math.max(1, this.buffer[0].bufferedAt + PARK_MAX_MS - performance.now());
    this.parkTimer = setTimeout(() => {
      this.parkTimer = null;
      const excess = Math.min(this.buffer.length, this.held.size - this.prefetch);
      if (excess > 0 && this.buffer[0].bufferedAt + PARK_MAX_MS <= performance.now()) {
        // The consumer stopped keeping up: no lookahead until it shows a rate again.
        this.lookahead?.reset();
        for (const j of this.buffer.splice(this.buffer.length - excess, excess)) this.release(j, false);
      }
      this.armParkTimer();
    }, wait);
    this.parkTimer.unref();
  }

  /** LEASE-2: the engine ended one of our leases (expiry, purge, failure, shutdown). */
  leaseLost(lease: Lease, reason: Error): void {
    const job = this.held.get(lease);
    if (job === undefined) return;
    this.forget(job);
    job.abort(reason);
    const i = this.buffer.findIndex((b) => b.lease === lease);
    if (i >= 0) this.buffer.splice(i, 1);
    this.onLeaseLost?.(job, reason);
  }

  /** The job's lease ended: room for another hand-out and grant. */
  private forget(job: LeasedJob<unknown>): void {
    if (!job.end()) return;
    this.held.delete(job.lease);
    if (job.handed) {
      this.handedOut--;
      if (this.buffer.length > 0) {
        this.wake();
        this.drainSoon();
      }
    }
    this.runtime?.schedule();
  }

  // ─────────────────────────────── JobOwner ───────────────────────────────

  ack(job: LeasedJob<unknown>, result: unknown): Promise<void> {
    // Throws (before anything changes) for a result the queue cannot keep: the job stays leased.
    const p = this.runtime!.ack(job, result);
    this.forget(job);
    return this.onJobs === null ? this.track(p) : p;
  }
  nack(job: LeasedJob<unknown>, opts: NackOptions): Promise<void> {
    const p = handled(this.runtime!.nack(job, opts, this));
    this.forget(job);
    return this.onJobs === null ? this.track(p) : p;
  }
  retryAfter(job: LeasedJob<unknown>, ms: number): Promise<void> {
    // Throws (bad ms, stale lease) before the job is forgotten: it stays leased, as a bad nack.
    const p = handled(this.runtime!.retryAfter(job, ms));
    this.forget(job);
    return this.onJobs === null ? this.track(p) : p;
  }
  extend(job: LeasedJob<unknown>, ms: number): Promise<void> {
    return handled(this.runtime!.extend(job, ms));
  }
  progress(job: LeasedJob<unknown>, value: unknown): Promise<void> {
    return handled(this.runtime!.progress(job, value));
  }
  childResults(job: LeasedJob<unknown>): Promise<Record<string, ChildOutcome>> {
    return this.runtime!.childResults(job.id);
  }
  release(job: LeasedJob<unknown>, counted: boolean): void {
    if (!job.leaseHeld) return;
    this.runtime?.stored.release(job.lease, counted);
    this.forget(job);
    job.abort(new AbortedError("worker closed"));
  }
  restartLease(job: LeasedJob<unknown>): void {
    if (job.leaseHeld) this.runtime?.stored.restartLease(job.lease);
  }

  /**
   * Counts a settlement until it is durable (or failed). Settlements of one journal batch share
   * one promise (callers group on identity), so this adds one reaction per batch, not per job.
   */
  private track(p: Promise<void>): Promise<void> {
    this.pending++;
    if (p === this.lastSettle) {
      this.lastGroup.n++;
      return p;
    }
    const g = { n: 1 };
    this.lastSettle = p;
    this.lastGroup = g;
    const done = (): void => {
      if (this.lastSettle === p) this.lastSettle = null;
      const blocked = !this.mayHandOut() || this.pending >= this.maxPending;
      this.pending -= g.n;
      if (this.pending === 0) for (const w of this.settledWaiters.splice(0)) w();
      if (blocked) {
        this.wake();
        this.drainSoon();
        this.runtime?.schedule();
      }
    };
    p.then(done, done);
    return p;
  }

  /** Resolves once every settlement issued through this worker is durable or failed. */
  private whenSettled(): Promise<void> {
    if (this.pending === 0) return Promise.resolve();
    return new Promise((r) => this.settledWaiters.push(r));
  }

  // ─────────────────────────────── iterator ───────────────────────────────

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
    if (!this.receiving) for (const r of this.stopWaiters.splice(0)) r();
  }

  async next(): Promise<IteratorResult<Job<T>>> {
    for (;;) {
      const j = this.takeBuffered();
      if (j !== undefined) return { value: j, done: false };
      if (this.failure && this.runtime === null) throw this.failure;
      if (!this.receiving) {
        // The loop ends with every settlement it issued durable (or failed).
        await this.whenSettled();
        return { value: undefined, done: true };
      }
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Job<T>> {
    return workerIterator(this);
  }

  // ─────────────────────────────── stopping ───────────────────────────────

  /** Resolves once the worker stopped receiving (close, stopReceiving, abort, queue shutdown). */
  whenStopped(): Promise<void> {
    if (!this.receiving) return Promise.resolve();
    return new Promise((r) => this.stopWaiters.push(r));
  }

  /** No more jobs; buffered ones go back without counting an attempt; held ones stay leased. */
  stopReceiving(): void {
    if (!this.receiving) return;
    this.receiving = false;
    this.wake();
    this.runtime?.removeWorker(this);
    if (this.parkTimer !== null) clearTimeout(this.parkTimer);
    this.parkTimer = null;
    for (const j of this.buffer.splice(0)) this.release(j, false);
  }

  /** Aborts the signals of the jobs it holds (shutdown), leaving their leases. */
  abortSignals(reason: Error): void {
    for (const j of this.held.values()) j.abort(reason);
  }

  /** Why the worker ended, if it failed (queue could not open, queue closed or deleted). */
  takeError(): Error | null {
    return this.failure;
  }
  get error(): Error | null {
    return this.failure;
  }

  /** The queue is closing or was deleted: job signals abort with `err`, the worker closes. */
  fail(err: Error): void {
    this.failure ??= err;
    this.abortSignals(err);
    void this.close();
  }

  /**
   * Stops receiving; unsettled jobs are released (onUnsettled "nack") or left to expire
   * ("error"). Resolves once every settlement issued through the worker is durable or failed.
   */
  async close(): Promise<void> {
    this.stopReceiving();
    if (!this.closed) {
      this.closed = true;
      await this.opened.catch(() => {});
      if (this.onUnsettled === "nack") for (const j of [...this.held.values()]) this.release(j, true);
    }
    await this.whenSettled();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
