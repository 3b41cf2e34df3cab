// SPDX-License-Identifier: Apache-2.0
/**
 * An embedded worker: the leases it holds, how it receives jobs (iterator, `process()`'s push
 * mode, or the server's batch push mode) and what it does with unsettled jobs when it stops.
 *
 * `prefetch` bounds the jobs a worker holds (granted and not settled, buffered included): the
 * engine grants to it only up to `prefetch` leases (`GrantRequest.upTo`), so a slow consumer
 * holds at most `prefetch` leases and never an unbounded buffer. A job that never reached
 * application code (buffered when the worker stops) goes back without counting an attempt.
 */
import { AbortedError } from "../errors.js";
import type { GrantedJob, Lease } from "../store/queue-store.js";
import { DEFAULT_PREFETCH, leaseOption, MAX_PREFETCH, prefetchOption } from "./config.js";
import type { DeliveredJob, PushWorker } from "./host-api.js";
import { LeasedJob, type JobOwner } from "./job.js";
import type { ProcessWorker } from "./process.js";
import { workerIterator } from "./iterate.js";
import type { QueueRuntime, RuntimeWorker } from "./runtime.js";
import type { Job, NackOptions, WorkOptions, Worker } from "./types.js";

let workerSeq = 0;

export interface QueueWorkerOptions extends WorkOptions {
  /** Batch push mode (the network server): each hand-out round in one call. */
  onJobs?: (jobs: DeliveredJob[]) => void;
  onLeaseLost?: (job: DeliveredJob, reason: unknown) => void;
}

export class QueueWorker<T> implements Worker<T>, RuntimeWorker, PushWorker, ProcessWorker<T>, JobOwner {
  readonly consumerId: string;
  readonly codeVersion: string | undefined;
  prefetch: number;
  private leaseMsOption: number | undefined;
  private readonly onUnsettled: "nack" | "error";
  private runtime: QueueRuntime | null = null;
  /** Delivered and not yet handed out by `next()` (iterator mode). */
  private buffer: LeasedJob<T>[] = [];
  /** Every delivered job whose lease has not ended (the buffer's included). */
  private readonly held = new Map<Lease, LeasedJob<unknown>>();
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
    this.leaseMsOption = opts.visibilityTimeoutMs === undefined ? undefined : leaseOption(opts.visibilityTimeoutMs, "visibilityTimeoutMs", 0);
    this.consumerId = opts.consumerId ?? `${process.pid}-worker-${++workerSeq}`;
    this.codeVersion = opts.codeVersion;
    this.onUnsettled = opts.onUnsettled ?? "nack";
    this.onJobs = opts.onJobs ?? null;
    this.onLeaseLost = opts.onLeaseLost ?? null;
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

  /** Whether the engine should grant to this worker now. */
  wantsJobs(): boolean {
    return this.receiving && this.held.size < this.prefetch;
  }

  setPrefetch(n: number): void {
    this.prefetch = Math.max(0, Math.min(MAX_PREFETCH, Math.floor(n)));
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
    if (this.onJobs !== null) this.onJobs(jobs);
    else if (this.onJob !== null) for (const j of jobs) this.onJob(j);
    else {
      for (const j of jobs) this.buffer.push(j);
      this.wake();
    }
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

  /** The job's lease ended: room for another grant. */
  private forget(job: LeasedJob<unknown>): void {
    if (!job.end()) return;
    this.held.delete(job.lease);
    this.runtime?.schedule();
  }

  // ─────────────────────────────── JobOwner ───────────────────────────────

  ack(job: LeasedJob<unknown>): Promise<void> {
    const p = this.runtime!.stored.ack(job.lease);
    this.forget(job);
    return p;
  }
  nack(job: LeasedJob<unknown>, opts: NackOptions): Promise<void> {
    const p = this.runtime!.nack(job, opts, this);
    this.forget(job);
    return p;
  }
  extend(job: LeasedJob<unknown>, ms: number): Promise<void> {
    return this.runtime!.extend(job, ms);
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

  // ─────────────────────────────── iterator ───────────────────────────────

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
    if (!this.receiving) for (const r of this.stopWaiters.splice(0)) r();
  }

  async next(): Promise<IteratorResult<Job<T>>> {
    for (;;) {
      if (this.buffer.length > 0 && this.receiving) return { value: this.buffer.shift()!, done: false };
      if (this.failure && this.runtime === null) throw this.failure;
      if (!this.receiving) return { value: undefined, done: true };
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

  /** Stops receiving; unsettled jobs are released (onUnsettled "nack") or left to expire ("error"). */
  async close(): Promise<void> {
    this.stopReceiving();
    if (this.closed) return;
    this.closed = true;
    await this.opened.catch(() => {});
    if (this.onUnsettled === "nack") for (const j of [...this.held.values()]) this.release(j, true);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
