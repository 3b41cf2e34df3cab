// SPDX-License-Identifier: Apache-2.0
/**
 * The shared vocabulary of the PostgreSQL queue files: what one open queue is to its SQL
 * (`QueueCtx`), the job row and its conversion to the neutral types of queue-store.ts, and
 * `queueTx`, the one way a state change is written.
 *
 * Why one transaction helper: every change of a queue's jobs takes the queue row first
 * (schema.ts: ids, event positions and admission counters allocated in commit order, one lock
 * order everywhere), adds its lifecycle events and counter deltas, wakes other nodes with
 * `pg_notify` at commit, and resolves only once COMMIT returned (durable, Q-1/Q-2). Doing that
 * in one place keeps each operation's file about its own SQL.
 */
import type pg from "pg";
import { BrokerClosedError, BrokerError, StorageError } from "../../../errors.js";
import type { ValueKind } from "../../../log/record-batch.js";
import type { DeadLetterInfo } from "../../../queues/types.js";
import type { QueueSettings, StoredJob } from "../../queue-store.js";
import { num, type Db, type Queryable, type Tables } from "../database.js";

/** NOTIFY channel: the payload is `<queue id>:<origin>`, a queue whose jobs may have become grantable and the store that said so. */
export const QUEUE_CHANNEL = "sluice_queue";
/**
 * Origin of a commit made by the application (an enqueue inside its transaction,
 * tx-enqueue.ts): no store saw that commit to wake its queues directly, so every store, the
 * enqueuing one included, wakes on its NOTIFY.
 */
export const APP_ORIGIN = "app";

/** What the SQL of one open queue needs. */
export interface QueueCtx {
  readonly db: Db;
  readonly t: Tables;
  readonly queueId: string;
  readonly name: string;
  /** This store's id in NOTIFY payloads (its own notifications are not wake-ups for it). */
  readonly origin: string;
  settings(): QueueSettings;
  now(): number;
  /** Told after a commit that wrote lifecycle events, the last one's position (readEvents "now"). */
  eventsWritten?(last: number): void;
}

/** A job row as the queries select it (`JOB_COLUMNS`). */
export interface JobRow {
  id: string;
  key: string | null;
  value: Buffer | null;
  value_kind: number;
  headers: [string, string][] | null;
  priority: number;
  state: string;
  visible_at: string;
  attempts: number;
  lease_token: string | null;
  lease_deadline: string | null;
  leased_at: string | null;
  enqueued_at: string;
  size: string;
  redrive_count: number;
  first_enqueued_at: string;
  dead_letter: (DeadLetterInfo & { key?: string | null }) | null;
  expires_at: string | null;
  history: unknown[] | null;
  progress: string | null;
  result: string | null;
  last_error: string | null;
  finished_at: string | null;
  grp: string | null;
  parent_id: string | null;
  children: Record<string, { state: "pending" | "completed" | "failed" | "removed"; result?: string; error?: string }> | null;
}

export const JOB_COLUMNS =
  "id, key, value, value_kind, headers, priority, state, visible_at, attempts, lease_token, lease_deadline, leased_at, enqueued_at, size, redrive_count, first_enqueued_at, dead_letter, expires_at, history, progress, result, last_error, finished_at, grp, parent_id, children";

/** Headers as stored (jsonb): `[name, base64]` pairs. */
export function encodeHeaders(h: readonly [string, Buffer][] | null | undefined): string | null {
  if (h == null || h.length === 0) return null;
  return JSON.stringify(h.map(([k, v]) => [k, v.toString("base64")]));
}

export function decodeHeaders(h: [string, string][] | null): [string, Buffer][] | null {
  if (h == null || h.length === 0) return null;
  return h.map(([k, v]) => [k, Buffer.from(v, "base64")]);
}

/** The dead-letter record as a consumer sees it (the source key is the engine's, for redrive). */
export function deadLetterOf(row: JobRow): DeadLetterInfo | null {
  if (row.dead_letter === null) return null;
  const { key: _key, ...info } = row.dead_letter;
  return info;
}

/** The job's key as users see it: a dead-letter entry shows its source job's key. */
export function keyOf(row: JobRow): string | null {
  return row.key ?? row.dead_letter?.key ?? null;
}

export function toStoredJob(row: JobRow): StoredJob {
  return {
    id: row.id,
    key: keyOf(row),
    value: row.value,
    valueKind: row.value_kind as ValueKind,
    headers: decodeHeaders(row.headers),
    enqueuedAt: num(row.enqueued_at),
    redriveCount: row.redrive_count,
    deadLetter: deadLetterOf(row),
  };
}

/** A lifecycle event as stored (QueueEvent without `position` and `at`). */
export type EventBody = Record<string, unknown> & { type: string };

/** Counter columns of the queue row a transaction may move. */
export type Counter = "live_jobs" | "live_bytes" | "completed" | "dead_lettered" | "retries" | "redeliveries";

/** The queue row, locked for the transaction: allocations, counter deltas, events, wake-up. */
export class LockedQueue {
  private readonly deltas = new Map<Counter, number>();
  private readonly events: EventBody[] = [];
  private ids = 0;
  private wake = false;

  constructor(
    readonly queueId: string,
    /** First id not yet allocated. */
    readonly nextId: number,
    private readonly nextEvent: number,
    /** Live jobs and bytes before this transaction's changes. */
    readonly liveJobs: number,
    readonly liveBytes: number,
    private readonly origin: string,
  ) {}

  /** `n` consecutive job ids; returns the first. */
  allocate(n: number): number {
    const first = this.nextId + this.ids;
    this.ids += n;
    return first;
  }

  add(c: Counter, delta: number): void {
    if (delta !== 0) this.deltas.set(c, (this.deltas.get(c) ?? 0) + delta);
  }

  event(e: EventBody): void {
    this.events.push(e);
  }

  /** Jobs may have become grantable: other nodes are told at commit. */
  notify(): void {
    this.wake = true;
  }

  /** Position of the last event this transaction writes (0: none). */
  get lastEvent(): number {
    return this.events.length === 0 ? 0 : this.nextEvent + this.events.length - 1;
  }

  /**
   * The queue's changes of a transaction that has not locked the queue row (queueTxLast):
   * counter deltas, events and the wake-up only; ids and the live counts are not known here.
   */
  static deferred(queueId: string, origin: string): LockedQueue {
    return new LockedQueue(queueId, Number.NaN, Number.NaN, Number.NaN, Number.NaN, origin);
  }

  /**
   * The flush of a deferred queue: one statement that takes the queue row (so events are
   * numbered in commit order, as in queue-first transactions) and writes counters, events and
   * the wake-up. Returns the position of the last event written (0: none). Takes no lock when
   * there is nothing to count or number.
   */
  async flushLocking(c: Queryable, t: Tables, at: number, name: string): Promise<number> {
    // PG-2: ids are allocated only under the queue row taken first.
    if (this.ids > 0 || !Number.isNaN(this.nextId)) throw new Error("flushLocking is for deferred queues that allocate no ids");
    const vals: unknown[] = [this.queueId];
    const sets: string[] = [];
    for (const [col, d] of this.deltas) {
      vals.push(d);
      sets.push(`${col} = ${col} + $${vals.length}`);
    }
    const n = this.events.length;
    const notify = this.wake ? `pg_notify($${vals.push(QUEUE_CHANNEL)}, $${vals.push(`${this.queueId}:${this.origin}`)})` : "NULL";
    if (sets.length === 0 && n === 0) {
      if (this.wake) await c.query(`SELECT ${notify}`, vals.slice(1));
      return 0;
    }
    const k = vals.push(n);
    sets.push(`next_event = next_event + $${k}`);
    let events = "";
    if (n > 0) {
      const atP = vals.push(at);
      const evP = vals.push(JSON.stringify(this.events));
      events = `, e AS (INSERT INTO ${t.queueEvents} (queue_id, seq, at, body)
        SELECT $1, q.first + x.o - 1, $${atP}, x.e FROM q, jsonb_array_elements($${evP}::jsonb) WITH ORDINALITY AS x(e, o))`;
    }
    const r = await c.query<{ first: string }>(
      `WITH q AS (UPDATE ${t.queues} SET ${sets.join(", ")} WHERE queue_id = $1 RETURNING next_event - $${k}::bigint AS first)${events}
       SELECT first, ${notify} FROM q`,
      vals,
    );
    if (r.rows.length === 0) throw new BrokerClosedError(`queue ${name} was deleted`);
    return n === 0 ? 0 : num(r.rows[0].first) + n - 1;
  }

  /** Writes the allocations, counters and events (the last statements of the transaction). */
  async flush(c: Queryable, t: Tables, at: number): Promise<void> {
    const sets: string[] = [];
    const vals: unknown[] = [this.queueId];
    for (const [col, d] of this.deltas) {
      vals.push(d);
      sets.push(`${col} = ${col} + $${vals.length}`);
    }
    if (this.ids > 0) {
      vals.push(this.ids);
      sets.push(`next_id = next_id + $${vals.length}`);
    }
    if (this.events.length > 0) {
      vals.push(this.events.length);
      sets.push(`next_event = next_event + $${vals.length}`);
    }
    // One statement (one round trip while the queue row is held): the row, the events, the wake-up.
    const parts: string[] = [];
    if (sets.length > 0) parts.push(`u AS (UPDATE ${t.queues} SET ${sets.join(", ")} WHERE queue_id = $1)`);
    if (this.events.length > 0) {
      const seqP = vals.push(this.nextEvent);
      const atP = vals.push(at);
      const evP = vals.push(JSON.stringify(this.events));
      parts.push(`e AS (INSERT INTO ${t.queueEvents} (queue_id, seq, at, body)
         SELECT $1, $${seqP}::bigint + x.o - 1, $${atP}, x.e FROM jsonb_array_elements($${evP}::jsonb) WITH ORDINALITY AS x(e, o))`);
    }
    const notify = this.wake ? `pg_notify($${vals.push(QUEUE_CHANNEL)}, $${vals.push(`${this.queueId}:${this.origin}`)})` : "NULL";
    if (parts.length === 0 && !this.wake) return;
    // $1 is used by the parts only; a lone wake-up still names it so the parameter types resolve.
    await c.query(`${parts.length > 0 ? `WITH ${parts.join(", ")} ` : ""}SELECT ${notify}, $1::uuid AS queue_id`, vals);
  }
}

/** Takes the queue row of `queueId` (FOR UPDATE); BrokerClosedError when it was deleted. */
export async function lockQueue(c: Queryable, t: Tables, queueId: string, name: string, origin: string): Promise<LockedQueue> {
  const r = await c.query<{ next_id: string; next_event: string; live_jobs: string; live_bytes: string }>(
    `SELECT next_id, next_event, live_jobs, live_bytes FROM ${t.queues} WHERE queue_id = $1 FOR UPDATE`,
    [queueId],
  );
  if (r.rows.length === 0) throw new BrokerClosedError(`queue ${name} was deleted`);
  const row = r.rows[0];
  return new LockedQueue(queueId, num(row.next_id), num(row.next_event), num(row.live_jobs), num(row.live_bytes), origin);
}

/** How long a queue-first transaction waits for a leased job row before it starts again (PG-2). */
export const LEASED_LOCK_TIMEOUT_MS = 200;
/** How often it starts again before the caller gets the retriable StorageError. */
const LOCK_TIMEOUT_RETRIES = 50;

/** Runs `attempt` again while it fails with lock_not_available (55P03: its lock_timeout passed). */
async function lockTimeoutRetries<T>(attempt: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await attempt();
    } catch (e) {
      if ((e as { code?: unknown }).code !== "55P03" || i >= LOCK_TIMEOUT_RETRIES) throw e instanceof BrokerError ? e : new StorageError(`queue transaction could not take its job rows: ${(e as Error).message}`, e);
      // The queue-last transaction it waited for needs the queue row for one statement only.
      await new Promise((r) => setTimeout(r, 1 + Math.random() * 10));
    }
  }
}

/**
 * Runs `fn` in one transaction that takes the queue row last, in the statement that writes the
 * queue's counters and events just before COMMIT (PG-2): `fn` changes job rows it names (by
 * lease token) and may not allocate ids or read the queue's counts. Holding the queue row only
 * for that statement and the commit, instead of the whole transaction, lets transactions of one
 * queue run their job statements at the same time.
 */
export async function queueTxLast<T>(ctx: QueueCtx, fn: (c: pg.PoolClient, q: LockedQueue) => Promise<T>): Promise<T> {
  let last = 0;
  const out = await ctx.db.tx(async (c) => {
    const q = LockedQueue.deferred(ctx.queueId, ctx.origin);
    const r = await fn(c, q);
    last = await q.flushLocking(c, ctx.t, ctx.now(), ctx.name);
    return r;
  });
  if (last > 0) ctx.eventsWritten?.(last);
  return out;
}

/** Another queue a transaction writes too (a dead-letter or redrive target), locked. */
export interface OtherQueue {
  queueId: string;
  q: LockedQueue;
}

/**
 * Locks this queue's row and, when `other` names another queue, that one's too, in queue id
 * order (two moves in opposite directions never deadlock).
 */
async function lockRows(c: pg.ClientBase, ctx: QueueCtx, other: string | null): Promise<{ q: LockedQueue; o: OtherQueue | null }> {
  if (other === null || other === ctx.name) return { q: await lockQueue(c, ctx.t, ctx.queueId, ctx.name, ctx.origin), o: null };
  const r = await c.query<{ queue_id: string }>(`SELECT queue_id FROM ${ctx.t.queues} WHERE name = $1`, [other]);
  if (r.rows.length === 0) throw new BrokerClosedError(`queue ${other} was deleted`);
  const otherId = r.rows[0].queue_id;
  const lockOther = (): Promise<LockedQueue> => lockQueue(c, ctx.t, otherId, other, ctx.origin);
  const lockOwn = (): Promise<LockedQueue> => lockQueue(c, ctx.t, ctx.queueId, ctx.name, ctx.origin);
  if (otherId < ctx.queueId) {
    const oq = await lockOther();
    return { q: await lockOwn(), o: { queueId: otherId, q: oq } };
  }
  const q = await lockOwn();
  return { q, o: { queueId: otherId, q: await lockOther() } };
}

/**
 * Runs `fn` in one transaction holding the queue row (and `other`'s, when given: null when it
 * is this queue); resolves once committed (durable).
 */
export async function queueTx<T>(
  ctx: QueueCtx,
  fn: (c: pg.PoolClient, q: LockedQueue, other: OtherQueue | null) => Promise<T>,
  other: string | null = null,
  opts: { locksLeased?: boolean } = {},
): Promise<T> {
  if (opts.locksLeased === true) return lockTimeoutRetries(() => runQueueTx(ctx, fn, other, true));
  return runQueueTx(ctx, fn, other, false);
}

async function runQueueTx<T>(ctx: QueueCtx, fn: (c: pg.PoolClient, q: LockedQueue, other: OtherQueue | null) => Promise<T>, other: string | null, locksLeased: boolean): Promise<T> {
  let last = 0;
  const out = await ctx.db.tx(async (c) => {
    const { q, o } = await lockRows(c, ctx, other);
    // PG-2: this transaction holds the queue row and will lock leased (or flow parent) rows,
    // which a queue-last transaction (queueTxLast) may hold while it waits for the queue row.
    // It gives up such a wait quickly (and is run again) instead of closing a lock cycle.
    if (locksLeased) await c.query(`SET LOCAL lock_timeout = '${LEASED_LOCK_TIMEOUT_MS}ms'`);
    const r = await fn(c, q, o);
    const now = ctx.now();
    await q.flush(c, ctx.t, now);
    await o?.q.flush(c, ctx.t, now);
    last = q.lastEvent;
    return r;
  });
  if (last > 0) ctx.eventsWritten?.(last);
  return out;
}
