// SPDX-License-Identifier: Apache-2.0
/**
 * A PostgreSQL queue's rate limit (`QueueSettings.rateLimit`, RATE-1): at most `max` leases
 * granted in any `durationMs` window, counted inside the grant transaction (grant.ts).
 *
 * Why a table and not a counter in memory (as the disk engine keeps): several nodes grant
 * from the same queue, and the limit is the queue's, not a node's. Each grant round of a
 * limited queue adds one row (wall-clock time, leases granted) under the queue row lock, so
 * rounds on all nodes are counted in one sliding window; rows that left the window are deleted
 * by the next round. Unlike the disk engine's, the window survives restarts. A full window
 * reports its next opening, where the granting node arms its wake-up timer.
 */
import type pg from "pg";
import { num } from "../database.js";
import type { QueueCtx } from "./rows.js";

export interface Window {
  /** Leases that may be granted now. */
  room: number;
  /** Wall-clock ms of the oldest round still in the window (Infinity: none). */
  oldest: number;
}

/** The window at `now` of a queue limited to `rate` (rounds that left it are deleted). */
export async function readWindow(c: pg.ClientBase, ctx: QueueCtx, rate: { max: number; durationMs: number }, now: number): Promise<Window> {
  const t = ctx.t;
  await c.query(`DELETE FROM ${t.queueGrants} WHERE queue_id = $1 AND grp IS NULL AND at <= $2`, [ctx.queueId, now - rate.durationMs]);
  const r = await c.query<{ used: string | null; oldest: string | null }>(`SELECT sum(n) AS used, min(at) AS oldest FROM ${t.queueGrants} WHERE queue_id = $1 AND grp IS NULL`, [ctx.queueId]);
  const used = r.rows[0].used === null ? 0 : num(r.rows[0].used);
  return { room: Math.max(0, rate.max - used), oldest: r.rows[0].oldest === null ? Infinity : num(r.rows[0].oldest) };
}

/**
 * Counts a round of `n` leases at `now`; returns when the window next has room if this round
 * filled it (Infinity otherwise).
 */
export async function countRound(c: pg.ClientBase, ctx: QueueCtx, rate: { max: number; durationMs: number }, w: Window, n: number, now: number): Promise<number> {
  if (n > 0) await c.query(`INSERT INTO ${ctx.t.queueGrants} (queue_id, at, n) VALUES ($1, $2, $3)`, [ctx.queueId, now, n]);
  if (w.room - n > 0) return Infinity;
  return Math.min(w.oldest, n > 0 ? now : Infinity) + rate.durationMs;
}
