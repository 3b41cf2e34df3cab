// SPDX-License-Identifier: Apache-2.0
/**
 * `broker.queue(name, config)` through a client: a `Queue<T>` with the embedded API. Enqueues
 * are idempotent requests (queue-enqueuer.ts); `work()` and `process()` run a `RemoteWorker`
 * (queue.ts); admin calls (declare, stats, purge, redrive) are QUEUE_ADMIN requests.
 */
import type { SchemaRegistry } from "../contracts/schemas.js";
import { AbortedError, ProtocolError, ValidationError } from "../errors.js";
import { processWorkerOptions, runProcess } from "../queues/process.js";
import { tracing } from "../observability/tracing.js";
import { browseRequest, readableHeaders } from "../queues/results.js";
import type { ResolvedQueueConfig } from "../queues/config.js";
import type { BrowsedJob, BrowseOptions, BrowsePage, EnqueueBatchOptions, EnqueueItem, EnqueueOptions, EnqueueResult, FlowJob, FlowResult, Job, JobInfo, ProcessOptions, Queue, QueueConfig, QueueEvent, QueueEvents, QueueEventsOptions, QueueStats, RedriveOptions, RedriveResult, ScheduleInfo, ScheduleOptions, WorkOptions, Worker } from "../queues/types.js";
import { QueueEventStream } from "../queues/events.js";
import type { PublishValue } from "../value-types.js";
import { Op, decodePublishRecords, encodePublishRecords, parseJobJson } from "../wire/index.js";
import type { Transport } from "./transport.js";
import { ENQUEUE_DELIVERY_TIMEOUT_MS, enqueuerFor } from "./queue-enqueuer.js";
import { RemoteWorker } from "./queue.js";
import { flattenFlow, flowResult, type FlowItem } from "../queues/flows.js";

/** A QUEUE_GET_JOB payload (kinds as in PUSH_JOB_BATCH: 0 bytes, 1 UTF-8, 2 JSON, 3 null). */
function decodeJobData(kind: number, body: Buffer | null): unknown {
  if (kind === 3 || body === null) return null;
  if (kind === 0) return Buffer.from(body);
  if (kind === 1) return body.toString("utf8");
  if (kind === 2) return parseJobJson(body.toString("utf8"));
  throw new ProtocolError(`unknown value kind ${kind}`);
}

/** Whether a job has options that travel in QUEUE_ENQUEUE's `opts`. */
function hasItemOptions(it: EnqueueItem): boolean {
  return (
    it.key !== undefined ||
    it.delayMs !== undefined ||
    it.deliverAt !== undefined ||
    it.dedupeId !== undefined ||
    it.priority !== undefined ||
    it.group !== undefined ||
    it.expireInMs !== undefined ||
    it.expiresAt !== undefined ||
    it.singletonKey !== undefined ||
    it.singletonMode !== undefined ||
    it.singletonWindowMs !== undefined ||
    (it as FlowItem).flow !== undefined
  );
}

/** A job's options as JSON (absent ones are left out by JSON). */
function wireItemOptions(it: EnqueueItem): Record<string, unknown> {
  return {
    key: it.key,
    delayMs: it.delayMs,
    deliverAt: it.deliverAt instanceof Date ? it.deliverAt.getTime() : it.deliverAt,
    dedupeId: it.dedupeId,
    priority: it.priority,
    group: it.group,
    expireInMs: it.expireInMs,
    expiresAt: it.expiresAt instanceof Date ? it.expiresAt.getTime() : it.expiresAt,
    singletonKey: it.singletonKey,
    singletonMode: it.singletonMode,
    singletonWindowMs: it.singletonWindowMs,
    flow: (it as Partial<FlowItem>).flow,
  };
}

/** `transaction` needs the broker in the application's process: a server cannot join its transaction. */
function notOverTheNetwork(): ValidationError {
  return new ValidationError("enqueueing inside a transaction works only with the embedded broker on the PostgreSQL engine (openBroker({ engine: postgresEngine(...) })): a server cannot join the application's transaction");
}

export class RemoteQueue<T> implements Queue<T> {
  constructor(
    private readonly transport: Transport,
    private readonly workers: Map<number, RemoteWorker<unknown>>,
    readonly name: string,
    private readonly config: QueueConfig | undefined,
    /** `deliveryTimeoutMs`: how long an enqueue is retried (default ENQUEUE_DELIVERY_TIMEOUT_MS); `schemas` checked before sending. */
    private readonly opts: { deliveryTimeoutMs?: number; schemas?: SchemaRegistry } = {},
  ) {
    // A handle with a config declares the queue now, as the embedded one does. Every request of
    // this handle carries the config too, so a declaration that fails here (connection lost,
    // invalid config) is reported by the handle's next operation, and this one is not awaited.
    if (config !== undefined) this.transport.request(Op.QueueAdmin, { ...this.meta(), action: "declare" }, null, { retry: true }).catch(() => {});
  }

  private meta(): { queue: string; config?: QueueConfig } {
    return this.config === undefined ? { queue: this.name } : { queue: this.name, config: this.config };
  }

  async enqueue(data: T & PublishValue, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const { signal, transaction, ...rest } = opts;
    const [r] = await this.enqueueBatch([{ ...rest, data }], transaction === undefined ? { signal } : { signal, transaction });
    return r;
  }

  enqueueBatch(items: EnqueueItem[], opts: EnqueueBatchOptions = {}): Promise<EnqueueResult[]> {
    if (opts.transaction !== undefined) return Promise.reject(notOverTheNetwork());
    // One PRODUCER span per call when tracing is on (src/observability/tracing.ts).
    if (tracing !== null && Array.isArray(items)) return tracing.enqueue(this.name, items, (its) => this.sendBatch(its, opts));
    return this.sendBatch(items, opts);
  }

  private async sendBatch(items: EnqueueItem[], opts: { signal?: AbortSignal }): Promise<EnqueueResult[]> {
    if (!Array.isArray(items)) throw new ValidationError("enqueueBatch needs an array");
    if (opts.signal?.aborted) throw new AbortedError("enqueue aborted before it was sent; nothing was stored", opts.signal.reason);
    if (items.length === 0) return [];
    // A batch with one invalid job is refused whole, before anything is sent.
    if (this.opts.schemas) for (const it of items) this.opts.schemas.validate("queue", this.name, it?.data, it?.headers);
    const enq = enqueuerFor(this.transport);
    await enq.room(items.length, opts.signal);
    let body: Buffer;
    let itemOpts: Record<string, unknown>[] | undefined;
    try {
      // Encoded now: a value that cannot be encoded fails this call alone, before it shares a request.
      body = encodePublishRecords(items.map((it) => ({ value: it.data, headers: it.headers })));
      // Per-job options travel as JSON, and only when some job has any.
      if (items.some(hasItemOptions)) itemOpts = items.map(wireItemOptions);
    } catch (e) {
      enq.abandon(items.length);
      throw e;
    }
    const meta = this.meta();
    return new Promise<EnqueueResult[]>((resolve, reject) =>
      enq.submit({
        body,
        count: items.length,
        opts: itemOpts,
        meta,
        configKey: this.config === undefined ? "" : JSON.stringify(this.config),
        started: Date.now(),
        deliveryTimeoutMs: this.opts.deliveryTimeoutMs ?? ENQUEUE_DELIVERY_TIMEOUT_MS,
        resolve,
        reject,
        signal: opts.signal,
      }),
    );
  }

  /** One QUEUE_ENQUEUE call of the flow's jobs (one append on the server: FLOW-1). */
  async enqueueFlow(flow: FlowJob, opts: EnqueueBatchOptions = {}): Promise<FlowResult> {
    const items = flattenFlow(flow);
    return flowResult(items, await this.enqueueBatch(items, opts));
  }

  work(opts: WorkOptions = {}): Worker<T> {
    return new RemoteWorker<T>(this.transport, this.workers, this.meta(), opts);
  }

  process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts: ProcessOptions = {}): Promise<void> {
    try {
      const { work, signal } = processWorkerOptions(opts);
      // Push mode: `prefetch = concurrency` bounds running handlers (the server sends a job only
      // in place of a settled one). Shutdown semantics: src/queues/process.ts (PROC-1).
      return runProcess(new RemoteWorker<T>(this.transport, this.workers, this.meta(), work), tracing === null ? fn : tracing.jobHandler(this.name, fn), signal);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  private async admin<R>(action: string, key: string, opts?: unknown): Promise<R> {
    const f = await this.transport.request(Op.QueueAdmin, { ...this.meta(), action, opts }, null, { retry: action === "stats" || action === "settings" });
    return f.meta[key] as R;
  }

  stats(): Promise<QueueStats> {
    return this.admin("stats", "stats");
  }
  /** The queue's stored config, defaults filled in (QueueNotFoundError when missing); not part of `Queue`. */
  settings(): Promise<ResolvedQueueConfig> {
    return this.admin("settings", "settings");
  }
  purge(): Promise<number> {
    return this.admin("purge", "purged");
  }
  redrive(opts: RedriveOptions = {}): Promise<RedriveResult> {
    return this.admin("redrive", "result", opts);
  }
  /** QUEUE_ADMIN `remove` (not re-sent after a reconnect: a second try would answer false). */
  async remove(id: string): Promise<boolean> {
    if (typeof id !== "string") throw new ValidationError("remove(id) needs the job's id (a string)");
    return (await this.admin<boolean>("remove", "removed", { id })) === true;
  }

  /** QUEUE_GET_JOB (a read: re-sent after a reconnect; never creates the queue). */
  async getJob(id: string): Promise<JobInfo<T> | null> {
    if (typeof id !== "string") throw new ValidationError("getJob(id) needs the job's id (a string)");
    const f = await this.transport.request(Op.QueueGetJob, { queue: this.name, id }, null, { retry: true });
    const job = f.meta.job as (JobInfo<T> & { valueKind?: number }) | null;
    if (job === null || job === undefined) return null;
    const { valueKind, ...info } = job;
    if (valueKind !== undefined) info.data = decodeJobData(valueKind, f.body) as T;
    return info;
  }

  /**
   * QUEUE_EVENTS, one long-poll per page (a read: re-sent after a reconnect, from the same
   * position, so nothing is lost or repeated); the server keeps nothing between pages.
   */
  events(opts?: QueueEventsOptions): QueueEvents {
    return new QueueEventStream(async (from, max, maxWaitMs, signal) => {
      const f = await this.transport.request(Op.QueueEvents, { queue: this.name, from, max, maxWaitMs }, null, { retry: true, signal, extraTimeoutMs: maxWaitMs });
      return { events: (f.meta.events ?? []) as QueueEvent[], position: String(f.meta.position) };
    }, opts);
  }

  /** QUEUE_SCHEDULE upsert (idempotent: re-sent after a reconnect). Data and headers travel as one publish record. */
  async upsertSchedule(name: string, opts: ScheduleOptions<T & PublishValue>): Promise<ScheduleInfo<T>> {
    if (opts === null || typeof opts !== "object") throw new ValidationError("upsertSchedule needs options { cron | everyMs, ... }");
    if (this.opts.schemas) this.opts.schemas.validate("queue", this.name, opts.data ?? null, opts.headers);
    const { data, headers, ...rest } = opts;
    const body = encodePublishRecords([{ value: (data ?? null) as PublishValue, headers }]);
    const [info] = await this.schedules("upsert", { name, opts: rest }, body);
    return info;
  }

  /** QUEUE_SCHEDULE list (a read). */
  listSchedules(): Promise<ScheduleInfo<T>[]> {
    return this.schedules("list", {}, null);
  }

  async pauseSchedule(name: string): Promise<void> {
    await this.transport.request(Op.QueueSchedule, { ...this.meta(), action: "pause", name }, null, { retry: true });
  }

  async resumeSchedule(name: string): Promise<void> {
    await this.transport.request(Op.QueueSchedule, { ...this.meta(), action: "resume", name }, null, { retry: true });
  }

  async removeSchedule(name: string): Promise<boolean> {
    const f = await this.transport.request(Op.QueueSchedule, { ...this.meta(), action: "remove", name }, null, { retry: true });
    return f.meta.removed === true;
  }

  private async schedules(action: string, extra: Record<string, unknown>, body: Buffer | null): Promise<ScheduleInfo<T>[]> {
    const f = await this.transport.request(Op.QueueSchedule, { ...this.meta(), action, ...extra }, body, { retry: true });
    const metas = (f.meta.schedules ?? []) as Omit<ScheduleInfo<T>, "data" | "headers">[];
    const recs = f.body === null || metas.length === 0 ? [] : decodePublishRecords(f.body, metas.length, true);
    if (recs.length !== metas.length) throw new ProtocolError(`QUEUE_SCHEDULE: ${metas.length} schedules but ${recs.length} records`);
    return metas.map((m, i) => ({ ...m, data: recs[i].value as T, headers: readableHeaders(Object.entries(recs[i].headers ?? {})) }));
  }

  /** QUEUE_BROWSE (a read: re-sent after a reconnect; never leases, never creates the queue). */
  async browse(opts: BrowseOptions = {}): Promise<BrowsePage<T>> {
    const req = browseRequest(opts);
    const f = await this.transport.request(Op.QueueBrowse, { queue: this.name, limit: req.limit, after: req.after, state: req.state }, null, { retry: true });
    const metas = (f.meta.jobs ?? []) as Omit<BrowsedJob<T>, "data" | "headers">[];
    const recs = f.body === null || metas.length === 0 ? [] : decodePublishRecords(f.body, metas.length, true);
    if (recs.length !== metas.length) throw new ProtocolError(`QUEUE_BROWSE: ${metas.length} jobs but ${recs.length} records`);
    const jobs = metas.map((m, i) => ({ ...m, data: recs[i].value as T, headers: readableHeaders(Object.entries(recs[i].headers ?? {})) }));
    return { jobs, next: (f.meta.next as string | null) ?? null };
  }
}
