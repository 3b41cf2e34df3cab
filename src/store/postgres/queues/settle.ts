// SPDX-License-Identifier: Apache-2.0
/**
 * Settlements of a PostgreSQL queue's leases (ack, retry, giveBack, release, extend, progress,
 * and the requeue of an expired lease), each one transaction on the job row.
 *
 * Why acks are queue-last (queueTxLast, PG-2): a batch of acks names its job rows by lease
 * token and needs the queue row only to count and number its events, so it takes that row in
 * its last statement and holds it only for that statement and the commit. The other
 * settlements take the queue row first (one at a time, as before) and may meet a leased row an
 * ack batch holds: they wait for it under a short lock_timeout (`locksLeased`).
 *
 * Why `WHERE id = $ AND lease_token = $`: the token is the lease. A settlement of a lease
 * that is no longer the row's (expired and requeued, perhaps granted again, by this node or
 * another) matches no row, changes nothing and rejects with LeaseExpiredError. Each resolves
 * only after COMMIT. Dead-letter moves, which touch two queues, are in moves.ts.
 */
import type pg from "pg";
import { LeaseExpiredError } from "../../../errors.js";
import type { AttemptRecord } from "../../../queues/types.js";
import { num } from "../database.js";
import { childFinished } from "./flows.js";
import { queueTx, queueTxLast, type LockedQueue, type QueueCtx } from "./rows.js";

/** What a settlement names: the job and the token of its lease. */
export interface LeaseRef {
  jobId: string;
  attempt: number;
  token: string;
}

/** The one row `sql` changed, or LeaseExpiredError when the lease no longer holds it. */
async function one<R extends pg.QueryResultRow>(c: pg.ClientBase, sql: string, vals: unknown[]): Promise<R> {
  const r = await c.query<R>(sql, vals);
  if (r.rows.length === 0) throw new LeaseExpiredError();
  return r.rows[0];
}

/** What a finishing job's statement returns. */
interface Finished {
  size: string;
  key: string | null;
  parent_id: string | null;
}

/** Frees a finished job's admission room. */
function finished(q: LockedQueue, size: string): void {
  q.add("live_jobs", -1);
  q.add("live_bytes", -num(size));
}

/** An ack waiting for its batch's transaction. */
export interface PendingAck {
  lease: LeaseRef;
  result: string | undefined;
  resolve(): void;
  reject(e: unknown): void;
}

/**
 * Acks in one transaction, so they share one commit (one WAL flush) and one lock of the queue
 * row: every ack that arrived while the previous batch committed (AckBatcher). One statement
 * settles them all (the rows whose id and lease token match), so the queue row is held for one
 * round trip, not one per ack. An ack whose lease is gone matched no row and rejects with
 * LeaseExpiredError; the others commit. A failure of the transaction itself rejects them all
 * (none was stored: the jobs are redelivered, as after a crash).
 */
export async function ackJobs(ctx: QueueCtx, acks: readonly PendingAck[]): Promise<void> {
  let held: Set<string>;
  try {
    held = await queueTxLast(ctx, (c, q) => ackIn(c, ctx, q, acks));
  } catch (e) {
    for (const a of acks) a.reject(e);
    return;
  }
  for (const a of acks) (held.has(a.lease.jobId) ? a.resolve() : a.reject(new LeaseExpiredError()));
}

/** The batch's statements inside its transaction; the ids of the jobs whose lease still held them. */
async function ackIn(c: pg.ClientBase, ctx: QueueCtx, q: LockedQueue, acks: readonly PendingAck[]): Promise<Set<string>> {
  const t = ctx.t;
  const ids = acks.map((a) => a.lease.jobId);
  const tokens = acks.map((a) => a.lease.token);
  // the result is written by the same commit as the completion; without retention nothing is kept.
  const r =
    ctx.settings().resultRetentionMs > 0
      ? await c.query<Finished & { id: string }>(
          `UPDATE ${t.jobs} j SET state = 'done', finished_at = $2, result = x.result, lease_token = NULL, progress = NULL, value = NULL, headers = NULL, children = NULL
             FROM unnest($3::bigint[], $4::text[], $5::text[]) AS x(id, token, result)
            WHERE j.queue_id = $1 AND j.id = x.id AND j.lease_token = x.token
            RETURNING j.id, j.size, j.key, j.parent_id`,
          [ctx.queueId, ctx.now(), ids, tokens, acks.map((a) => a.result ?? null)],
        )
      : await c.query<Finished & { id: string }>(
          `DELETE FROM ${t.jobs} j USING unnest($2::bigint[], $3::text[]) AS x(id, token)
            WHERE j.queue_id = $1 AND j.id = x.id AND j.lease_token = x.token
            RETURNING j.id, j.size, j.key, j.parent_id`,
          [ctx.queueId, ids, tokens],
        );
  const rows = new Map(r.rows.map((row) => [String(row.id), row]));
  // Events in the order the acks were made.
  for (const a of acks) {
    const row = rows.get(a.lease.jobId);
    if (row === undefined) continue;
    const l = a.lease;
    finished(q, row.size);
    q.add("completed", 1);
    q.event({ type: "completed", jobId: l.jobId, attempt: l.attempt, ...(a.result !== undefined ? { resultText: a.result } : {}) });
    // KEY-1: the key's next job may be granted now, on any node.
    if (row.key !== null) q.notify();
    // FLOW-2: the parent learns the outcome in the same commit (a completed child fails nobody).
    if (row.parent_id !== null) await childFinished(c, ctx, q, row.parent_id, l.jobId, { state: "completed", ...(a.result !== undefined ? { result: a.result } : {}) });
  }
  return new Set(rows.keys());
}

/** Most acks one transaction carries (its statements run one after the other). */
export const MAX_ACK_BATCH = 256;

/**
 * Group commit for acks: the first ack starts a transaction at once; acks arriving meanwhile
 * wait for it and go together in the next one (at most MAX_ACK_BATCH each). With N workers
 * acking, a queue commits about once per round trip instead of N times, and the queue row is
 * locked once per batch instead of once per job.
 */
export class AckBatcher {
  private waiting: PendingAck[] = [];
  private running = false;

  constructor(private readonly ctx: QueueCtx) {}

  ack(lease: LeaseRef, result: string | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.waiting.push({ lease, result, resolve, reject });
      if (!this.running) void this.run();
    });
  }

  private async run(): Promise<void> {
    this.running = true;
    while (this.waiting.length > 0) {
      const batch = this.waiting.splice(0, MAX_ACK_BATCH);
      await ackJobs(this.ctx, batch);
    }
    this.running = false;
  }
}

/** Appends `failure` to the job's history (jsonb) in the same UPDATE. */
const HISTORY = `history = coalesce(history, '[]'::jsonb) || jsonb_build_array($5::jsonb), last_error = $6`;

export function retryJob(ctx: QueueCtx, l: LeaseRef, visibleAt: number, failure: AttemptRecord): Promise<void> {
  return queueTx(
    ctx,
    async (c, q) => {
      await one(
        c,
        `UPDATE ${ctx.t.jobs} SET state = 'waiting', visible_at = $4, lease_token = NULL, lease_deadline = NULL, ${HISTORY}
         WHERE queue_id = $1 AND id = $2 AND lease_token = $3 RETURNING id`,
        [ctx.queueId, l.jobId, l.token, visibleAt, JSON.stringify(failure), failure.error || failure.errorClass],
      );
      q.add("retries", 1);
      q.event({ type: "failed", jobId: l.jobId, attempt: l.attempt, errorClass: failure.errorClass, error: failure.error, willRetry: true, retryAt: visibleAt });
      q.notify();
    },
    null,
    { locksLeased: true }, // PG-2
  );
}

/**
 * Back to waiting at `visibleAt` without a failure record: giveBack (RATE-2, never an attempt)
 * and release (`counted` false: never an attempt). Rejects LeaseExpiredError for a lost lease.
 */
export function returnJob(ctx: QueueCtx, l: LeaseRef, visibleAt: number, counted: boolean): Promise<void> {
  return queueTx(
    ctx,
    async (c, q) => {
      await one(
        c,
        `UPDATE ${ctx.t.jobs} SET state = 'waiting', visible_at = $4, lease_token = NULL, lease_deadline = NULL, attempts = attempts - $5
         WHERE queue_id = $1 AND id = $2 AND lease_token = $3 RETURNING id`,
        [ctx.queueId, l.jobId, l.token, visibleAt, counted ? 0 : 1],
      );
      q.event({ type: "released", jobId: l.jobId, attempt: l.attempt, ...(visibleAt > ctx.now() ? { retryAt: visibleAt } : {}) });
      q.notify();
    },
    null,
    { locksLeased: true }, // PG-2
  );
}

export async function extendJob(ctx: QueueCtx, l: LeaseRef, deadline: number): Promise<void> {
  const r = await ctx.db.query(`UPDATE ${ctx.t.jobs} SET lease_deadline = $4 WHERE queue_id = $1 AND id = $2 AND lease_token = $3`, [ctx.queueId, l.jobId, l.token, deadline]);
  if (r.rowCount === 0) throw new LeaseExpiredError();
}

export function progressJob(ctx: QueueCtx, l: LeaseRef, json: string): Promise<void> {
  return queueTx(
    ctx,
    async (c, q) => {
      await one(c, `UPDATE ${ctx.t.jobs} SET progress = $4 WHERE queue_id = $1 AND id = $2 AND lease_token = $3 RETURNING id`, [ctx.queueId, l.jobId, l.token, json]);
      q.event({ type: "progress", jobId: l.jobId, attempt: l.attempt, progressText: json });
    },
    null,
    { locksLeased: true }, // PG-2
  );
}

/**
 * LEASE-3: an expired lease's job is visible again at once, the expiry in its history; false
 * when it is at `maxAttempts` (the caller dead-letters it instead) or the lease is gone.
 */
export function requeueExpired(ctx: QueueCtx, l: LeaseRef, rec: AttemptRecord): Promise<"requeued" | "dead" | "gone"> {
  return queueTx(
    ctx,
    async (c, q) => {
      const r = await c.query<{ attempts: number }>(`SELECT attempts FROM ${ctx.t.jobs} WHERE queue_id = $1 AND id = $2 AND lease_token = $3 FOR UPDATE`, [ctx.queueId, l.jobId, l.token]);
      if (r.rows.length === 0) return "gone";
      if (r.rows[0].attempts >= ctx.settings().maxAttempts) return "dead";
      const now = ctx.now();
      await c.query(
        `UPDATE ${ctx.t.jobs} SET state = 'waiting', visible_at = $4, lease_token = NULL, lease_deadline = NULL, ${HISTORY}
         WHERE queue_id = $1 AND id = $2 AND lease_token = $3`,
        [ctx.queueId, l.jobId, l.token, now, JSON.stringify(rec), rec.error || rec.errorClass],
      );
      q.event({ type: "stalled", jobId: l.jobId, attempt: l.attempt, willRetry: true, retryAt: now });
      q.notify();
      return "requeued";
    },
    null,
    { locksLeased: true }, // PG-2
  );
}

/**
 * A lease of another node is expired here only this long after its stored deadline: the
 * granting node runs the exact clock (from the hand-out, LEASE-1, a little after the stored
 * deadline was computed) and expires it itself while it is alive.
 */
export const FOREIGN_EXPIRY_GRACE_MS = 2000;

/** Leases of other nodes (or of a previous run of this one) whose wall-clock deadline passed. */
export async function expiredElsewhere(ctx: QueueCtx, localTokens: string[], limit: number): Promise<LeaseRef[]> {
  const r = await ctx.db.query<{ id: string; attempts: number; lease_token: string }>(
    `SELECT id, attempts, lease_token FROM ${ctx.t.jobs} WHERE queue_id = $1 AND state = 'leased' AND lease_deadline < $2 AND NOT (lease_token = ANY($3)) ORDER BY lease_deadline LIMIT $4`,
    [ctx.queueId, ctx.now() - FOREIGN_EXPIRY_GRACE_MS, localTokens, limit],
  );
  return r.rows.map((x) => ({ jobId: x.id, attempt: x.attempts, token: x.lease_token }));
}
