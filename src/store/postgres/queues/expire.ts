// SPDX-License-Identifier: Apache-2.0
/**
 * Job expiry of a PostgreSQL queue (JOB-3): a job whose `expiresAt` passed before it was ever
 * granted leaves the queue, dead-lettered with JobExpiredError (the default) or dropped
 * (`onExpire: "drop"`, a `removed` event with reason `expired`).
 *
 * Why a periodic pass and not a timer per job: the grant query already skips expired rows
 * (grant.ts), so an expired job is never delivered however late this runs; the pass (driven
 * by sweep.ts on every open queue, on any node) only moves them out, in short transactions
 * over the `jobs_expiring` index. A job granted once no longer expires.
 */
import { LeaseExpiredError } from "../../../errors.js";
import type { AttemptRecord } from "../../../queues/types.js";
import { num } from "../database.js";
import { deadLetterJob, EXPIRED } from "./moves.js";
import { childFinished } from "./flows.js";
import { queueTx, type QueueCtx } from "./rows.js";

/** Expired jobs handled per pass. */
const EXPIRE_BATCH = 100;

export interface ExpireHost {
  peer(name: string): Promise<unknown>;
  wake(queueId: string): void;
}

/** Moves out the expired jobs found now; returns how many. */
export async function expireDue(ctx: QueueCtx, incarnation: string, host: ExpireHost): Promise<number> {
  const now = ctx.now();
  const r = await ctx.db.query<{ id: string; expires_at: string }>(
    `SELECT id, expires_at FROM ${ctx.t.jobs} WHERE queue_id = $1 AND expires_at IS NOT NULL AND state = 'waiting' AND attempts = 0 AND expires_at <= $2 ORDER BY expires_at LIMIT $3`,
    [ctx.queueId, now, EXPIRE_BATCH],
  );
  if (r.rows.length === 0) return 0;
  const s = ctx.settings();
  if (s.onExpire === "drop") return drop(ctx, r.rows.map((x) => x.id));
  if (s.deadLetter !== null) await host.peer(s.deadLetter);
  let n = 0;
  for (const row of r.rows) {
    const failure: AttemptRecord = { at: now, attempt: 0, consumer: "(expiry)", errorClass: "JobExpiredError", error: `job expired at ${new Date(num(row.expires_at)).toISOString()} before it was started` };
    try {
      const target = await deadLetterJob(ctx, incarnation, { jobId: row.id, attempt: 0, token: null }, failure, "failed");
      if (target !== null) host.wake(target);
      n++;
    } catch (e) {
      if (!(e instanceof LeaseExpiredError)) throw e; // granted or removed meanwhile
    }
  }
  return n;
}

function drop(ctx: QueueCtx, ids: string[]): Promise<number> {
  return queueTx(ctx, async (c, q) => {
    const r = await c.query<{ id: string; size: string; parent_id: string | null }>(
      `DELETE FROM ${ctx.t.jobs} WHERE queue_id = $1 AND id = ANY($2) AND ${EXPIRED} RETURNING id, size, parent_id`,
      [ctx.queueId, ids, ctx.now()],
    );
    q.add("live_jobs", -r.rows.length);
    q.add("live_bytes", -r.rows.reduce((n, x) => n + num(x.size), 0));
    for (const row of r.rows) {
      q.event({ type: "removed", jobId: row.id, reason: "expired" });
      if (row.parent_id !== null) await childFinished(c, ctx, q, row.parent_id, row.id, { state: "removed" });
    }
    return r.rows.length;
  });
}
