// SPDX-License-Identifier: Apache-2.0
/**
 * One open PostgreSQL queue as callers hold it (`StoredQueue`): the node-local side of a
 * queue whose jobs are rows.
 *
 * Why a node-local object at all: the rows are the truth, but the interface's lease rules
 * live on this node. It keeps the leases it granted (leases.ts) so settlements throw stale
 * leases synchronously and `upTo` is honoured; serialises its own grant rounds (one grant
 * transaction at a time per queue and node, so two rounds never count the same consumer's room
 * twice); runs the lease clock (LEASE-1..3) on the monotonic clock; and wakes its listeners
 * when jobs may be grantable: after its own commits, on a NOTIFY from another node
 * (store.ts), at the next `visible_at` it learnt from a grant, and by polling while workers
 * wait (a lost notification only delays a wake-up). The SQL of each operation is in its own
 * file (enqueue.ts, grant.ts, settle.ts, moves.ts, inspect.ts, sweep.ts).
 */
import { BrokerClosedError, JobActiveError, LeaseExpiredError } from "../../../errors.js";
import type { AttemptRecord, QueueStats, RedriveOptions, RedriveResult } from "../../../queues/types.js";
import type {
  EnqueueOutcome,
  EnqueueRequestOptions,
  GrantedJob,
  GrantRequest,
  Lease,
  NewJob,
  QueueListener,
  QueueSettings,
  StoredBrowsePage,
  StoredBrowseRequest,
  StoredEventsPage,
  StoredEventsRequest,
  StoredJobInfo,
  StoredQueue,
} from "../../queue-store.js";
import { EarliestTimer } from "../../disk/queues/earliest-timer.js";
import type { Db } from "../database.js";
import { enqueueJobs } from "./enqueue.js";
import { expireDue } from "./expire.js";
import { childFinished } from "./flows.js";
import { grantJobs } from "./grant.js";
import { browseJobs, getJob, idNumber, queueStats, readEvents } from "./inspect.js";
import { LeaseTable, PgLease } from "./leases.js";
import { deadLetterJob, redrive } from "./moves.js";
import { queueTx, toStoredJob, type QueueCtx } from "./rows.js";
import { AckBatcher, extendJob, progressJob, requeueExpired, returnJob, retryJob, type LeaseRef } from "./settle.js";
import { Sweeper } from "./sweep.js";
import { enqueueInTransaction } from "./tx-enqueue.js";
import type { Queryable } from "../database.js";

/** While workers wait and a grant came back short: look again at least this often. */
export const GRANT_POLL_MS = 500;
/** `completionRatePerSec` is over this window. */
const RATE_WINDOW_MS = 10_000;

export interface PgQueueOptions {
  db: Db;
  queueId: string;
  name: string;
  /** The store's id in NOTIFY payloads. */
  origin: string;
  settings: QueueSettings;
  now(): number;
  monoNow(): number;
  /** Other queues through the policy layer (dead-letter and redrive targets). */
  peer(name: string): Promise<StoredQueue>;
  /** Jobs were added to queue `queueId` by this node (wakes its workers here at once). */
  wake(queueId: string): void;
  /** Failures of background work (expiry, sweeps), for the log. */
  warn(err: unknown, what: string): void;
}

/** Sleeps `ms`, or until `wake` is called, or `signal` aborts. */
function sleeper(waiters: Set<() => void>) {
  return (ms: number, signal?: AbortSignal): Promise<void> =>
    new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        waiters.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      waiters.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
}

export class PgQueue implements StoredQueue {
  readonly name: string;
  readonly incarnation: string;
  /** FLOW-2: set once this node stored or granted a flow's job (acks then keep results for parents). */
  hasFlows = false;
  readonly ctx: QueueCtx;
  private _settings: QueueSettings;
  private readonly leases = new LeaseTable();
  private listeners: QueueListener[] = [];
  private grants: Promise<unknown> = Promise.resolve();
  private closed: Error | null = null;
  private readonly roomWaiters = new Set<() => void>();
  private readonly eventWaiters = new Set<() => void>();
  private readonly background = new Set<Promise<unknown>>();
  private acks: number[] = [];
  /** Acks committed in groups (settle.ts AckBatcher). */
  private readonly ackBatcher: AckBatcher;
  /** The last event position this node committed (readEvents "now"). */
  private eventEnd = 0;
  private readonly leaseTimer: EarliestTimer;
  private readonly wakeTimer: EarliestTimer;
  private readonly sweeper: Sweeper;

  constructor(private readonly o: PgQueueOptions) {
    this.name = o.name;
    this.incarnation = o.queueId;
    this._settings = o.settings;
    this.ctx = {
      db: o.db,
      t: o.db.t,
      queueId: o.queueId,
      name: o.name,
      origin: o.origin,
      settings: () => this._settings,
      now: o.now,
      eventsWritten: (last) => {
        if (last > this.eventEnd) this.eventEnd = last;
        this.notifyEvents();
      },
    };
    this.ackBatcher = new AckBatcher(this.ctx);
    this.leaseTimer = new EarliestTimer(o.monoNow, () => this.checkLeases());
    this.wakeTimer = new EarliestTimer(o.now, () => this.notify());
    this.sweeper = new Sweeper(this.ctx, {
      localTokens: () => this.leases.tokens(),
      expire: (ref, rec) => this.track(this.expireRow(ref, rec)),
      expireDue: () => expireDue(this.ctx, this.incarnation, { peer: (n) => this.o.peer(n), wake: (id) => this.o.wake(id) }).then((n) => n > 0 && this.notify()),
      warn: o.warn,
    });
    this.sweeper.start();
  }

  get settings(): QueueSettings {
    return this._settings;
  }

  /** The stored config changed (applies to the next operation). */
  configure(s: QueueSettings): void {
    this._settings = s;
    this.notify();
  }

  private check(): void {
    if (this.closed !== null) throw this.closed;
  }

  /** Jobs may be grantable (a commit here or elsewhere, a timer): the listeners are told. */
  notify(): void {
    if (this.closed !== null) return;
    const ls = this.listeners;
    for (let i = 0; i < ls.length; i++) ls[i].available();
    for (const w of [...this.roomWaiters]) w();
    for (const w of [...this.eventWaiters]) w();
  }

  private track(p: Promise<unknown>): void {
    const q = p.catch((e) => this.o.warn(e, "background queue work failed"));
    this.background.add(q);
    void q.finally(() => this.background.delete(q));
  }

  // ── enqueue and grant ──

  enqueue(jobs: readonly NewJob[], opts: EnqueueRequestOptions = {}): Promise<EnqueueOutcome> {
    try {
      this.check();
    } catch (e) {
      return Promise.reject(e);
    }
    const sleep = sleeper(this.roomWaiters);
    const room = async (ms: number, signal?: AbortSignal): Promise<void> => {
      await sleep(ms, signal);
      this.check();
    };
    if (jobs.some((j) => j.flow)) this.hasFlows = true;
    const p = enqueueJobs(this.ctx, jobs, opts, room, this.o.monoNow);
    return p.then((r) => {
      this.notify();
      return r;
    });
  }

  /**
   * Stores jobs inside the application's transaction (tx-enqueue.ts). Nobody is told here: the
   * jobs exist only once the caller commits, and its NOTIFY wakes the workers then (a local wake
   * now would start a grant round that waits for the caller's lock).
   */
  enqueueInTransaction(tx: Queryable, jobs: readonly NewJob[]): Promise<EnqueueOutcome> {
    try {
      this.check();
    } catch (e) {
      return Promise.reject(e);
    }
    if (jobs.some((j) => j.flow)) this.hasFlows = true;
    return enqueueInTransaction(tx, this.ctx, jobs);
  }

  grant(requests: readonly GrantRequest[]): Promise<GrantedJob[][]> {
    this.check();
    const requestedAt = this.o.now();
    const run = this.grants.then(() => this.grantRound(requests, requestedAt));
    this.grants = run.catch(() => {});
    return run;
  }

  private async grantRound(requests: readonly GrantRequest[], requestedAt: number): Promise<GrantedJob[][]> {
    if (this.closed !== null) return requests.map(() => []);
    const wants = requests.map((r) => Math.max(0, r.upTo - this.leases.heldBy(r.consumer)));
    const wanted = wants.reduce((a, b) => a + b, 0);
    if (wanted === 0) return requests.map(() => []);
    let plan: Awaited<ReturnType<typeof grantJobs>>;
    try {
      plan = await grantJobs(this.ctx, requests, wants, requestedAt);
    } catch (e) {
      this.wakeTimer.arm(this.o.now() + GRANT_POLL_MS);
      throw e;
    }
    // LEASE-1: the lease runs from the hand-out (now), on the monotonic clock.
    const handoff = this.o.monoNow();
    let given = 0;
    const out = plan.granted.map((list, i) =>
      list.map((g): GrantedJob => {
        const consumer = requests[i].consumer;
        const l = new PgLease(g.row.id, g.row.attempts, g.deadline, g.token, consumer, handoff, handoff + consumer.leaseMs);
        if (g.row.parent_id !== null) this.hasFlows = true;
        this.leases.add(l);
        this.leaseTimer.arm(l.deadlineMono);
        given++;
        return { ...toStoredJob(g.row), lease: l };
      }),
    );
    // Closed while the round was in flight: nobody got these jobs; they go back at once, uncounted.
    if (this.closed !== null) {
      const now = this.o.now();
      for (const g of out.flat()) this.leases.end(g.lease as PgLease);
      await Promise.allSettled(out.flat().map((g) => returnJob(this.ctx, g.lease as PgLease, now, false)));
      return requests.map(() => []);
    }
    if (plan.rateOpening < Infinity) this.wakeTimer.arm(plan.rateOpening);
    else if (given < wanted) this.wakeTimer.arm(Math.min(plan.nextVisible, this.o.now() + GRANT_POLL_MS));
    return out;
  }

  // ── settlements ──

  /** the live lease `lease` names (ended now when `end`), or LeaseExpiredError at once. */
  private take(lease: Lease, end: boolean): PgLease {
    this.check();
    const l = this.leases.current(lease);
    if (l === null) throw new LeaseExpiredError();
    if (this.o.monoNow() >= l.deadlineMono) {
      this.expire(l);
      throw new LeaseExpiredError();
    }
    if (end) this.leases.end(l);
    return l;
  }

  /** After a settlement committed: room for blocked enqueues, and grants may follow. */
  private async settled<T>(p: Promise<T>): Promise<T> {
    const r = await p;
    this.notify();
    return r;
  }

  ack(lease: Lease, result?: string): Promise<void> {
    const l = this.take(lease, true);
    return this.settled(this.ackBatcher.ack(l, result)).then(() => {
      const now = this.o.now();
      this.acks.push(now);
      if (this.acks.length > 4096 || this.acks[0] < now - RATE_WINDOW_MS) this.acks = this.acks.filter((t) => t >= now - RATE_WINDOW_MS);
    });
  }

  retry(lease: Lease, visibleAt: number, failure: AttemptRecord): Promise<void> {
    const l = this.take(lease, true);
    this.wakeTimer.arm(visibleAt);
    return this.settled(retryJob(this.ctx, l, visibleAt, failure));
  }

  giveBack(lease: Lease, visibleAt: number): Promise<void> {
    const l = this.take(lease, true);
    this.wakeTimer.arm(visibleAt);
    return this.settled(returnJob(this.ctx, l, visibleAt, false));
  }

  deadLetter(lease: Lease, failure: AttemptRecord): Promise<void> {
    const l = this.take(lease, true);
    return this.settled(this.moveToDeadLetters(l, failure, "failed")).then(() => {});
  }

  /** Q-4 in one transaction (moves.ts); the dead-letter queue is opened through the policy first. */
  private async moveToDeadLetters(l: LeaseRef, failure: AttemptRecord, event: "failed" | "stalled"): Promise<void> {
    const target = this._settings.deadLetter;
    if (target !== null) await this.o.peer(target);
    const targetId = await deadLetterJob(this.ctx, this.incarnation, l, failure, event);
    if (targetId !== null) this.o.wake(targetId);
  }

  extend(lease: Lease, ms: number): Promise<void> {
    const l = this.take(lease, false);
    const mono = this.o.monoNow();
    l.deadlineMono = mono + ms;
    l.deadline = this.o.now() + ms;
    this.leaseTimer.arm(l.deadlineMono);
    return extendJob(this.ctx, l, l.deadline);
  }

  progress(lease: Lease, json: string): Promise<void> {
    const l = this.take(lease, false);
    return progressJob(this.ctx, l, json);
  }

  release(lease: Lease, counted: boolean): void {
    if (this.closed !== null) return;
    const l = this.leases.current(lease);
    if (l === null || !this.leases.end(l)) return;
    this.track(this.settled(returnJob(this.ctx, l, this.o.now(), counted)).catch((e) => (e instanceof LeaseExpiredError ? undefined : Promise.reject(e))));
  }

  restartLease(lease: Lease): void {
    const l = this.leases.current(lease);
    if (l === null) return;
    const ttl = l.deadlineMono - l.startedMono;
    l.startedMono = this.o.monoNow();
    l.deadlineMono = l.startedMono + ttl;
    l.deadline = this.o.now() + ttl;
    this.leaseTimer.arm(l.deadlineMono);
    // Not durable (LEASE-1), but other nodes' sweeps go by the stored deadline: best effort.
    extendJob(this.ctx, l, l.deadline).catch(() => {});
  }

  // ── lease expiry (LEASE-2, LEASE-3) ──

  private checkLeases(): void {
    if (this.closed !== null) return;
    for (const l of this.leases.expired(this.o.monoNow())) this.expire(l);
    this.leaseTimer.arm(this.leases.nextDeadline());
  }

  /** Tells the holder (LEASE-2) and ends the lease here; the row is requeued or dead-lettered. */
  private lose(l: PgLease, reason: Error): void {
    if (this.leases.end(l)) l.consumer.leaseLost(l, reason);
  }

  private expire(l: PgLease): void {
    if (!this.leases.end(l)) return;
    l.consumer.leaseLost(l, new LeaseExpiredError());
    const rec: AttemptRecord = {
      at: this.o.now(),
      attempt: l.attempt,
      consumer: l.consumer.consumerId,
      errorClass: "LeaseExpiredError",
      error: "lease expired before the job was settled",
      ...(l.consumer.codeVersion !== undefined ? { codeVersion: l.consumer.codeVersion } : {}),
    };
    this.track(this.expireRow(l, rec));
  }

  /** LEASE-3 for the row: visible again, or to the dead-letter queue at `maxAttempts`. */
  private async expireRow(ref: LeaseRef, rec: AttemptRecord): Promise<void> {
    const r = await requeueExpired(this.ctx, ref, rec);
    if (r === "dead") await this.moveToDeadLetters(ref, rec, "stalled").catch((e) => (e instanceof LeaseExpiredError ? undefined : Promise.reject(e)));
    if (r !== "gone") this.notify();
  }

  // ── admin and reads ──

  async purge(): Promise<number> {
    this.check();
    const { n, before } = await queueTx(
      this.ctx,
      async (c, q) => {
        const r = await c.query<{ size: string }>(`DELETE FROM ${this.ctx.t.jobs} WHERE queue_id = $1 AND state IN ('waiting', 'leased', 'children') RETURNING size`, [this.ctx.queueId]);
        q.add("live_jobs", -r.rows.length);
        q.add("live_bytes", -r.rows.reduce((s, x) => s + Number(x.size), 0));
        q.event({ type: "purged", beforeId: String(q.nextId) });
        return { n: r.rows.length, before: q.nextId };
      },
      null,
      { locksLeased: true }, // PG-2
    );
    for (const l of this.leases.all()) if (Number(l.jobId) < before) this.lose(l, new LeaseExpiredError("job was purged"));
    this.notify();
    return n;
  }

  async remove(id: string): Promise<boolean> {
    this.check();
    const n = idNumber(id);
    if (n < 0) return false;
    const removed = await queueTx(this.ctx, async (c, q) => {
      const r = await c.query<{ state: string; size: string; parent_id: string | null }>(`SELECT state, size, parent_id FROM ${this.ctx.t.jobs} WHERE queue_id = $1 AND id = $2 FOR UPDATE`, [this.ctx.queueId, n]);
      const row = r.rows[0];
      if (row === undefined || (row.state !== "waiting" && row.state !== "leased")) return false;
      if (row.state === "leased") throw new JobActiveError(this.name, id);
      await c.query(`DELETE FROM ${this.ctx.t.jobs} WHERE queue_id = $1 AND id = $2`, [this.ctx.queueId, n]);
      q.add("live_jobs", -1);
      q.add("live_bytes", -Number(row.size));
      q.event({ type: "removed", jobId: id, reason: "removed" });
      q.notify();
      // FLOW-2: a removed child counts as finished for its parent.
      if (row.parent_id !== null) await childFinished(c, this.ctx, q, row.parent_id, id, { state: "removed" });
      return true;
    }, null, { locksLeased: true }); // PG-2: the row may be leased, its parent locked by a child's ack
    if (removed) this.notify();
    return removed;
  }

  redrive(opts: RedriveOptions): Promise<RedriveResult> {
    this.check();
    return redrive(this.ctx, opts, { peer: (n) => this.o.peer(n), wake: (id) => this.o.wake(id) });
  }

  /** Reads see this node's own writes: releases and expiries it started are waited for. */
  private async ownWrites(): Promise<void> {
    if (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  async stats(): Promise<QueueStats> {
    this.check();
    await this.ownWrites();
    const now = this.o.now();
    const recent = this.acks.filter((t) => t >= now - RATE_WINDOW_MS).length;
    return queueStats(this.ctx, recent / (RATE_WINDOW_MS / 1000));
  }

  async getJob(id: string): Promise<StoredJobInfo | null> {
    this.check();
    await this.ownWrites();
    return getJob(this.ctx, id);
  }

  async browse(req: StoredBrowseRequest): Promise<StoredBrowsePage> {
    this.check();
    await this.ownWrites();
    return browseJobs(this.ctx, req);
  }

  async readEvents(req: StoredEventsRequest): Promise<StoredEventsPage> {
    this.check();
    const now = { at: this.o.now(), localEnd: this.eventEnd };
    return readEvents(this.ctx, req, now, sleeper(this.eventWaiters), this.o.monoNow);
  }

  private notifyEvents(): void {
    for (const w of [...this.eventWaiters]) w();
  }

  listen(listener: QueueListener): () => void {
    this.listeners = [...this.listeners, listener];
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  async whenIdle(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  /**
   * Stops the queue here (close, or the queue was deleted): its leases end (LEASE-2; their rows
   * stay leased until their stored deadline, LEASE-1), blocked enqueues wake and fail.
   */
  async close(reason: Error = new BrokerClosedError(`queue ${this.name} is closed`)): Promise<void> {
    if (this.closed !== null) return;
    this.closed = reason;
    this.leaseTimer.stop();
    this.wakeTimer.stop();
    this.sweeper.stop();
    for (const w of [...this.roomWaiters, ...this.eventWaiters]) w();
    for (const l of this.leases.all()) this.lose(l, reason);
    await this.grants;
    await this.whenIdle().catch(() => {});
  }
}
