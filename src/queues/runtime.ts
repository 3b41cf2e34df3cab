// SPDX-License-Identifier: Apache-2.0
/**
 * The policy side of one open queue, shared by every engine: it owns the queue's workers,
 * asks the engine for leases when jobs may be grantable (`QueueListener.available`) or a
 * worker has room, and decides what a failure means (backoff, or the dead-letter queue once
 * `maxAttempts` is reached or the failure is permanent).
 */
import { ValidationError } from "../errors.js";
import type { AttemptRecord, ChildOutcome, NackOptions } from "./types.js";
import type { GrantedJob, GrantRequest, LeaseConsumer, QueueListener, QueueSettings, StoredQueue } from "../store/queue-store.js";
import { retryDelayMs } from "./backoff.js";
import { MAX_DELAY_MS, MAX_ERROR_CHARS, MAX_LEASE_MS } from "./config.js";
import type { LeasedJob } from "./job.js";
import { encodeProgress, encodeResult, toJobInfo } from "./results.js";

/** Settlements since the last grant round that make it worth granting before a journal write. */
const EARLY_GRANT_MIN = 4;

/** A worker as the runtime drives it (src/queues/worker.ts). */
export interface RuntimeWorker extends LeaseConsumer {
  /** Leases it may hold now (the cap of its grants). */
  readonly grantCap: number;
  wantsJobs(): boolean;
  /** A durable hand-out round for it. */
  deliver(jobs: GrantedJob[]): void;
  /** The queue is going away: its jobs' signals abort with `err` and it closes. */
  fail(err: Error): void;
}

function errorInfo(e: unknown): { errorClass: string; error: string } {
  if (e instanceof Error) return { errorClass: e.name || e.constructor.name, error: String(e.message).slice(0, MAX_ERROR_CHARS) };
  if (e === undefined) return { errorClass: "Nack", error: "" };
  return { errorClass: typeof e, error: String(e).slice(0, MAX_ERROR_CHARS) };
}

export class QueueRuntime implements QueueListener {
  private readonly workers = new Set<RuntimeWorker>();
  private immediate: NodeJS.Immediate | null = null;
  /** Keeps the process alive while workers wait for jobs (the engine's timers are unref'd). */
  private keepAlive: NodeJS.Timeout | null = null;
  private readonly unlisten: () => void;
  private detached = false;
  /** `schedule()` calls since the last dispatch (settlements that made room, roughly). */
  private requested = 0;

  constructor(
    readonly stored: StoredQueue,
    private readonly random: () => number,
    /** Wall-clock ms (the broker's telemetry clock). */
    readonly now: () => number,
  ) {
    this.unlisten = stored.listen(this);
  }

  get settings(): QueueSettings {
    return this.stored.settings;
  }

  // ─────────────────────────────── dispatch ───────────────────────────────

  available(): void {
    this.schedule();
  }

  addWorker(w: RuntimeWorker): void {
    if (this.detached) return;
    this.workers.add(w);
    if (this.keepAlive === null) this.keepAlive = setInterval(() => {}, 1 << 30);
    this.schedule();
  }

  removeWorker(w: RuntimeWorker): void {
    this.workers.delete(w);
    if (this.workers.size === 0 && this.keepAlive !== null) {
      clearInterval(this.keepAlive);
      this.keepAlive = null;
    }
  }

  /**
   * Grants on the next event-loop turn: settlements of one turn then share one round of grants
   * (one DELIVER group commit, one read-ahead, one hand-out) instead of one round per ack.
   */
  schedule(): void {
    this.requested++;
    if (this.immediate !== null || this.detached || this.workers.size === 0) return;
    this.immediate = setImmediate(() => {
      this.immediate = null;
      this.dispatch();
    });
  }

  /**
   * The journal is about to write this turn's settlements: grants they made room for are issued
   * now, so their DELIVER events share that write (one fdatasync, not a second write behind it).
   */
  beforeWrite(): void {
    // Only for a round's worth of settlements (a `process()` round settled in one go): a loop
    // settling one job per microtask would otherwise get a grant round per job; its grants wait
    // for the turn's end as before.
    if (this.immediate !== null && this.requested >= EARLY_GRANT_MIN) this.dispatchNow();
  }

  /**
   * Grants now. For a caller that has just applied a batch of settlements (one network frame):
   * the DELIVER events then join the journal batch holding those ACKs and share its fdatasync.
   */
  dispatchNow(): void {
    if (this.immediate !== null) {
      clearImmediate(this.immediate);
      this.immediate = null;
    }
    this.dispatch();
  }

  private dispatch(): void {
    this.requested = 0;
    if (this.detached) return;
    const requests: GrantRequest[] = [];
    const targets: RuntimeWorker[] = [];
    for (const w of this.workers) {
      if (!w.wantsJobs()) continue;
      requests.push({ consumer: w, upTo: w.grantCap });
      targets.push(w);
    }
    if (requests.length === 0) return;
    let granted: Promise<GrantedJob[][]>;
    try {
      granted = this.stored.grant(requests);
    } catch {
      // Closed, or recovering from a storage failure: `available` comes again once it is back.
      return;
    }
    granted.then(
      (lists) => {
        for (let k = 0; k < lists.length; k++) if (lists[k].length > 0) targets[k].deliver(lists[k]);
      },
      () => {},
    );
  }

  // ─────────────────────────────── settlement policy ───────────────────────────────

  /** Whether acks' results are kept (the queue's `resultRetentionMs`). */
  get keepsResults(): boolean {
    return this.settings.resultRetentionMs > 0 || this.stored.hasFlows;
  }

  /**
   * Completes the job. A result is encoded and checked only when the queue keeps results (a
   * queue without `resultRetentionMs` ignores it, as before results existed); a bad one throws
   * ValidationError before anything is written, so the job stays leased.
   */
  ack(job: LeasedJob<unknown>, result: unknown): Promise<void> {
    if (result === undefined || !this.keepsResults) return this.stored.ack(job.lease);
    return this.stored.ack(job.lease, encodeResult(result));
  }

  /** A failed attempt: retry with backoff (or `delayMs`), or the dead-letter queue when it is permanent or the last attempt. */
  nack(job: LeasedJob<unknown>, opts: NackOptions, consumer: LeaseConsumer): Promise<void> {
    if (opts.delayMs !== undefined && (typeof opts.delayMs !== "number" || !(opts.delayMs >= 0) || opts.delayMs > MAX_DELAY_MS))
      throw new ValidationError("nack delayMs must be a number in [0, 1 year]");
    const info = opts.error !== undefined ? errorInfo(opts.error) : { errorClass: "Nack", error: "" };
    if (opts.reason !== undefined) info.error = String(opts.reason).slice(0, MAX_ERROR_CHARS);
    const now = this.now();
    const failure: AttemptRecord = {
      at: now,
      attempt: job.attempt,
      consumer: consumer.consumerId,
      errorClass: info.errorClass,
      error: info.error,
      ...(consumer.codeVersion !== undefined ? { codeVersion: consumer.codeVersion } : {}),
    };
    if (opts.requeue === false || job.attempt >= this.settings.maxAttempts) return this.stored.deadLetter(job.lease, failure);
    const delay = opts.delayMs ?? retryDelayMs(this.settings.backoff, job.attempt, this.random);
    return this.stored.retry(job.lease, now + delay, failure);
  }

  /** RATE-2: back to the queue after `ms`, this delivery not counted as an attempt. */
  retryAfter(job: LeasedJob<unknown>, ms: number): Promise<void> {
    if (typeof ms !== "number" || !(ms >= 0) || ms > MAX_DELAY_MS) throw new ValidationError("retryAfter(ms) needs a number in [0, 1 year]");
    return this.stored.giveBack(job.lease, this.now() + ms);
  }

  /** A flow parent's children's outcomes so far (FLOW-2; `{}` for a job without children). */
  async childResults(id: string): Promise<Record<string, ChildOutcome>> {
    const s = await this.stored.getJob(id);
    return (s === null ? undefined : toJobInfo(s).children) ?? {};
  }

  /** Progress of a leased job: checked (JSON, MAX_PROGRESS_BYTES) before anything is written. */
  progress(job: LeasedJob<unknown>, value: unknown): Promise<void> {
    return this.stored.progress(job.lease, encodeProgress(value));
  }

  extend(job: LeasedJob<unknown>, ms: number): Promise<void> {
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 1 || ms > MAX_LEASE_MS) throw new ValidationError("extend(ms) needs a number in [1, 12 h]");
    return this.stored.extend(job.lease, ms);
  }

  // ─────────────────────────────── shutdown ───────────────────────────────

  /** The queue is going away (broker closing, queue deleted): every worker ends with `err`. */
  detach(err: Error): void {
    if (this.detached) return;
    this.detached = true;
    this.unlisten();
    if (this.immediate !== null) clearImmediate(this.immediate);
    this.immediate = null;
    for (const w of [...this.workers]) w.fail(err);
    this.workers.clear();
    if (this.keepAlive !== null) clearInterval(this.keepAlive);
    this.keepAlive = null;
  }
}
