// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network, server side. A remote worker is one embedded `queue.work()`
 * per QUEUE_WORK request; its jobs are pushed to the client (PUSH_JOB_BATCH, numbered with
 * delivery tags; PUSH_JOBS for older clients), which settles them by tag (QUEUE_SETTLE_BATCH)
 * or by receipt (QUEUE_SETTLE).
 *
 * Invariants:
 * - Leases belong to the connection: when it closes (or the client stops the worker), the
 *   embedded worker is closed with `onUnsettled: "nack"`, so every job still in flight is
 *   released for redelivery at once instead of waiting for its lease to expire.
 * - Memory is bounded by `prefetch`: the client holds at most `prefetch` unsettled jobs plus
 *   the lookahead it asked for (`lookahead` in QUEUE_SETTLE_BATCH's meta, at most
 *   maxLookahead(prefetch), none below MIN_LOOKAHEAD_LEASE_MS), the server at most
 *   2 x `prefetch` more (parked, see LOOKAHEAD_MS; 10 000 in all).
 * - Lease loss is pushed (PUSH_LEASE_LOST) so the client aborts `job.signal`.
 */
import type { ProcessingLog } from "./processing-log.js";
import { LeaseExpiredError, ValidationError } from "../errors.js";
import { MAX_PREFETCH } from "../queues/config.js";
import { maxLookahead } from "../queues/lookahead.js";
import type { DeliveredJob, HostQueue, PushWorker, RawEnqueueItem } from "../queues/host-api.js";
import type { EnqueueIdentity } from "../queues/idempotence.js";
import type { EnqueueItemOptions } from "../queues/prepare.js";
import type { EnqueueItem, EnqueueResult, NackOptions } from "../queues/types.js";
import { decodeEnqueueRecords, errorToWire, type WireError, type WireJob } from "../wire/index.js";
import { checkProgressText, checkResultText } from "../queues/results.js";

/** A result as a client sent it (JSON text): checked as embedded checks it (ValidationError). */
function parseResultText(json: string): unknown {
  checkResultText(json);
  try {
    return JSON.parse(json);
  } catch {
    throw new ValidationError("job result is not valid JSON");
  }
}

export interface RemoteWorkerOptions {
  id: number;
  queue: HostQueue;
  prefetch: number;
  visibilityTimeoutMs?: number;
  consumerId?: string;
  codeVersion?: string;
  /** "nack" (default): when the worker or its connection ends, unsettled jobs are released at
   * once. "error": they stay leased until their lease expires. */
  onUnsettled: "nack" | "error";
  /** The client settles by receipt (QUEUE_SETTLE) rather than by delivery tag. */
  byReceipt: boolean;
  /** Where settlements are logged (processing-log.ts), with the queue's name. */
  log: ProcessingLog;
  queueName: string;
  /** Sends jobs to the client; job i has delivery tag `firstTag + i` (mod 2^32). */
  push(jobs: DeliveredJob[], firstTag: number): boolean;
  pushLeaseLost(receipt: string, tag: number): void;
  pushEnded(reason: string, error?: unknown): void;
  waitWritable(): Promise<void>;
}

/** One settlement: by delivery tag (QUEUE_SETTLE_BATCH) or by receipt (QUEUE_SETTLE). */
export interface SettleRequest {
  tag?: number;
  receipt?: string;
  action: string;
  arg: Record<string, unknown>;
}

/** The fields of a job as PUSH_JOB_BATCH carries them: the stored bytes, forwarded without a decode. */
export function toWireJob(job: DeliveredJob): WireJob {
  const r = job.stored;
  return {
    id: job.id,
    receipt: job.receipt,
    attempt: job.attempt,
    enqueuedAt: job.enqueuedAt,
    leaseExpiresAt: job.leaseExpiresAt,
    redriveCount: job.redriveCount,
    key: job.key,
    deadLetterJson: job.deadLetter === null ? null : JSON.stringify(job.deadLetter),
    valueKind: r.valueKind,
    value: r.value,
    headers: r.headers,
  };
}

/** Settles a batch; `errors` lists [index, error] for each item that failed (the rest succeeded). */
export interface SettleOutcome {
  errors: [number, unknown][];
}

/**
 * Lookahead (push mode): besides the `prefetch` jobs at the client, the server keeps about
 * LOOKAHEAD_MS worth of jobs (at the recent settle rate; at most 2 x prefetch) granted and
 * durable but *parked* here, so a settlement is answered with the next job at once instead of
 * after that job's DELIVER fdatasync. Under load a group commit takes milliseconds, and without
 * lookahead every slot would sit idle through one per job (measured: ~80k -> ~100k jobs/s with
 * prefetch 256). Sizing by rate keeps a parked job's wait near LOOKAHEAD_MS, so a slow consumer
 * does not sit on jobs other workers could run.
 */
const LOOKAHEAD_MS = 10;
/** A job parked longer than this (client stalled or slowed down) goes back to the queue. */
const PARK_MAX_MS = 250;
/** Below this visibility timeout no lookahead: a parked lease must never get near expiry. */
const MIN_LOOKAHEAD_LEASE_MS = 2000;
const RESOLVED: Promise<void> = Promise.resolve();

export class RemoteWorker {
  private readonly worker: PushWorker;
  /** Pushed, unsettled jobs by delivery tag: at most `prefetch`. */
  private readonly jobs = new Map<number, DeliveredJob>();
  /** Receipt -> tag, only for a client that settles by receipt. */
  private readonly receipts: Map<string, number> | null;
  private nextTag = 1;
  private ended = false;
  /** False once the client asked for no more jobs (QUEUE_STOP with drain): it settles the rest. */
  private receiving = true;
  /**
   * Granted (DELIVER durable) but not yet pushed, because the client has `prefetch` unsettled
   * jobs. Their lease clock restarts when they are pushed; one that waits longer than
   * PARK_MAX_MS is given back without counting an attempt (`unstart`). Entries whose lease was
   * lost meanwhile are skipped lazily.
   */
  private parked: DeliveredJob[] = [];
  private parkedAt: number[] = [];
  private parkTimer: NodeJS.Timeout | null = null;
  private drainScheduled = false;
  private readonly maxLookahead: number;
  /** Settlements per second (EWMA), sizing the lookahead. */
  private rate = 0;
  private rateCount = 0;
  private rateStart = performance.now();
  private settledCount = 0;
  /** Jobs the client takes beyond `prefetch` (its own lookahead, set by its settle frames). */
  private clientLookahead = 0;
  /** Jobs parked here beyond the client's window (sized by noteSettled). */
  private parkLookahead = 0;

  constructor(private readonly opts: RemoteWorkerOptions) {
    this.receipts = opts.byReceipt ? new Map() : null;
    this.maxLookahead = Math.max(0, Math.min(2 * opts.prefetch, MAX_PREFETCH - opts.prefetch - maxLookahead(opts.prefetch)));
    // The queue pushes whole hand-out rounds to us (no iterator promise per job).
    const w = opts.queue.pushWorker({
      prefetch: opts.prefetch,
      visibilityTimeoutMs: opts.visibilityTimeoutMs,
      consumerId: opts.consumerId,
      codeVersion: opts.codeVersion,
      onUnsettled: opts.onUnsettled,
      onJobs: (jobs) => this.deliver(jobs),
      onLeaseLost: (job) => this.leaseLost(job.tag),
    });
    this.worker = w;
    void w.whenStopped().then(() => {
      const err = w.openError;
      if (err !== null) this.finish("error", err);
      else this.finish("closed");
    });
  }

  private get consumer(): string {
    return this.opts.consumerId ?? `worker-${this.opts.id}`;
  }

  /** Whether the queue keeps acks' results (told to the client with each job batch). */
  get keepsResults(): boolean {
    return this.worker.keepsResults;
  }

  /** Jobs the client accepts unsettled: `prefetch` plus its lookahead. */
  private get window(): number {
    return this.opts.prefetch + this.clientLookahead;
  }

  /**
   * The client's lookahead (jobs it buffers beyond `prefetch` so that a free slot need not wait
   * for a round trip): clamped to maxLookahead(prefetch), none while the lease is shorter than
   * MIN_LOOKAHEAD_LEASE_MS (the client may hold a buffered job up to PARK_MAX_MS) or once the
   * client stopped taking jobs. A larger window is filled from the parked jobs at once.
   */
  setClientLookahead(n: unknown): void {
    if (typeof n !== "number" || !Number.isFinite(n)) throw new ValidationError("lookahead must be a number");
    let la = Math.max(0, Math.min(Math.floor(n), maxLookahead(this.opts.prefetch)));
    if (!this.receiving || this.worker.visibilityTimeoutMs < MIN_LOOKAHEAD_LEASE_MS) la = 0;
    if (la === this.clientLookahead) return;
    this.clientLookahead = la;
    this.worker.setPrefetch(this.window + this.parkLookahead);
  }

  /** Numbers the jobs, records them as at the client, and sends them in one frame. */
  private send(jobs: DeliveredJob[]): boolean {
    const first = this.nextTag;
    for (const j of jobs) {
      const tag = this.nextTag;
      this.nextTag = (tag + 1) >>> 0;
      j.tag = tag;
      this.jobs.set(tag, j);
      this.receipts?.set(j.receipt, tag);
    }
    return this.opts.push(jobs, first);
  }

  /**
   * Push mode. Memory stays bounded: the embedded worker holds at most prefetch + lookahead
   * unsettled jobs, and only settlements (which arrive on this connection, and are not read
   * while its output is over maxOutputBytes) make room for more.
   */
  private deliver(jobs: DeliveredJob[]): void {
    if (this.ended || !this.receiving) {
      for (const j of jobs) j.unstart();
      return;
    }
    if (this.parked.length === 0) {
      // The common case: room at the client for the whole round.
      const room = this.window - this.jobs.size;
      if (room >= jobs.length) {
        this.send(jobs);
        return;
      }
      if (room > 0) {
        this.send(jobs.slice(0, room));
        jobs = jobs.slice(room);
      }
    }
    const now = performance.now();
    for (const j of jobs) {
      this.parked.push(j);
      this.parkedAt.push(now);
    }
    this.armParkTimer();
    this.drain();
  }

  /** Pushes parked jobs while the client has room (one frame). */
  private drain(): void {
    if (this.ended || !this.receiving || this.parked.length === 0) return;
    const out: DeliveredJob[] = [];
    let k = 0;
    let room = this.window - this.jobs.size;
    while (k < this.parked.length && room > 0) {
      const j = this.parked[k++];
      if (!j.leaseHeld) continue;
      j.restartLease();
      out.push(j);
      room--;
    }
    if (k > 0) {
      this.parked.splice(0, k);
      this.parkedAt.splice(0, k);
    }
    if (out.length > 0) this.send(out);
  }

  private scheduleDrain(): void {
    if (this.drainScheduled || this.parked.length === 0) return;
    this.drainScheduled = true;
    queueMicrotask(() => {
      this.drainScheduled = false;
      this.drain();
    });
  }

  private armParkTimer(): void {
    if (this.parkTimer !== null || this.parked.length === 0 || this.ended) return;
    const wait = Math.max(1, this.parkedAt[0] + PARK_MAX_MS - performance.now());
    this.parkTimer = setTimeout(() => {
      this.parkTimer = null;
      const limit = performance.now() - PARK_MAX_MS;
      let k = 0;
      while (k < this.parked.length && this.parkedAt[k] <= limit) k++;
      const stale = this.parked.splice(0, k);
      this.parkedAt.splice(0, k);
      if (stale.length > 0) {
        // The client stopped keeping up: no lookahead (no new grants to park) until its
        // settlements show a rate again. Then give the stale jobs back.
        this.rate = 0;
        this.rateCount = 0;
        this.rateStart = performance.now();
        this.parkLookahead = 0;
        this.worker.setPrefetch(this.window);
        for (const j of stale) if (j.leaseHeld) j.unstart();
      }
      this.armParkTimer();
    }, wait);
    this.parkTimer.unref();
  }

  /** Sizes the lookahead from the recent settle rate: enough parked jobs for LOOKAHEAD_MS. */
  private noteSettled(n: number): void {
    const d = this.worker;
    if (!this.receiving || this.maxLookahead === 0 || d.visibilityTimeoutMs < MIN_LOOKAHEAD_LEASE_MS) return;
    this.rateCount += n;
    const now = performance.now();
    const elapsed = now - this.rateStart;
    if (elapsed < 20) return;
    const r = (this.rateCount * 1000) / elapsed;
    this.rate = this.rate === 0 ? r : 0.5 * this.rate + 0.5 * r;
    this.rateCount = 0;
    this.rateStart = now;
    this.parkLookahead = Math.min(this.maxLookahead, Math.ceil((this.rate * LOOKAHEAD_MS) / 1000));
    d.setPrefetch(this.window + this.parkLookahead);
  }

  private leaseLost(tag: number): void {
    // Lease lost (expired, purged, queue failure): tell the client so it stops working on it.
    // (A parked job's loss needs no message: the client never had it.)
    const job = this.jobs.get(tag);
    if (job === undefined) return;
    this.forget(tag, job);
    if (!this.ended) this.opts.pushLeaseLost(job.receipt, tag);
    this.scheduleDrain();
  }

  private forget(tag: number, job: DeliveredJob): void {
    this.jobs.delete(tag);
    if (this.receipts !== null && this.receipts.get(job.receipt) === tag) this.receipts.delete(job.receipt);
  }

  /**
   * Starts one settlement and returns its promise (durable when it resolves); throws at once
   * for a stale tag/receipt or bad arguments. Nothing is awaited here, so a batch of
   * settlements lands in one journal group commit.
   */
  private start(it: SettleRequest): Promise<void> {
    const tag = it.tag ?? (it.receipt === undefined ? undefined : this.receipts?.get(it.receipt));
    const job = tag === undefined ? undefined : this.jobs.get(tag);
    if (job === undefined) throw new LeaseExpiredError();
    const arg = it.arg;
    switch (it.action) {
      case "ack": {
        // A result is checked before the tag is spent: a refused one leaves the lease (and the
        // tag) in place, as embedded, so the client can ack again without it or nack.
        const result = typeof arg.result === "string" ? parseResultText(arg.result) : undefined;
        // The tag is spent whatever the outcome: a stale lease fails, a durable ack ends it.
        this.forget(tag!, job);
        this.settledCount++;
        this.opts.log.job(this.opts.queueName, this.consumer, job, "ack");
        return result === undefined ? job.ack() : job.ack(result);
      }
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
        const p = job.nack(o);
        // ENC-3: a failure reason may quote the payload; an encrypted queue's stays out of the log.
        const reason = this.worker.encrypted && o.reason !== undefined ? "(redacted: encrypted queue)" : o.reason;
        this.opts.log.job(this.opts.queueName, this.consumer, job, o.requeue === false ? "dead-letter" : "nack", reason);
        // A nack refused for its options (ValidationError) leaves the lease in place; any
        // other outcome ends it (synchronously, so the slot is free for the next push now).
        if (!job.leaseHeld) {
          this.forget(tag!, job);
          this.settledCount++;
        }
        return p;
      }
      case "retryAfter": {
        if (typeof arg.ms !== "number") throw new ValidationError("retryAfter needs ms");
        // Refused for its ms (ValidationError): the lease stays, as a bad nack's.
        const p = job.retryAfter(arg.ms);
        this.opts.log.job(this.opts.queueName, this.consumer, job, "retry-after");
        if (!job.leaseHeld) {
          this.forget(tag!, job);
          this.settledCount++;
        }
        return p;
      }
      case "extend": {
        if (typeof arg.ms !== "number") throw new ValidationError("extend needs ms");
        return job.extend(arg.ms);
      }
      case "release": {
        // The client never handed this job to application code (it arrived while stopping):
        // back to the queue without counting an attempt. Not a settlement that needs to be
        // durable: if the NACK event is lost in a crash, the lease simply expires.
        this.forget(tag!, job);
        this.opts.log.job(this.opts.queueName, this.consumer, job, "release");
        job.unstart();
        return RESOLVED;
      }
      default:
        throw new ValidationError(`unknown settle action ${JSON.stringify(it.action)}`);
    }
  }

  /** QUEUE_PROGRESS: the progress (JSON text) of a pushed job; resolves once durable. */
  progress(tag: number | undefined, receipt: string | undefined, json: string): Promise<void> {
    const t = tag ?? (receipt === undefined ? undefined : this.receipts?.get(receipt));
    const job = t === undefined ? undefined : this.jobs.get(t);
    if (job === undefined) throw new LeaseExpiredError();
    return job.progress(checkProgressText(json));
  }

  /**
   * Settles many deliveries (one frame). All are applied synchronously; then parked jobs go
   * to the client in their place and new grants refill the lookahead before the journal batch
   * is written, so the ACKs and the next DELIVERs share one fdatasync. Resolves when every
   * settlement is durable (or failed); acks of one journal batch share one promise, so this
   * awaits a handful of promises, not one per job.
   */
  async settleMany(items: readonly SettleRequest[]): Promise<SettleOutcome> {
    const errors: [number, unknown][] = [];
    this.settledCount = 0;
    const promises: Promise<void>[] = [];
    const groupOf: number[] = new Array(items.length);
    for (let i = 0; i < items.length; i++) {
      let p: Promise<void>;
      try {
        p = this.start(items[i]);
      } catch (err) {
        errors.push([i, err]);
        groupOf[i] = -1;
        continue;
      }
      const last = promises.length - 1;
      if (last >= 0 && promises[last] === p) groupOf[i] = last;
      else {
        groupOf[i] = promises.length;
        promises.push(p);
      }
    }
    this.noteSettled(this.settledCount);
    this.drain();
    this.worker.grantNow();
    if (promises.length === 0) return { errors };
    const results = await Promise.allSettled(promises);
    let failed = false;
    for (const r of results) if (r.status === "rejected") failed = true;
    if (failed) {
      for (let i = 0; i < items.length; i++) {
        const g = groupOf[i];
        if (g >= 0 && results[g].status === "rejected") errors.push([i, (results[g] as PromiseRejectedResult).reason]);
      }
      errors.sort((a, b) => a[0] - b[0]);
    }
    return { errors };
  }

  /**
   * The client stops taking jobs but keeps settling the ones it has (process() after its
   * signal aborted): no more pushes or grants, parked jobs go back without an attempt.
   */
  stopDeliveries(): void {
    if (!this.receiving) return;
    this.receiving = false;
    this.clientLookahead = 0;
    this.parkLookahead = 0;
    this.worker.setPrefetch(0);
    this.returnParked();
  }

  /** Parked jobs never reached the client: back to the queue without counting an attempt. */
  private returnParked(): void {
    if (this.parkTimer !== null) clearTimeout(this.parkTimer);
    this.parkTimer = null;
    const parked = this.parked;
    this.parked = [];
    this.parkedAt = [];
    for (const j of parked) if (j.leaseHeld) j.unstart();
  }

  private finish(reason: string, error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    if (this.parkTimer !== null) clearTimeout(this.parkTimer);
    this.parkTimer = null;
    this.opts.pushEnded(reason, error);
  }

  /** The queue this worker takes jobs from. */
  get queueName(): string {
    return this.opts.queueName;
  }

  /** Ends this worker for `reason` (the client hears PUSH_WORKER_ENDED); its leases are released. */
  end(reason: string, error?: unknown): void {
    this.finish(reason, error);
    void this.close();
  }

  /** Stops the worker; unsettled jobs are nacked (released for redelivery) by the embedded worker. */
  async close(): Promise<void> {
    this.ended = true;
    // Whatever onUnsettled says: it is about jobs the client may be working on.
    this.returnParked();
    try {
      await this.worker.close();
    } catch {
      // best effort: the embedded worker releases its leases either way
    }
    this.jobs.clear();
    this.receipts?.clear();
  }
}

/**
 * QUEUE_ENQUEUE: the queue stores the client's value bytes as they are (no decode into JS
 * values and re-encode).
 *
 * `extra.idem` (producerId + sequence): the request may be a retry of one the queue already
 * stored, which is then answered with its original ids (src/queues/idempotence.ts).
 * `extra.calls`: the job counts of the client's enqueue calls that share this request; each call
 * succeeds or fails on its own (`{results, errors}`), see docs/protocol.md §7.
 */
export async function enqueueFromWire(
  q: HostQueue,
  body: Buffer,
  opts: unknown,
  maxRecords: number,
  signal: AbortSignal,
  compact: boolean,
  extra: { idem?: EnqueueIdentity; calls?: unknown } = {},
): Promise<{ results: (EnqueueResult | null)[]; errors?: [number, WireError][] } | { first: string; n: number }> {
  const calls = extra.calls === undefined ? undefined : parseCalls(extra.calls);
  const recs = decodeEnqueueRecords(body, maxRecords);
  if (opts !== undefined && (!Array.isArray(opts) || opts.length !== recs.length)) {
    throw new ValidationError("opts must be an array with one entry per job");
  }
  const items = new Array<RawEnqueueItem>(recs.length);
  for (let i = 0; i < recs.length; i++) {
    const r = recs[i];
    const o = opts === undefined ? undefined : (opts as unknown[])[i];
    items[i] = { value: r.value, valueKind: r.valueKind, opts: itemOptions(o, i, r.headers) };
  }
  if (calls !== undefined) checkCallTotal(calls, items.length);
  // Options of a job are checked with its call (a bad one fails only that call).
  const r = await q.enqueueCalls(items, calls, { signal, identity: extra.idem });
  if ("first" in r) {
    if (compact) return { first: String(r.first), n: r.count };
    return { results: Array.from({ length: r.count }, (_, k): EnqueueResult => ({ id: String(r.first + k), duplicate: false })) };
  }
  const errors = r.errors.map(([c, e]): [number, WireError] => [c, errorToWire(e)]);
  if (errors.length > 0) return { results: r.results, errors };
  const all = r.results as EnqueueResult[];
  return compact ? compactEnqueueResults(all) : { results: all };
}

/** At most this many calls per request (one job each at least, except empty calls). */
const MAX_CALLS = 100_000;

function parseCalls(v: unknown): number[] {
  if (!Array.isArray(v) || v.length === 0 || v.length > MAX_CALLS || !v.every((c) => Number.isSafeInteger(c) && c >= 0))
    throw new ValidationError("calls must be a non-empty array of job counts");
  return v as number[];
}

function checkCallTotal(calls: number[], jobs: number): void {
  let total = 0;
  for (const c of calls) total += c;
  if (total !== jobs) throw new ValidationError(`calls count ${total} jobs, the request has ${jobs}`);
}

function itemOptions(o: unknown, i: number, headers: Record<string, Uint8Array> | undefined): EnqueueItemOptions {
  const item: EnqueueItemOptions = {};
  if (headers !== undefined) item.headers = headers;
  if (o === undefined || o === null) return item;
  if (typeof o !== "object") throw new ValidationError(`opts[${i}] must be an object`);
  const x = o as Record<string, unknown>;
  if (x.key !== undefined) item.key = x.key as string | null;
  if (x.delayMs !== undefined) item.delayMs = x.delayMs as number;
  if (x.deliverAt !== undefined) item.deliverAt = x.deliverAt as number;
  if (x.dedupeId !== undefined) item.dedupeId = x.dedupeId as string;
  // Checked by the queue (prepare.ts) as embedded enqueues are.
  if (x.priority !== undefined) item.priority = x.priority as number;
  if (x.group !== undefined) item.group = x.group as string;
  if (x.expireInMs !== undefined) item.expireInMs = x.expireInMs as number;
  if (x.expiresAt !== undefined) item.expiresAt = x.expiresAt as number;
  if (x.singletonKey !== undefined) item.singletonKey = x.singletonKey as string;
  if (x.singletonMode !== undefined) item.singletonMode = x.singletonMode as EnqueueItem["singletonMode"];
  if (x.singletonWindowMs !== undefined) item.singletonWindowMs = x.singletonWindowMs as number;
  // FLOW-1: the queue checks the link and the call's shape (checkFlowShape).
  if (x.flow !== undefined) item.flow = x.flow as EnqueueItemOptions["flow"];
  return item;
}

/**
 * A compact QUEUE_ENQUEUE response: `{first, n}` when the results are n new jobs with
 * consecutive numeric ids (the usual case: one append), else the full `{results}`. Checked,
 * not assumed: the client rebuilds exactly these ids.
 */
export function compactEnqueueResults(results: EnqueueResult[]): { first: string; n: number } | { results: EnqueueResult[] } {
  if (results.length === 0) return { results };
  const first = results[0].id;
  const base = Number(first);
  if (!Number.isSafeInteger(base) || base < 0 || String(base) !== first) return { results };
  for (let k = 0; k < results.length; k++) {
    const r = results[k];
    if (r.duplicate || r.replaced !== undefined || r.id !== String(base + k)) return { results };
  }
  return { first, n: results.length };
}
