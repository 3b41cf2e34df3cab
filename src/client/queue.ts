// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network, client side: `broker.queue(name, config)` returns a `Queue<T>`
 * with the embedded API (enqueue, work, process, stats, purge, redrive).
 *
 * Leases belong to the connection: if it drops, the server releases this worker's in-flight
 * jobs for redelivery at once; their `signal` aborts here and settling them fails with
 * `LeaseExpiredError`. The worker then re-registers on the new connection and keeps going.
 */
import { AbortedError, LeaseExpiredError, PermanentError, ValidationError } from "../errors.js";
import type {
  DeadLetterInfo,
  EnqueueItem,
  EnqueueOptions,
  EnqueueResult,
  Job,
  NackOptions,
  ProcessOptions,
  Queue,
  QueueConfig,
  QueueStats,
  RedriveOptions,
  RedriveResult,
  WorkOptions,
  Worker,
} from "../queues/types.js";
import type { PublishValue } from "../types.js";
import { Op, decodePublishRecords, encodePublishRecords, wireToError, type Frame, type WireError } from "../server/protocol.js";
import type { Transport } from "./transport.js";

let nextWorkerId = 1;

interface JobMeta {
  id: string;
  key: string | null;
  attempt: number;
  enqueuedAt: number;
  receipt: string;
  leaseExpiresAt: number;
  redriveCount: number;
  deadLetter: DeadLetterInfo | null;
}

class RemoteJob<T> implements Job<T> {
  readonly id: string;
  readonly key: string | null;
  readonly attempt: number;
  readonly enqueuedAt: number;
  readonly receipt: string;
  leaseExpiresAt: number;
  readonly redriveCount: number;
  readonly deadLetter: DeadLetterInfo | null;
  readonly signal: AbortSignal;
  readonly #ac: AbortController;
  readonly #settle: (job: RemoteJob<T>, action: string, arg: Record<string, unknown>) => Promise<void>;
  settled = false;

  constructor(
    meta: JobMeta,
    readonly data: T,
    readonly headers: Record<string, Uint8Array>,
    settle: (job: RemoteJob<T>, action: string, arg: Record<string, unknown>) => Promise<void>,
  ) {
    this.id = meta.id;
    this.key = meta.key;
    this.attempt = meta.attempt;
    this.enqueuedAt = meta.enqueuedAt;
    this.receipt = meta.receipt;
    this.leaseExpiresAt = meta.leaseExpiresAt;
    this.redriveCount = meta.redriveCount;
    this.deadLetter = meta.deadLetter;
    this.#ac = new AbortController();
    this.signal = this.#ac.signal;
    this.#settle = settle;
  }
  abort(reason: unknown): void {
    this.#ac.abort(reason);
  }
  async ack(): Promise<void> {
    await this.#settle(this, "ack", {});
    this.settled = true;
  }
  async nack(opts: NackOptions = {}): Promise<void> {
    const arg: Record<string, unknown> = {};
    if (opts.delayMs !== undefined) arg.delayMs = opts.delayMs;
    if (opts.requeue === false) arg.requeue = false;
    if (opts.reason !== undefined) arg.reason = String(opts.reason);
    if (opts.error !== undefined) {
      const e = opts.error as { name?: unknown; constructor?: { name?: string }; message?: unknown };
      arg.errorClass = e instanceof Error ? e.constructor?.name ?? e.name : typeof opts.error;
      arg.errorMessage = e instanceof Error ? String(e.message) : String(opts.error);
    }
    await this.#settle(this, "nack", arg);
    this.settled = true;
  }
  async extend(ms: number): Promise<void> {
    if (!Number.isFinite(ms) || ms <= 0) throw new ValidationError("extend(ms) needs a positive number of milliseconds");
    await this.#settle(this, "extend", { ms });
    this.leaseExpiresAt = Date.now() + ms;
  }
}

export class RemoteWorker<T> implements Worker<T> {
  private id = 0;
  private buffer: RemoteJob<T>[] = [];
  private waiter: (() => void) | null = null;
  private closed = false;
  private receiving = true;
  private error: unknown = null;
  private readonly live = new Map<string, RemoteJob<T>>();

  constructor(
    private readonly transport: Transport,
    private readonly registry: Map<number, RemoteWorker<unknown>>,
    private readonly queueMeta: { queue: string; config?: QueueConfig },
    private readonly opts: WorkOptions,
  ) {
    const prefetch = opts.prefetch ?? 16;
    if (!Number.isInteger(prefetch) || prefetch < 1 || prefetch > 10_000) throw new ValidationError("prefetch must be an integer in [1, 10000]");
    if (opts.signal) {
      if (opts.signal.aborted) this.closed = true;
      else opts.signal.addEventListener("abort", () => void this.close(), { once: true });
    }
    if (!this.closed) void this.register();
  }

  /** (Re-)registers with the server under a fresh id. */
  async register(): Promise<void> {
    if (this.closed) return;
    this.releaseAll(new LeaseExpiredError("lease lost: the connection to the server dropped; the job was released for redelivery"));
    if (this.id) this.registry.delete(this.id);
    const id = nextWorkerId++;
    this.id = id;
    this.registry.set(id, this as RemoteWorker<unknown>);
    try {
      await this.transport.request(
        Op.QueueWork,
        {
          ...this.queueMeta,
          worker: id,
          prefetch: this.opts.prefetch ?? 16,
          visibilityTimeoutMs: this.opts.visibilityTimeoutMs,
          consumerId: this.opts.consumerId,
          codeVersion: this.opts.codeVersion,
          // Also decides what a dropped connection does to this worker's leases: "nack"
          // releases them at once, "error" leaves them until lease expiry.
          onUnsettled: this.opts.onUnsettled ?? "nack",
        },
        null,
        { retry: false },
      );
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "CONNECTION_CLOSED" || code === "TIMEOUT") return; // re-registered on reconnect
      this.error = err;
      this.wake();
    }
  }

  /** The connection dropped: the server released our leases, so abort every job's signal now. */
  connectionLost(): void {
    this.releaseAll(new LeaseExpiredError("lease lost: the connection to the server dropped; the job was released for redelivery"));
  }

  private releaseAll(reason: unknown): void {
    for (const j of this.live.values()) j.abort(reason);
    this.live.clear();
    this.buffer = [];
  }

  onPush(f: Frame): void {
    if (f.meta.worker !== this.id) return;
    switch (f.op) {
      case Op.PushJobs: {
        const metas = f.meta.jobs as JobMeta[];
        const recs = decodePublishRecords(f.body, 100_000, true);
        const id = this.id;
        recs.forEach((r, i) => {
          const headers: Record<string, Uint8Array> = {};
          for (const [k, v] of Object.entries(r.headers ?? {})) headers[k] = typeof v === "string" ? Buffer.from(v) : v;
          const job = new RemoteJob<T>(metas[i], r.value as T, headers, (j, action, arg) => this.settle(id, j, action, arg));
          this.live.set(job.receipt, job);
          this.buffer.push(job);
        });
        this.wake();
        break;
      }
      case Op.PushLeaseLost: {
        const j = this.live.get(String(f.meta.receipt));
        if (j) {
          this.live.delete(j.receipt);
          j.abort(new LeaseExpiredError());
          this.buffer = this.buffer.filter((b) => b !== j);
        }
        break;
      }
      case Op.PushWorkerEnded: {
        if (f.meta.reason === "error" && f.meta.error) this.error = wireToError(f.meta.error as WireError);
        this.closed = true;
        this.wake();
        break;
      }
    }
  }

  /** Settles issued in the same event-loop turn travel in one QUEUE_SETTLE frame. */
  private pendingSettles: { item: { receipt: string; action: string; arg: Record<string, unknown> }; resolve(): void; reject(e: unknown): void }[] = [];
  private settleScheduled = false;

  private async settle(workerId: number, job: RemoteJob<T>, action: string, arg: Record<string, unknown>): Promise<void> {
    if (job.settled) throw new ValidationError(`job ${job.id} is already settled`);
    if (workerId !== this.id || !this.live.has(job.receipt)) throw new LeaseExpiredError();
    await new Promise<void>((resolve, reject) => {
      this.pendingSettles.push({ item: { receipt: job.receipt, action, arg }, resolve, reject });
      if (!this.settleScheduled) {
        this.settleScheduled = true;
        setImmediate(() => this.flushSettles(workerId));
      }
    });
    if (action !== "extend") this.live.delete(job.receipt);
  }

  private flushSettles(workerId: number): void {
    this.settleScheduled = false;
    const batch = this.pendingSettles;
    this.pendingSettles = [];
    if (batch.length === 0) return;
    this.transport
      .request(Op.QueueSettle, { worker: workerId, items: batch.map((b) => b.item) }, null, { retry: false })
      .then(
        (f) => {
          const results = (f.meta.results ?? []) as (WireError | null)[];
          batch.forEach((b, i) => (results[i] ? b.reject(wireToError(results[i]!)) : b.resolve()));
        },
        (err) => {
          for (const b of batch) b.reject(err);
        },
      );
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  async next(): Promise<IteratorResult<Job<T>>> {
    for (;;) {
      if (this.error) {
        const e = this.error;
        this.error = null;
        throw e;
      }
      if (!this.receiving || this.closed) return { value: undefined, done: true };
      const j = this.buffer.shift();
      if (j) return { value: j, done: false };
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Job<T>> {
    return {
      next: () => this.next(),
      return: async () => {
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  /** Stop taking new jobs; jobs received but not handed out are released. Settles keep working. */
  async stopReceiving(): Promise<void> {
    this.receiving = false;
    this.wake();
    const unhanded = this.buffer;
    this.buffer = [];
    await Promise.all(unhanded.map((j) => j.nack({ reason: "worker stopping" }).catch(() => {})));
  }

  async close(): Promise<void> {
    if (this.closed && this.id === 0) return;
    this.closed = true;
    this.receiving = false;
    this.wake();
    const id = this.id;
    this.id = 0;
    this.registry.delete(id);
    // Server side: unsettled jobs are nacked (released for redelivery).
    this.releaseAll(new AbortedError("worker closed"));
    if (id) await this.transport.request(Op.QueueStop, { worker: id }, null, { retry: false }).catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

export class RemoteQueue<T> implements Queue<T> {
  constructor(
    private readonly transport: Transport,
    private readonly workers: Map<number, RemoteWorker<unknown>>,
    readonly name: string,
    private readonly config: QueueConfig | undefined,
  ) {}

  private meta(): { queue: string; config?: QueueConfig } {
    return this.config === undefined ? { queue: this.name } : { queue: this.name, config: this.config };
  }

  async enqueue(data: T & PublishValue, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const { signal, ...rest } = opts;
    const [r] = await this.enqueueBatch([{ ...rest, data }], { signal });
    return r;
  }

  async enqueueBatch(items: EnqueueItem[], opts: { signal?: AbortSignal } = {}): Promise<EnqueueResult[]> {
    if (!Array.isArray(items)) throw new ValidationError("enqueueBatch needs an array");
    const body = encodePublishRecords(items.map((it) => ({ value: it.data, headers: it.headers })));
    const itemOpts = items.map((it) => ({
      key: it.key,
      delayMs: it.delayMs,
      deliverAt: it.deliverAt instanceof Date ? it.deliverAt.getTime() : it.deliverAt,
      dedupeId: it.dedupeId,
    }));
    // Only an enqueue where every job carries a dedupeId is safe to re-send after a reconnect.
    const retry = items.length > 0 && items.every((it) => typeof it.dedupeId === "string");
    const f = await this.transport.request(Op.QueueEnqueue, { ...this.meta(), opts: itemOpts }, body, { retry, signal: opts.signal });
    return f.meta.results as EnqueueResult[];
  }

  work(opts: WorkOptions = {}): Worker<T> {
    return new RemoteWorker<T>(this.transport, this.workers, this.meta(), opts);
  }

  async process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts: ProcessOptions = {}): Promise<void> {
    const concurrency = opts.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 10_000) {
      throw new ValidationError("concurrency must be an integer in [1, 10000]");
    }
    const { signal, ...rest } = opts;
    const worker = new RemoteWorker<T>(this.transport, this.workers, this.meta(), { ...rest, prefetch: concurrency });
    const running = new Set<Promise<void>>();
    const onAbort = (): void => void worker.stopReceiving();
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) onAbort();
    try {
      for (;;) {
        const r = await worker.next();
        if (r.done) break;
        const job = r.value;
        const p = (async () => {
          try {
            await fn(job);
            await job.ack();
          } catch (err) {
            if (job.signal.aborted) return; // lease lost: someone else may have it now
            try {
              if (err instanceof PermanentError) await job.nack({ requeue: false, reason: err.message, error: err });
              else await job.nack({ error: err, reason: err instanceof Error ? err.message : String(err) });
            } catch {
              // lease lost meanwhile
            }
          }
        })().finally(() => running.delete(p));
        running.add(p);
        while (running.size >= concurrency) await Promise.race(running);
      }
      await Promise.all(running);
    } finally {
      signal?.removeEventListener("abort", onAbort);
      await worker.close();
    }
  }

  private async admin<R>(action: string, key: string, opts?: unknown): Promise<R> {
    const f = await this.transport.request(Op.QueueAdmin, { ...this.meta(), action, opts }, null, { retry: action === "stats" });
    return f.meta[key] as R;
  }

  stats(): Promise<QueueStats> {
    return this.admin("stats", "stats");
  }
  purge(): Promise<number> {
    return this.admin("purge", "purged");
  }
  redrive(opts: RedriveOptions = {}): Promise<RedriveResult> {
    return this.admin("redrive", "result", opts);
  }
}
