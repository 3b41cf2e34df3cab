// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine's schedule store (src/store/schedule-store.ts): the scheduler's
 * document of job schedules as the single row of `queue_schedules`, replaced whole by one
 * upsert, so `save` resolves only once the new document is committed (SCHED-1) and a crash
 * leaves the old or the new one.
 *
 * Why one row: the scheduler (src/queues/schedules/) loads and saves the whole document, as
 * on disk. Several nodes on one schema each run their scheduler on their own copy: ticks are
 * never enqueued twice (their `sys:sch:` dedupe ids are kept 7 days by every queue, SCHED-2),
 * but definitions changed on two nodes at once are last-writer-wins; run schedules on one node
 * (`runSchedules`) when they are changed from several.
 */
import type { ScheduleStore, StoredSchedule } from "../../schedule-store.js";
import type { Db } from "../database.js";

export class PgScheduleStore implements ScheduleStore {
  constructor(private readonly db: Db) {}

  async load(): Promise<StoredSchedule[]> {
    const r = await this.db.query<{ doc: { schedules: StoredSchedule[] } }>(`SELECT doc FROM ${this.db.t.queueSchedules} WHERE id`);
    return r.rows[0]?.doc.schedules ?? [];
  }

  async save(all: readonly StoredSchedule[]): Promise<void> {
    await this.db.query(`INSERT INTO ${this.db.t.queueSchedules} (id, doc) VALUES (true, $1) ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc`, [JSON.stringify({ version: 1, schedules: all })]);
  }
}
