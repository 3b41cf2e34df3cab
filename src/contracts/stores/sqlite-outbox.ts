// SPDX-License-Identifier: Apache-2.0
/**
 * The outbox on SQLite (better-sqlite3 12.x). The application inserts with `addToOutbox(db, m)`
 * inside its own transaction; the relay's planning and completion are each one synchronous
 * `db.transaction()`, so they never interleave with the application's writes on a shared
 * connection. New rows are found by polling (`pollIntervalMs`).
 */
import { groupRows, outboxRow, sleepUnlessAborted, type OutboxMessage, type OutboxRow, type OutboxStore, type PlannedBatch, type RelayIdentity } from "../outbox.js";
import type { SqliteDatabase } from "./sqlite-inbox.js";

/** better-sqlite3's `Database` with `transaction()`. */
export interface SqliteTxDatabase extends SqliteDatabase {
  transaction(fn: () => unknown): () => unknown;
}

export const SQLITE_OUTBOX_SCHEMA = `
CREATE TABLE IF NOT EXISTS message_outbox (
  position       INTEGER PRIMARY KEY AUTOINCREMENT,
  message_id     TEXT NOT NULL UNIQUE,
  aggregate_type TEXT NOT NULL,
  aggregate_id   TEXT NOT NULL,
  message_type   TEXT NOT NULL,
  payload        TEXT NOT NULL,   -- JSON
  created_at     INTEGER NOT NULL, -- ms since the epoch
  published_at   INTEGER           -- null until the relay published it
);
CREATE INDEX IF NOT EXISTS message_outbox_unpublished ON message_outbox (position) WHERE published_at IS NULL;
CREATE TABLE IF NOT EXISTS outbox_relay (
  relay_name     TEXT PRIMARY KEY,
  producer_id    INTEGER NOT NULL,
  producer_epoch INTEGER NOT NULL,
  sequences      TEXT NOT NULL     -- JSON: {"<partition>@<topic>": next sequence}
);
CREATE TABLE IF NOT EXISTS outbox_relay_pending (
  relay_name     TEXT NOT NULL,
  topic          TEXT NOT NULL,
  partition      INTEGER NOT NULL,
  base_sequence  INTEGER NOT NULL,
  positions      TEXT NOT NULL,    -- JSON array of message_outbox positions, in publish order
  PRIMARY KEY (relay_name, topic, partition)
);`;

/** Inserts a message into the outbox; call it inside the transaction of your business change. */
export function addToOutbox(db: SqliteDatabase, m: OutboxMessage, now = Date.now()): string {
  const r = outboxRow(m);
  db.prepare("INSERT INTO message_outbox (message_id, aggregate_type, aggregate_id, message_type, payload, created_at) VALUES (?, ?, ?, ?, ?, ?)").run(r.messageId, r.aggregateType, r.aggregateId, r.type, r.payloadJson, now);
  return r.messageId;
}

type RawRow = { position: number; message_id: string; aggregate_type: string; aggregate_id: string; message_type: string; payload: string; created_at: number };
const toRow = (r: RawRow): OutboxRow => ({ position: Number(r.position), messageId: r.message_id, aggregateType: r.aggregate_type, aggregateId: r.aggregate_id, type: r.message_type, payloadJson: r.payload, createdAt: Number(r.created_at) });
const COLUMNS = "position, message_id, aggregate_type, aggregate_id, message_type, payload, created_at";

export class SqliteOutboxStore implements OutboxStore {
  constructor(
    readonly db: SqliteTxDatabase,
    private readonly opts: { pollIntervalMs?: number } = {},
  ) {}

  async ensureSchema(): Promise<void> {
    this.db.exec(SQLITE_OUTBOX_SCHEMA);
  }

  async loadIdentity(relay: string): Promise<RelayIdentity | null> {
    const r = this.db.prepare("SELECT producer_id, producer_epoch FROM outbox_relay WHERE relay_name = ?").get(relay) as { producer_id: number; producer_epoch: number } | undefined;
    return r ? { producerId: Number(r.producer_id), producerEpoch: Number(r.producer_epoch) } : null;
  }

  async saveIdentity(relay: string, id: RelayIdentity): Promise<RelayIdentity> {
    this.db.prepare("INSERT INTO outbox_relay (relay_name, producer_id, producer_epoch, sequences) VALUES (?, ?, ?, '{}') ON CONFLICT (relay_name) DO NOTHING").run(relay, id.producerId, id.producerEpoch);
    return (await this.loadIdentity(relay))!;
  }

  async plan(relay: string, limit: number, place: (row: OutboxRow) => { topic: string; partition: number }): Promise<PlannedBatch[]> {
    const run = this.db.transaction((): PlannedBatch[] => {
      const pending = this.db.prepare("SELECT topic, partition, base_sequence, positions FROM outbox_relay_pending WHERE relay_name = ? ORDER BY topic, partition").all(relay) as { topic: string; partition: number; base_sequence: number; positions: string }[];
      if (pending.length > 0) {
        const get = this.db.prepare(`SELECT ${COLUMNS} FROM message_outbox WHERE position = ?`);
        return pending.map((p) => ({ topic: p.topic, partition: Number(p.partition), baseSequence: Number(p.base_sequence), rows: (JSON.parse(p.positions) as number[]).map((pos) => toRow(get.get(pos) as RawRow)) }));
      }
      const rows = (this.db.prepare(`SELECT ${COLUMNS} FROM message_outbox WHERE published_at IS NULL ORDER BY position LIMIT ?`).all(limit) as RawRow[]).map(toRow);
      if (rows.length === 0) return [];
      const state = this.db.prepare("SELECT sequences FROM outbox_relay WHERE relay_name = ?").get(relay) as { sequences: string };
      const seqs = JSON.parse(state.sequences) as Record<string, number>;
      const batches = groupRows(rows, place, (t, p) => seqs[`${p}@${t}`] ?? 0);
      const ins = this.db.prepare("INSERT INTO outbox_relay_pending (relay_name, topic, partition, base_sequence, positions) VALUES (?, ?, ?, ?, ?)");
      for (const b of batches) {
        ins.run(relay, b.topic, b.partition, b.baseSequence, JSON.stringify(b.rows.map((r) => r.position)));
        seqs[`${b.partition}@${b.topic}`] = b.baseSequence + b.rows.length;
      }
      this.db.prepare("UPDATE outbox_relay SET sequences = ? WHERE relay_name = ?").run(JSON.stringify(seqs), relay);
      return batches;
    });
    return run() as PlannedBatch[];
  }

  async complete(relay: string, batches: PlannedBatch[], publishedAt: number): Promise<void> {
    const mark = this.db.prepare("UPDATE message_outbox SET published_at = ? WHERE position = ? AND published_at IS NULL");
    const forget = this.db.prepare("DELETE FROM outbox_relay_pending WHERE relay_name = ? AND topic = ? AND partition = ?");
    this.db.transaction(() => {
      for (const b of batches) {
        for (const r of b.rows) mark.run(publishedAt, r.position);
        forget.run(relay, b.topic, b.partition);
      }
    })();
  }

  async backlog(now: number): Promise<{ rows: number; oldestAgeMs: number }> {
    const r = this.db.prepare("SELECT count(*) AS n, min(created_at) AS oldest FROM message_outbox WHERE published_at IS NULL").get() as { n: number; oldest: number | null };
    return { rows: Number(r.n), oldestAgeMs: r.oldest === null ? 0 : Math.max(0, now - Number(r.oldest)) };
  }

  waitForRows(maxWaitMs: number, signal: AbortSignal): Promise<void> {
    return sleepUnlessAborted(Math.min(maxWaitMs, this.opts.pollIntervalMs ?? 100), signal);
  }


  async close(): Promise<void> {}
}
