// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine's schema, as numbered migrations applied in order.
 *
 * Why this way: several broker nodes may open the same database at once. All migrations run
 * in one transaction that first takes a transaction-scoped advisory lock keyed by the schema
 * name, so exactly one node applies them while the others wait and then find nothing to do;
 * a failure rolls the whole step back. `schema_version` records what has been applied, so a
 * migration never runs twice and a newer schema than this code knows is refused.
 *
 * Layout: one row per stored batch (`batches.data` holds the batch in the disk format of
 * src/log/record-batch.ts with its real base offset, so its CRC-32C covers the offsets and raw
 * reads hand the bytes out unchanged); `partitions.next_offset` is the log end, allocated under
 * the row's lock by the inserting transaction (offsets are gap-free).
 */
import type pg from "pg";
import { StorageError } from "../../errors.js";
import type { Tables } from "./database.js";
import { queueTables } from "./queues/schema.js";

interface Migration {
  version: number;
  statements: (t: Tables) => string[];
}

const MIGRATIONS: Migration[] = [
  {
    version: 1,
    statements: (t) => [
      `CREATE TABLE ${t.topics} (
        topic_id uuid PRIMARY KEY,
        name text NOT NULL,
        created_at bigint NOT NULL,
        config jsonb NOT NULL,
        deleted boolean NOT NULL DEFAULT false)`,
      `CREATE UNIQUE INDEX topics_live_name ON ${t.topics} (name) WHERE NOT deleted`,
      `CREATE TABLE ${t.partitions} (
        topic_id uuid NOT NULL REFERENCES ${t.topics} (topic_id) ON DELETE CASCADE,
        partition int NOT NULL,
        next_offset bigint NOT NULL DEFAULT 0,
        log_start_offset bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (topic_id, partition))`,
      `CREATE TABLE ${t.batches} (
        topic_id uuid NOT NULL,
        partition int NOT NULL,
        base_offset bigint NOT NULL,
        last_offset bigint NOT NULL,
        first_timestamp bigint NOT NULL,
        max_timestamp bigint NOT NULL,
        record_count int NOT NULL,
        bytes int NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (topic_id, partition, base_offset),
        FOREIGN KEY (topic_id, partition) REFERENCES ${t.partitions} (topic_id, partition) ON DELETE CASCADE)`,
      // Batches are mostly incompressible payloads: store them out of line without pglz.
      `ALTER TABLE ${t.batches} ALTER COLUMN data SET STORAGE EXTERNAL`,
      `CREATE SEQUENCE ${t.producerIds} MINVALUE 0 START 0`,
      `CREATE TABLE ${t.producers} (producer_id bigint PRIMARY KEY, epoch int NOT NULL)`,
      `CREATE TABLE ${t.producerState} (
        topic_id uuid NOT NULL,
        partition int NOT NULL,
        producer_id bigint NOT NULL,
        state jsonb NOT NULL,
        PRIMARY KEY (topic_id, partition, producer_id),
        FOREIGN KEY (topic_id, partition) REFERENCES ${t.partitions} (topic_id, partition) ON DELETE CASCADE)`,
      `CREATE TABLE ${t.groupOffsets} (
        group_name text NOT NULL,
        topic_id uuid NOT NULL REFERENCES ${t.topics} (topic_id) ON DELETE CASCADE,
        partition int NOT NULL,
        committed_offset bigint NOT NULL,
        committed_at bigint NOT NULL,
        metadata text,
        replay_until bigint,
        PRIMARY KEY (group_name, topic_id, partition))`,
      `CREATE TABLE ${t.offsetResets} (
        id bigserial PRIMARY KEY,
        group_name text NOT NULL,
        topic_id uuid NOT NULL REFERENCES ${t.topics} (topic_id) ON DELETE CASCADE,
        at bigint NOT NULL,
        partitions jsonb NOT NULL)`,
      `CREATE INDEX offset_resets_group ON ${t.offsetResets} (group_name, topic_id, id DESC)`,
    ],
  },
  // Work queues: one row per job (src/store/postgres/queues/schema.ts).
  { version: 2, statements: queueTables },
  // Consumer groups coordinated through the database (group-membership.ts, PG-1). Keyed by
  // topic name: membership is of a subscription, which names the topic.
  {
    version: 3,
    statements: (t) => [
      `CREATE TABLE ${t.groups} (
        group_name text NOT NULL,
        topic text NOT NULL,
        generation bigint NOT NULL,
        partitions int NOT NULL,
        strategy text NOT NULL,
        PRIMARY KEY (group_name, topic))`,
      `CREATE TABLE ${t.groupMembers} (
        group_name text NOT NULL,
        topic text NOT NULL,
        member_id text NOT NULL,
        node_id text NOT NULL,
        seq bigserial NOT NULL,
        heartbeat_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (group_name, topic, member_id))`,
      `CREATE INDEX group_members_node ON ${t.groupMembers} (node_id)`,
      `CREATE INDEX group_members_heartbeat ON ${t.groupMembers} (heartbeat_at)`,
      // At most one owner per partition (GRP-1 across nodes); a member's rows go with it.
      `CREATE TABLE ${t.groupOwners} (
        group_name text NOT NULL,
        topic text NOT NULL,
        partition int NOT NULL,
        member_id text NOT NULL,
        generation bigint NOT NULL,
        PRIMARY KEY (group_name, topic, partition),
        FOREIGN KEY (group_name, topic, member_id) REFERENCES ${t.groupMembers} (group_name, topic, member_id) ON DELETE CASCADE)`,
      `CREATE INDEX group_owners_member ON ${t.groupOwners} (group_name, topic, member_id)`,
    ],
  },
  // A time index (partition-store.ts offsetForTimestamp): each batch row carries the largest
  // record timestamp of its partition up to and including it, which never decreases along the
  // offsets, so the first batch reaching a time is one index probe, as with Kafka's time index.
  {
    version: 4,
    statements: (t) => [
      `ALTER TABLE ${t.partitions} ADD COLUMN max_timestamp bigint NOT NULL DEFAULT -1`,
      `ALTER TABLE ${t.batches} ADD COLUMN time_index bigint`,
      `UPDATE ${t.batches} b SET time_index = s.m FROM (
         SELECT topic_id, partition, base_offset, max(max_timestamp) OVER (PARTITION BY topic_id, partition ORDER BY base_offset) AS m FROM ${t.batches}) s
        WHERE b.topic_id = s.topic_id AND b.partition = s.partition AND b.base_offset = s.base_offset`,
      `UPDATE ${t.partitions} p SET max_timestamp = coalesce((SELECT max(b.max_timestamp) FROM ${t.batches} b WHERE b.topic_id = p.topic_id AND b.partition = p.partition), -1)`,
      `ALTER TABLE ${t.batches} ALTER COLUMN time_index SET NOT NULL`,
      `CREATE INDEX batches_time ON ${t.batches} (topic_id, partition, time_index, base_offset)`,
    ],
  },
];

/** The schema version this code writes and understands. */
export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1].version;

/**
 * Brings the schema to SCHEMA_VERSION, idempotently and safely under concurrent callers (see
 * the file comment). Refuses a schema newer than this code.
 */
export async function migrate(client: pg.ClientBase, t: Tables, schemaName: string): Promise<void> {
  await client.query("BEGIN");
  try {
    await client.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [`sluice-migrations:${schemaName}`]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${t.schema}`);
    await client.query(`CREATE TABLE IF NOT EXISTS ${t.schemaVersion} (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`);
    const r = await client.query<{ v: number | null }>(`SELECT max(version) AS v FROM ${t.schemaVersion}`);
    const current = r.rows[0].v ?? 0;
    if (current > SCHEMA_VERSION) throw new StorageError(`schema ${schemaName} is at version ${current}, newer than this sluice understands (${SCHEMA_VERSION}); upgrade sluice`);
    for (const m of MIGRATIONS) {
      if (m.version <= current) continue;
      for (const sql of m.statements(t)) await client.query(sql);
      await client.query(`INSERT INTO ${t.schemaVersion} (version) VALUES ($1)`, [m.version]);
    }
    await client.query("COMMIT");
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  }
}
