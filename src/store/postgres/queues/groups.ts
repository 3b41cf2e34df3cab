// SPDX-License-Identifier: Apache-2.0
/**
 * Job groups of a PostgreSQL queue (GRP-Q1, GRP-Q2): which waiting jobs a grant round takes
 * when the queue holds grouped jobs.
 *
 * Why rows and a turn table: groups take turns, one job per turn, in the order of
 * `queue_group_turns.turn` (a group joins the rotation when its first job is enqueued; ungrouped
 * jobs are one more member, `''`); a group served moves to the back, durably, so the order
 * holds across grant rounds, nodes and restarts. Within a group, jobs go by priority then id,
 * and only a key's first job competes (KEY-1). `groupConcurrency` counts the group's leased
 * rows; `groupRateLimit` keeps each group's grant rounds in `queue_grants` (as rate-limit.ts
 * does for the queue). All of it runs under the queue row lock, in the grant transaction.
 */
import type pg from "pg";
import type { NewJob } from "../../queue-store.js";
import { num, type Queryable } from "../database.js";
import { JOB_COLUMNS, type JobRow, type QueueCtx } from "./rows.js";

/** The rotation member of a job's group (`''`: ungrouped). */
const member = (g: string | null): string => g ?? "";

/** Enqueue: the call's groups join the rotation (at its back) unless they are in it already. */
export async function joinTurns(c: Queryable, ctx: QueueCtx, jobs: readonly NewJob[]): Promise<void> {
  const groups = [...new Set(jobs.map((j) => member(j.group ?? null)))];
  if (groups.length === 1 && groups[0] === "") {
    // Ungrouped jobs only: nothing to do unless the queue rotates groups at all.
    const any = await c.query(`SELECT 1 FROM ${ctx.t.queueGroupTurns} WHERE queue_id = $1 LIMIT 1`, [ctx.queueId]);
    if (any.rows.length === 0) return;
  }
  await c.query(
    `INSERT INTO ${ctx.t.queueGroupTurns} (queue_id, grp, turn)
     SELECT $1, x.g, coalesce((SELECT max(turn) FROM ${ctx.t.queueGroupTurns} WHERE queue_id = $1), 0) + x.o
     FROM unnest($2::text[]) WITH ORDINALITY AS x(g, o)
     ON CONFLICT (queue_id, grp) DO NOTHING`,
    [ctx.queueId, groups],
  );
}

export interface GroupPick {
  /** In the order they are granted (round-robin over the groups). */
  rows: JobRow[];
  /** When a group held back by its rate window has room again (Infinity: none). */
  opening: number;
}

/** Each group's room now: its cap minus its leased jobs, and its rate window's room. */
async function groupRooms(c: pg.ClientBase, ctx: QueueCtx, now: number): Promise<{ room: (g: string) => number; oldest: Map<string, number> }> {
  const s = ctx.settings();
  const cap = s.groupConcurrency ?? 0;
  const leased = new Map<string, number>();
  if (cap > 0) {
    const r = await c.query<{ grp: string; n: string }>(`SELECT grp, count(*) AS n FROM ${ctx.t.jobs} WHERE queue_id = $1 AND state = 'leased' AND grp IS NOT NULL GROUP BY grp`, [ctx.queueId]);
    for (const row of r.rows) leased.set(row.grp, num(row.n));
  }
  const rate = s.groupRateLimit ?? null;
  const used = new Map<string, number>();
  const oldest = new Map<string, number>();
  if (rate !== null) {
    await c.query(`DELETE FROM ${ctx.t.queueGrants} WHERE queue_id = $1 AND grp IS NOT NULL AND at <= $2`, [ctx.queueId, now - rate.durationMs]);
    const r = await c.query<{ grp: string; n: string; oldest: string }>(`SELECT grp, sum(n) AS n, min(at) AS oldest FROM ${ctx.t.queueGrants} WHERE queue_id = $1 AND grp IS NOT NULL GROUP BY grp`, [ctx.queueId]);
    for (const row of r.rows) {
      used.set(row.grp, num(row.n));
      oldest.set(row.grp, num(row.oldest));
    }
  }
  const room = (g: string): number => {
    if (g === "") return Infinity;
    const a = cap > 0 ? cap - (leased.get(g) ?? 0) : Infinity;
    const b = rate !== null ? rate.max - (used.get(g) ?? 0) : Infinity;
    return Math.max(0, Math.min(a, b));
  };
  return { room, oldest };
}

/** Picks up to `total` grantable jobs round-robin over the groups (`grantable`: the SQL condition on `j`). */
export async function pickGrouped(c: pg.ClientBase, ctx: QueueCtx, grantable: string, vals: unknown[], total: number, now: number): Promise<GroupPick> {
  const r = await c.query<JobRow & { rn: string }>(
    `SELECT * FROM (
       SELECT ${JOB_COLUMNS}, row_number() OVER (PARTITION BY coalesce(j.grp, '') ORDER BY j.priority DESC, j.id) AS rn
       FROM ${ctx.t.jobs} j WHERE ${grantable}) x
     WHERE x.rn <= $${vals.length + 1}`,
    [...vals, total],
  );
  const byGroup = new Map<string, JobRow[]>();
  for (const row of r.rows) {
    const g = member(row.grp);
    let l = byGroup.get(g);
    if (!l) byGroup.set(g, (l = []));
    l.push(row);
  }
  for (const l of byGroup.values()) l.sort((a, b) => b.priority - a.priority || num(a.id) - num(b.id));
  const turns = await c.query<{ grp: string }>(`SELECT grp FROM ${ctx.t.queueGroupTurns} WHERE queue_id = $1 ORDER BY turn`, [ctx.queueId]);
  const order = turns.rows.map((x) => x.grp).filter((g) => byGroup.has(g));
  for (const g of byGroup.keys()) if (!order.includes(g)) order.push(g);
  const { room, oldest } = await groupRooms(c, ctx, now);
  const left = new Map(order.map((g) => [g, room(g)]));
  const rows: JobRow[] = [];
  const served: string[] = [];
  let opening = Infinity;
  const rate = ctx.settings().groupRateLimit ?? null;
  for (let progress = true; progress && rows.length < total; ) {
    progress = false;
    for (const g of order) {
      if (rows.length >= total) break;
      const l = byGroup.get(g)!;
      if (l.length === 0) continue;
      if (left.get(g)! <= 0) {
        if (rate !== null && oldest.has(g)) opening = Math.min(opening, oldest.get(g)! + rate.durationMs);
        continue;
      }
      rows.push(l.shift()!);
      left.set(g, left.get(g)! - 1);
      served.push(g);
      progress = true;
    }
  }
  await recordRound(c, ctx, served, now);
  if (rate !== null) for (const g of new Set(served)) if (left.get(g)! <= 0 && byGroup.get(g)!.length > 0) opening = Math.min(opening, (oldest.get(g) ?? now) + rate.durationMs);
  return { rows, opening };
}

/** The groups served move to the back of the rotation (in serving order); their rate windows count the round. */
async function recordRound(c: pg.ClientBase, ctx: QueueCtx, served: string[], now: number): Promise<void> {
  if (served.length === 0) return;
  const last = new Map<string, number>();
  served.forEach((g, i) => last.set(g, i));
  const groups = [...last.entries()].sort((a, b) => a[1] - b[1]).map(([g]) => g);
  await c.query(
    `UPDATE ${ctx.t.queueGroupTurns} t SET turn = (SELECT max(turn) FROM ${ctx.t.queueGroupTurns} WHERE queue_id = $1) + x.o
     FROM unnest($2::text[]) WITH ORDINALITY AS x(g, o) WHERE t.queue_id = $1 AND t.grp = x.g`,
    [ctx.queueId, groups],
  );
  if ((ctx.settings().groupRateLimit ?? null) === null) return;
  const counts = new Map<string, number>();
  for (const g of served) if (g !== "") counts.set(g, (counts.get(g) ?? 0) + 1);
  if (counts.size === 0) return;
  await c.query(`INSERT INTO ${ctx.t.queueGrants} (queue_id, grp, at, n) SELECT $1, x.g, $2, x.n FROM unnest($3::text[], $4::int[]) AS x(g, n)`, [
    ctx.queueId,
    now,
    [...counts.keys()],
    [...counts.values()],
  ]);
}
