// SPDX-License-Identifier: Apache-2.0
/**
 * A queue handle of an embedded principal view (`view.queue(name, config?)`,
 * src/broker/principal-view.ts): every call is checked against QUEUE_NEEDS before it reaches
 * the broker's queue, and the workers, event readers and jobs it hands out check too (ACL-5).
 *
 * A handle with a config declares the queue, as the broker's and a client's handles do, but
 * only once the principal may create it (and its dead-letter queue): until then its calls run
 * on a handle that declares nothing, so a refused declaration creates nothing.
 */
import type { HostQueue } from "../queues/host-api.js";
import type {
  BrowseOptions,
  BrowsePage,
  EnqueueBatchOptions,
  EnqueueItem,
  EnqueueOptions,
  EnqueueResult,
  FlowJob,
  FlowResult,
  Job,
  JobInfo,
  ProcessOptions,
  Queue,
  QueueConfig,
  QueueEvents,
  QueueEventsOptions,
  QueueStats,
  RedriveOptions,
  RedriveResult,
  ScheduleInfo,
  ScheduleOptions,
  WorkOptions,
  Worker,
} from "../queues/types.js";
import type { PublishValue } from "../types.js";
import type { Need } from "../security/acl/model.js";
import { NEEDS } from "../security/acl/needs.js";
import { ForbiddenError } from "../errors.js";
import { LIVE_NEEDS, QUEUE_NEEDS, type QueueRef } from "./principal-needs.js";
import { GuardedEvents, GuardedWorker, guardJob, type ViewContext } from "./principal-handles.js";

/** Opens the broker's own handle on a queue (`EmbeddedBroker.queue`). */
export type OpenQueue = <T>(name: string, config: QueueConfig | undefined) => HostQueue<T>;

export class GuardedQueue<T = unknown> implements Queue<T> {
  private plain: HostQueue<T> | null = null;
  private declared: HostQueue<T> | null = null;
  private readonly ref: QueueRef;

  constructor(
    private readonly ctx: ViewContext,
    readonly name: string,
    private readonly config: QueueConfig | undefined,
    private readonly openQueue: OpenQueue,
  ) {
    this.ref = { name, config };
    // Declared now, as the broker's handle is; a refusal is reported by the calls that need it.
    if (config !== undefined) ctx.run(() => NEEDS.declareQueue(name, config), async () => void this.handle()).catch(() => {});
  }

  /** The broker's handle to run an allowed call on (see the file comment). */
  private handle(): HostQueue<T> {
    if (this.config !== undefined && this.ctx.allows(NEEDS.declareQueue(this.name, this.config))) return (this.declared ??= this.openQueue<T>(this.name, this.config));
    return (this.plain ??= this.openQueue<T>(this.name, undefined));
  }

  private run<R>(needs: () => readonly Need[], op: (q: HostQueue<T>) => Promise<R>): Promise<R> {
    return this.ctx.run(needs, () => op(this.handle()));
  }

  enqueue(data: T & PublishValue, opts?: EnqueueOptions): Promise<EnqueueResult> {
    return this.run(() => QUEUE_NEEDS.enqueue(this.ref, data, opts), (q) => q.enqueue(data, opts));
  }

  enqueueBatch(items: EnqueueItem[], opts?: EnqueueBatchOptions): Promise<EnqueueResult[]> {
    return this.run(() => QUEUE_NEEDS.enqueueBatch(this.ref, items, opts), (q) => q.enqueueBatch(items, opts));
  }

  enqueueFlow(flow: FlowJob, opts?: EnqueueBatchOptions): Promise<FlowResult> {
    return this.run(() => QUEUE_NEEDS.enqueueFlow(this.ref, flow, opts), (q) => q.enqueueFlow(flow, opts));
  }

  private readonly checkSettle = (): void => this.ctx.checkNow(NEEDS.settle(this.name));

  work(opts?: WorkOptions): Worker<T> {
    return new GuardedWorker<T>(
      this.ctx,
      this.name,
      () => QUEUE_NEEDS.work(this.ref, opts),
      () => LIVE_NEEDS.worker(this.name),
      () => NEEDS.settle(this.name),
      () => this.handle().work(opts),
    );
  }

  /**
   * The broker's `process()` with each job checked on settling; ends with ForbiddenError when
   * a policy change no longer allows consuming (its handlers finish first, PROC-1).
   */
  process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts: ProcessOptions = {}): Promise<void> {
    return this.run(
      () => QUEUE_NEEDS.process(this.ref, anyHandler, opts),
      async (q) => {
        const ac = new AbortController();
        const ended: { reason: Error | null } = { reason: null };
        const untrack = this.ctx.track({
          reauthorize: () => {
            if (ended.reason !== null || this.ctx.allows(LIVE_NEEDS.worker(this.name))) return;
            ended.reason = new ForbiddenError(`not allowed any more: consume queue ${this.name} (the authorization policy changed)`);
            ac.abort(ended.reason);
          },
          close: async () => ac.abort(),
        });
        try {
          const signal = opts.signal === undefined ? ac.signal : AbortSignal.any([opts.signal, ac.signal]);
          await q.process((job) => fn(guardJob(job, this.checkSettle)), { ...opts, signal });
        } finally {
          untrack();
        }
        if (ended.reason !== null) throw ended.reason;
      },
    );
  }

  stats(): Promise<QueueStats> {
    return this.run(() => QUEUE_NEEDS.stats(this.ref), (q) => q.stats());
  }

  purge(): Promise<number> {
    return this.run(() => QUEUE_NEEDS.purge(this.ref), (q) => q.purge());
  }

  remove(id: string): Promise<boolean> {
    return this.run(() => QUEUE_NEEDS.remove(this.ref, id), (q) => q.remove(id));
  }

  redrive(opts?: RedriveOptions): Promise<RedriveResult> {
    return this.run(() => QUEUE_NEEDS.redrive(this.ref, opts), (q) => q.redrive(opts));
  }

  getJob(id: string): Promise<JobInfo<T> | null> {
    return this.run(() => QUEUE_NEEDS.getJob(this.ref, id), (q) => q.getJob(id));
  }

  browse(opts?: BrowseOptions): Promise<BrowsePage<T>> {
    return this.run(() => QUEUE_NEEDS.browse(this.ref, opts), (q) => q.browse(opts));
  }

  events(opts?: QueueEventsOptions): QueueEvents {
    return new GuardedEvents(
      this.ctx,
      this.name,
      () => QUEUE_NEEDS.events(this.ref, opts),
      () => LIVE_NEEDS.events(this.name),
      () => this.handle().events(opts),
    );
  }

  upsertSchedule(name: string, opts: ScheduleOptions<T & PublishValue>): Promise<ScheduleInfo<T>> {
    return this.run(() => QUEUE_NEEDS.upsertSchedule(this.ref, name, opts), (q) => q.upsertSchedule(name, opts));
  }

  listSchedules(): Promise<ScheduleInfo<T>[]> {
    return this.run(() => QUEUE_NEEDS.listSchedules(this.ref), (q) => q.listSchedules());
  }

  pauseSchedule(name: string): Promise<void> {
    return this.run(() => QUEUE_NEEDS.pauseSchedule(this.ref, name), (q) => q.pauseSchedule(name));
  }

  resumeSchedule(name: string): Promise<void> {
    return this.run(() => QUEUE_NEEDS.resumeSchedule(this.ref, name), (q) => q.resumeSchedule(name));
  }

  removeSchedule(name: string): Promise<boolean> {
    return this.run(() => QUEUE_NEEDS.removeSchedule(this.ref, name), (q) => q.removeSchedule(name));
  }
}

/** The needs of `process()` do not depend on its handler. */
const anyHandler = (): undefined => undefined;
