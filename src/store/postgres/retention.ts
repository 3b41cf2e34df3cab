// SPDX-License-Identifier: Apache-2.0
/**
 * Retention of the PostgreSQL engine: whole batches past a topic's retentionMs or beyond its
 * retentionBytes are deleted and the log start moves forward.
 *
 * Why in short steps: the new log start is written first (one statement, LOG-6: it never
 * points into deleted data, and readers below it get OffsetOutOfRangeError at once), then the
 * batch rows below it are deleted in chunks of DELETE_CHUNK rows, each its own transaction,
 * so retention never holds a lock that appends or reads would wait on for long. As the disk
 * engine never deletes its active segment, the last batch of a partition is always kept.
 */
import type { EngineTopic } from "../engine.js";
import { num, type Db } from "./database.js";

/** Batch rows deleted per statement. */
const DELETE_CHUNK = 1000;

/** The log start retention wants for one partition (the current one when nothing expired). */
async function retentionStart(db: Db, topic: EngineTopic, partition: number, now: number): Promise<{ current: number; target: number }> {
  const t = db.t;
  const { retentionMs, retentionBytes } = topic.config;
  const p = await db.query<{ log_start_offset: string; last_base: string | null }>(
    `SELECT p.log_start_offset, (SELECT max(base_offset) FROM ${t.batches} b WHERE b.topic_id = p.topic_id AND b.partition = p.partition) AS last_base
       FROM ${t.partitions} p WHERE p.topic_id = $1 AND p.partition = $2`,
    [topic.topicId, partition],
  );
  if (p.rowCount === 0 || p.rows[0].last_base === null) return { current: 0, target: 0 };
  const current = num(p.rows[0].log_start_offset);
  const lastBase = num(p.rows[0].last_base);
  let target = current;
  if (retentionMs >= 0) {
    // The first batch (from the log start) not yet expired; every one before it has.
    const r = await db.query<{ b: string | null }>(
      `SELECT min(base_offset) AS b FROM ${t.batches} WHERE topic_id = $1 AND partition = $2 AND base_offset >= $3 AND max_timestamp >= $4`,
      [topic.topicId, partition, current, now - retentionMs],
    );
    target = Math.max(target, r.rows[0].b === null ? lastBase : num(r.rows[0].b));
  }
  if (retentionBytes >= 0) {
    // The first batch whose removal would leave less than retentionBytes after it.
    const r = await db.query<{ b: string | null }>(
      `SELECT min(base_offset) AS b FROM (
         SELECT base_offset, sum(bytes) OVER (ORDER BY base_offset DESC) - bytes AS after
           FROM ${t.batches} WHERE topic_id = $1 AND partition = $2 AND base_offset >= $3) s
        WHERE after < $4`,
      [topic.topicId, partition, current, retentionBytes],
    );
    target = Math.max(target, r.rows[0].b === null ? lastBase : num(r.rows[0].b));
  }
  return { current, target: Math.min(target, lastBase) };
}

/** Applies retention to one partition; returns its log start after. */
export async function enforcePartitionRetention(db: Db, topic: EngineTopic, partition: number, now: number): Promise<number> {
  const t = db.t;
  if (topic.config.retentionMs < 0 && topic.config.retentionBytes < 0) return -1;
  const { current, target } = await retentionStart(db, topic, partition, now);
  if (target > current) {
    await db.query(`UPDATE ${t.partitions} SET log_start_offset = GREATEST(log_start_offset, $3) WHERE topic_id = $1 AND partition = $2`, [topic.topicId, partition, target]);
  }
  // Also removes rows a previous run left below the log start (it failed half way).
  for (;;) {
    const r = await db.query(
      `DELETE FROM ${t.batches} WHERE (topic_id, partition, base_offset) IN (
         SELECT b.topic_id, b.partition, b.base_offset FROM ${t.batches} b JOIN ${t.partitions} p ON p.topic_id = b.topic_id AND p.partition = b.partition
          WHERE b.topic_id = $1 AND b.partition = $2 AND b.base_offset < p.log_start_offset ORDER BY b.base_offset LIMIT $3)`,
      [topic.topicId, partition, DELETE_CHUNK],
    );
    if ((r.rowCount ?? 0) < DELETE_CHUNK) break;
  }
  return Math.max(current, target);
}
