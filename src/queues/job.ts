// SPDX-License-Identifier: Apache-2.0
/**
 * The job handle of an embedded worker: `job.ack()`, `job.nack()`, `job.extend()`,
 * `job.signal` over one lease of the engine (`GrantedJob`). Settlements go through the
 * queue's policy (runtime.ts); lease loss reaches the job through its worker (LEASE-2).
 */
import { decodeValue } from "../log/record-batch.js";
import type { GrantedJob, Lease } from "../store/queue-store.js";
import type { DeliveredJob } from "./host-api.js";
import type { ChildOutcome, DeadLetterInfo, NackOptions } from "./types.js";

/** What a job needs from the worker that holds it. */
export interface JobOwner {
  /** `result`: as the user passed it (undefined: none). */
  ack(job: LeasedJob<unknown>, result: unknown): Promise<void>;
  nack(job: LeasedJob<unknown>, opts: NackOptions): Promise<void>;
  extend(job: LeasedJob<unknown>, ms: number): Promise<void>;
  /** Gives the job back after `ms` without counting this delivery (RATE-2). */
  retryAfter(job: LeasedJob<unknown>, ms: number): Promise<void>;
  progress(job: LeasedJob<unknown>, value: unknown): Promise<void>;
  /** A flow parent's children's outcomes (FLOW-2). */
  childResults(job: LeasedJob<unknown>): Promise<Record<string, ChildOutcome>>;
  /** Gives the job back without a failure record (`counted` false: not an attempt). */
  release(job: LeasedJob<unknown>, counted: boolean): void;
  restartLease(job: LeasedJob<unknown>): void;
}

const noop = (): void => {};

/** A rejected promise that is never reported as unhandled (it still rejects when awaited). */
export function handledRejection(e: unknown): Promise<never> {
  const p = Promise.reject(e);
  p.catch(noop);
  return p;
}

/** Marks `p` handled (an un-awaited settlement) and returns it unchanged. */
export function handled<T>(p: Promise<T>): Promise<T> {
  p.catch(noop);
  return p;
}

const UNDECODED: unique symbol = Symbol("undecoded");

function headerObject(h: [string, Buffer][] | null): Record<string, Uint8Array> {
  const out: Record<string, Uint8Array> = {};
  if (h) for (const [k, v] of h) out[k] = v;
  return out;
}

export class LeasedJob<T> implements DeliveredJob {
  readonly lease: Lease;
  tag = -1;
  /** Handed to application code (by the iterator or to a `process()` handler). */
  handed = false;
  /** performance.now() when it reached its worker's buffer (park timeout). */
  bufferedAt = 0;
  /** Set once the lease ended (settled through this job, or lost). */
  private ended = false;
  /** Created lazily on first `signal` access (an AbortController per job is costly). */
  private ac: AbortController | null = null;
  private abortReason: unknown = undefined;
  /** `data` and `headers` are decoded on first access: the network server never needs them
   * (it forwards the stored bytes), and a JSON parse per job is not free. */
  private decoded: T | typeof UNDECODED = UNDECODED;
  private headerObj: Record<string, Uint8Array> | null = null;

  constructor(
    private readonly owner: JobOwner,
    readonly stored: GrantedJob,
  ) {
    this.lease = stored.lease;
  }

  // Read through to the engine's job (its fields may be decoded on first access).
  get id(): string {
    return this.stored.id;
  }
  get key(): string | null {
    return this.stored.key;
  }
  get attempt(): number {
    return this.lease.attempt;
  }
  get enqueuedAt(): number {
    return this.stored.enqueuedAt;
  }
  get redriveCount(): number {
    return this.stored.redriveCount;
  }
  get deadLetter(): DeadLetterInfo | null {
    return this.stored.deadLetter;
  }

  get data(): T {
    if (this.decoded === UNDECODED) {
      const r = this.stored;
      try {
        this.decoded = decodeValue(r.value, r.valueKind) as T;
      } catch {
        this.decoded = r.value as T;
      }
    }
    return this.decoded;
  }
  get headers(): Record<string, Uint8Array> {
    return (this.headerObj ??= headerObject(this.stored.headers));
  }
  get receipt(): string {
    return this.lease.receipt;
  }
  get leaseExpiresAt(): number {
    return this.lease.deadline;
  }
  get signal(): AbortSignal {
    if (this.ac === null) {
      this.ac = new AbortController();
      if (this.abortReason !== undefined) this.ac.abort(this.abortReason);
    }
    return this.ac.signal;
  }
  get leaseHeld(): boolean {
    return !this.ended;
  }

  // Errors known at once (a stale lease, a bad argument) are thrown synchronously by the
  // engine; users get them as rejections. A settlement may be left un-awaited (docs/queues.md,
  // "Settling without awaiting"): its promise never causes an unhandled rejection.
  ack(result?: unknown): Promise<void> {
    try {
      return this.owner.ack(this, result);
    } catch (e) {
      return handledRejection(e);
    }
  }
  nack(opts: NackOptions = {}): Promise<void> {
    try {
      return this.owner.nack(this, opts);
    } catch (e) {
      return handledRejection(e);
    }
  }
  extend(ms: number): Promise<void> {
    try {
      return this.owner.extend(this, ms);
    } catch (e) {
      return handledRejection(e);
    }
  }
  retryAfter(ms: number): Promise<void> {
    try {
      return this.owner.retryAfter(this, ms);
    } catch (e) {
      return handledRejection(e);
    }
  }
  progress(value: unknown): Promise<void> {
    try {
      return this.owner.progress(this, value);
    } catch (e) {
      return handledRejection(e);
    }
  }
  childResults(): Promise<Record<string, ChildOutcome>> {
    return this.owner.childResults(this);
  }
  unstart(): void {
    this.owner.release(this, false);
  }
  restartLease(): void {
    this.owner.restartLease(this);
  }

  /** Aborts `signal` (lease lost, or shutdown: then the lease stays). */
  abort(reason: unknown): void {
    if (this.abortReason !== undefined) return;
    this.abortReason = reason;
    this.ac?.abort(reason);
  }

  /** The lease ended; returns false when it had already. */
  end(): boolean {
    if (this.ended) return false;
    this.ended = true;
    return true;
  }
}
