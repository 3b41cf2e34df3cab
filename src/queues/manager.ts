// SPDX-License-Identifier: Apache-2.0
/**
 * QueueManager: the queues of a broker, on any engine's queue store (`StorageEngine.queues`,
 * src/store/queue-store.ts), reached only through that interface. It keeps one QueueRuntime
 * (policy: workers, dispatch, the failure rules) per open queue, and hands out `Queue<T>`
 * handles (`EmbeddedQueue`) that open their queue lazily.
 */
import { BrokerClosedError, QueueNotFoundError, StorageError, ValidationError } from "../errors.js";
import { NO_AUDIT, type Auditor } from "../security/audit/auditor.js";
import type { AuditActor, AuditDetails } from "../security/audit/record.js";
import { silentLogger, systemClock, type Clock, type Logger } from "../observability/telemetry.js";
import { tracing } from "../observability/tracing.js";
import { Scheduler } from "./schedules/scheduler.js";
import type { EnqueueOutcome, QueueSettings, QueueStore, StoredQueue, TransactionalEnqueues } from "../store/queue-store.js";
import { MAX_BATCH_ITEMS, resolveQueueConfig, validateQueueName } from "./config.js";
import type { EnqueueCallsOutcome, HostQueue, PushWorker, PushWorkerOptions, QueueHostApi, RawEnqueueItem } from "./host-api.js";
import type { EnqueueIdentity } from "./idempotence.js";
import { checkFlowShape, prepareItem, prepareRaw } from "./prepare.js";
import { flattenFlow, flowResult } from "./flows.js";
import { processWorkerOptions, runProcess } from "./process.js";
import { browseRequest, toBrowsedJob, toJobInfo } from "./results.js";
import { eventsBounds, QueueEventStream, type EventsPage } from "./events.js";
import { QueueRuntime } from "./runtime.js";
import { QueueWorker } from "./worker.js";
import { TurnYield } from "../turn-yield.js";

/** `stats()` completes without waiting for I/O: a polling loop over it must still yield (turn-yield.ts). */
const statsYield = new TurnYield();
import type { BrowseOptions, BrowsePage, EnqueueBatchOptions, EnqueueItem, EnqueueOptions, EnqueueResult, FlowJob, FlowResult, Job, JobInfo, ProcessOptions, QueueConfig, QueueEvents, QueueEventsOptions, QueueStats, RedriveOptions, RedriveResult, ScheduleInfo, ScheduleOptions, WorkOptions, Worker } from "./types.js";
import type { PublishValue } from "../value-types.js";
import type { NewJob } from "../store/queue-store.js";
import type { SchemaRegistry } from "../contracts/schemas.js";

export interface QueueManagerOptions {
  /** The engine's queue store. */
  store: QueueStore;
  /** Randomness for backoff jitter (tests). */
  random?: () => number;
  clock?: Clock;
  /** Schemas per queue: enqueues are validated before anything is stored. */
  schemas?: SchemaRegistry;
  logger?: Logger;
  /** Audits queue creation, config changes, purges, removals and redrives (AUD-1). Default: none. */
  auditor?: Auditor;
  /** The engine's name, for errors about what it cannot do ("disk", ...). */
  engineKind?: string;
}

export class QueueManager implements QueueHostApi {
  private readonly store: QueueStore;
  private readonly random: () => number;
  private readonly clock: Clock;
  private readonly runtimes = new Map<string, Promise<QueueRuntime>>();
  private closed = false;
  private readonly logger: Logger;
  /** @internal What the handles' administrative operations are audited through. */
  readonly auditor: Auditor;

  constructor(opts: QueueManagerOptions) {
    this.store = opts.store;
    this.logger = opts.logger ?? silentLogger;
    this.auditor = opts.auditor ?? NO_AUDIT;
    this.random = opts.random ?? Math.random;
    this.clock = opts.clock ?? systemClock;
    this.schemas = opts.schemas ?? null;
    this.engineKind = opts.engineKind ?? "configured";
    const sched = opts.store.schedules;
    this.scheduler =
      sched === undefined
        ? null
        : new Scheduler(sched, { enqueueTicks: (q, make) => this.enqueueTicks(q, make) }, this.clock, opts.logger ?? silentLogger);
  }

  /** @internal The job schedules of every queue (null: the engine keeps none). */
  readonly scheduler: Scheduler | null;

  /** Loads the stored schedules and starts their timer (openBroker calls it once). */
  async startSchedules(run = true): Promise<void> {
    await this.scheduler?.start(run);
  }

  /** A schedule's tick jobs, through the queue's store like any enqueue (created when missing). */
  private async enqueueTicks(queue: string, make: (maxMessageBytes: number, now: number) => NewJob[]): Promise<void> {
    const rt = await this.runtime(queue);
    await rt.stored.enqueue(make(rt.settings.maxMessageBytes, rt.now()));
  }

  /** @internal Schemas per queue, checked by every enqueue of this process. */
  readonly schemas: SchemaRegistry | null;
  private readonly engineKind: string;

  /**
   * @internal The store's capability for `opts.transaction`, or the ValidationError saying why
   * not (checked before the queue is opened: a refused call creates nothing).
   */
  transactionalEnqueues(opts: EnqueueBatchOptions): TransactionalEnqueues {
    const cap = this.store.transactional;
    if (cap === undefined) throw new ValidationError(`enqueueing inside a transaction needs the PostgreSQL engine (openBroker({ engine: postgresEngine(...) })); this broker runs on the ${this.engineKind} engine`);
    const tx = opts.transaction as { query?: unknown } | null;
    if (tx === null || typeof tx !== "object" || typeof tx.query !== "function") throw new ValidationError("transaction must be the application's database client (a pg Client or PoolClient) after BEGIN");
    // A blocked enqueue would wait for room holding the queue's lock in the caller's
    // transaction, and only settlements, which need that lock, free room: it never waits.
    if (opts.signal !== undefined)
      throw new ValidationError("an enqueue inside a transaction takes no signal: it never waits for room (a full queue rejects it at once with QueueFullError), so there is nothing to abort");
    return cap;
  }

  /**
   * Returns a handle. With `config` the queue is declared: validated now (ValidationError),
   * then created if missing and its config stored at once, in the background (a storage
   * failure surfaces at the handle's first operation). Without `config` nothing is created
   * until the first write (enqueue, work, process); reads (stats, purge, redrive, getJob, browse) of a
   * queue that does not exist create nothing.
   */
  queue<T = unknown>(name: string, config?: QueueConfig, actor?: AuditActor): EmbeddedQueue<T> {
    validateQueueName(name);
    if (config !== undefined) resolveQueueConfig(name, config);
    if (this.closed) throw new BrokerClosedError();
    return new EmbeddedQueue<T>(this, name, config, actor);
  }

  /**
   * @internal The runtime of `name`'s current incarnation (opening, or creating, it). `actor`:
   * who is audited when this creates the queue or replaces its config.
   */
  runtime(name: string, config?: QueueConfig, implicit = false, actor?: AuditActor, encrypted = false): Promise<QueueRuntime> {
    if (this.closed) return Promise.reject(new BrokerClosedError());
    const cached = this.runtimes.get(name);
    if (cached !== undefined && config === undefined) return cached;
    const seen: { change: "create" | "alter" | null } = { change: null };
    const opened = this.audited(
      this.store.open(name, {
        config,
        implicit,
        encrypted,
        settings: (c) => resolveQueueConfig(name, c),
        peer: (n) => this.peer(n),
        changed: (k) => (seen.change = k),
      }),
      { name, config, implicit, actor },
      () => seen.change,
    );
    const p: Promise<QueueRuntime> =
      cached !== undefined
        ? opened.then(() => cached)
        : opened.then(async (stored) => {
            const rt = new QueueRuntime(stored, this.random, () => this.clock.now());
            // A queue's dead-letter queue exists with it: its stats (and alerts on its depth)
            // read 0 before the first failure instead of "not found".
            const dl = rt.settings.deadLetter;
            // ENC-1: an encrypted queue's dead letters go to an encrypted queue.
            if (!implicit && dl !== null) await this.runtime(dl, undefined, true, actor, rt.settings.encrypted === true);
            return rt;
          });
    this.runtimes.set(name, p);
    p.catch(() => {
      if (this.runtimes.get(name) === p) this.runtimes.delete(name);
    });
    return p;
  }

  /**
   * An open that created the queue or replaced its config resolves only once that is in the
   * audit log (AUD-1); a declaration (with a config) that failed is recorded too.
   */
  private async audited(
    opened: Promise<StoredQueue>,
    o: { name: string; config: QueueConfig | undefined; implicit: boolean; actor: AuditActor | undefined },
    change: () => "create" | "alter" | null,
  ): Promise<StoredQueue> {
    const target = { resourceType: "queue" as const, resource: o.name };
    let stored: StoredQueue;
    try {
      stored = await opened;
    } catch (e) {
      if (o.config !== undefined) {
        try {
          await this.auditor.record(o.actor, { ...target, op: "queue.declare" }, e);
        } catch (err) {
          this.logger.error({ err, queue: o.name }, "audit record of a failed queue declaration not written");
          throw new StorageError(`queue.declare ${o.name} failed, and its audit record could not be written`, e);
        }
      }
      throw e;
    }
    const k = change();
    if (k !== null) {
      const details: AuditDetails | undefined = o.implicit ? { implicit: true } : o.config === undefined ? undefined : { config: JSON.stringify(o.config) };
      try {
        await this.auditor.record(o.actor, { ...target, op: `queue.${k}`, details });
      } catch (err) {
        throw new StorageError(`queue.${k} ${o.name} took effect, but its audit record could not be written`, err);
      }
    }
    return stored;
  }

  /** @internal The runtime of `name` if the queue exists (opened, never created), else null. */
  async existingRuntime(name: string): Promise<QueueRuntime | null> {
    if (this.closed) throw new BrokerClosedError();
    if (!this.runtimes.has(name) && !(await this.store.list()).includes(name)) return null;
    return this.runtime(name);
  }

  /** Dead-letter and redrive targets, for the engine's moves (created implicitly). */
  private async peer(name: string): Promise<StoredQueue> {
    return (await this.runtime(name, undefined, true)).stored;
  }

  /** @internal */
  schedulerOrThrow(): Scheduler {
    if (this.closed) throw new BrokerClosedError();
    if (this.scheduler === null) throw new ValidationError("this storage engine keeps no job schedules");
    return this.scheduler;
  }

  listQueues(): Promise<string[]> {
    return this.store.list();
  }

  /** Durably deletes the queue and all its jobs. Open handles re-create it (empty) on next use. */
  async deleteQueue(name: string): Promise<void> {
    validateQueueName(name);
    // Its schedules first: a tick after the delete would create the queue again.
    await this.scheduler?.removeQueue(name);
    const rt = this.runtimes.get(name);
    this.runtimes.delete(name);
    (await rt?.catch(() => null))?.detach(new BrokerClosedError(`queue ${name} was deleted`));
    await this.store.delete(name);
  }

  /** Ends every worker (BrokerClosedError); the engine closes the queues themselves. */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.scheduler?.close();
    this.closed = true;
    const rts = [...this.runtimes.values()];
    this.runtimes.clear();
    for (const p of rts) (await p.catch(() => null))?.detach(new BrokerClosedError("the broker is closing"));
  }
}

/** The embedded `Queue<T>`: a thin handle resolving its runtime lazily. */
export class EmbeddedQueue<T> implements HostQueue<T> {
  /** The declaration with `config` while pending (null once stored, or when there is no config). */
  private declared: Promise<QueueRuntime> | null = null;
  private configStored: boolean;
  constructor(
    private readonly mgr: QueueManager,
    readonly name: string,
    private readonly config: QueueConfig | undefined,
    /** Who this handle's administrative operations are audited as (AUD-1). */
    private readonly actor: AuditActor | undefined = undefined,
  ) {
    this.configStored = config === undefined;
    // A declared queue exists, with its config, from now on: not from its first operation.
    if (config !== undefined) this.declared = this.declare();
  }

  private declare(): Promise<QueueRuntime> {
    const p = this.mgr.runtime(this.name, this.config, false, this.actor);
    // Handled here so that a handle never used cannot raise an unhandled rejection; a failed
    // declaration is tried again by the next operation, which reports its error.
    p.then(
      () => {
        this.configStored = true;
        this.declared = null;
      },
      () => {
        if (this.declared === p) this.declared = null;
      },
    );
    return p;
  }

  private runtime(): Promise<QueueRuntime> {
    if (this.configStored) return this.mgr.runtime(this.name, undefined, false, this.actor);
    return this.declared ?? (this.declared = this.declare());
  }

  /** For reads: the runtime if the queue exists (or this handle declared it), never creating one. */
  private async existing(): Promise<QueueRuntime> {
    if (this.config !== undefined) return this.runtime();
    const rt = await this.mgr.existingRuntime(this.name);
    if (rt === null) throw new QueueNotFoundError(this.name);
    return rt;
  }

  async enqueue(data: T & PublishValue, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const { signal, transaction, ...item } = opts;
    const [r] = await this.enqueueBatch([{ ...item, data }], transaction === undefined ? { signal } : { signal, transaction });
    return r;
  }

  enqueueBatch(items: EnqueueItem[], opts: EnqueueBatchOptions = {}): Promise<EnqueueResult[]> {
    // One PRODUCER span per call when tracing is on (src/observability/tracing.ts).
    if (tracing !== null && Array.isArray(items)) return tracing.enqueue(this.name, items, (its) => this.storeBatch(its, opts));
    return this.storeBatch(items, opts);
  }

  private async storeBatch(items: EnqueueItem[], opts: EnqueueBatchOptions): Promise<EnqueueResult[]> {
    if (!Array.isArray(items)) throw new ValidationError("enqueueBatch needs an array");
    if (items.length > MAX_BATCH_ITEMS) throw new ValidationError(`at most ${MAX_BATCH_ITEMS} jobs per batch`);
    // On a job it would be ignored, and the job committed outside the caller's transaction.
    if (items.some((it) => typeof it === "object" && it !== null && "transaction" in it)) throw new ValidationError("transaction is an option of the call (enqueueBatch(jobs, { transaction })), not of a job");
    const inTx = opts.transaction === undefined ? null : this.mgr.transactionalEnqueues(opts);
    // A batch with one invalid job is refused whole, before anything is stored.
    if (this.mgr.schemas !== null) for (const it of items) this.mgr.schemas.validate("queue", this.name, it?.data, it?.headers);
    const rt = await this.runtime();
    const max = rt.settings.maxMessageBytes;
    const now = rt.now();
    const jobs = items.map((it) => prepareItem(it, max, rt.settings.dedupeWindowMs, now));
    checkFlowShape(jobs);
    if (inTx !== null) return results(await inTx.enqueue(opts.transaction!, rt.stored, jobs));
    return results(await rt.stored.enqueue(jobs, { signal: opts.signal }));
  }

  async enqueueFlow(flow: FlowJob, opts: EnqueueBatchOptions = {}): Promise<FlowResult> {
    const items = flattenFlow(flow);
    return flowResult(items, await this.enqueueBatch(items, opts));
  }

  async enqueueCalls(items: readonly RawEnqueueItem[], calls: readonly number[] | undefined, opts: { signal?: AbortSignal; identity?: EnqueueIdentity }): Promise<EnqueueCallsOutcome> {
    const counts = calls ?? [items.length];
    let total = 0;
    for (const c of counts) {
      if (!Number.isSafeInteger(c) || c < 0) throw new ValidationError("calls must be job counts");
      total += c;
    }
    if (total !== items.length) throw new ValidationError(`calls count ${total} jobs, the request has ${items.length}`);
    if (items.length > MAX_BATCH_ITEMS) throw new ValidationError(`at most ${MAX_BATCH_ITEMS} jobs per batch`);
    const rt = await this.runtime();
    const max = rt.settings.maxMessageBytes;
    const now = rt.now();
    const jobs: NewJob[] = [];
    const errors: [number, unknown][] = [];
    /** Per call: index of its first job in `jobs`, or -1 when it failed. */
    const starts: number[] = new Array(counts.length);
    let i = 0;
    for (let c = 0; c < counts.length; c++) {
      const from = jobs.length;
      try {
        for (let k = 0; k < counts[c]; k++) {
          const it = items[i + k];
          jobs.push(prepareRaw(it.value, it.valueKind, it.opts, max, rt.settings.dedupeWindowMs, now));
        }
        checkFlowShape(jobs, from);
        starts[c] = from;
      } catch (e) {
        if (calls === undefined) throw e;
        jobs.length = from;
        starts[c] = -1;
        errors.push([c, e]);
      }
      i += counts[c];
    }
    const r: EnqueueOutcome = jobs.length === 0 ? [] : await rt.stored.enqueue(jobs, { signal: opts.signal, identity: opts.identity, compact: true });
    if (errors.length === 0 && !Array.isArray(r)) return r;
    const stored = results(r);
    const out: (EnqueueResult | null)[] = new Array(items.length).fill(null);
    i = 0;
    for (let c = 0; c < counts.length; c++) {
      if (starts[c] >= 0) for (let k = 0; k < counts[c]; k++) out[i + k] = stored[starts[c] + k];
      i += counts[c];
    }
    return { results: out, errors };
  }

  work(opts: WorkOptions = {}): Worker<T> {
    return new QueueWorker<T>(this.runtime(), opts);
  }

  pushWorker(opts: PushWorkerOptions): PushWorker {
    return new QueueWorker<unknown>(this.runtime(), opts);
  }

  process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts: ProcessOptions = {}): Promise<void> {
    try {
      const { work, signal } = processWorkerOptions(opts);
      return runProcess(new QueueWorker<T>(this.runtime(), work), tracing === null ? fn : tracing.jobHandler(this.name, fn), signal);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  async stats(): Promise<QueueStats> {
    const y = statsYield.turn();
    if (y !== null) await y;
    return (await this.existing()).stored.stats();
  }

  purge(): Promise<number> {
    const target = { op: "queue.purge", resourceType: "queue" as const, resource: this.name };
    return this.mgr.auditor.run(this.actor, target, async () => (await this.existing()).stored.purge(), (purged) => ({ purged }));
  }

  remove(id: string): Promise<boolean> {
    const target = { op: "queue.remove", resourceType: "queue" as const, resource: this.name, details: { id: typeof id === "string" ? id : null } };
    return this.mgr.auditor.run(this.actor, target, async () => {
      if (typeof id !== "string") throw new ValidationError("remove(id) needs the job's id (a string)");
      return (await this.existing()).stored.remove(id);
    }, (removed) => ({ removed }));
  }

  redrive(opts: RedriveOptions = {}): Promise<RedriveResult> {
    const target = { op: "queue.redrive", resourceType: "queue" as const, resource: this.name, details: redriveDetails(opts) };
    return this.mgr.auditor.run(this.actor, target, async () => {
      if (opts.target !== undefined) validateQueueName(opts.target);
      // Targets are opened by the engine through `peer` (created implicitly when missing).
      return (await this.existing()).stored.redrive(opts);
    }, (r) => redriveOutcome(r));
  }

  async getJob(id: string): Promise<JobInfo<T> | null> {
    if (typeof id !== "string") throw new ValidationError("getJob(id) needs the job's id (a string)");
    // A read: a queue that does not exist is not created (a declaring handle created it already).
    const rt = this.config !== undefined ? await this.runtime() : await this.mgr.existingRuntime(this.name);
    if (rt === null) return null;
    const s = await rt.stored.getJob(id);
    return s === null ? null : toJobInfo<T>(s);
  }

  async browse(opts?: BrowseOptions): Promise<BrowsePage<T>> {
    const req = browseRequest(opts);
    // A read: QueueNotFoundError for a queue that does not exist, nothing created or leased.
    const page = await (await this.existing()).stored.browse(req);
    return { jobs: page.jobs.map((j) => toBrowsedJob<T>(j)), next: page.next };
  }

  events(opts?: QueueEventsOptions): QueueEvents {
    return new QueueEventStream((from, max, maxWaitMs, signal) => this.readEvents(from, max, maxWaitMs, signal), opts);
  }

  /** One page of events after `from` (a read: QueueNotFoundError for a queue that does not exist). */
  async readEvents(from: string, max: number, maxWaitMs: number, signal?: AbortSignal): Promise<EventsPage> {
    const b = eventsBounds(max, maxWaitMs);
    return (await this.existing()).stored.readEvents({ from, max: b.max, maxWaitMs: b.maxWaitMs, signal });
  }

  /** The stored config, defaults filled in (a read: never creates the queue). Topology plans compare it. */
  async settings(): Promise<QueueSettings> {
    return structuredClone((await this.existing()).stored.settings);
  }

  async upsertSchedule(name: string, opts: ScheduleOptions<T & PublishValue>): Promise<ScheduleInfo<T>> {
    const sched = this.mgr.schedulerOrThrow();
    // The jobs it will enqueue are checked against the queue's schema now, once.
    if (this.mgr.schemas !== null) this.mgr.schemas.validate("queue", this.name, opts?.data ?? null, opts?.headers);
    // A write: the queue is created (as by enqueue), and its maxMessageBytes bounds the jobs.
    const rt = await this.runtime();
    // ENC-1: a schedule's job data lives in queues/schedules.json, which is not encrypted.
    if (rt.settings.encrypted === true) throw new ValidationError(`queue ${JSON.stringify(this.name)} is encrypted: job schedules (stored with their data in clear) are not available on it`);
    return (await sched.upsert(this.name, name, opts, rt.settings.maxMessageBytes)) as ScheduleInfo<T>;
  }

  async listSchedules(): Promise<ScheduleInfo<T>[]> {
    return (await this.mgr.schedulerOrThrow().list(this.name)) as ScheduleInfo<T>[];
  }

  pauseSchedule(name: string): Promise<void> {
    return this.mgr.schedulerOrThrow().pause(this.name, name);
  }

  resumeSchedule(name: string): Promise<void> {
    return this.mgr.schedulerOrThrow().resume(this.name, name);
  }

  removeSchedule(name: string): Promise<boolean> {
    return this.mgr.schedulerOrThrow().remove(this.name, name);
  }

  /** Waits for background recovery (resumed dead-letter moves / redrive) to finish. Embedded only. */
  async whenIdle(): Promise<void> {
    await (await this.runtime()).stored.whenIdle();
  }
}

/** One result per job from an engine's answer (`{first, count}`: consecutive new ids). */
function results(r: EnqueueOutcome): EnqueueResult[] {
  if (Array.isArray(r)) return r;
  const out = new Array<EnqueueResult>(r.count);
  for (let k = 0; k < r.count; k++) out[k] = { id: String(r.first + k), duplicate: false };
  return out;
}

/** What a redrive asked for, as audit details (small scalars only). */
function redriveDetails(o: RedriveOptions): Record<string, string | number | boolean | null> {
  const d: Record<string, string | number | boolean | null> = {};
  if (typeof o.target === "string") d.target = o.target;
  if (typeof o.limit === "number") d.limit = o.limit;
  if (o.includeRepeats === true) d.includeRepeats = true;
  if (o.filter !== undefined) d.filter = JSON.stringify(o.filter) ?? null;
  return d;
}

function redriveOutcome(r: RedriveResult): Record<string, number> {
  return { moved: r.moved, skippedRepeats: r.skippedRepeats };
}
