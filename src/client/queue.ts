// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network, client side: `broker.queue(name, config)` returns a `Queue<T>`
 * with the embedded API (enqueue, work, process, stats, purge, redrive).
 *
 * Leases belong to the connection: if it drops, the server releases this worker's in-flight
 * jobs for redelivery at once; their `signal` aborts here and settling them fails with
 * `LeaseExpiredError`. The worker then re-registers on the new connection and keeps going.
 *
 * Lookahead (docs/queues.md, "Lookahead"): besides the `prefetch` jobs it hands to application
 * code, a worker of a batch server accepts about LOOKAHEAD_MS worth of further jobs (at its
 * recent hand-out rate, at most `maxLookahead(prefetch)`), buffered here, so a free slot does not
 * wait a round trip (our settle, the server's push) for its next job. The size travels to the
 * server with the settle frames (`lookahead` in QUEUE_SETTLE_BATCH's meta); a buffered job that
 * waits longer than PARK_MAX_MS, or is still buffered when the worker stops, goes back with the
 * settle action "release" (not an attempt: application code never saw it). Their lease clock
 * runs while buffered (LEASE-1 counts from the push), at most PARK_MAX_MS of it. A connection
 * drop releases them server-side with the running jobs, attempt counted (docs/queues.md).
 *
 * Enqueues are idempotent requests (QueueEnqueuer, queue-enqueuer.ts): calls gathered into one request per
 * queue, numbered under the client's producer id, re-sent with the same number when their
 * connection drops or they time out, so a job is stored once however often it travels. The
 * `Queue<T>` handle itself is in queue-handle.ts; this file is its worker.
 */
import { AbortedError, LeaseExpiredError, ValidationError } from "../errors.js";
import { DEFAULT_MAX_PENDING_SETTLEMENTS, DEFAULT_PREFETCH, intOption, MAX_PENDING_SETTLEMENTS, MAX_PREFETCH, prefetchOption } from "../queues/config.js";
import type { ProcessWorker } from "../queues/process.js";
import { workerIterator } from "../queues/iterate.js";
import { LookaheadSizer, maxLookahead, PARK_MAX_MS } from "../queues/lookahead.js";
import type {
  ChildOutcome,
  DeadLetterInfo,
  JobInfo,
  Job,
  QueueConfig,
  WorkOptions,
  Worker,
} from "../queues/types.js";
import { Op, decodeJobBatch, decodePublishRecords, encodeSettleItems, wireToError, type Frame, type WireError } from "../wire/index.js";
import type { Transport } from "./transport.js";
import { NO_ARG, RemoteJob, type JobMeta, type SettleAction } from "./remote-job.js";

export { drainEnqueues, enqueueStats, ENQUEUE_DELIVERY_TIMEOUT_MS, MAX_WAITING_JOBS } from "./queue-enqueuer.js";

let nextWorkerId = 1;
const noop = (): void => {};

function handledRejection(e: unknown): Promise<never> {
  const p = Promise.reject(e);
  p.catch(noop);
  return p;
}

/** Settle items per QUEUE_SETTLE(_BATCH) frame: a worker holds at most MAX_PREFETCH jobs (extends may repeat). */
const MAX_SETTLES_PER_FRAME = MAX_PREFETCH;

interface PendingSettle {
  job: RemoteJob<unknown>;
  action: SettleAction;
  arg: Record<string, unknown>;
  /** An ack or nack: counted in `pendingCount` until answered. */
  counted: boolean;
  resolve(): void;
  reject(e: unknown): void;
}

export class RemoteWorker<T> implements Worker<T>, ProcessWorker<T> {
  private id = 0;
  private buffer: RemoteJob<T>[] = [];
  private waiter: (() => void) | null = null;
  private stopWaiters: (() => void)[] = [];
  private closed = false;
  private receiving = true;
  private error: Error | null = null;
  /** The server speaks the batch frames (and QUEUE_STOP drain, settle "release"). */
  private batchServer = false;
  /** The queue keeps acks' results (PUSH_JOB_BATCH `results`): only then are they sent. */
  keepsResults = false;
  /** The server takes `retryAfter` settlements (PUSH_JOB_BATCH `giveBack`); an older one does not. */
  givesBack = false;
  /** Delivered, unsettled jobs by delivery tag. */
  private readonly live = new Map<number, RemoteJob<T>>();
  /** Tags for jobs of an older server (PUSH_JOBS carries none): negative, never a server tag. */
  private localTag = 0;
  /**
   * Push mode (used by `process()`): delivered jobs go straight to this callback instead of the
   * iterator buffer; no promise per job. `prefetch` still bounds how many are unsettled.
   */
  onJob: ((job: Job<T>) => void) | null = null;
  private readonly prefetch: number;
  /** Bound on settlements sent and not yet answered (un-awaited acks), see WorkOptions. */
  private readonly maxPending: number;
  /** Jobs handed to application code and not yet settled. */
  private handedOut = 0;
  /** Acks and nacks issued and not yet answered by the server (durable or failed). */
  private pendingCount = 0;
  private settledWaiters: (() => void)[] = [];
  private drainQueued = false;
  /** Sizes the jobs accepted beyond `prefetch` (the lookahead, see the file comment). */
  private readonly lookahead: LookaheadSizer;
  /** The lookahead the server was last told (registration, then settle frames). */
  private lookaheadSent = 0;
  private parkTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly transport: Transport,
    private readonly registry: Map<number, RemoteWorker<unknown>>,
    private readonly queueMeta: { queue: string; config?: QueueConfig },
    private readonly opts: WorkOptions,
  ) {
    this.prefetch = prefetchOption(opts.prefetch, "prefetch", DEFAULT_PREFETCH);
    this.maxPending = intOption(opts.maxPendingSettlements, "maxPendingSettlements", 1, MAX_PENDING_SETTLEMENTS, DEFAULT_MAX_PENDING_SETTLEMENTS);
    this.lookahead = new LookaheadSizer(maxLookahead(this.prefetch));
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
    this.receivingServer = true;
    this.drainRequest = null;
    // A new registration starts without lookahead (the server grows it from our settle frames).
    this.lookahead.reset();
    this.lookaheadSent = 0;
    this.registry.set(id, this as RemoteWorker<unknown>);
    try {
      const f = await this.transport.request(
        Op.QueueWork,
        {
          ...this.queueMeta,
          worker: id,
          prefetch: this.prefetch,
          visibilityTimeoutMs: this.opts.visibilityTimeoutMs,
          consumerId: this.opts.consumerId,
          codeVersion: this.opts.codeVersion,
          // Also decides what a dropped connection does to this worker's leases: "nack"
          // releases them at once, "error" leaves them until lease expiry.
          onUnsettled: this.opts.onUnsettled ?? "nack",
          // Jobs as PUSH_JOB_BATCH, settlements as QUEUE_SETTLE_BATCH (binary, no JSON per job).
          batch: true,
        },
        null,
        { retry: false },
      );
      if (f.meta.batch === true) this.batchServer = true;
      // Re-registered (after a reconnect) while stopping: still no new jobs, please.
      if (!this.receiving && this.batchServer && this.id === id) void this.requestDrain();
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "CONNECTION_CLOSED" || code === "TIMEOUT") return; // re-registered on reconnect
      this.error = err instanceof Error ? err : new Error(String(err));
      this.wake();
    }
  }

  /** The connection dropped: the server released our leases, so abort every job's signal now. */
  connectionLost(): void {
    this.releaseAll(new LeaseExpiredError("lease lost: the connection to the server dropped; the job was released for redelivery"));
  }

  /** Aborts the signals of the jobs this worker holds (process() shutting down); their leases stay. */
  abortSignals(reason: Error): void {
    for (const j of this.live.values()) j.abort(reason);
  }

  private releaseAll(reason: unknown): void {
    for (const j of this.live.values()) {
      this.unhand(j);
      j.abort(reason);
    }
    this.live.clear();
    this.buffer = [];
    this.clearParkTimer();
  }

  /** The job left application code (settled, or its lease was lost). */
  private unhand(j: RemoteJob<T>): void {
    if (!j.handed) return;
    j.handed = false;
    this.handedOut--;
    if (this.buffer.length > 0) {
      this.wake();
      this.drainSoon();
    }
  }

  /** `prefetch` and `maxPendingSettlements` allow another job into application code. */
  private mayHandOut(): boolean {
    return this.handedOut < this.prefetch && this.handedOut + this.pendingCount < this.prefetch + this.maxPending;
  }

  private takeBuffered(): RemoteJob<T> | undefined {
    if (this.buffer.length === 0 || !this.mayHandOut()) return undefined;
    const j = this.buffer.shift()!;
    j.handed = true;
    this.handedOut++;
    this.lookahead.note(1);
    return j;
  }

  /**
   * Buffered jobs beyond `prefetch` (the lookahead) that waited longer than PARK_MAX_MS go back
   * without counting an attempt, oldest first (their lease clock runs), and the lookahead stays
   * off until hand-outs show a rate again: a slowed-down consumer does not sit on jobs other
   * workers could run.
   */
  private armParkTimer(): void {
    if (this.parkTimer !== null || !this.receiving || this.buffer.length === 0 || this.handedOut + this.buffer.length <= this.prefetch) return;
    const wait = Math.max(1, this.buffer[0].bufferedAt + PARK_MAX_MS - performance.now());
    this.parkTimer = setTimeout(() => {
      this.parkTimer = null;
      if (!this.receiving) return;
      const limit = performance.now() - PARK_MAX_MS;
      const excess = Math.min(this.buffer.length, this.handedOut + this.buffer.length - this.prefetch);
      let k = 0;
      while (k < excess && this.buffer[k].bufferedAt <= limit) k++;
      if (k > 0) {
        this.lookahead.reset();
        for (const j of this.buffer.splice(0, k)) void this.giveBack(j);
      }
      this.armParkTimer();
    }, wait);
    this.parkTimer.unref();
  }

  private clearParkTimer(): void {
    if (this.parkTimer !== null) clearTimeout(this.parkTimer);
    this.parkTimer = null;
  }

  /** Push mode: buffered jobs to `process()` while the bounds allow (on a microtask: no recursion). */
  private drainSoon(): void {
    if (this.drainQueued || this.onJob === null || this.buffer.length === 0) return;
    this.drainQueued = true;
    queueMicrotask(() => {
      this.drainQueued = false;
      const onJob = this.onJob;
      if (onJob === null || !this.receiving) return;
      for (let j = this.takeBuffered(); j !== undefined; j = this.takeBuffered()) onJob(j);
    });
  }

  /** A settlement was answered (durable or failed): room under `maxPendingSettlements`. */
  private settleDone(): void {
    const blocked = !this.mayHandOut();
    this.pendingCount--;
    if (this.pendingCount === 0) for (const w of this.settledWaiters.splice(0)) w();
    if (blocked && this.buffer.length > 0) {
      this.wake();
      this.drainSoon();
    }
  }

  /** Resolves once every settlement issued is answered. */
  private whenSettled(): Promise<void> {
    if (this.pendingCount === 0) return Promise.resolve();
    return new Promise((r) => this.settledWaiters.push(r));
  }

  onPush(f: Frame): void {
    if (f.meta.worker !== this.id) return;
    switch (f.op) {
      case Op.PushJobBatch: {
        this.batchServer = true;
        // Each batch says whether the queue keeps results (its config may change meanwhile).
        this.keepsResults = f.meta.results === true;
        this.givesBack = f.meta.giveBack === true;
        const id = this.id;
        const decoded = decodeJobBatch(f.body, 100_000, true);
        const jobs: RemoteJob<T>[] = new Array(decoded.length);
        for (let i = 0; i < decoded.length; i++) {
          const d = decoded[i];
          const dl = d.deadLetterJson === null ? null : (JSON.parse(d.deadLetterJson) as DeadLetterInfo);
          const job = new RemoteJob<T>(d, dl, d.data as T, d.jsonText, d.headers, this, id, d.tag);
          this.live.set(d.tag, job);
          jobs[i] = job;
        }
        this.accept(jobs);
        break;
      }
      case Op.PushJobs: {
        const metas = f.meta.jobs as (JobMeta & { deadLetter: DeadLetterInfo | null })[];
        const recs = decodePublishRecords(f.body, 100_000, true);
        const id = this.id;
        const jobs = recs.map((r, i) => {
          const headers: Record<string, Uint8Array> = {};
          for (const [k, v] of Object.entries(r.headers ?? {})) headers[k] = typeof v === "string" ? Buffer.from(v) : v;
          const tag = --this.localTag;
          const job = new RemoteJob<T>(metas[i], metas[i].deadLetter ?? null, r.value as T, undefined, headers, this, id, tag);
          this.live.set(tag, job);
          return job;
        });
        this.accept(jobs);
        break;
      }
      case Op.PushLeaseLost: {
        let j: RemoteJob<T> | undefined;
        if (typeof f.meta.tag === "number") j = this.live.get(f.meta.tag);
        else for (const x of this.live.values()) if (x.receipt === f.meta.receipt) j = x;
        if (j) {
          this.live.delete(j.tag);
          this.unhand(j);
          j.abort(new LeaseExpiredError());
          const i = this.buffer.indexOf(j);
          if (i >= 0) this.buffer.splice(i, 1);
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

  /** Hands delivered jobs to process() (push mode) or to the iterator buffer. */
  private accept(jobs: RemoteJob<T>[]): void {
    if (!this.receiving) {
      // Stopping (process() aborted): give them back at once.
      for (const j of jobs) this.giveBack(j);
      return;
    }
    const onJob = this.onJob;
    let k = 0;
    if (onJob !== null && this.buffer.length === 0) {
      while (k < jobs.length && this.mayHandOut()) {
        const j = jobs[k++];
        j.handed = true;
        this.handedOut++;
        onJob(j);
      }
      this.lookahead.note(k);
    }
    if (k < jobs.length) {
      const now = performance.now();
      for (; k < jobs.length; k++) {
        jobs[k].bufferedAt = now;
        this.buffer.push(jobs[k]);
      }
      this.armParkTimer();
    }
    if (onJob === null) this.wake();
    else this.drainSoon();
  }

  /**
   * Settlements issued in the same event-loop turn travel in one frame (QUEUE_SETTLE_BATCH, or
   * QUEUE_SETTLE for an older server); each gets its own result. The promise resolves once the
   * server has made the settlement durable.
   */
  private pendingSettles: PendingSettle[] = [];
  private settleScheduled = false;

  /** QUEUE_PROGRESS (not re-sent after a reconnect: the lease is gone with the connection). */
  progress(job: RemoteJob<T>, json: string): Promise<void> {
    // As embedded: a settled job's lease has ended.
    if (job.settled || job.workerId !== this.id || this.live.get(job.tag) !== job) return handledRejection(new LeaseExpiredError());
    const meta = job.tag >= 0 ? { worker: this.id, tag: job.tag, progress: json } : { worker: this.id, receipt: job.receipt, progress: json };
    const p = this.transport.request(Op.QueueProgress, meta, null, { retry: false }).then(() => {});
    p.catch(() => {}); // may be left un-awaited, as settlements
    return p;
  }

  /** QUEUE_GET_JOB of the job (a read: re-sent after a reconnect). */
  async childResults(job: RemoteJob<T>): Promise<Record<string, ChildOutcome>> {
    const f = await this.transport.request(Op.QueueGetJob, { queue: this.queueMeta.queue, id: job.id }, null, { retry: true });
    return ((f.meta.job as JobInfo | null)?.children ?? {}) as Record<string, ChildOutcome>;
  }

  settle(job: RemoteJob<T>, action: SettleAction, arg: Record<string, unknown>): Promise<void> {
    // Settlements may be left un-awaited: their promises never cause an unhandled rejection.
    if (job.settled) return handledRejection(new ValidationError(`job ${job.id} is already settled`));
    if (job.workerId !== this.id || this.live.get(job.tag) !== job) return handledRejection(new LeaseExpiredError());
    // Acks and nacks end the job's time in application code now, and count as pending until
    // answered (maxPendingSettlements).
    const counted = action === "ack" || action === "nack" || action === "retryAfter";
    if (counted) {
      this.unhand(job);
      this.pendingCount++;
    }
    let resolve!: () => void;
    let reject!: (e: unknown) => void;
    const p = new Promise<void>((a, b) => {
      resolve = a;
      reject = b;
    });
    p.catch(noop);
    this.pendingSettles.push({ job: job as RemoteJob<unknown>, action, arg, counted, resolve, reject });
    if (!this.settleScheduled) {
      this.settleScheduled = true;
      setImmediate(this.flushSettlesNow);
    }
    return p;
  }

  private readonly flushSettlesNow = (): void => this.flushSettles();

  /** Answers one settlement (`err` null: it is durable). */
  private answer(p: PendingSettle, err: unknown): void {
    if (err === null) p.resolve();
    else p.reject(err);
    if (p.counted) this.settleDone();
  }

  private flushSettles(): void {
    this.settleScheduled = false;
    const all = this.pendingSettles;
    this.pendingSettles = [];
    const workerId = this.id;
    // The lookahead rides on the settle frames (a batch server only: it alone can take jobs
    // back without an attempt). Re-measured once per flush.
    const la = this.batchServer && this.receiving ? this.lookahead.size() : 0;
    let batch: PendingSettle[] = [];
    for (const p of all) {
      // Re-registered since (connection lost): that lease was released server-side.
      if (p.job.workerId !== workerId || this.live.get(p.job.tag) !== p.job) this.answer(p, new LeaseExpiredError());
      else batch.push(p);
      if (batch.length === MAX_SETTLES_PER_FRAME) {
        this.sendSettles(workerId, batch, la);
        batch = [];
      }
    }
    if (batch.length > 0) this.sendSettles(workerId, batch, la);
  }

  private sendSettles(workerId: number, batch: PendingSettle[], lookahead: number): void {
    // Jobs that came with a delivery tag (PUSH_JOB_BATCH) are settled by tag, in binary.
    if (batch[0].job.tag >= 0) {
      const items = batch.map((b) => ({ tag: b.job.tag, action: b.action, arg: b.arg }));
      let meta: { worker: number; lookahead?: number } = { worker: workerId };
      if (lookahead !== this.lookaheadSent) {
        meta = { worker: workerId, lookahead };
        this.lookaheadSent = lookahead;
      }
      this.transport.request(Op.QueueSettleBatch, meta, encodeSettleItems(items), { retry: false }).then(
        (f) => {
          // Only failures are listed, as [index, error].
          const errors = Array.isArray(f.meta.errors) ? new Map(f.meta.errors as [number, WireError][]) : null;
          for (let i = 0; i < batch.length; i++) this.settled(batch[i], errors?.get(i) ?? null);
        },
        (err) => {
          for (const b of batch) this.answer(b, err);
        },
      );
      return;
    }
    const items = batch.map((b) => ({ receipt: b.job.receipt, action: b.action, arg: b.arg }));
    this.transport.request(Op.QueueSettle, { worker: workerId, items }, null, { retry: false }).then(
      (f) => {
        const results = (f.meta.results ?? []) as (WireError | null)[];
        batch.forEach((b, i) => this.settled(b, results[i] ?? null));
      },
      (err) => {
        for (const b of batch) this.answer(b, err);
      },
    );
  }

  private settled(p: PendingSettle, wire: WireError | null): void {
    const job = p.job;
    if (wire !== null) {
      const err = wireToError(wire);
      if (err instanceof LeaseExpiredError && this.live.get(job.tag) === job) {
        // The lease is gone server-side: stop whoever still works on the job.
        this.live.delete(job.tag);
        job.abort(err);
      }
      this.answer(p, err);
      return;
    }
    if (p.action === "extend") job.leaseExpiresAt = Date.now() + (p.arg.ms as number);
    else {
      job.settled = true;
      if (this.live.get(job.tag) === job) this.live.delete(job.tag);
    }
    this.answer(p, null);
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
    if (this.stopWaiters.length > 0 && this.stopped()) for (const r of this.stopWaiters.splice(0)) r();
  }

  private stopped(): boolean {
    return this.closed || !this.receiving || this.error !== null;
  }

  /** Resolves once the worker stops taking jobs (closed, stopReceiving, server ended it, or failed). */
  whenStopped(): Promise<void> {
    if (this.stopped()) return Promise.resolve();
    return new Promise((r) => this.stopWaiters.push(r));
  }

  /** The error that ended the worker, if any (taken: reported once). */
  takeError(): Error | null {
    const e = this.error;
    this.error = null;
    return e;
  }

  async next(): Promise<IteratorResult<Job<T>>> {
    for (;;) {
      if (this.error) {
        const e = this.error;
        this.error = null;
        throw e;
      }
      if (!this.receiving || this.closed) {
        // The loop ends with every settlement it issued answered (durable, or failed).
        await this.whenSettled();
        return { value: undefined, done: true };
      }
      const j = this.takeBuffered();
      if (j) return { value: j, done: false };
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Job<T>> {
    return workerIterator(this);
  }

  /** Stop taking new jobs; jobs received but not handed out are released. Settles keep working. */
  /**
   * Gives back a job application code never saw: released without counting an attempt when
   * it came with a delivery tag (QUEUE_SETTLE_BATCH "release"), else nacked.
   */
  private giveBack(j: RemoteJob<T>): Promise<void> {
    const p = j.tag >= 0 ? this.settle(j, "release", NO_ARG) : j.nack({ reason: "worker stopping" });
    return p.catch(() => {});
  }

  async stopReceiving(): Promise<void> {
    if (!this.receiving) return;
    this.receiving = false;
    this.wake();
    this.clearParkTimer();
    const unhanded = this.buffer;
    this.buffer = [];
    // Ask the server for no more jobs (it keeps our leases: running handlers still settle).
    const drain = this.batchServer && this.id !== 0 ? this.requestDrain() : Promise.resolve();
    await Promise.all([drain, ...unhanded.map((j) => this.giveBack(j))]);
  }

  /** Whether the server still sends us jobs (no QUEUE_STOP drain sent for this registration). */
  private receivingServer = true;

  /** The drain request of this registration, answered once the server sends no more jobs. */
  private drainRequest: Promise<void> | null = null;

  private requestDrain(): Promise<void> {
    this.receivingServer = false;
    this.drainRequest = this.transport.request(Op.QueueStop, { worker: this.id, drain: true }, null, { retry: false }).then(
      () => {},
      () => {},
    );
    return this.drainRequest;
  }

  private closing: Promise<void> | null = null;

  close(): Promise<void> {
    if (this.closed && this.id === 0) return this.closing ?? Promise.resolve();
    return (this.closing ??= this.closeNow());
  }

  private async closeNow(): Promise<void> {
    this.closed = true;
    this.receiving = false;
    this.wake();
    this.clearParkTimer();
    // Frames go out in this order and the server handles them in order: no more deliveries
    // (else a released job could be granted to us again), jobs received but never handed out
    // back without counting an attempt, settlements still pending, then QUEUE_STOP, which
    // releases whatever is left as a failed attempt.
    if (this.batchServer && this.receivingServer && this.id !== 0) this.requestDrain();
    // Jobs the server pushed before it took the drain request arrive before its answer: while
    // still registered we give them back ("release", no attempt; with a lookahead there may be
    // many) instead of ignoring them, which would leave QUEUE_STOP to release them as attempts.
    if (this.drainRequest !== null && this.id !== 0) await this.drainRequest;
    const unhanded = this.buffer;
    this.buffer = [];
    for (const j of unhanded) if (j.tag >= 0) this.settle(j, "release", NO_ARG).catch(() => {});
    if (this.pendingSettles.length > 0) this.flushSettles();
    const id = this.id;
    this.id = 0;
    this.registry.delete(id);
    // Server side: unsettled jobs are nacked (released for redelivery).
    this.releaseAll(new AbortedError("worker closed"));
    if (id) await this.transport.request(Op.QueueStop, { worker: id }, null, { retry: false }).catch(() => {});
    // Un-awaited acks: close() resolves once each is durable (or failed).
    await this.whenSettled();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
