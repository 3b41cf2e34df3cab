// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueues through the server as idempotent requests (docs/queues.md, "Enqueue through the
 * server"): calls of one connection gathered per queue into numbered requests, re-sent under
 * the same identity until answered or past their delivery timeout.
 */
import { AbortedError, ProtocolError, TimeoutError } from "../errors.js";
import { MAX_BATCH_ITEMS } from "../queues/config.js";
import { ENQUEUE_REQUESTS_KEPT } from "../queues/idempotence.js";
import type { EnqueueResult, QueueConfig } from "../queues/types.js";
import { Op, wireToError, type Frame, type WireError } from "../wire/index.js";
import type { Transport } from "./transport.js";

/**
 * How long an enqueue through the server is retried under its identity (across lost connections
 * and request timeouts) before it fails with TimeoutError: the one outcome of an enqueue call
 * that is ambiguous (the job may or may not have been stored). Like the producer's delivery
 * timeout.
 */
export const ENQUEUE_DELIVERY_TIMEOUT_MS = 120_000;
/** Enqueue calls gathered together share a request up to these bounds (a larger call goes alone). */
const MAX_REQUEST_JOBS = MAX_BATCH_ITEMS;
const MAX_REQUEST_BYTES = 4 * 1024 * 1024;
/**
 * Jobs of calls not yet sent, per client: further calls wait for room (backpressure instead of
 * an unbounded buffer when callers enqueue faster than the server stores). A larger call is
 * let in alone. Sent requests are bounded by the window: ENQUEUE_REQUESTS_KEPT x
 * MAX_REQUEST_JOBS per queue.
 */
export const MAX_WAITING_JOBS = 100_000;

/** One enqueue()/enqueueBatch() call waiting for, or riding in, a request. */
export interface EnqueueCall {
  /** encodePublishRecords of the call's jobs: u32 count, then the records. */
  body: Buffer;
  count: number;
  opts: Record<string, unknown>[] | undefined;
  meta: { queue: string; config?: QueueConfig };
  configKey: string;
  started: number;
  deliveryTimeoutMs: number;
  resolve(r: EnqueueResult[]): void;
  reject(e: unknown): void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

/** The enqueue requests of one queue (sequences are per queue and producer). */
interface EnqueueLane {
  nextSeq: number;
  /** Sequences sent and not yet answered, ascending. */
  unanswered: number[];
  waiting: EnqueueCall[];
  scheduled: boolean;
}

/**
 * Idempotent enqueues of one connection (`connect()`): one producer id (INIT_PRODUCER), a
 * sequence per queue and request, and at most ENQUEUE_REQUESTS_KEPT requests of a queue
 * outstanding, counted as a window over sequences: sequence `s + ENQUEUE_REQUESTS_KEPT` is not
 * sent while `s` is unanswered, so every retry is one the broker still remembers. A request
 * interrupted by a lost connection is re-sent by the transport on the next connection (in
 * order, `retry: true`); one that timed out is sent again under the same identity. The broker
 * answers a request it already stored with the original ids, so a job is stored once and a
 * caller sees an error only when its jobs were certainly not stored, except TimeoutError after
 * ENQUEUE_DELIVERY_TIMEOUT_MS (and BrokerClosedError when the client is closed meanwhile).
 */
export class QueueEnqueuer {
  /** Requests answered on a later connection than the one they were first sent on, or sent
   * again after a timeout or a retriable answer (each counted once), and their jobs. */
  readonly stats = { requests: 0, retried: 0, retriedJobs: 0 };
  private producerId: number | null = null;
  private loading: Promise<void> | null = null;
  private readonly lanes = new Map<string, EnqueueLane>();
  private waitingJobs = 0;
  private roomWaiters: (() => void)[] = [];
  /** Calls submitted and not yet answered (waiting or in a request). */
  private open = 0;
  private idleWaiters: (() => void)[] = [];

  constructor(private readonly transport: Transport) {}

  /**
   * Waits until a call of `n` jobs may join the unsent ones (MAX_WAITING_JOBS), then reserves
   * its room (at once, before any await of the caller: calls made in one go see each other).
   * The call then goes to submit(), or gives the room back with release().
   */
  async room(n: number, signal: AbortSignal | undefined): Promise<void> {
    while (this.waitingJobs > 0 && this.waitingJobs + n > MAX_WAITING_JOBS) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => {
          const i = this.roomWaiters.indexOf(wake);
          if (i >= 0) this.roomWaiters.splice(i, 1);
          reject(new AbortedError("enqueue aborted before it was sent; nothing was stored", signal?.reason));
        };
        const wake = (): void => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        };
        this.roomWaiters.push(wake);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
    this.waitingJobs += n;
    this.open++;
  }

  /** A call that reserved room but will not be submitted (it failed before). */
  abandon(n: number): void {
    this.release(n);
    if (--this.open === 0) for (const w of this.idleWaiters.splice(0)) w();
  }

  private release(n: number): void {
    this.waitingJobs -= n;
    if (this.roomWaiters.length > 0) for (const w of this.roomWaiters.splice(0)) w();
  }

  /** `calls` left the unsent list (sent, aborted or failed): wake callers waiting for room. */
  private left(calls: readonly EnqueueCall[]): void {
    let n = 0;
    for (const c of calls) n += c.count;
    this.release(n);
  }

  /** Jobs of calls not sent yet (tests). */
  get waiting(): number {
    return this.waitingJobs;
  }

  /** Resolves once every submitted call is answered, or after `timeoutMs`. */
  async drain(timeoutMs: number): Promise<void> {
    if (this.open === 0) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, timeoutMs);
      function done(): void {
        clearTimeout(t);
        resolve();
      }
      this.idleWaiters.push(done);
    });
  }

  submit(call: EnqueueCall): void {
    // Counted (from room()) until answered, for drain().
    const settle = (): void => {
      if (--this.open === 0) for (const w of this.idleWaiters.splice(0)) w();
    };
    const { resolve, reject } = call;
    call.resolve = (r) => {
      settle();
      resolve(r);
    };
    call.reject = (e) => {
      settle();
      reject(e);
    };
    if (call.signal?.aborted) {
      this.release(call.count);
      call.reject(new AbortedError("enqueue aborted before it was sent; nothing was stored", call.signal.reason));
      return;
    }
    let lane = this.lanes.get(call.meta.queue);
    if (lane === undefined) this.lanes.set(call.meta.queue, (lane = { nextSeq: 0, unanswered: [], waiting: [], scheduled: false }));
    const l = lane;
    if (call.signal) {
      // Honoured only while the call waits here: once sent, its jobs may be stored, and the
      // call then reports what the broker did.
      call.onAbort = () => {
        const i = l.waiting.indexOf(call);
        if (i < 0) return;
        l.waiting.splice(i, 1);
        this.left([call]);
        call.reject(new AbortedError("enqueue aborted before it was sent; nothing was stored", call.signal?.reason));
      };
      call.signal.addEventListener("abort", call.onAbort, { once: true });
    }
    l.waiting.push(call);
    // Calls made before the current microtask checkpoint travel together (one request); a
    // microtask, not setImmediate: no extra event-loop turn of latency per call. Calls made
    // while the window is full gather until a request is answered.
    if (!l.scheduled) {
      l.scheduled = true;
      queueMicrotask(() => {
        l.scheduled = false;
        this.flush(l);
      });
    }
  }

  /** True once the producer id is known; else starts loading it (flushing every lane after). */
  private ensureIdentity(): boolean {
    if (this.producerId !== null) return true;
    if (this.loading === null) {
      const deadline = Date.now() + Math.min(ENQUEUE_DELIVERY_TIMEOUT_MS, ...[...this.lanes.values()].flatMap((l) => l.waiting.map((c) => c.deliveryTimeoutMs)));
      this.loading = (async () => {
        for (;;) {
          try {
            // Safe to re-send: a lost answer only wastes a producer id.
            const f = await this.transport.request(Op.InitProducer, {}, null, { retry: true });
            const id = Number(f.meta.producerId);
            if (!Number.isSafeInteger(id) || id < 0) throw new ProtocolError("malformed INIT_PRODUCER response");
            this.producerId = id;
            return;
          } catch (err) {
            if (!this.transport.isClosed && retryKind(err) !== null && Date.now() < deadline) {
              if (retryKind(err) === "backoff") await new Promise((r) => setTimeout(r, RETRY_BACKOFF_MAX_MS / 4));
              continue;
            }
            // Nothing was sent under an identity yet: the waiting calls certainly stored nothing.
            for (const l of this.lanes.values()) {
              const calls = l.waiting.splice(0);
              this.left(calls);
              for (const c of calls) this.detach(c).reject(err);
            }
            return;
          }
        }
      })().finally(() => {
        this.loading = null;
        for (const l of this.lanes.values()) this.flush(l);
      });
    }
    return false;
  }

  private detach(c: EnqueueCall): EnqueueCall {
    if (c.onAbort) c.signal?.removeEventListener("abort", c.onAbort);
    return c;
  }

  private flush(lane: EnqueueLane): void {
    if (lane.waiting.length === 0 || !this.ensureIdentity()) return;
    while (lane.waiting.length > 0 && (lane.unanswered.length === 0 || lane.nextSeq < lane.unanswered[0] + ENQUEUE_REQUESTS_KEPT)) {
      const first = lane.waiting[0];
      let n = 1;
      let jobs = first.count;
      let bytes = first.body.length;
      while (n < lane.waiting.length) {
        const c = lane.waiting[n];
        if (c.configKey !== first.configKey || jobs + c.count > MAX_REQUEST_JOBS || bytes + c.body.length > MAX_REQUEST_BYTES) break;
        jobs += c.count;
        bytes += c.body.length;
        n++;
      }
      const calls = lane.waiting.splice(0, n);
      for (const c of calls) this.detach(c);
      this.left(calls);
      const seq = lane.nextSeq++;
      lane.unanswered.push(seq);
      void this.send(lane, seq, calls, jobs, bytes);
    }
  }

  private async send(lane: EnqueueLane, seq: number, calls: EnqueueCall[], jobs: number, bytes: number): Promise<void> {
    let body: Buffer;
    if (calls.length === 1) body = calls[0].body;
    else {
      // One record list: the total count, then each call's records (their own counts dropped).
      body = Buffer.allocUnsafe(4 + bytes - 4 * calls.length);
      body.writeUInt32BE(jobs, 0); // the wire is big-endian (protocol.ts Writer)
      let pos = 4;
      for (const c of calls) pos += c.body.copy(body, pos, 4);
    }
    let opts: unknown[] | undefined;
    if (calls.some((c) => c.opts !== undefined)) {
      opts = [];
      for (const c of calls) {
        if (c.opts !== undefined) for (const o of c.opts) opts.push(o);
        else for (let k = 0; k < c.count; k++) opts.push(null);
      }
    }
    const meta = {
      ...calls[0].meta,
      opts,
      compact: true,
      producerId: this.producerId,
      sequence: seq,
      calls: calls.length > 1 ? calls.map((c) => c.count) : undefined,
    };
    let deadline = Infinity;
    for (const c of calls) deadline = Math.min(deadline, c.started + c.deliveryTimeoutMs);
    let backoffMs = 0;
    // The connection this request first goes out on (while disconnected: the next one).
    const reconnects = this.transport.reconnects + (this.transport.isReady ? 0 : 1);
    let again = false;
    this.stats.requests++;
    try {
      for (;;) {
        let f: Frame;
        try {
          f = await this.transport.request(Op.QueueEnqueue, meta, body, { retry: true });
        } catch (err) {
          // close() of this client: nothing more is sent (the jobs may have been stored if the
          // request had gone out; see docs/queues.md).
          const retry = this.transport.isClosed ? null : retryKind(err);
          if (retry === null) {
            for (const c of calls) c.reject(err);
            return;
          }
          if (Date.now() >= deadline) {
            const e = new TimeoutError(
              `enqueue not confirmed within its delivery timeout (last error: ${(err as Error).message}); the jobs may or may not have been stored`,
            );
            for (const c of calls) c.reject(e);
            return;
          }
          if (retry === "backoff") {
            // The server is there but cannot store right now (storage failing, shutting down).
            backoffMs = Math.min(RETRY_BACKOFF_MAX_MS, backoffMs === 0 ? RETRY_BACKOFF_MIN_MS : backoffMs * 2);
            const delay = Math.min(backoffMs / 2 + (Math.random() * backoffMs) / 2, Math.max(0, deadline - Date.now()));
            await new Promise((r) => setTimeout(r, delay));
          }
          // Same identity again: if an earlier attempt was stored, the broker answers with its ids.
          again = true;
          continue;
        }
        if (again || this.transport.reconnects !== reconnects) {
          this.stats.retried++;
          this.stats.retriedJobs += jobs;
        }
        answer(calls, jobs, f);
        return;
      }
    } finally {
      const i = lane.unanswered.indexOf(seq);
      if (i >= 0) lane.unanswered.splice(i, 1);
      this.flush(lane);
    }
  }
}

const RETRY_BACKOFF_MIN_MS = 50;
const RETRY_BACKOFF_MAX_MS = 2000;

/**
 * Whether a failed attempt is sent again under the same identity: "now" for a request lost with
 * its connection (the transport re-sends it once reconnected) or timed out; "backoff" for an
 * answer that stored nothing now but may be an outcome the broker cannot yet vouch for
 * (STORAGE_ERROR: a write whose fdatasync failed may still surface on reopen) or that the
 * next server process will not give (BROKER_CLOSED, ABORTED while it shuts down); null for a final
 * answer (the jobs are certainly not stored: validation, QUEUE_FULL, not found...).
 */
function retryKind(err: unknown): "now" | "backoff" | null {
  const code = (err as { code?: string } | null)?.code;
  if (code === "CONNECTION_CLOSED" || code === "TIMEOUT") return "now";
  // ABORTED: the server gave up a blocked enqueue of a connection it is closing (this client
  // passes no signal once a request is sent, so it never comes from here).
  if (code === "STORAGE_ERROR" || code === "STORAGE_FULL" || code === "BROKER_CLOSED" || code === "ABORTED") return "backoff";
  return null;
}

/** Splits a QUEUE_ENQUEUE answer among the calls that shared the request. */
function answer(calls: EnqueueCall[], jobs: number, f: Frame): void {
  const m = f.meta;
  if (Array.isArray(m.results)) {
    const results = m.results as (EnqueueResult | null)[];
    const errors = Array.isArray(m.errors) ? new Map(m.errors as [number, WireError][]) : null;
    if (results.length !== jobs) {
      for (const c of calls) c.reject(new ProtocolError("malformed enqueue response"));
      return;
    }
    let i = 0;
    for (let k = 0; k < calls.length; k++) {
      const c = calls[k];
      const err = errors?.get(k);
      const mine = results.slice(i, i + c.count);
      i += c.count;
      if (err !== undefined) c.reject(wireToError(err));
      else if (mine.some((r) => r === null || typeof r !== "object" || typeof r.id !== "string")) c.reject(new ProtocolError("malformed enqueue response"));
      else c.resolve(mine as EnqueueResult[]);
    }
    return;
  }
  // Compact answer: n new jobs with consecutive ids from `first` (docs/protocol.md §7).
  const first = Number(m.first);
  const n = Number(m.n);
  if (!Number.isSafeInteger(first) || n !== jobs) {
    for (const c of calls) c.reject(new ProtocolError("malformed enqueue response"));
    return;
  }
  let id = first;
  for (const c of calls) {
    const out = new Array<EnqueueResult>(c.count);
    for (let k = 0; k < c.count; k++) out[k] = { id: String(id++), duplicate: false };
    c.resolve(out);
  }
}

/** One enqueuer per connection (transport), shared by every queue handle of that client. */
const enqueuers = new WeakMap<Transport, QueueEnqueuer>();

/** The enqueuer of a connection (created on its first enqueue). */
export function enqueuerFor(transport: Transport): QueueEnqueuer {
  let enq = enqueuers.get(transport);
  if (enq === undefined) enqueuers.set(transport, (enq = new QueueEnqueuer(transport)));
  return enq;
}

/**
 * Waits (up to `timeoutMs`) until every enqueue of this client's connection is answered: for
 * `close()`, so that closing does not cut off enqueues that may already be stored (a call cut
 * off by close fails with BrokerClosedError and its outcome is unknown).
 */
export function drainEnqueues(transport: Transport, timeoutMs: number): Promise<void> {
  return enqueuers.get(transport)?.drain(timeoutMs) ?? Promise.resolve();
}

/** @internal Counters of a client's enqueue requests (tests and diagnostics). */
export function enqueueStats(transport: Transport): { requests: number; retried: number; retriedJobs: number; waitingJobs: number } {
  const e = enqueuers.get(transport);
  return { ...(e?.stats ?? { requests: 0, retried: 0, retriedJobs: 0 }), waitingJobs: e?.waiting ?? 0 };
}
