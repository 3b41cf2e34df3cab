// SPDX-License-Identifier: Apache-2.0
/**
 * Grants of a PostgreSQL queue: which waiting jobs go to which consumer, in one transaction.
 *
 * Why this query: `SELECT ... FOR UPDATE SKIP LOCKED` picks visible waiting jobs, highest
 * priority first and in id (enqueue) order within one, skipping rows another transaction holds;
 * the UPDATE in the same transaction raises `attempts` and writes the lease token and wall-clock
 * deadline, so a grant resolves only once the new attempt number is durable. KEY-1: a
 * job with a key is a candidate only if no earlier job of that key is still waiting or leased
 * (`NOT EXISTS` over the `jobs_key` index), so a key's jobs go one at a time, in order, and a
 * retried head (waiting, not yet visible) holds its successors back. `maxInFlight` counts the
 * queue's leased rows under the queue row lock, so it holds across nodes, as does the rate
 * limit's window (rate-limit.ts). A queue holding grouped jobs picks round-robin over its groups
 * (groups.ts). A job whose
 * `expiresAt` passed before it was ever granted is not a candidate (expire.ts removes it).
 */
import { randomUUID } from "node:crypto";
import type { GrantRequest } from "../../queue-store.js";
import { num } from "../database.js";
import { pickGrouped } from "./groups.js";
import { countRound, readWindow } from "./rate-limit.js";
import { JOB_COLUMNS, queueTx, type JobRow, type QueueCtx } from "./rows.js";

export interface GrantPlan {
  /** Per request, the rows it gets with their lease token and wall-clock deadline. */
  granted: { row: JobRow; token: string; deadline: number }[][];
  /** Earliest `visible_at` of a waiting job not yet visible (Infinity: none). */
  nextVisible: number;
  /** RATE-1: when a full window next has room (Infinity: not full, or no limit). */
  rateOpening: number;
}

/**
 * The condition on `j` of a grantable job ($1 queue, $2 now, $3 requested at): waiting and
 * visible, stored before the round was asked for, not expired unstarted, and first of its key.
 */
function grantable(jobs: string): string {
  return `j.queue_id = $1 AND j.state = 'waiting' AND j.visible_at <= $2 AND j.stored_at <= $3
    AND (j.expires_at IS NULL OR j.expires_at > $2 OR j.attempts > 0)
    AND (j.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM ${jobs} e WHERE e.queue_id = j.queue_id AND e.key = j.key AND e.id < j.id AND e.state IN ('waiting', 'leased')))`;
}

/** How many each request may still get (`upTo` minus the leases its consumer holds). */
export type Wants = number[];

/**
 * `requestedAt`: when the grant was asked for (this node's clock). Only jobs stored by then are
 * candidates: a round asked for by a consumer that has since gone away never takes a job
 * enqueued after it left (it would only be released again).
 */
export function grantJobs(ctx: QueueCtx, requests: readonly GrantRequest[], wants: Wants, requestedAt: number): Promise<GrantPlan> {
  return queueTx(ctx, async (c, q) => {
    const t = ctx.t;
    const now = ctx.now();
    // One round trip while the queue row is held: the leases out (maxInFlight) and whether jobs are grouped.
    const inFlight = await c.query<{ n: string; grouped: boolean }>(
      `SELECT (SELECT count(*) FROM ${t.jobs} WHERE queue_id = $1 AND state = 'leased') AS n,
              EXISTS (SELECT 1 FROM ${t.queueGroupTurns} WHERE queue_id = $1 AND grp <> '') AS grouped`,
      [ctx.queueId],
    );
    const rate = ctx.settings().rateLimit ?? null;
    const win = rate === null ? null : await readWindow(c, ctx, rate, now);
    const room = Math.min(win?.room ?? Infinity, Math.max(0, ctx.settings().maxInFlight - num(inFlight.rows[0].n)));
    const total = Math.min(room, wants.reduce((a, b) => a + b, 0));
    const granted: GrantPlan["granted"] = requests.map(() => []);
    let rows: JobRow[] = [];
    let groupOpening = Infinity;
    const vals = [ctx.queueId, now, requestedAt];
    if (total > 0 && inFlight.rows[0].grouped) {
      const pick = await pickGrouped(c, ctx, grantable(t.jobs), vals, total, now);
      rows = pick.rows;
      groupOpening = pick.opening;
    } else if (total > 0) {
      const r = await c.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${t.jobs} j WHERE ${grantable(t.jobs)} ORDER BY j.priority DESC, j.id LIMIT $4 FOR UPDATE SKIP LOCKED`, [...vals, total]);
      rows = r.rows;
    }
    // Round-robin over the requests, in grant order.
    const left = [...wants];
    let k = 0;
    for (const row of rows) {
      while (left[k % left.length] <= 0) k++;
      const i = k % left.length;
      left[i]--;
      k++;
      row.attempts += 1;
      granted[i].push({ row, token: randomUUID(), deadline: now + requests[i].consumer.leaseMs });
    }
    const flat = granted.flat();
    if (flat.length > 0) {
      await c.query(
        `UPDATE ${t.jobs} j SET state = 'leased', attempts = j.attempts + 1, lease_token = x.token, lease_deadline = x.deadline, leased_at = $2
         FROM unnest($3::bigint[], $4::text[], $5::bigint[]) AS x(id, token, deadline)
         WHERE j.queue_id = $1 AND j.id = x.id`,
        [ctx.queueId, now, flat.map((g) => g.row.id), flat.map((g) => g.token), flat.map((g) => g.deadline)],
      );
      q.add("redeliveries", flat.filter((g) => g.row.attempts > 1).length);
      for (const g of flat) q.event({ type: "active", jobId: g.row.id, attempt: g.row.attempts, leaseExpiresAt: g.deadline });
    }
    const rateOpening = Math.min(groupOpening, rate === null ? Infinity : await countRound(c, ctx, rate, win!, flat.length, now));
    let nextVisible = Infinity;
    if (flat.length < total || total === 0) {
      const nv = await c.query<{ at: string | null }>(`SELECT min(visible_at) AS at FROM ${t.jobs} WHERE queue_id = $1 AND state = 'waiting' AND visible_at > $2`, [ctx.queueId, now]);
      if (nv.rows[0].at !== null) nextVisible = num(nv.rows[0].at);
    }
    return { granted, nextVisible, rateOpening };
  });
}
