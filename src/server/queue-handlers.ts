// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network (docs/protocol.md §7): QUEUE_ENQUEUE, QUEUE_WORK, QUEUE_SETTLE,
 * QUEUE_SETTLE_BATCH, QUEUE_STOP and QUEUE_ADMIN. The workers themselves are in
 * remote-queue.ts.
 */
import { LeaseExpiredError, ValidationError } from "../errors.js";
import type { BrowseState, RedriveOptions } from "../queues/types.js";
import type { PublishValue } from "../types.js";
import {
  decodeSettleItems,
  encodeFrame,
  encodeJobBatchFrame,
  encodePublishRecords,
  errorToWire,
  FLAG_PUSH,
  Op,
  type Frame,
  type WireError,
} from "../wire/index.js";
import { RemoteWorker, enqueueFromWire, toWireJob } from "./remote-queue.js";
import { int, str, type Reply, type RequestHandler, type Session } from "./session.js";
import { DEFAULT_PREFETCH, MAX_PREFETCH } from "../queues/config.js";
import { MAX_EVENTS_PER_PAGE } from "../queues/events.js";

const EMPTY: Reply = { meta: {} };

/** Settling on a worker that no longer exists: its leases were released when it ended. */
class LeaseExpiredErrorForWorker extends LeaseExpiredError {
  constructor() {
    super("lease expired: the worker that received this job has ended (connection lost or worker closed); the job was released for redelivery");
  }
}

async function enqueue(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const q = s.queueFor(m);
  // producerId + sequence: an idempotent request, possibly a retry of one already stored
  // (answered with the original ids); calls: the client's coalesced enqueue calls, each
  // answered on its own (docs/protocol.md §7).
  const producerId = int(m, "producerId", true);
  const idem = producerId === undefined ? undefined : { producerId, sequence: int(m, "sequence") };
  // A client that asks for it gets {first, n} instead of one {id, duplicate} per job.
  const meta = await enqueueFromWire(q, f.body, m.opts, s.limits.maxRecordsPerBatch, s.signal, m.compact === true, { idem, calls: m.calls ?? undefined });
  return { meta };
}

function work(s: Session, f: Frame): Reply {
  const m = f.meta;
  const id = int(m, "worker");
  if (s.workers.has(id)) throw new ValidationError(`worker id ${id} is already in use`);
  if (s.workers.size >= s.limits.maxSubscriptionsPerConnection) {
    throw new ValidationError(`at most ${s.limits.maxSubscriptionsPerConnection} workers per connection`);
  }
  const q = s.queueFor(m);
  const prefetch = Math.max(1, Math.min(int(m, "prefetch", true) ?? DEFAULT_PREFETCH, MAX_PREFETCH));
  // A client that asks for it gets jobs as PUSH_JOB_BATCH (binary, no per-job JSON) and may
  // settle with QUEUE_SETTLE_BATCH; older clients keep PUSH_JOBS.
  const batch = m.batch === true;
  const worker: RemoteWorker = new RemoteWorker({
    id,
    queue: q,
    prefetch,
    visibilityTimeoutMs: int(m, "visibilityTimeoutMs", true),
    consumerId: typeof m.consumerId === "string" ? m.consumerId.slice(0, 200) : `conn-${s.id}-worker-${id}`,
    codeVersion: typeof m.codeVersion === "string" ? m.codeVersion.slice(0, 200) : undefined,
    onUnsettled: m.onUnsettled === "error" ? "error" : "nack",
    byReceipt: !batch,
    log: s.processing,
    queueName: str(m, "queue", 300),
    push: (jobs, firstTag) => {
      // `results`: the queue keeps acks' results, so the client sends them (else it drops them).
      // `giveBack`: this server takes settle action 5 (`job.retryAfter`).
      if (batch) return s.send(encodeJobBatchFrame(Op.PushJobBatch, FLAG_PUSH, worker.keepsResults ? { worker: id, results: true, giveBack: true } : { worker: id, giveBack: true }, firstTag, jobs.map(toWireJob)));
      const metaJobs = jobs.map((j) => ({
        id: j.id,
        key: j.key,
        attempt: j.attempt,
        enqueuedAt: j.enqueuedAt,
        receipt: j.receipt,
        leaseExpiresAt: j.leaseExpiresAt,
        redriveCount: j.redriveCount,
        deadLetter: j.deadLetter,
      }));
      const body = encodePublishRecords(jobs.map((j) => ({ value: j.data as PublishValue, headers: j.headers })));
      return s.send(encodeFrame(Op.PushJobs, FLAG_PUSH, 0, { worker: id, jobs: metaJobs }, body));
    },
    pushLeaseLost: (receipt, tag) => s.send(encodeFrame(Op.PushLeaseLost, FLAG_PUSH, 0, batch ? { worker: id, receipt, tag } : { worker: id, receipt })),
    pushEnded: (reason, error) => {
      if (s.workers.get(id) === worker) s.workers.delete(id);
      s.send(encodeFrame(Op.PushWorkerEnded, FLAG_PUSH, 0, { worker: id, reason, error: error === undefined ? undefined : errorToWire(error) }));
    },
    waitWritable: () => s.waitWritable(),
  });
  s.workers.set(id, worker);
  return { meta: batch ? { worker: id, batch: true } : { worker: id } };
}

/** QUEUE_SETTLE: settles by receipt, for workers registered without `batch` (older clients).
 * Coalesced by the client: one frame carries many, each answered separately. */
async function settle(s: Session, f: Frame): Promise<Reply> {
  const w = s.workers.get(int(f.meta, "worker"));
  const items = f.meta.items;
  if (!Array.isArray(items) || items.length > 100_000) throw new ValidationError("items must be an array");
  const results: (WireError | null)[] = new Array(items.length).fill(null);
  const valid: { i: number; receipt: string; action: string; arg: Record<string, unknown> }[] = [];
  items.forEach((it: unknown, i: number) => {
    try {
      if (!w) throw new LeaseExpiredErrorForWorker();
      const o = (it ?? {}) as Record<string, unknown>;
      const arg = (o.arg ?? {}) as Record<string, unknown>;
      if (arg === null || typeof arg !== "object") throw new ValidationError("arg must be an object");
      valid.push({ i, receipt: str(o, "receipt"), action: str(o, "action"), arg });
    } catch (err) {
      results[i] = errorToWire(err);
    }
  });
  if (w && valid.length > 0) {
    const { errors } = await w.settleMany(valid);
    for (const [k, e] of errors) results[valid[k].i] = errorToWire(e);
  }
  return { meta: { results } };
}

/**
 * The binary form of QUEUE_SETTLE (docs/protocol.md §7): every settlement of the frame is
 * applied before the journal batch is written (one fdatasync for all of them and for the jobs
 * granted in their place); only failures are listed in the response.
 */
async function settleBatch(s: Session, f: Frame): Promise<Reply> {
  const w = s.workers.get(int(f.meta, "worker"));
  const items = decodeSettleItems(f.body, s.limits.maxRecordsPerBatch);
  if (!w) {
    const wire = errorToWire(new LeaseExpiredErrorForWorker());
    return { meta: { errors: items.map((_, i) => [i, wire]) } };
  }
  // The client's lookahead (docs/protocol.md §7), before the settlements free room for it.
  if (f.meta.lookahead !== undefined) w.setClientLookahead(f.meta.lookahead);
  const { errors } = await w.settleMany(items);
  return { meta: errors.length === 0 ? null : { errors: errors.map(([i, e]) => [i, errorToWire(e)]) } };
}

async function stop(s: Session, f: Frame): Promise<Reply> {
  const id = int(f.meta, "worker");
  const w = s.workers.get(id);
  if (w && f.meta.drain === true) {
    // Stop sending jobs; the worker stays, so the client can still settle what it holds.
    w.stopDeliveries();
    return EMPTY;
  }
  if (w) {
    s.workers.delete(id);
    await w.close();
  }
  return EMPTY;
}

async function admin(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  if (m.action === "list") return { meta: { queues: s.gate.visible(s.principal, "queue", await s.host.listQueues(), (q) => q) } };
  if (m.action === "delete") {
    const name = str(m, "queue", 300);
    await s.host.deleteQueue(name, s.actor);
    s.forgetQueue(name);
    return EMPTY;
  }
  const q = s.queueFor(m);
  switch (m.action) {
    case "declare":
      // A handle with a config was created: the queue exists with that config from now on
      // (a declaring handle's stats wait for its config to be stored).
      if (m.config === undefined || m.config === null) throw new ValidationError("declare needs a config");
      await q.stats();
      return EMPTY;
    case "stats":
      return { meta: { stats: await q.stats() } };
    case "settings":
      return { meta: { settings: await q.settings() } };
    case "purge":
      return { meta: { purged: await q.purge() } };
    case "redrive":
      return { meta: { result: await q.redrive((m.opts ?? {}) as RedriveOptions) } };
    case "remove": {
      // JOB-4: one waiting or delayed job by id (JOB_ACTIVE for a leased one).
      const o = (m.opts ?? {}) as Record<string, unknown>;
      if (typeof o.id !== "string") throw new ValidationError("remove needs opts.id (the job's id)");
      return { meta: { removed: await q.remove(o.id) } };
    }
    default:
      throw new ValidationError(`unknown queue action ${JSON.stringify(m.action)}`);
  }
}

/**
 * QUEUE_GET_JOB: a job by id. Never creates the queue (a handle without config, and getJob
 * itself only reads). The payload travels as the body, its kind in `valueKind` (as in
 * PUSH_JOB_BATCH: 0 bytes, 1 UTF-8, 2 JSON, 3 null; absent when there is no payload); the
 * result travels in the meta as the JSON value it is.
 */
async function getJob(s: Session, f: Frame): Promise<Reply> {
  const q = s.queueFor({ queue: f.meta.queue });
  const info = await q.getJob(str(f.meta, "id", 64));
  if (info === null) return { meta: { job: null } };
  const { data, ...job } = info;
  if (!("data" in info)) return { meta: { job } };
  const [valueKind, body] = encodeJobData(data);
  return { meta: { job: { ...job, valueKind } }, body };
}

/**
 * QUEUE_BROWSE: jobs in id order without leasing them (`queue.browse`). Never creates the
 * queue (QUEUE_NOT_FOUND). The metadata travels in the meta, payloads and headers as publish
 * records in the body, one per job, in order.
 */
async function browse(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const q = s.queueFor({ queue: m.queue });
  const page = await q.browse({
    limit: int(m, "limit", true),
    after: m.after === undefined || m.after === null ? undefined : str(m, "after", 64),
    state: m.state === undefined || m.state === null ? undefined : (str(m, "state", 16) as BrowseState),
  });
  const jobs = page.jobs.map(({ data: _data, headers: _headers, ...meta }) => meta);
  const body = encodePublishRecords(page.jobs.map((j) => ({ value: j.data as PublishValue, headers: j.headers })));
  return { meta: { jobs, next: page.next }, body };
}

/**
 * QUEUE_PROGRESS: a pushed job's progress (`job.progress(value)`), by delivery tag (or receipt
 * for a worker registered without `batch`); answered once durable. `progress` is JSON text.
 */
async function progress(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const w = s.workers.get(int(m, "worker"));
  if (!w) throw new LeaseExpiredErrorForWorker();
  const tag = m.tag === undefined || m.tag === null ? undefined : int(m, "tag");
  const receipt = m.receipt === undefined || m.receipt === null ? undefined : str(m, "receipt", 100);
  await w.progress(tag, receipt, str(m, "progress", 64 * 1024));
  return EMPTY;
}

/**
 * QUEUE_EVENTS: one page of `queue.events()` after `from` (a long-poll: waits up to
 * `maxWaitMs`, at most MAX_EVENTS_WAIT_MS, while there is none). Reads only; the client asks
 * again from the answer's `position`, so the server holds nothing per reader between requests.
 */
async function events(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const q = s.queueFor({ queue: m.queue });
  const page = await q.readEvents(str(m, "from", 200), int(m, "max", true) ?? MAX_EVENTS_PER_PAGE, int(m, "maxWaitMs", true) ?? 0, s.signal);
  return { meta: { events: page.events, position: page.position } };
}

/** A decoded payload back to its wire kind and bytes (strings were stored as UTF-8, buffers as bytes, the rest as JSON). */
function encodeJobData(data: unknown): [number, Buffer | null] {
  if (data === null || data === undefined) return [3, null];
  if (typeof data === "string") return [1, Buffer.from(data, "utf8")];
  if (data instanceof Uint8Array) return [0, Buffer.from(data.buffer, data.byteOffset, data.byteLength)];
  return [2, Buffer.from(JSON.stringify(data), "utf8")];
}

export const QUEUE_HANDLERS: {
  readonly QueueEnqueue: RequestHandler;
  readonly QueueWork: RequestHandler;
  readonly QueueSettle: RequestHandler;
  readonly QueueSettleBatch: RequestHandler;
  readonly QueueStop: RequestHandler;
  readonly QueueAdmin: RequestHandler;
  readonly QueueGetJob: RequestHandler;
  readonly QueueBrowse: RequestHandler;
  readonly QueueProgress: RequestHandler;
  readonly QueueEvents: RequestHandler;
} = {
  QueueEnqueue: enqueue,
  QueueWork: work,
  QueueSettle: settle,
  QueueSettleBatch: settleBatch,
  QueueStop: stop,
  QueueAdmin: admin,
  QueueGetJob: getJob,
  QueueBrowse: browse,
  QueueProgress: progress,
  QueueEvents: events,
};
