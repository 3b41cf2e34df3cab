// SPDX-License-Identifier: Apache-2.0
/**
 * Singleton, debounce and throttle keys of a PostgreSQL queue's enqueues (JOB-2), decided
 * inside the enqueue transaction (enqueue.ts), under the queue row lock.
 *
 * Why no table of their own: the rows already say what a key holds. A `singleton` or
 * `debounce` job carries `jobs.singleton` = `<mode>:<key>`, so "the key's live job" is a
 * lookup on the live rows (it frees itself when the job completes, dead-letters or is removed,
 * with nothing to clean up). A `throttle` window outlives its job, so it is a dedupe entry
 * (`sys:throttle:<key>`, expiring with the window) in `queue_dedupe`. Within one call the
 * first job of a singleton or throttle key takes it, and the last job of a debounce key
 * replaces the others.
 */
import type { Queryable } from "../database.js";
import type { EnqueueResult } from "../../../queues/types.js";
import type { NewJob } from "../../queue-store.js";
import type { LockedQueue, QueueCtx } from "./rows.js";

/** The `jobs.singleton` value of a job (throttle keys live in the dedupe table instead). */
export function singletonTag(j: NewJob): string | null {
  const s = j.singleton;
  return s && s.mode !== "throttle" ? `${s.mode}:${s.key}` : null;
}

/** Dedupe id of a throttle key's window. */
const throttleId = (key: string): string => `sys:throttle:${key}`;

/** One enqueue call's singleton decisions. */
export class SingletonRound {
  /** First job of the call per singleton / throttle key. */
  private readonly first = new Map<string, number>();
  /** Last job of the call per debounce key. */
  private readonly lastDebounce = new Map<string, number>();
  /** Job index -> id of the waiting job it replaced (debounce). */
  readonly replacedBy = new Map<number, string>();
  /** Throttle windows the call opens: job index and window end. */
  readonly throttles: { i: number; key: string; until: number }[] = [];

  constructor(
    private readonly c: Queryable,
    private readonly ctx: QueueCtx,
    private readonly q: LockedQueue,
    private readonly jobs: readonly NewJob[],
  ) {
    jobs.forEach((j, i) => {
      if (j.singleton?.mode === "debounce") this.lastDebounce.set(j.singleton.key, i);
    });
  }

  /** Job `i`: null when it is stored, a result when it is a duplicate, an index when it duplicates a job of this call. */
  async decide(i: number, now: number): Promise<EnqueueResult | number | null> {
    const s = this.jobs[i].singleton!;
    const t = this.ctx.t;
    if (s.mode === "debounce") {
      const last = this.lastDebounce.get(s.key)!;
      if (last !== i) return last;
      // Replaces the key's waiting job (never an active one: the new job waits behind it).
      const r = await this.c.query<{ id: string; size: string }>(
        `DELETE FROM ${t.jobs} WHERE queue_id = $1 AND singleton = $2 AND state = 'waiting' RETURNING id, size`,
        [this.ctx.queueId, singletonTag(this.jobs[i])],
      );
      for (const row of r.rows) {
        this.q.add("live_jobs", -1);
        this.q.add("live_bytes", -Number(row.size));
        this.q.event({ type: "removed", jobId: row.id, reason: "replaced" });
        this.replacedBy.set(i, row.id);
      }
      return null;
    }
    const tag = `${s.mode}:${s.key}`;
    const earlier = this.first.get(tag);
    if (earlier !== undefined) return earlier;
    const held =
      s.mode === "singleton"
        ? await this.c.query<{ id: string }>(`SELECT id FROM ${t.jobs} WHERE queue_id = $1 AND singleton = $2 AND state IN ('waiting', 'leased') LIMIT 1`, [this.ctx.queueId, tag])
        : await this.c.query<{ id: string }>(`SELECT job_id AS id FROM ${t.queueDedupe} WHERE queue_id = $1 AND dedupe_id = $2 AND expires_at > $3`, [this.ctx.queueId, throttleId(s.key), now]);
    if (held.rows.length > 0) return { id: held.rows[0].id, duplicate: true };
    this.first.set(tag, i);
    if (s.mode === "throttle") this.throttles.push({ i, key: s.key, until: this.jobs[i].record.timestamp + s.windowMs });
    return null;
  }

  /** Opens the throttle windows of the stored jobs (`idOf`: a job index's new id). */
  async store(idOf: (i: number) => number): Promise<void> {
    if (this.throttles.length === 0) return;
    await this.c.query(
      `INSERT INTO ${this.ctx.t.queueDedupe} (queue_id, dedupe_id, job_id, expires_at) SELECT $1, x.d, x.id, x.exp FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS x(d, id, exp)
       ON CONFLICT (queue_id, dedupe_id) DO UPDATE SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at`,
      [this.ctx.queueId, this.throttles.map((x) => throttleId(x.key)), this.throttles.map((x) => idOf(x.i)), this.throttles.map((x) => x.until)],
    );
  }
}
