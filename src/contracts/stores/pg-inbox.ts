// SPDX-License-Identifier: Apache-2.0
/**
 * The inbox on PostgreSQL through `pg`, given the application's pool: each handled message
 * takes a client, and the handler's queries and the inbox row share one transaction on it.
 * Two deliveries of one id at once: the second insert waits on the primary key until the first
 * transaction ends, then finds the row (a duplicate) or takes over (the first rolled back).
 */
import type { InboxStore } from "../inbox.js";
import { pgDatabase } from "./sql.js";

/** The part of `pg`'s client the store uses (a `PoolClient` or a `Client`). */
export interface PgQueryable {
  query(text: string, params?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
}
export interface PgPoolClient extends PgQueryable {
  release(err?: Error | boolean): void;
}
/** The part of `pg`'s `Pool` the store uses. */
export interface PgPool extends PgQueryable {
  connect(): Promise<PgPoolClient>;
}

export const PG_INBOX_SCHEMA = `
CREATE TABLE IF NOT EXISTS processed_messages (
  consumer_name text NOT NULL,
  message_id    text NOT NULL,
  processed_at  timestamptz NOT NULL,
  PRIMARY KEY (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS processed_messages_age ON processed_messages (consumer_name, processed_at);
CREATE TABLE IF NOT EXISTS consumer_offsets (
  consumer_name text NOT NULL,
  topic         text NOT NULL,
  partition     integer NOT NULL,
  next_offset   bigint NOT NULL,
  updated_at    timestamptz NOT NULL,
  PRIMARY KEY (consumer_name, topic, partition)
);`;

export class PgInboxStore implements InboxStore<PgPoolClient> {
  constructor(readonly pool: PgPool) {}

  async ensureSchema(): Promise<void> {
    // Concurrent CREATE TABLE IF NOT EXISTS can still collide on the catalog: serialize with an
    // advisory lock for the duration of the transaction.
    await this.transaction(async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtext('sluice_inbox_schema'))");
      await c.query(PG_INBOX_SCHEMA);
    });
  }

  transaction<R>(fn: (tx: PgPoolClient) => Promise<R>): Promise<R> {
    return pgDatabase(this.pool).transaction((_sql, tx) => fn(tx));
  }


  async claim(tx: PgPoolClient, consumer: string, messageId: string, processedAt: number): Promise<boolean> {
    const r = await tx.query("INSERT INTO processed_messages (consumer_name, message_id, processed_at) VALUES ($1, $2, to_timestamp($3 / 1000.0)) ON CONFLICT DO NOTHING", [consumer, messageId, processedAt]);
    return r.rowCount === 1;
  }

  async saveOffset(tx: PgPoolClient, consumer: string, topic: string, partition: number, nextOffset: number): Promise<void> {
    await tx.query(
      "INSERT INTO consumer_offsets (consumer_name, topic, partition, next_offset, updated_at) VALUES ($1, $2, $3, $4, now()) ON CONFLICT (consumer_name, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at",
      [consumer, topic, partition, nextOffset],
    );
  }

  async loadOffsets(consumer: string, topic: string): Promise<Map<number, number>> {
    const r = await this.pool.query("SELECT partition, next_offset FROM consumer_offsets WHERE consumer_name = $1 AND topic = $2", [consumer, topic]);
    return new Map((r.rows as { partition: number; next_offset: string }[]).map((row) => [Number(row.partition), Number(row.next_offset)]));
  }

  async isProcessed(consumer: string, messageId: string): Promise<boolean> {
    const r = await this.pool.query("SELECT 1 FROM processed_messages WHERE consumer_name = $1 AND message_id = $2", [consumer, messageId]);
    return (r.rowCount ?? 0) > 0;
  }

  async prune(consumer: string, beforeMs: number): Promise<number> {
    const r = await this.pool.query("DELETE FROM processed_messages WHERE consumer_name = $1 AND processed_at < to_timestamp($2 / 1000.0)", [consumer, beforeMs]);
    return r.rowCount ?? 0;
  }
}
