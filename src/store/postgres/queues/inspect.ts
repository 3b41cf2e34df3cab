// SPDX-License-Identifier: Apache-2.0
/**
 * Reads of a PostgreSQL queue that change nothing: stats, getJob, browse and
 * readEvents (EVT-1).
 *
 * Why plain queries: the rows are the state, so each read is one or two statements outside
 * any transaction (READ COMMITTED: what is committed). Memory is bounded by the request
 * (LIMIT on every query that returns jobs or events). Result retention is applied at
 * read time too, so a result whose retention passed is never reported even before the sweep
 * (sweep.ts) deletes its row.
 */
import { ValidationError } from "../../../errors.js";
import type { QueueEvent, QueueStats } from "../../../queues/types.js";
import type { StoredBrowsedJob, StoredBrowsePage, StoredBrowseRequest, StoredEventsPage, StoredEventsRequest, StoredJobInfo } from "../../queue-store.js";
import { num } from "../database.js";
import { deadLetterOf, decodeHeaders, JOB_COLUMNS, keyOf, type JobRow, type QueueCtx } from "./rows.js";

/** An earlier job of the same key still waiting or leased (KEY-1): `j` is held behind it. */
const BLOCKED = (t: string): string => `(j.key IS NOT NULL AND EXISTS (SELECT 1 FROM ${t} e WHERE e.queue_id = j.queue_id AND e.key = j.key AND e.id < j.id AND e.state IN ('waiting', 'leased')))`;

export async function queueStats(ctx: QueueCtx, completionRatePerSec: number): Promise<QueueStats> {
  const t = ctx.t;
  const now = ctx.now();
  const [counts, q, heads] = await Promise.all([
    ctx.db.query<Record<string, string | null>>(
      `SELECT count(*) FILTER (WHERE state = 'waiting' AND visible_at <= $2 AND NOT blocked) AS waiting,
              count(*) FILTER (WHERE state = 'waiting' AND visible_at > $2 AND NOT blocked) AS delayed,
              count(*) FILTER (WHERE state = 'leased') AS in_flight,
              count(*) FILTER (WHERE state = 'waiting' AND blocked) AS blocked,
              count(*) FILTER (WHERE state = 'children') AS children,
              min(enqueued_at) FILTER (WHERE state = 'waiting' AND visible_at <= $2 AND NOT blocked) AS oldest_waiting,
              min(leased_at) FILTER (WHERE state = 'leased') AS oldest_lease
       FROM (SELECT state, visible_at, enqueued_at, leased_at, ${BLOCKED(t.jobs)} AS blocked
             FROM ${t.jobs} j WHERE queue_id = $1 AND state IN ('waiting', 'leased', 'children')) x`,
      [ctx.queueId, now],
    ),
    ctx.db.query<Record<string, string>>(`SELECT live_bytes, completed, dead_lettered, retries, redeliveries FROM ${t.queues} WHERE queue_id = $1`, [ctx.queueId]),
    // Keys whose head job failed at least once and holds later jobs back.
    ctx.db.query<{ key: string; first_enqueued_at: string; attempts: number }>(
      `SELECT j.key, j.first_enqueued_at, j.attempts FROM ${t.jobs} j
       WHERE j.queue_id = $1 AND j.state = 'waiting' AND j.key IS NOT NULL AND j.attempts > 0 AND NOT ${BLOCKED(t.jobs)}
         AND EXISTS (SELECT 1 FROM ${t.jobs} l WHERE l.queue_id = j.queue_id AND l.key = j.key AND l.id > j.id AND l.state = 'waiting')
       ORDER BY j.id LIMIT 100`,
      [ctx.queueId],
    ),
  ]);
  const c = counts.rows[0];
  const r = q.rows[0] ?? { live_bytes: "0", completed: "0", dead_lettered: "0", retries: "0", redeliveries: "0" };
  const waiting = num(c.waiting);
  const delayed = num(c.delayed);
  const inFlight = num(c.in_flight);
  const blocked = num(c.blocked);
  const waitingChildren = num(c.children);
  return {
    name: ctx.name,
    waiting,
    delayed,
    inFlight,
    blockedByKey: blocked,
    waitingChildren,
    deadLettered: num(r.dead_lettered),
    depth: waiting + delayed + inFlight + blocked + waitingChildren,
    bytes: num(r.live_bytes),
    oldestWaitingAgeMs: c.oldest_waiting === null ? 0 : Math.max(0, now - num(c.oldest_waiting)),
    oldestLeaseAgeMs: c.oldest_lease === null ? 0 : Math.max(0, now - num(c.oldest_lease)),
    redeliveries: num(r.redeliveries),
    retries: num(r.retries),
    completed: num(r.completed),
    completionRatePerSec,
    blockedKeys: heads.rows.map((h) => ({ key: h.key, ageMs: Math.max(0, now - num(h.first_enqueued_at)), attempts: h.attempts })),
    unreadable: 0,
  };
}

/** A job id this engine issues (a non-negative integer), or -1. */
export function idNumber(id: string): number {
  return typeof id === "string" && /^(0|[1-9][0-9]{0,15})$/.test(id) ? Number(id) : -1;
}

function liveStatus(row: JobRow, now: number): StoredJobInfo["state"] {
  if (row.state === "leased") return "active";
  if (row.state === "children") return "waiting-children";
  return num(row.visible_at) > now ? "delayed" : "waiting";
}

export async function getJob(ctx: QueueCtx, id: string): Promise<StoredJobInfo | null> {
  const n = idNumber(id);
  if (n < 0) return null;
  const r = await ctx.db.query<JobRow>(`SELECT ${JOB_COLUMNS} FROM ${ctx.t.jobs} WHERE queue_id = $1 AND id = $2`, [ctx.queueId, n]);
  if (r.rows.length === 0) return null;
  const row = r.rows[0];
  const now = ctx.now();
  if (row.state === "done" || row.state === "dead") {
    // never once retention has passed, whether or not the sweep ran.
    const at = num(row.finished_at);
    if (at + ctx.settings().resultRetentionMs <= now) return null;
    const out: StoredJobInfo = { id, state: row.state === "done" ? "completed" : "dead", attempts: row.attempts, completedAt: at };
    if (row.result !== null) out.result = row.result;
    if (row.last_error !== null) out.lastError = row.last_error;
    return out;
  }
  const out: StoredJobInfo = { id, state: liveStatus(row, now), attempts: row.attempts, record: { value: row.value, valueKind: row.value_kind as 0 | 1 | 2 } };
  if (row.last_error !== null) out.lastError = row.last_error;
  if (row.progress !== null) out.progress = row.progress;
  if (row.children !== null) out.children = row.children;
  if (row.grp !== null) out.group = row.grp;
  if (row.parent_id !== null) out.parentId = row.parent_id;
  return out;
}

export async function browseJobs(ctx: QueueCtx, req: StoredBrowseRequest): Promise<StoredBrowsePage> {
  let after = -1;
  if (req.after !== null) {
    after = idNumber(req.after);
    if (after < 0) throw new ValidationError(`browse: after must be a job id (a page's next), got ${JSON.stringify(String(req.after).slice(0, 64))}`);
  }
  const now = ctx.now();
  const filter = req.state === "waiting" ? "AND state = 'waiting' AND visible_at <= $3" : req.state === "delayed" ? "AND state = 'waiting' AND visible_at > $3" : "AND $3::bigint IS NOT NULL";
  const states = req.state === "all" ? "('waiting', 'leased', 'children')" : "('waiting', 'leased')";
  const r = await ctx.db.query<JobRow>(
    `SELECT ${JOB_COLUMNS} FROM ${ctx.t.jobs} WHERE queue_id = $1 AND id > $2 AND state IN ${states} ${filter} ORDER BY id LIMIT $4`,
    [ctx.queueId, after, now, req.limit + 1],
  );
  const jobs: StoredBrowsedJob[] = [];
  let bytes = 0;
  let more = false;
  for (const row of r.rows) {
    const size = row.value?.length ?? 0;
    if (jobs.length >= req.limit || (jobs.length > 0 && bytes + size > req.maxBytes)) {
      more = true;
      break;
    }
    bytes += size;
    jobs.push({
      id: row.id,
      state: liveStatus(row, now),
      attempts: row.attempts,
      key: keyOf(row),
      value: row.value,
      valueKind: row.value_kind as 0 | 1 | 2,
      headers: decodeHeaders(row.headers),
      enqueuedAt: num(row.enqueued_at),
      redriveCount: row.redrive_count,
      deadLetter: deadLetterOf(row),
      ...(row.grp !== null ? { group: row.grp } : {}),
    });
  }
  return { jobs, next: more && jobs.length > 0 ? jobs[jobs.length - 1].id : null };
}

/** A stored event body as the policy reports it (results and progress parsed back from JSON text). */
function toEvent(seq: string, at: string, body: Record<string, unknown>): QueueEvent {
  const { resultText, progressText, ...rest } = body;
  const e: Record<string, unknown> = { ...rest, position: seq, at: num(at) };
  if (typeof resultText === "string") e.result = JSON.parse(resultText);
  if (typeof progressText === "string") e.progress = JSON.parse(progressText);
  return e as unknown as QueueEvent;
}

/**
 * Where "now" is, as of the call (taken before any await): the events this node committed by
 * then, and those of other nodes stored before that moment (a commit racing the call may land
 * on either side; never one this node made after it).
 */
export interface EventsNow {
  at: number;
  localEnd: number;
}

/** The position `from` names: the last event to skip (0: none). */
async function startOf(ctx: QueueCtx, from: string, now: EventsNow): Promise<number> {
  if (from === "earliest") return 0;
  if (from === "now") {
    const r = await ctx.db.query<{ seq: string | null }>(`SELECT max(seq) AS seq FROM ${ctx.t.queueEvents} WHERE queue_id = $1 AND at < $2`, [ctx.queueId, now.at]);
    return Math.max(now.localEnd, r.rows[0].seq === null ? 0 : num(r.rows[0].seq));
  }
  const n = idNumber(from);
  if (n < 0) throw new ValidationError(`events: from must be "now", "earliest" or an event's position, got ${JSON.stringify(String(from).slice(0, 64))}`);
  return n;
}

/** Polling period of a read waiting for its first event. */
const EVENT_POLL_MS = 100;

export async function readEvents(ctx: QueueCtx, req: StoredEventsRequest, now: EventsNow, sleep: (ms: number, signal?: AbortSignal) => Promise<void>, monoNow: () => number): Promise<StoredEventsPage> {
  const start = await startOf(ctx, req.from, now);
  const deadline = monoNow() + req.maxWaitMs;
  for (;;) {
    const r = await ctx.db.query<{ seq: string; at: string; body: Record<string, unknown> }>(
      `SELECT seq, at, body FROM ${ctx.t.queueEvents} WHERE queue_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
      [ctx.queueId, start, req.max],
    );
    if (r.rows.length > 0) {
      const events: QueueEvent[] = [];
      const firstSeq = num(r.rows[0].seq);
      // Events before the oldest kept one were trimmed: the reader is told (a gap).
      if (start > 0 && firstSeq > start + 1) events.push({ type: "gap", position: String(firstSeq - 1), at: ctx.now() });
      for (const row of r.rows) if (events.length < req.max) events.push(toEvent(row.seq, row.at, row.body));
      return { events, position: events[events.length - 1].position };
    }
    const left = deadline - monoNow();
    if (left <= 0 || req.signal?.aborted) return { events: [], position: String(start) };
    await sleep(Math.min(left, EVENT_POLL_MS), req.signal);
  }
}
