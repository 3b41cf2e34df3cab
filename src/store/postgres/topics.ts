// SPDX-License-Identifier: Apache-2.0
/**
 * Topics of the PostgreSQL engine: create, alter, delete, list, and the name -> incarnation
 * lookup every partition call starts with.
 *
 * Why a cache: a topic's id and config (except retention, which only retention reads) never
 * change during an incarnation, so the hot paths (append, read) validate against a cached
 * copy before talking to the database. The cache is only a hint: every partition statement
 * names the topic id, and when the partition row is gone (the topic was deleted, perhaps by
 * another node) the caller drops the entry and looks again (`forget`). Admin calls and
 * listings always read the table.
 *
 * TOPIC-1 here: the topic row and its partition rows are inserted in one transaction; a
 * delete marks the row deleted and removes its partitions (cascading to batches and producer
 * state) and its group offsets in one transaction, so a re-created name is a new incarnation
 * with nothing resurrected.
 */
import { randomUUID } from "node:crypto";
import { PartitionNotFoundError, TopicExistsError, TopicNotFoundError, ValidationError } from "../../errors.js";
import type { TopicConfig, TopicDescription } from "../../types.js";
import type { EngineTopic } from "../engine.js";
import { validateName } from "../names.js";
import { resolveTopicConfig } from "../topic-config.js";
import { num, type Db } from "./database.js";

interface TopicRow {
  topic_id: string;
  name: string;
  created_at: string;
  config: TopicConfig;
}

function toTopic(r: TopicRow): EngineTopic {
  return { name: r.name, topicId: r.topic_id, createdAt: num(r.created_at), config: resolveTopicConfig(r.config) };
}

/** Features of the disk engine this engine does not store yet: refused at creation, not ignored. */
function checkSupported(name: string, c: Required<TopicConfig>): void {
  const no = (what: string): never => {
    throw new ValidationError(`topic ${JSON.stringify(name)}: ${what} is not yet available on the PostgreSQL engine`);
  };
  if (c.cleanupPolicy !== "delete") no(`cleanupPolicy ${JSON.stringify(c.cleanupPolicy)} (key compaction)`);
  if (c.archive !== null) no("archive (tiered storage)");
  if (c.encrypted) no("encryption at rest");
}

export class TopicCatalog {
  private cache = new Map<string, EngineTopic>();

  constructor(
    private readonly db: Db,
    private readonly now: () => number,
  ) {}

  async create(name: string, config: Required<TopicConfig>): Promise<EngineTopic> {
    validateName("topic", name);
    checkSupported(name, config);
    const t = this.db.t;
    const topic: EngineTopic = { name, topicId: randomUUID(), createdAt: this.now(), config };
    try {
      await this.db.tx(async (c) => {
        await c.query(`INSERT INTO ${t.topics} (topic_id, name, created_at, config) VALUES ($1, $2, $3, $4)`, [topic.topicId, name, topic.createdAt, JSON.stringify(config)]);
        await c.query(`INSERT INTO ${t.partitions} (topic_id, partition) SELECT $1, p FROM generate_series(0, $2 - 1) AS p`, [topic.topicId, config.partitions]);
      });
    } catch (e) {
      // The partial unique index on live names: another creator (maybe another node) won.
      if ((e as { code?: string }).code === "23505") throw new TopicExistsError(name);
      throw e;
    }
    this.cache.set(name, topic);
    return { ...topic, config: { ...config } };
  }

  async alter(name: string, changes: { retentionMs?: number; retentionBytes?: number }): Promise<EngineTopic> {
    validateName("topic", name);
    const r = await this.db.query<TopicRow>(
      `UPDATE ${this.db.t.topics} SET config = config || $2::jsonb WHERE name = $1 AND NOT deleted RETURNING topic_id, name, created_at, config`,
      [name, JSON.stringify(changes)],
    );
    if (r.rowCount === 0) throw new TopicNotFoundError(name);
    const topic = toTopic(r.rows[0]);
    this.cache.set(name, topic);
    return topic;
  }

  async delete(name: string): Promise<void> {
    validateName("topic", name);
    const t = this.db.t;
    this.cache.delete(name);
    await this.db.tx(async (c) => {
      const r = await c.query<{ topic_id: string }>(`UPDATE ${t.topics} SET deleted = true WHERE name = $1 AND NOT deleted RETURNING topic_id`, [name]);
      if (r.rowCount === 0) throw new TopicNotFoundError(name);
      const id = r.rows[0].topic_id;
      // Locks each partition row first (an append in flight finishes before its rows go).
      await c.query(`DELETE FROM ${t.partitions} WHERE topic_id = $1`, [id]);
      await c.query(`DELETE FROM ${t.groupOffsets} WHERE topic_id = $1`, [id]);
      await c.query(`DELETE FROM ${t.offsetResets} WHERE topic_id = $1`, [id]);
    });
  }

  async list(): Promise<string[]> {
    const r = await this.db.query<{ name: string }>(`SELECT name FROM ${this.db.t.topics} WHERE NOT deleted ORDER BY name COLLATE "C"`);
    return r.rows.map((x) => x.name);
  }

  /** The current incarnation, from the table (refreshes the cache). */
  async get(name: string): Promise<EngineTopic> {
    validateName("topic", name);
    const r = await this.db.query<TopicRow>(`SELECT topic_id, name, created_at, config FROM ${this.db.t.topics} WHERE name = $1 AND NOT deleted`, [name]);
    if (r.rowCount === 0) {
      this.cache.delete(name);
      throw new TopicNotFoundError(name);
    }
    const topic = toTopic(r.rows[0]);
    this.cache.set(name, topic);
    return topic;
  }

  /** The cached incarnation (or a fresh lookup); partition calls verify it by topic id. */
  async lookup(name: string): Promise<EngineTopic> {
    return this.cache.get(name) ?? this.get(name);
  }

  /** A partition call found the cached incarnation gone: look again next time. */
  forget(name: string, topicId: string): void {
    if (this.cache.get(name)?.topicId === topicId) this.cache.delete(name);
  }

  /** Every live topic (retention walks them). */
  async all(): Promise<EngineTopic[]> {
    const r = await this.db.query<TopicRow>(`SELECT topic_id, name, created_at, config FROM ${this.db.t.topics} WHERE NOT deleted ORDER BY name COLLATE "C"`);
    return r.rows.map(toTopic);
  }

  async describe(name: string): Promise<TopicDescription> {
    const topic = await this.get(name);
    const r = await this.db.query<{ partition: number; next_offset: string; log_start_offset: string; size: string | null; batches: string }>(
      `SELECT p.partition, p.next_offset, p.log_start_offset,
              (SELECT sum(b.bytes) FROM ${this.db.t.batches} b WHERE b.topic_id = p.topic_id AND b.partition = p.partition) AS size,
              (SELECT count(*) FROM ${this.db.t.batches} b WHERE b.topic_id = p.topic_id AND b.partition = p.partition) AS batches
         FROM ${this.db.t.partitions} p WHERE p.topic_id = $1 ORDER BY p.partition`,
      [topic.topicId],
    );
    return {
      name: topic.name,
      topicId: topic.topicId,
      createdAt: topic.createdAt,
      config: { ...topic.config },
      partitions: r.rows.map((p) => ({
        partition: p.partition,
        logStartOffset: num(p.log_start_offset),
        logEndOffset: num(p.next_offset),
        highWatermark: num(p.next_offset),
        sizeBytes: p.size === null ? 0 : num(p.size),
        // No segment files here: one stored batch row is this engine's unit of retention.
        segments: num(p.batches),
      })),
    };
  }
}

/** Throws PartitionNotFoundError unless `partition` is one of the topic's. */
export function checkPartition(topic: EngineTopic, partition: number): void {
  if (!Number.isInteger(partition) || partition < 0 || partition >= topic.config.partitions) throw new PartitionNotFoundError(topic.name, partition);
}
