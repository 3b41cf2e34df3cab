// SPDX-License-Identifier: Apache-2.0
/**
 * The inbox on SQLite through better-sqlite3 (12.x), given the application's own `Database`:
 * the handler's writes and the inbox row share one `BEGIN IMMEDIATE` transaction.
 *
 * better-sqlite3 is synchronous and a connection has one transaction at a time, so this store
 * runs transactions one after another (a handler that awaits inside keeps the others waiting).
 * Write to this database only inside `inbox.handle()` (or use another connection): a write made
 * elsewhere while a handler awaits would land in the handler's transaction.
 */
import type { InboxStore } from "../inbox.js";
import { sqliteDatabase, type SqlDatabase } from "./sql.js";

/** The part of better-sqlite3's `Database` the store uses. */
export interface SqliteDatabase {
  prepare(sql: string): { run(...params: unknown[]): { changes: number | bigint }; get(...params: unknown[]): unknown; all(...params: unknown[]): unknown[] };
  exec(sql: string): unknown;
}

export const SQLITE_INBOX_SCHEMA = `
CREATE TABLE IF NOT EXISTS processed_messages (
  consumer_name TEXT NOT NULL,
  message_id    TEXT NOT NULL,
  processed_at  INTEGER NOT NULL, -- ms since the epoch
  PRIMARY KEY (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS processed_messages_age ON processed_messages (consumer_name, processed_at);
CREATE TABLE IF NOT EXISTS consumer_offsets (
  consumer_name TEXT NOT NULL,
  topic         TEXT NOT NULL,
  partition     INTEGER NOT NULL,
  next_offset   INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  PRIMARY KEY (consumer_name, topic, partition)
);`;

export class SqliteInboxStore implements InboxStore<SqliteDatabase> {
  /** Runs transactions one after another on the connection (sql.ts). */
  private readonly sql: SqlDatabase<SqliteDatabase>;

  constructor(readonly db: SqliteDatabase) {
    this.sql = sqliteDatabase(db);
  }

  async ensureSchema(): Promise<void> {
    this.db.exec(SQLITE_INBOX_SCHEMA);
  }

  transaction<R>(fn: (tx: SqliteDatabase) => Promise<R>): Promise<R> {
    return this.sql.transaction((_sql, tx) => fn(tx));
  }


  async claim(tx: SqliteDatabase, consumer: string, messageId: string, processedAt: number): Promise<boolean> {
    const r = tx.prepare("INSERT INTO processed_messages (consumer_name, message_id, processed_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING").run(consumer, messageId, processedAt);
    return Number(r.changes) === 1;
  }

  async saveOffset(tx: SqliteDatabase, consumer: string, topic: string, partition: number, nextOffset: number): Promise<void> {
    tx.prepare(
      "INSERT INTO consumer_offsets (consumer_name, topic, partition, next_offset, updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (consumer_name, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at",
    ).run(consumer, topic, partition, nextOffset, Date.now());
  }

  async loadOffsets(consumer: string, topic: string): Promise<Map<number, number>> {
    const rows = this.db.prepare("SELECT partition, next_offset FROM consumer_offsets WHERE consumer_name = ? AND topic = ?").all(consumer, topic) as { partition: number; next_offset: number }[];
    return new Map(rows.map((r) => [Number(r.partition), Number(r.next_offset)]));
  }

  async isProcessed(consumer: string, messageId: string): Promise<boolean> {
    return this.db.prepare("SELECT 1 FROM processed_messages WHERE consumer_name = ? AND message_id = ?").get(consumer, messageId) !== undefined;
  }

  async prune(consumer: string, beforeMs: number): Promise<number> {
    return Number(this.db.prepare("DELETE FROM processed_messages WHERE consumer_name = ? AND processed_at < ?").run(consumer, beforeMs).changes);
  }
}
