// SPDX-License-Identifier: Apache-2.0
/**
 * Committed group offsets on PostgreSQL: one row per (group, topic incarnation, partition),
 * plus the last resets of each group on each incarnation (`offset_resets`).
 *
 * Why keyed by topic id: a deleted and re-created topic is a new incarnation, so old
 * positions, replay marks and reset history never apply to it (the delete also removes them).
 * Why one transaction per commit or reset, under an advisory lock of (group, topic id): the
 * replay marks (META-4) depend on the offsets before the write, so they are read and written
 * by the same transaction, serialized against every other commit of that group and topic on
 * any node; the high watermark check (META-3) reads the partition rows in that transaction
 * too. The marks follow the shared rules of src/store/engine.ts (markAfterCommit,
 * markAfterReset), so both engines keep the same marks.
 */
import { NotAssignedError, OffsetOutOfRangeError, PartitionNotFoundError, ValidationError } from "../../errors.js";
import type { CommitFence } from "../group-coordination.js";
import { markAfterCommit, markAfterReset, MAX_REMEMBERED_RESETS, type CommittedOffset, type EngineTopic, type OffsetReset } from "../engine.js";
import { validateName } from "../names.js";
import { num, type Db } from "./database.js";
import type pg from "pg";

interface OffsetRow {
  partition: number;
  committed_offset: string;
  committed_at: string;
  metadata: string | null;
  replay_until: string | null;
}

function toCommitted(r: OffsetRow): CommittedOffset {
  const c: CommittedOffset = { offset: num(r.committed_offset), committedAt: num(r.committed_at) };
  if (r.metadata !== null) c.metadata = r.metadata;
  if (r.replay_until !== null) c.replayUntil = num(r.replay_until);
  return c;
}

export class PgGroupOffsets {
  constructor(
    private readonly db: Db,
    private readonly now: () => number,
  ) {}

  async get(group: string, topic: EngineTopic): Promise<Map<number, CommittedOffset>> {
    validateName("group", group);
    const r = await this.db.query<OffsetRow>(
      `SELECT partition, committed_offset, committed_at, metadata, replay_until FROM ${this.db.t.groupOffsets}
        WHERE group_name = $1 AND topic_id = $2 ORDER BY partition`,
      [group, topic.topicId],
    );
    return new Map(r.rows.map((row) => [row.partition, toCommitted(row)]));
  }

  async resets(group: string, topic: EngineTopic): Promise<OffsetReset[]> {
    validateName("group", group);
    const r = await this.db.query<{ at: string; partitions: OffsetReset["partitions"] }>(
      `SELECT at, partitions FROM ${this.db.t.offsetResets} WHERE group_name = $1 AND topic_id = $2 ORDER BY id DESC LIMIT $3`,
      [group, topic.topicId, MAX_REMEMBERED_RESETS],
    );
    return r.rows.map((row) => ({ at: num(row.at), partitions: row.partitions }));
  }

  /** Every (group, live topic) with committed offsets for the topic's current incarnation. */
  async list(): Promise<{ group: string; topic: string }[]> {
    const t = this.db.t;
    const r = await this.db.query<{ group_name: string; name: string }>(
      `SELECT g.group_name, tp.name FROM ${t.groupOffsets} g JOIN ${t.topics} tp ON tp.topic_id = g.topic_id AND NOT tp.deleted
        GROUP BY g.group_name, tp.name ORDER BY g.group_name COLLATE "C", tp.name COLLATE "C"`,
    );
    return r.rows.map((x) => ({ group: x.group_name, topic: x.name }));
  }

  commit(group: string, topic: EngineTopic, offsets: Map<number, number>, fence?: CommitFence): Promise<void> {
    return this.write(group, topic, offsets, false, fence);
  }

  reset(group: string, topic: EngineTopic, offsets: Map<number, number>): Promise<void> {
    return this.write(group, topic, offsets, true);
  }

  private async write(group: string, topic: EngineTopic, offsets: Map<number, number>, isReset: boolean, fence?: CommitFence): Promise<void> {
    validateName("group", group);
    for (const [p, o] of offsets) {
      if (!Number.isInteger(p) || p < 0 || p >= topic.config.partitions) throw new PartitionNotFoundError(topic.name, p);
      if (!Number.isSafeInteger(o) || o < 0) throw new ValidationError(`invalid offset ${o}`);
    }
    const t = this.db.t;
    const at = this.now();
    await this.db.tx(async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [`sluice-group:${this.db.schemaName}:${topic.topicId}:${group}`]);
      if (fence !== undefined) await checkFence(c, this.db, group, topic, offsets, fence);
      await checkHighWatermarks(c, this.db, topic, offsets);
      const cur = await c.query<OffsetRow>(
        `SELECT partition, committed_offset, committed_at, metadata, replay_until FROM ${t.groupOffsets} WHERE group_name = $1 AND topic_id = $2`,
        [group, topic.topicId],
      );
      const before = new Map(cur.rows.map((row) => [row.partition, toCommitted(row)]));
      const history: OffsetReset["partitions"] = [];
      for (const [p, o] of offsets) {
        const prev = before.get(p);
        // META-4: a reset sets or keeps the mark from the offsets before it; a commit keeps a mark until it reaches it.
        const mark = isReset ? markAfterReset(prev, o) : markAfterCommit(prev, o);
        if (isReset) history.push({ partition: p, from: prev?.offset ?? null, to: o });
        await c.query(
          `INSERT INTO ${t.groupOffsets} (group_name, topic_id, partition, committed_offset, committed_at, replay_until) VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (group_name, topic_id, partition) DO UPDATE SET committed_offset = EXCLUDED.committed_offset, committed_at = EXCLUDED.committed_at, replay_until = EXCLUDED.replay_until`,
          [group, topic.topicId, p, o, at, mark ?? null],
        );
      }
      if (!isReset) return;
      await c.query(`INSERT INTO ${t.offsetResets} (group_name, topic_id, at, partitions) VALUES ($1, $2, $3, $4)`, [group, topic.topicId, at, JSON.stringify(history)]);
      // Older resets are forgotten (at most MAX_REMEMBERED_RESETS kept).
      await c.query(
        `DELETE FROM ${t.offsetResets} WHERE group_name = $1 AND topic_id = $2 AND id NOT IN
           (SELECT id FROM ${t.offsetResets} WHERE group_name = $1 AND topic_id = $2 ORDER BY id DESC LIMIT $3)`,
        [group, topic.topicId, MAX_REMEMBERED_RESETS],
      );
    });
  }
}

/**
 * PG-1: the committing member owns every partition of the commit, in the ownership period
 * (generation) the commit belongs to. FOR SHARE holds the owner rows until this transaction
 * ends, so the rows cannot be deleted (the partition handed to another member) between this
 * check and the write.
 */
async function checkFence(c: pg.PoolClient, db: Db, group: string, topic: EngineTopic, offsets: Map<number, number>, fence: CommitFence): Promise<void> {
  const r = await c.query<{ partition: number; generation: string }>(
    `SELECT partition, generation FROM ${db.t.groupOwners} WHERE group_name = $1 AND topic = $2 AND member_id = $3 AND partition = ANY($4::int[]) FOR SHARE`,
    [group, topic.name, fence.memberId, [...offsets.keys()]],
  );
  const owned = new Map(r.rows.map((x) => [x.partition, num(x.generation)]));
  for (const p of offsets.keys()) {
    const g = owned.get(p);
    if (g === undefined || g !== fence.generations.get(p))
      throw new NotAssignedError(`partition ${topic.name}/${p} is not assigned to this member of group ${group} (in this generation); the new owner resumes from the last commit`);
  }
}

/** META-3: no committed position beyond what the partition holds (its high watermark). */
async function checkHighWatermarks(c: pg.PoolClient, db: Db, topic: EngineTopic, offsets: Map<number, number>): Promise<void> {
  const r = await c.query<{ partition: number; next_offset: string; log_start_offset: string }>(
    `SELECT partition, next_offset, log_start_offset FROM ${db.t.partitions} WHERE topic_id = $1 AND partition = ANY($2::int[])`,
    [topic.topicId, [...offsets.keys()]],
  );
  const byPartition = new Map(r.rows.map((x) => [x.partition, x]));
  for (const [p, o] of offsets) {
    const row = byPartition.get(p);
    if (!row) throw new PartitionNotFoundError(topic.name, p);
    if (o > num(row.next_offset)) throw new OffsetOutOfRangeError(topic.name, p, o, num(row.log_start_offset), num(row.next_offset));
  }
}
