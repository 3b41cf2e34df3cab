// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network, server side. A remote worker is one embedded `queue.work()`
 * iterator per QUEUE_WORK request; its jobs are pushed to the client (PUSH_JOBS), which settles
 * them by receipt (QUEUE_SETTLE).
 *
 * Invariants:
 * - Leases belong to the connection: when it closes (or the client stops the worker), the
 *   embedded worker is closed with `onUnsettled: "nack"`, so every job still in flight is
 *   released for redelivery at once instead of waiting for its lease to expire.
 * - Memory is bounded by `prefetch`: the embedded worker holds at most `prefetch` unsettled
 *   jobs, and we pull the next job only when it lets us and the socket is writable.
 * - Lease loss is pushed (PUSH_LEASE_LOST) so the client aborts `job.signal`.
 */
import { LeaseExpiredError, ValidationError } from "../errors.js";
import type { Broker } from "../types.js";
import type { EnqueueItem, Job, NackOptions, Queue, QueueConfig, Worker } from "../queues/types.js";

/** The embedded broker exposes queues as `broker.queue(name, config)` (issue 3). */
export type QueueHost = { queue<T = unknown>(name: string, config?: QueueConfig): Queue<T> };

export function queueHost(broker: Broker): QueueHost {
  const b = broker as unknown as Partial<QueueHost>;
  if (typeof b.queue !== "function") {
    throw new ValidationError("this broker has no work queues (broker.queue is not available)");
  }
  return b as QueueHost;
}

export interface RemoteWorkerOptions {
  id: number;
  queue: Queue<unknown>;
  prefetch: number;
  visibilityTimeoutMs?: number;
  consumerId?: string;
  codeVersion?: string;
  /** "nack" (default): when the worker or its connection ends, unsettled jobs are released at
   * once. "error": they stay leased until their lease expires. */
  onUnsettled: "nack" | "error";
  push(jobs: Job<unknown>[]): boolean;
  pushLeaseLost(receipt: string): void;
  pushEnded(reason: string, error?: unknown): void;
  waitWritable(): Promise<void>;
}

const tick = (): Promise<"tick"> => new Promise((resolve) => setImmediate(() => resolve("tick")));

export class RemoteWorker {
  private readonly worker: Worker<unknown>;
  private readonly ac = new AbortController();
  /** Delivered, unsettled jobs by receipt (at most `prefetch`). */
  private readonly jobs = new Map<string, Job<unknown>>();
  private ended = false;

  constructor(private readonly opts: RemoteWorkerOptions) {
    this.worker = opts.queue.work({
      prefetch: opts.prefetch,
      visibilityTimeoutMs: opts.visibilityTimeoutMs,
      consumerId: opts.consumerId,
      codeVersion: opts.codeVersion,
      signal: this.ac.signal,
      onUnsettled: opts.onUnsettled,
    });
    void this.pump();
  }

  private async pump(): Promise<void> {
    const it = this.worker[Symbol.asyncIterator]();
    let pending: Promise<IteratorResult<Job<unknown>>> | null = null;
    try {
      while (!this.ended) {
        if (pending === null) pending = it.next();
        const first = await pending;
        pending = null;
        if (first.done) break;
        const batch = [first.value];
        const turn = tick();
        while (batch.length < this.opts.prefetch) {
          pending = it.next();
          const r = await Promise.race([pending, turn]);
          if (r === "tick") break;
          pending = null;
          if (r.done) break;
          batch.push(r.value);
        }
        if (this.ended) break;
        for (const job of batch) this.track(job);
        if (!this.opts.push(batch)) await this.opts.waitWritable();
      }
      this.finish("closed");
    } catch (err) {
      this.finish("error", err);
    }
  }

  private track(job: Job<unknown>): void {
    this.jobs.set(job.receipt, job);
    const onAbort = (): void => {
      // Lease lost (expired or worker shutting down): tell the client so it stops working on it.
      if (this.jobs.get(job.receipt) === job) {
        this.jobs.delete(job.receipt);
        if (!this.ended) this.opts.pushLeaseLost(job.receipt);
      }
    };
    if (job.signal.aborted) onAbort();
    else job.signal.addEventListener("abort", onAbort, { once: true });
  }

  async settle(receipt: string, action: string, arg: Record<string, unknown>): Promise<void> {
    const job = this.jobs.get(receipt);
    if (!job) throw new LeaseExpiredError();
    switch (action) {
      case "ack":
        await job.ack();
        this.jobs.delete(receipt);
        return;
      case "nack": {
        const o: NackOptions = {};
        if (typeof arg.delayMs === "number") o.delayMs = arg.delayMs;
        if (arg.requeue === false) o.requeue = false;
        if (typeof arg.reason === "string") o.reason = arg.reason;
        if (typeof arg.errorClass === "string") {
          const e = new Error(typeof arg.errorMessage === "string" ? arg.errorMessage : "");
          e.name = arg.errorClass;
          o.error = e;
        }
        await job.nack(o);
        this.jobs.delete(receipt);
        return;
      }
      case "extend": {
        if (typeof arg.ms !== "number") throw new ValidationError("extend needs ms");
        await job.extend(arg.ms);
        return;
      }
      default:
        throw new ValidationError(`unknown settle action ${JSON.stringify(action)}`);
    }
  }

  private finish(reason: string, error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.opts.pushEnded(reason, error);
  }

  /** Stops the worker; unsettled jobs are nacked (released for redelivery) by the embedded worker. */
  async close(): Promise<void> {
    this.ended = true;
    this.ac.abort();
    try {
      await this.worker.close();
    } catch {
      // best effort: the embedded worker releases its leases either way
    }
    this.jobs.clear();
  }
}

/** Validates the per-item options of an enqueue request (they travel as JSON). */
export function enqueueItems(values: { value: unknown; headers?: Record<string, string | Uint8Array> }[], opts: unknown): EnqueueItem[] {
  if (opts !== undefined && (!Array.isArray(opts) || opts.length !== values.length)) {
    throw new ValidationError("opts must be an array with one entry per job");
  }
  return values.map((v, i) => {
    const o = ((opts as unknown[] | undefined)?.[i] ?? {}) as Record<string, unknown>;
    if (o === null || typeof o !== "object") throw new ValidationError(`opts[${i}] must be an object`);
    const item: EnqueueItem = { data: v.value as EnqueueItem["data"] };
    if (v.headers) item.headers = v.headers;
    if (o.key !== undefined) item.key = o.key as string | null;
    if (o.delayMs !== undefined) item.delayMs = o.delayMs as number;
    if (o.deliverAt !== undefined) item.deliverAt = o.deliverAt as number;
    if (o.dedupeId !== undefined) item.dedupeId = o.dedupeId as string;
    return item;
  });
}
