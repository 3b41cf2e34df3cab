// SPDX-License-Identifier: Apache-2.0
/**
 * The enqueue path of a PostgreSQL queue: idempotent requests (IDEM-1), dedupe, admission
 * (maxDepth / maxBytes, overflow reject or block) and the INSERT of the new job rows, all in
 * one transaction holding the queue row.
 *
 * Why in one transaction: the request's answer, its dedupe entries and its jobs commit
 * together or not at all, so a retry finds exactly what was stored (IDEM-1), a dedupe id never
 * names a job that does not exist, and admission counts what is really live (`live_jobs`,
 * `live_bytes` of the locked queue row). A job is grantable only once that COMMIT returned
 * the grant query cannot see uncommitted rows. `insertJobs` is also the copy step of
 * dead-letter moves and redrives (moves.ts), inside their own transaction, and `storeRequest`
 * runs inside the application's own transaction too (tx-enqueue.ts).
 */
import { AbortedError, QueueFullError } from "../../../errors.js";
import { ENQUEUE_REQUESTS_KEPT, validateIdentity, type EnqueueIdentity } from "../../../queues/idempotence.js";
import type { EnqueueResult } from "../../../queues/types.js";
import { SYSTEM_DEDUPE_PREFIX, type EnqueueOutcome, type EnqueueRequestOptions, type NewJob } from "../../queue-store.js";
import type { Queryable, Tables } from "../database.js";
import { encodeHeaders, queueTx, type LockedQueue, type QueueCtx } from "./rows.js";
import { SingletonRound, singletonTag } from "./singletons.js";
import { flowColumns } from "./flows.js";
import { joinTurns } from "./groups.js";

/** Window of the broker's own dedupe ids (dead-letter moves, redrives): 7 days. */
export const SYSTEM_DEDUPE_WINDOW_MS = 7 * 86_400_000;
/** While an enqueue blocks for room: how often it looks again (other nodes free room too). */
const ROOM_POLL_MS = 200;

/** Bytes a job counts against `maxBytes` (a move's copy is measured on what it stores). */
export function jobSize(j: NewJob): number {
  if (j.origin === null) return j.size;
  let n = (j.record.value?.length ?? 0) + (j.record.key?.length ?? 0);
  for (const [k, v] of j.record.headers ?? []) n += k.length + v.length;
  return n;
}

/** The flow columns' parameters (all null for jobs outside flows). */
function flowArgs(jobs: readonly NewJob[], first: number): unknown[] {
  const f = flowColumns(jobs, first);
  if (f === null) {
    const none = jobs.map(() => null);
    return [none, none, none, none];
  }
  return [f.parent, f.pending, f.policy, f.children];
}

/** Inserts `jobs` with ids `first ..` into the locked queue `q`, with their `enqueued` events. */
export async function insertJobs(c: Queryable, t: Tables, q: LockedQueue, jobs: readonly NewJob[], first: number, storedAt: number): Promise<void> {
  if (jobs.length === 0) return;
  const cols = {
    id: [] as number[],
    key: [] as (string | null)[],
    value: [] as (Buffer | null)[],
    kind: [] as number[],
    headers: [] as (string | null)[],
    priority: [] as number[],
    visible: [] as number[],
    enq: [] as number[],
    size: [] as number[],
    redrives: [] as number[],
    firstEnq: [] as number[],
    dl: [] as (string | null)[],
    expires: [] as (number | null)[],
    singleton: [] as (string | null)[],
    grp: [] as (string | null)[],
  };
  let bytes = 0;
  jobs.forEach((j, k) => {
    const size = jobSize(j);
    bytes += size;
    cols.id.push(first + k);
    cols.key.push(j.key);
    cols.value.push(j.record.value);
    cols.kind.push(j.record.valueKind);
    cols.headers.push(encodeHeaders(j.record.headers));
    cols.priority.push(j.priority ?? 0);
    cols.visible.push(j.deliverAt);
    cols.enq.push(j.record.timestamp);
    cols.size.push(size);
    cols.redrives.push(j.origin?.redriveCount ?? 0);
    cols.firstEnq.push(j.origin?.firstEnqueuedAt ?? j.record.timestamp);
    cols.dl.push(j.origin?.deadLetter ? JSON.stringify(j.origin.deadLetter) : null);
    cols.expires.push(j.expiresAt ? j.expiresAt : null);
    cols.singleton.push(singletonTag(j));
    cols.grp.push(j.group ?? null);
    q.event({ type: "enqueued", jobId: String(first + k), key: j.key, ...(j.deliverAt > j.record.timestamp ? { delayedUntil: j.deliverAt } : {}) });
  });
  await c.query(
    `INSERT INTO ${t.jobs} (queue_id, id, key, value, value_kind, headers, priority, state, visible_at, enqueued_at, stored_at, size, redrive_count, first_enqueued_at, dead_letter, expires_at, singleton, grp, parent_id, pending_children, child_policy, children)
     SELECT $1, x.id, x.key, x.value, x.kind, x.headers::jsonb, x.priority, CASE WHEN x.pending > 0 THEN 'children' ELSE 'waiting' END, x.visible, x.enq, $14, x.size, x.redrives, x.first_enq, x.dl::jsonb, x.expires, x.singleton, x.grp, x.parent, x.pending, x.policy, x.children::jsonb
     FROM unnest($2::bigint[], $3::text[], $4::bytea[], $5::smallint[], $6::text[], $7::int[], $8::bigint[], $9::bigint[], $10::bigint[], $11::int[], $12::bigint[], $13::text[], $15::bigint[], $16::text[],
                 $17::bigint[], $18::int[], $19::text[], $20::text[], $21::text[])
       AS x(id, key, value, kind, headers, priority, visible, enq, size, redrives, first_enq, dl, expires, singleton, parent, pending, policy, children, grp)`,
    [q.queueId, cols.id, cols.key, cols.value, cols.kind, cols.headers, cols.priority, cols.visible, cols.enq, cols.size, cols.redrives, cols.firstEnq, cols.dl, storedAt, cols.expires, cols.singleton, ...flowArgs(jobs, first), cols.grp],
  );
  q.add("live_jobs", jobs.length);
  q.add("live_bytes", bytes);
  q.notify();
}

/** Dedupe window of an id (0: not deduped). */
function windowOf(ctx: QueueCtx, id: string): number {
  return id.startsWith(SYSTEM_DEDUPE_PREFIX) ? SYSTEM_DEDUPE_WINDOW_MS : ctx.settings().dedupeWindowMs;
}

/** Which jobs are duplicates (of a stored job, or of an earlier one of the call), which are new. */
async function classify(
  c: Queryable,
  ctx: QueueCtx,
  q: LockedQueue,
  jobs: readonly NewJob[],
  now: number,
): Promise<{ results: (EnqueueResult | number | null)[]; fresh: number[]; sg: SingletonRound | null }> {
  const ids = [...new Set(jobs.map((j) => j.dedupeId).filter((d): d is string => d !== null && windowOf(ctx, d) > 0))];
  const known = new Map<string, string>();
  if (ids.length > 0) {
    const r = await c.query<{ dedupe_id: string; job_id: string }>(`SELECT dedupe_id, job_id FROM ${ctx.t.queueDedupe} WHERE queue_id = $1 AND dedupe_id = ANY($2) AND expires_at > $3`, [ctx.queueId, ids, now]);
    for (const row of r.rows) known.set(row.dedupe_id, row.job_id);
  }
  const sg = jobs.some((j) => j.singleton) ? new SingletonRound(c, ctx, q, jobs) : null;
  // A result, or the index of the job of this call it duplicates, or null: new.
  const results: (EnqueueResult | number | null)[] = [];
  const fresh: number[] = [];
  const seen = new Map<string, number>();
  for (let i = 0; i < jobs.length; i++) {
    const j = jobs[i];
    const d = j.dedupeId !== null && windowOf(ctx, j.dedupeId) > 0 ? j.dedupeId : null;
    if (d !== null && known.has(d)) results.push({ id: known.get(d)!, duplicate: true });
    else if (d !== null && seen.has(d)) results.push(seen.get(d)!);
    else {
      const decided = sg !== null && j.singleton ? await sg.decide(i, now) : null;
      results.push(decided);
      if (decided !== null) continue;
      if (d !== null) seen.set(d, i);
      fresh.push(i);
    }
  }
  return { results, fresh, sg };
}

/** Room for `n` jobs of `bytes` in the locked queue (QueueFullError when `reject`ing). */
function fits(ctx: QueueCtx, q: LockedQueue, n: number, bytes: number): boolean {
  const s = ctx.settings();
  return q.liveJobs + n <= s.maxDepth && q.liveBytes + bytes <= s.maxBytes;
}

/** The user dedupe entries the queue may still hold (`maxDedupeEntries`). */
async function checkDedupeRoom(c: Queryable, ctx: QueueCtx, q: LockedQueue, fresh: readonly NewJob[], now: number): Promise<void> {
  const adding = fresh.filter((j) => j.dedupeId !== null && !j.dedupeId.startsWith(SYSTEM_DEDUPE_PREFIX) && windowOf(ctx, j.dedupeId) > 0).length;
  if (adding === 0) return;
  const r = await c.query<{ n: string }>(`SELECT count(*) AS n FROM ${ctx.t.queueDedupe} WHERE queue_id = $1 AND expires_at > $2 AND dedupe_id NOT LIKE 'sys:%'`, [ctx.queueId, now]);
  if (Number(r.rows[0].n) + adding > ctx.settings().maxDedupeEntries) throw new QueueFullError(ctx.name, q.liveJobs, q.liveBytes);
}

export type Attempt = { done: true; outcome: EnqueueOutcome } | { done: false };

/** Thrown inside the transaction to roll it back when the request must wait for room. */
class NoRoom extends Error {}

/** One try of the whole request in one transaction; `done: false` when it must wait for room. */
async function attempt(ctx: QueueCtx, jobs: readonly NewJob[], identity: EnqueueIdentity | null, compact: boolean, mayWait: boolean): Promise<Attempt> {
  try {
    return await tryOnce(ctx, jobs, identity, compact, mayWait);
  } catch (e) {
    if (e instanceof NoRoom) return { done: false };
    throw e;
  }
}

function tryOnce(ctx: QueueCtx, jobs: readonly NewJob[], identity: EnqueueIdentity | null, compact: boolean, mayWait: boolean): Promise<Attempt> {
  return queueTx(ctx, (c, q) => storeRequest(c, ctx, q, jobs, identity, compact, mayWait));
}

/**
 * The request's statements on `c`, inside a transaction holding the queue row `q` (the
 * engine's own, or the application's: tx-enqueue.ts). Throws QueueFullError (or NoRoom when
 * `mayWait`) before anything is inserted, though a debounce may already have removed a job:
 * the caller's transaction must then be rolled back (to its savepoint).
 */
export async function storeRequest(c: Queryable, ctx: QueueCtx, q: LockedQueue, jobs: readonly NewJob[], identity: EnqueueIdentity | null, compact: boolean, mayWait: boolean): Promise<Attempt> {
  const t = ctx.t;
  if (identity !== null) {
    const r = await c.query<{ answer: EnqueueOutcome }>(`SELECT answer FROM ${t.queueRequests} WHERE queue_id = $1 AND producer_id = $2 AND sequence = $3`, [ctx.queueId, identity.producerId, identity.sequence]);
    if (r.rows.length > 0) return { done: true, outcome: r.rows[0].answer };
  }
  const now = ctx.now();
  const { results, fresh, sg } = await classify(c, ctx, q, jobs, now);
  const newJobs = fresh.map((i) => jobs[i]);
  const bytes = newJobs.reduce((n, j) => n + jobSize(j), 0);
  if (newJobs.length > 0 && !fits(ctx, q, newJobs.length, bytes)) {
    if (mayWait) throw new NoRoom();
    throw new QueueFullError(ctx.name, q.liveJobs, q.liveBytes);
  }
  await checkDedupeRoom(c, ctx, q, newJobs, now);
  const first = q.allocate(newJobs.length);
  await insertJobs(c, t, q, newJobs, first, now);
  if (newJobs.length > 0) await joinTurns(c, ctx, newJobs);
  const dd = newJobs.flatMap((j, k) => (j.dedupeId !== null && windowOf(ctx, j.dedupeId) > 0 ? [{ d: j.dedupeId, id: first + k, exp: now + windowOf(ctx, j.dedupeId) }] : []));
  if (dd.length > 0)
    await c.query(
      `INSERT INTO ${t.queueDedupe} (queue_id, dedupe_id, job_id, expires_at) SELECT $1, x.d, x.id, x.exp FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS x(d, id, exp)
       ON CONFLICT (queue_id, dedupe_id) DO UPDATE SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at`,
      [ctx.queueId, dd.map((x) => x.d), dd.map((x) => x.id), dd.map((x) => x.exp)],
    );
  const idOf = new Map(fresh.map((i, k) => [i, first + k]));
  await sg?.store((i) => idOf.get(i)!);
  fresh.forEach((i, k) => {
    const replaced = sg?.replacedBy.get(i);
    results[i] = { id: String(first + k), duplicate: false, ...(replaced !== undefined ? { replaced } : {}) };
  });
  const out = results.map((r) => (typeof r === "number" ? { id: (results[r] as EnqueueResult).id, duplicate: true } : r!));
  const outcome: EnqueueOutcome = compact && fresh.length === jobs.length && sg === null ? { first, count: jobs.length } : out;
  // IDEM-1: remembered with the jobs, in the same commit; a request that stored nothing leaves no entry.
  if (identity !== null && newJobs.length > 0) {
    await c.query(`INSERT INTO ${t.queueRequests} (queue_id, producer_id, sequence, answer) VALUES ($1, $2, $3, $4)`, [ctx.queueId, identity.producerId, identity.sequence, JSON.stringify(outcome)]);
    await c.query(`DELETE FROM ${t.queueRequests} WHERE queue_id = $1 AND producer_id = $2 AND sequence <= $3`, [ctx.queueId, identity.producerId, identity.sequence - ENQUEUE_REQUESTS_KEPT]);
  }
  return { done: true, outcome };
}

/**
 * Stores a request's jobs (StoredQueue.enqueue). Overflow `block` waits for room up to
 * `blockTimeoutMs`, woken by `room` (settlements on this node) or by polling (other nodes).
 */
export async function enqueueJobs(ctx: QueueCtx, jobs: readonly NewJob[], opts: EnqueueRequestOptions, room: (ms: number, signal?: AbortSignal) => Promise<void>, monoNow: () => number): Promise<EnqueueOutcome> {
  const identity = opts.identity === undefined ? null : validateIdentity(opts.identity);
  const compact = opts.compact === true;
  const s = ctx.settings();
  const block = s.overflow === "block";
  const deadline = monoNow() + s.blockTimeoutMs;
  const aborted = (): AbortedError => new AbortedError("enqueue aborted while waiting for room; nothing was stored", opts.signal?.reason);
  for (;;) {
    if (opts.signal?.aborted) throw aborted();
    const left = deadline - monoNow();
    const r = await attempt(ctx, jobs, identity, compact, block && left > 0 && jobs.length <= s.maxDepth);
    if (r.done) return r.outcome;
    await room(Math.min(left, ROOM_POLL_MS), opts.signal);
    if (opts.signal?.aborted) throw aborted();
    if (monoNow() >= deadline) {
      const last = await attempt(ctx, jobs, identity, compact, false);
      if (last.done) return last.outcome;
    }
  }
}
