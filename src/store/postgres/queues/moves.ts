// SPDX-License-Identifier: Apache-2.0
/**
 * Moves between PostgreSQL queues: dead-lettering and redrive.
 *
 * Why one transaction per move: both queues are rows of the same database, so the copy into
 * the target (an INSERT under the target's queue row lock) and the change of the source (the
 * job marked dead, or the dead-letter entry deleted) commit together. After any crash the job
 * is in exactly one of the two places; no intent record, no system dedupe id, no resume step
 * is needed (the disk engine needs all three). The target is opened through the policy layer
 * first (`peer`, which creates an implicit dead-letter queue with its defaults), then written
 * directly in the move's transaction; both queue rows are locked in queue id order (rows.ts),
 * so a dead-letter move and a redrive between the same two queues never deadlock.
 */
import type pg from "pg";
import { LeaseExpiredError, ValidationError } from "../../../errors.js";
import type { AttemptRecord, DeadLetterInfo, RedriveOptions, RedriveResult } from "../../../queues/types.js";
import { isSystemHeader, type NewJob } from "../../queue-store.js";
import { num } from "../database.js";
import { MAX_ERROR_CHARS } from "../../../queues/config.js";
import { insertJobs } from "./enqueue.js";
import { childFinished, type FailedParent } from "./flows.js";
import { decodeHeaders, JOB_COLUMNS, queueTx, type JobRow, type LockedQueue, type QueueCtx } from "./rows.js";
import type { LeaseRef } from "./settle.js";

/** A waiting job never granted whose `expiresAt` passed (no lease: `token` null). */
export interface ExpiredRef {
  jobId: string;
  attempt: number;
  token: null;
}

/** SQL condition of an expired job (`$3`: now). */
export const EXPIRED = "state = 'waiting' AND attempts = 0 AND expires_at <= $3";

/** Dead-letter entries examined per redrive transaction. */
const REDRIVE_ROUND = 256;

/** The job as it lands in the dead-letter queue: payload, kept headers, the failure record. */
function deadLetterCopy(ctx: QueueCtx, incarnation: string, row: JobRow, failure: AttemptRecord, now: number): NewJob {
  const s = ctx.settings();
  const redact = new Set(s.redactHeaders.map((h) => h.toLowerCase()));
  const redacted: string[] = [];
  const kept: [string, Buffer][] = [];
  for (const [k, v] of decodeHeaders(row.headers) ?? []) {
    if (isSystemHeader(k)) continue;
    if (redact.has(k.toLowerCase())) redacted.push(k);
    else kept.push([k, v]);
  }
  const history = [...((row.history as AttemptRecord[] | null) ?? []), failure];
  const info: DeadLetterInfo & { key: string | null } = {
    sourceQueue: ctx.name,
    sourceId: row.id,
    sourceIncarnation: incarnation,
    firstEnqueuedAt: num(row.first_enqueued_at),
    deadLetteredAt: now,
    attempts: row.attempts,
    errorClass: failure.errorClass,
    error: failure.error,
    history,
    ...(failure.codeVersion !== undefined ? { codeVersion: failure.codeVersion } : {}),
    redriveCount: row.redrive_count,
    repeat: row.redrive_count > 0 && row.redrive_count >= s.maxRedrives,
    duplicate: false,
    redacted,
    key: row.key,
  };
  return {
    record: { key: null, value: row.value, valueKind: row.value_kind as 0 | 1 | 2, timestamp: now, headers: kept.length > 0 ? kept : null },
    key: null,
    deliverAt: now,
    dedupeId: null,
    size: 0,
    origin: { redriveCount: 0, firstEnqueuedAt: now, deadLetter: info },
  };
}

/**
 * moves the job `l` holds to the dead-letter queue (or drops it without one), in one
 * transaction; `willRetry: false` failure and `dead-lettered` events. Returns the target
 * queue's id (to wake its workers on this node), null without one.
 */
export function deadLetterJob(ctx: QueueCtx, incarnation: string, l: LeaseRef | ExpiredRef, failure: AttemptRecord, event: "failed" | "stalled"): Promise<string | null> {
  const target = ctx.settings().deadLetter;
  return queueTx(
    ctx,
    async (c, q, dest) => {
      const t = ctx.t;
      const now = ctx.now();
      const r =
        l.token === null
          ? await c.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${t.jobs} WHERE queue_id = $1 AND id = $2 AND ${EXPIRED} FOR UPDATE`, [ctx.queueId, l.jobId, now])
          : await c.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${t.jobs} WHERE queue_id = $1 AND id = $2 AND lease_token = $3 FOR UPDATE`, [ctx.queueId, l.jobId, l.token]);
      if (r.rows.length === 0) throw new LeaseExpiredError();
      const move = { c, ctx, q, dest: target === null ? null : (dest?.q ?? q), incarnation, now };
      let failed = await moveRow(move, r.rows[0], failure, event, l.attempt);
      // FLOW-2: a child failed under "fail" fails its parent, and so on up the flow.
      while (failed !== null) {
        const p = await c.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${t.jobs} WHERE queue_id = $1 AND id = $2 AND state = 'children' FOR UPDATE`, [ctx.queueId, failed.id]);
        if (p.rows.length === 0) break;
        const rec: AttemptRecord = { at: now, attempt: 0, consumer: "(flow)", errorClass: "ChildFailedError", error: `child ${failed.child} failed: ${failed.error}`.slice(0, MAX_ERROR_CHARS) };
        failed = await moveRow(move, p.rows[0], rec, "failed", 0);
      }
      return target === null ? null : (dest?.queueId ?? ctx.queueId);
    },
    target,
    // The job is leased (and its flow parent may be locked by a child's ack): PG-2.
    { locksLeased: true },
  );
}

interface Move {
  c: pg.ClientBase;
  ctx: QueueCtx;
  q: LockedQueue;
  /** The dead-letter queue, locked (null: the job is dropped). */
  dest: LockedQueue | null;
  incarnation: string;
  now: number;
}

/** Q-4 for one row (copy, then the source marked dead or deleted); returns the parent it fails, if any. */
async function moveRow(m: Move, row: JobRow, failure: AttemptRecord, event: "failed" | "stalled", attempt: number): Promise<FailedParent | null> {
  const { c, ctx, q, now } = m;
  const t = ctx.t;
  if (m.dest !== null) await insertJobs(c, t, m.dest, [deadLetterCopy(ctx, m.incarnation, row, failure, now)], m.dest.allocate(1), now);
  const vals = [ctx.queueId, row.id, now, JSON.stringify(failure), failure.error || failure.errorClass];
  if (ctx.settings().resultRetentionMs > 0)
    await c.query(
      `UPDATE ${t.jobs} SET state = 'dead', finished_at = $3, lease_token = NULL, value = NULL, headers = NULL, progress = NULL, children = NULL,
         history = coalesce(history, '[]'::jsonb) || jsonb_build_array($4::jsonb), last_error = $5 WHERE queue_id = $1 AND id = $2`,
      vals,
    );
  else await c.query(`DELETE FROM ${t.jobs} WHERE queue_id = $1 AND id = $2`, [ctx.queueId, row.id]);
  q.add("live_jobs", -1);
  q.add("live_bytes", -num(row.size));
  q.add("dead_lettered", 1);
  if (event === "failed") q.event({ type: "failed", jobId: row.id, attempt, errorClass: failure.errorClass, error: failure.error, willRetry: false });
  else q.event({ type: "stalled", jobId: row.id, attempt, willRetry: false });
  q.event({ type: "dead-lettered", jobId: row.id });
  if (row.key !== null) q.notify();
  if (row.parent_id === null) return null;
  return childFinished(c, ctx, q, row.parent_id, row.id, { state: "failed", error: failure.error || failure.errorClass });
}

/** Whether a dead-letter entry matches the redrive's filter. */
function matches(row: JobRow, opts: RedriveOptions): boolean {
  const f = opts.filter;
  const info = row.dead_letter;
  if (f?.ids !== undefined && !f.ids.map(String).some((id) => id === row.id || id === info?.sourceId)) return false;
  if (f?.errorClass !== undefined && info?.errorClass !== f.errorClass) return false;
  const at = info?.deadLetteredAt ?? num(row.enqueued_at);
  if (f?.from !== undefined && at < f.from) return false;
  if (f?.to !== undefined && at >= f.to) return false;
  return true;
}

/** The copy of a dead-letter entry as it goes back (a redriven job carries its count + 1). */
function redriveCopy(row: JobRow, now: number): NewJob {
  const info = row.dead_letter;
  const key = info?.key ?? null;
  const headers = (decodeHeaders(row.headers) ?? []).filter(([k]) => !isSystemHeader(k));
  return {
    record: { key: key === null ? null : Buffer.from(key, "utf8"), value: row.value, valueKind: row.value_kind as 0 | 1 | 2, timestamp: now, headers: headers.length > 0 ? headers : null },
    key,
    deliverAt: now,
    dedupeId: null,
    size: 0,
    origin: { redriveCount: (info?.redriveCount ?? 0) + 1, firstEnqueuedAt: info?.firstEnqueuedAt ?? num(row.enqueued_at), deadLetter: null },
  };
}

export interface RedriveHost {
  /** Opens (creating) a target through the policy layer. */
  peer(name: string): Promise<unknown>;
  /** Jobs were added to the queue `queueId` (wakes its workers on this node). */
  wake(queueId: string): void;
}

/**
 * moves matching waiting dead-letter entries of this queue back to their source (or
 * `opts.target`), each round one transaction: copies inserted, entries deleted together.
 */
export async function redrive(ctx: QueueCtx, opts: RedriveOptions, host: RedriveHost): Promise<RedriveResult> {
  if (opts.limit !== undefined && !(Number.isInteger(opts.limit) && opts.limit >= 0)) throw new ValidationError("limit must be a non-negative integer");
  const limit = opts.limit ?? Infinity;
  const result: RedriveResult = { moved: 0, skippedRepeats: 0 };
  let after = -1;
  // Entries stored after the redrive began (its own copies, when it targets this queue) are not in it.
  const endR = await ctx.db.query<{ next_id: string }>(`SELECT next_id FROM ${ctx.t.queues} WHERE queue_id = $1`, [ctx.queueId]);
  const end = endR.rows.length === 0 ? 0 : num(endR.rows[0].next_id);
  while (result.moved < limit) {
    const page = await ctx.db.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${ctx.t.jobs} WHERE queue_id = $1 AND state = 'waiting' AND id > $2 AND id < $3 ORDER BY id LIMIT $4`, [
      ctx.queueId,
      after,
      end,
      REDRIVE_ROUND,
    ]);
    if (page.rows.length === 0) break;
    after = num(page.rows[page.rows.length - 1].id);
    const byTarget = new Map<string, string[]>();
    for (const row of page.rows) {
      if (result.moved + [...byTarget.values()].reduce((n, l) => n + l.length, 0) >= limit) break;
      const target = opts.target ?? row.dead_letter?.sourceQueue;
      if (target === undefined || !matches(row, opts)) continue;
      if (row.dead_letter?.repeat && !opts.includeRepeats) {
        result.skippedRepeats++;
        continue;
      }
      let ids = byTarget.get(target);
      if (!ids) byTarget.set(target, (ids = []));
      ids.push(row.id);
    }
    for (const [target, ids] of byTarget) {
      await host.peer(target);
      const moved = await moveBack(ctx, target, ids);
      result.moved += moved.n;
      if (moved.n > 0) host.wake(moved.targetId);
    }
  }
  return result;
}

/** One redrive transaction: the entries still waiting are copied to `target` and deleted here. */
function moveBack(ctx: QueueCtx, target: string, ids: string[]): Promise<{ n: number; targetId: string }> {
  return queueTx(
    ctx,
    async (c, q, other) => {
      const t = ctx.t;
      const now = ctx.now();
      const r = await c.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${t.jobs} WHERE queue_id = $1 AND id = ANY($2) AND state = 'waiting' ORDER BY id FOR UPDATE`, [ctx.queueId, ids]);
      const dest = other ?? { queueId: ctx.queueId, q };
      const first = dest.q.allocate(r.rows.length);
      await insertJobs(c, t, dest.q, r.rows.map((row) => redriveCopy(row, now)), first, now);
      await c.query(`DELETE FROM ${t.jobs} WHERE queue_id = $1 AND id = ANY($2)`, [ctx.queueId, r.rows.map((x) => x.id)]);
      q.add("live_jobs", -r.rows.length);
      q.add("live_bytes", -r.rows.reduce((n, x) => n + num(x.size), 0));
      for (const row of r.rows) q.event({ type: "removed", jobId: row.id });
      return { n: r.rows.length, targetId: dest.queueId };
    },
    target,
  );
}
