// SPDX-License-Identifier: Apache-2.0
/**
 * The queue half of CountingEngine (src/testing/counting-engine.ts): a QueueStore that counts
 * every call (as `queues.<method>`) and delegates to another engine's queue store, wrapping each
 * opened queue the same way. The inner store's own moves between queues (dead-letter copies,
 * redrives) reach other queues through `OpenQueueRequest.peer`, which the policy layer answers
 * with these wrapped queues, so they are counted too.
 */
import type { AttemptRecord, QueueStats, RedriveOptions, RedriveResult } from "../queues/types.js";
import type {
  EnqueueOutcome,
  EnqueueRequestOptions,
  GrantedJob,
  GrantRequest,
  Lease,
  NewJob,
  OpenQueueRequest,
  QueueListener,
  QueueSettings,
  QueueStore,
  TransactionalEnqueues,
  StoredBrowsePage,
  StoredBrowseRequest,
  StoredEventsPage,
  StoredEventsRequest,
  StoredJobInfo,
  StoredQueue,
} from "../store/queue-store.js";
import type { ScheduleStore } from "../store/schedule-store.js";

type Counter = <R>(name: string, fn: () => R) => R;

export class CountingQueueStore implements QueueStore {
  private readonly wrapped = new WeakMap<StoredQueue, CountingStoredQueue>();

  constructor(
    private readonly inner: QueueStore,
    private readonly count: Counter,
  ) {}

  async open(name: string, req: OpenQueueRequest): Promise<StoredQueue> {
    const q = await this.count("queues.open", () => this.inner.open(name, req));
    let w = this.wrapped.get(q);
    if (w === undefined) this.wrapped.set(q, (w = new CountingStoredQueue(q, this.count)));
    return w;
  }
  list(): Promise<string[]> {
    return this.count("queues.list", () => this.inner.list());
  }
  delete(name: string): Promise<void> {
    return this.count("queues.delete", () => this.inner.delete(name));
  }
  get transactional(): TransactionalEnqueues | undefined {
    const tr = this.inner.transactional;
    if (tr === undefined) return undefined;
    // The wrapped queue names the same incarnation: the inner store finds its own queue by it.
    return { enqueue: (tx, queue, jobs) => this.count("queues.transactional.enqueue", () => tr.enqueue(tx, queue, jobs)) };
  }
  get schedules(): ScheduleStore | undefined {
    const s = this.inner.schedules;
    if (s === undefined) return undefined;
    return {
      load: () => this.count("queues.schedules.load", () => s.load()),
      save: (all) => this.count("queues.schedules.save", () => s.save(all)),
    };
  }
}

class CountingStoredQueue implements StoredQueue {
  constructor(
    private readonly inner: StoredQueue,
    private readonly count: Counter,
  ) {}
  get name(): string {
    return this.inner.name;
  }
  get incarnation(): string {
    return this.inner.incarnation;
  }
  get settings(): QueueSettings {
    return this.inner.settings;
  }
  get hasFlows(): boolean {
    return this.inner.hasFlows;
  }
  enqueue(jobs: readonly NewJob[], opts?: EnqueueRequestOptions): Promise<EnqueueOutcome> {
    return this.count("queues.enqueue", () => this.inner.enqueue(jobs, opts));
  }
  grant(requests: readonly GrantRequest[]): Promise<GrantedJob[][]> {
    return this.count("queues.grant", () => this.inner.grant(requests));
  }
  ack(lease: Lease, result?: string): Promise<void> {
    return this.count("queues.ack", () => this.inner.ack(lease, result));
  }
  retry(lease: Lease, visibleAt: number, failure: AttemptRecord): Promise<void> {
    return this.count("queues.retry", () => this.inner.retry(lease, visibleAt, failure));
  }
  deadLetter(lease: Lease, failure: AttemptRecord): Promise<void> {
    return this.count("queues.deadLetter", () => this.inner.deadLetter(lease, failure));
  }
  extend(lease: Lease, ms: number): Promise<void> {
    return this.count("queues.extend", () => this.inner.extend(lease, ms));
  }
  giveBack(lease: Lease, visibleAt: number): Promise<void> {
    return this.count("queues.giveBack", () => this.inner.giveBack(lease, visibleAt));
  }
  progress(lease: Lease, json: string): Promise<void> {
    return this.count("queues.progress", () => this.inner.progress(lease, json));
  }
  readEvents(req: StoredEventsRequest): Promise<StoredEventsPage> {
    return this.count("queues.readEvents", () => this.inner.readEvents(req));
  }
  release(lease: Lease, counted: boolean): void {
    this.count("queues.release", () => this.inner.release(lease, counted));
  }
  restartLease(lease: Lease): void {
    this.count("queues.restartLease", () => this.inner.restartLease(lease));
  }
  stats(): Promise<QueueStats> {
    return this.count("queues.stats", () => this.inner.stats());
  }
  getJob(id: string): Promise<StoredJobInfo | null> {
    return this.count("queues.getJob", () => this.inner.getJob(id));
  }
  browse(req: StoredBrowseRequest): Promise<StoredBrowsePage> {
    return this.count("queues.browse", () => this.inner.browse(req));
  }
  remove(id: string): Promise<boolean> {
    return this.count("queues.remove", () => this.inner.remove(id));
  }
  purge(): Promise<number> {
    return this.count("queues.purge", () => this.inner.purge());
  }
  redrive(opts: RedriveOptions): Promise<RedriveResult> {
    return this.count("queues.redrive", () => this.inner.redrive(opts));
  }
  listen(listener: QueueListener): () => void {
    return this.count("queues.listen", () => this.inner.listen(listener));
  }
  whenIdle(): Promise<void> {
    return this.count("queues.whenIdle", () => this.inner.whenIdle());
  }
}
