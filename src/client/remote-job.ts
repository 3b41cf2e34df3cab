// SPDX-License-Identifier: Apache-2.0
/**
 * A job received by the network client's worker (queue.ts): its fields, `signal`, and its
 * settlements, which the worker sends in batches (QUEUE_SETTLE_BATCH).
 */
import { ValidationError } from "../errors.js";
import { MAX_DELAY_MS } from "../queues/config.js";
import { handledRejection } from "../queues/job.js";
import { encodeProgress, encodeResult } from "../queues/results.js";
import type { ChildOutcome, DeadLetterInfo, Job, NackOptions } from "../queues/types.js";
import { parseJobJson } from "../wire/queue.js";

export const NO_ARG: Record<string, unknown> = Object.freeze({}) as Record<string, unknown>;

export interface JobMeta {
  id: string;
  key: string | null;
  attempt: number;
  enqueuedAt: number;
  receipt: string;
  leaseExpiresAt: number;
  redriveCount: number;
}

export type SettleAction = "ack" | "nack" | "extend" | "release" | "retryAfter";

/** What a job needs from the worker that received it. */
export interface JobSettler<T> {
  /** Whether the queue keeps acks' results (else a result is dropped, as embedded). */
  readonly keepsResults: boolean;
  /** Whether the server takes `retryAfter` settlements (an older one: a nack with that delay). */
  readonly givesBack: boolean;
  settle(job: RemoteJob<T>, action: SettleAction, arg: Record<string, unknown>): Promise<void>;
  /** Sends a progress value (JSON text, checked) of a job it holds (QUEUE_PROGRESS). */
  progress(job: RemoteJob<T>, json: string): Promise<void>;
  /** A flow parent's children's outcomes (QUEUE_GET_JOB). */
  childResults(job: RemoteJob<T>): Promise<Record<string, ChildOutcome>>;
}

export class RemoteJob<T> implements Job<T> {
  readonly id: string;
  readonly key: string | null;
  readonly attempt: number;
  readonly enqueuedAt: number;
  readonly receipt: string;
  leaseExpiresAt: number;
  readonly redriveCount: number;
  readonly deadLetter: DeadLetterInfo | null;
  /** Created on first `signal` access: an AbortController per job is costly, most are never read. */
  #ac: AbortController | null = null;
  #abortReason: unknown = undefined;
  /** True once the lease is lost (connection dropped, expired, worker closed). */
  aborted = false;
  settled = false;
  /** Handed to application code (iterator or a `process()` handler) and not yet settled. */
  handed = false;
  /** performance.now() when it reached its worker's buffer (the lookahead's park limit). */
  bufferedAt = 0;
  #data: T | undefined;
  /** A JSON value's text until `data` is first read (a handler that never reads it costs no
   * parse); parsed then, a ProtocolError if the server sent something that is not JSON. */
  #jsonText: string | undefined;

  constructor(
    meta: JobMeta,
    deadLetter: DeadLetterInfo | null,
    data: T | undefined,
    jsonText: string | undefined,
    readonly headers: Record<string, Uint8Array>,
    private readonly worker: JobSettler<T>,
    /** The worker registration (server-side worker id) that received this job. */
    readonly workerId: number,
    /** The delivery tag settlements name (QUEUE_SETTLE_BATCH); negative for a job of an older
     * server (PUSH_JOBS), which is settled by receipt. */
    readonly tag: number,
  ) {
    this.id = meta.id;
    this.key = meta.key;
    this.attempt = meta.attempt;
    this.enqueuedAt = meta.enqueuedAt;
    this.receipt = meta.receipt;
    this.leaseExpiresAt = meta.leaseExpiresAt;
    this.redriveCount = meta.redriveCount;
    this.deadLetter = deadLetter;
    this.#data = data;
    this.#jsonText = jsonText;
  }
  get data(): T {
    if (this.#jsonText !== undefined) {
      this.#data = parseJobJson(this.#jsonText) as T;
      this.#jsonText = undefined;
    }
    return this.#data as T;
  }
  get signal(): AbortSignal {
    if (this.#ac === null) {
      this.#ac = new AbortController();
      if (this.aborted) this.#ac.abort(this.#abortReason);
    }
    return this.#ac.signal;
  }
  abort(reason: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.#abortReason = reason;
    this.#ac?.abort(reason);
  }
  ack(result?: unknown): Promise<void> {
    if (result === undefined || !this.worker.keepsResults) return this.worker.settle(this, "ack", NO_ARG);
    let json: string;
    try {
      // Checked here, before anything is sent: a refused result leaves the job leased.
      json = encodeResult(result);
    } catch (e) {
      return handledRejection(e);
    }
    return this.worker.settle(this, "ack", { result: json });
  }
  nack(opts: NackOptions = {}): Promise<void> {
    const arg: Record<string, unknown> = {};
    if (opts.delayMs !== undefined) arg.delayMs = opts.delayMs;
    if (opts.requeue === false) arg.requeue = false;
    if (opts.reason !== undefined) arg.reason = String(opts.reason);
    if (opts.error !== undefined) {
      const e = opts.error as { name?: unknown; constructor?: { name?: string }; message?: unknown };
      arg.errorClass = e instanceof Error ? e.constructor?.name ?? e.name : typeof opts.error;
      arg.errorMessage = e instanceof Error ? String(e.message) : String(opts.error);
    }
    return this.worker.settle(this, "nack", arg);
  }
  retryAfter(ms: number): Promise<void> {
    if (typeof ms !== "number" || !(ms >= 0) || ms > MAX_DELAY_MS) return handledRejection(new ValidationError("retryAfter(ms) needs a number in [0, 1 year]"));
    if (this.worker.givesBack) return this.worker.settle(this, "retryAfter", { ms });
    // An older server: the delay is kept, the attempt is spent (docs/queues.md).
    return this.worker.settle(this, "nack", { delayMs: ms, errorClass: "RateLimitedError", errorMessage: `rate limited downstream: retry after ${ms} ms` });
  }
  progress(value: unknown): Promise<void> {
    let json: string;
    try {
      // Checked here, before anything is sent, as embedded.
      json = encodeProgress(value);
    } catch (e) {
      return handledRejection(e);
    }
    return this.worker.progress(this, json);
  }
  childResults(): Promise<Record<string, ChildOutcome>> {
    return this.worker.childResults(this);
  }
  extend(ms: number): Promise<void> {
    if (!Number.isFinite(ms) || ms <= 0) return Promise.reject(new ValidationError("extend(ms) needs a positive number of milliseconds"));
    return this.worker.settle(this, "extend", { ms });
  }
}
