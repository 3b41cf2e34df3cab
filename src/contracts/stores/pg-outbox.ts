// SPDX-License-Identifier: Apache-2.0
/**
 * The outbox on PostgreSQL (`pg`). The application inserts with `addToOutboxPg(client, m)` in
 * its own transaction; the insert also sends `NOTIFY sluice_outbox` (delivered at commit), which
 * wakes the relay at once; the relay still polls every `pollIntervalMs` in case a notification
 * was missed (a reconnect). Relays of one name serialize on their `outbox_relay` row.
 */
import { groupRows, outboxRow, type OutboxMessage, type OutboxRow, type OutboxStore, type PlannedBatch, type RelayIdentity } from "../outbox.js";
import type { PgPool, PgPoolClient, PgQueryable } from "./pg-inbox.js";
import { pgDatabase } from "./sql.js";

export const OUTBOX_CHANNEL = "sluice_outbox";

export const PG_OUTBOX_SCHEMA = `
CREATE TABLE IF NOT EXISTS message_outbox (
  position       bigserial PRIMARY KEY,
  message_id     text NOT NULL UNIQUE,
  aggregate_type text NOT NULL,
  aggregate_id   text NOT NULL,
  message_type   text NOT NULL,
  payload        jsonb NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),
  published_at   timestamptz
);
CREATE INDEX IF NOT EXISTS message_outbox_unpublished ON message_outbox (position) WHERE published_at IS NULL;
CREATE TABLE IF NOT EXISTS outbox_relay (
  relay_name     text PRIMARY KEY,
  producer_id    bigint NOT NULL,
  producer_epoch integer NOT NULL,
  sequences      jsonb NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS outbox_relay_pending (
  relay_name     text NOT NULL,
  topic          text NOT NULL,
  partition      integer NOT NULL,
  base_sequence  integer NOT NULL,
  positions      bigint[] NOT NULL,
  PRIMARY KEY (relay_name, topic, partition)
);`;

/** Inserts a message into the outbox inside your transaction (`client` holds it open). */
export async function addToOutboxPg(client: PgQueryable, m: OutboxMessage): Promise<string> {
  const r = outboxRow(m);
  await client.query("INSERT INTO message_outbox (message_id, aggregate_type, aggregate_id, message_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)", [r.messageId, r.aggregateType, r.aggregateId, r.type, r.payloadJson]);
  await client.query(`SELECT pg_notify('${OUTBOX_CHANNEL}', '')`);
  return r.messageId;
}

/** A pooled client that can LISTEN. */
export interface PgListenClient extends PgPoolClient {
  on(event: "notification", fn: (n: { channel: string }) => void): unknown;
  removeListener(event: "notification", fn: (n: { channel: string }) => void): unknown;
}

type RawRow = { position: string; message_id: string; aggregate_type: string; aggregate_id: string; message_type: string; payload: string; created_ms: string };
const toRow = (r: RawRow): OutboxRow => ({ position: Number(r.position), messageId: r.message_id, aggregateType: r.aggregate_type, aggregateId: r.aggregate_id, type: r.message_type, payloadJson: r.payload, createdAt: Number(r.created_ms) });
const COLUMNS = "position, message_id, aggregate_type, aggregate_id, message_type, payload::text AS payload, (extract(epoch from created_at) * 1000)::bigint AS created_ms";

export class PgOutboxStore implements OutboxStore {
  private listener: PgListenClient | null = null;
  private wake: (() => void) | null = null;
  private notified = false;
  private readonly onNotify = () => {
    this.notified = true;
    this.wake?.();
  };

  constructor(
    readonly pool: PgPool,
    private readonly opts: { pollIntervalMs?: number } = {},
  ) {}

  async ensureSchema(): Promise<void> {
    await this.tx(async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtext('sluice_outbox_schema'))");
      await c.query(PG_OUTBOX_SCHEMA);
    });
  }

  async loadIdentity(relay: string): Promise<RelayIdentity | null> {
    const r = await this.pool.query("SELECT producer_id, producer_epoch FROM outbox_relay WHERE relay_name = $1", [relay]);
    const row = r.rows[0] as { producer_id: string; producer_epoch: number } | undefined;
    return row ? { producerId: Number(row.producer_id), producerEpoch: Number(row.producer_epoch) } : null;
  }

  async saveIdentity(relay: string, id: RelayIdentity): Promise<RelayIdentity> {
    await this.pool.query("INSERT INTO outbox_relay (relay_name, producer_id, producer_epoch) VALUES ($1, $2, $3) ON CONFLICT (relay_name) DO NOTHING", [relay, id.producerId, id.producerEpoch]);
    return (await this.loadIdentity(relay))!;
  }

  plan(relay: string, limit: number, place: (row: OutboxRow) => { topic: string; partition: number }): Promise<PlannedBatch[]> {
    return this.tx(async (c) => {
      const state = await c.query("SELECT sequences FROM outbox_relay WHERE relay_name = $1 FOR UPDATE", [relay]);
      const seqs = ((state.rows[0] as { sequences: Record<string, number> } | undefined)?.sequences ?? {}) as Record<string, number>;
      const pending = (await c.query("SELECT topic, partition, base_sequence, positions::text[] AS positions FROM outbox_relay_pending WHERE relay_name = $1 ORDER BY topic, partition", [relay])).rows as { topic: string; partition: number; base_sequence: number; positions: string[] }[];
      if (pending.length > 0) {
        const out: PlannedBatch[] = [];
        for (const p of pending) {
          const rows = (await c.query(`SELECT ${COLUMNS} FROM message_outbox WHERE position = ANY($1::bigint[])`, [p.positions])).rows as RawRow[];
          const byPos = new Map(rows.map((r) => [String(r.position), toRow(r)]));
          out.push({ topic: p.topic, partition: Number(p.partition), baseSequence: Number(p.base_sequence), rows: p.positions.map((pos) => byPos.get(String(pos))!) });
        }
        return out;
      }
      const rows = ((await c.query(`SELECT ${COLUMNS} FROM message_outbox WHERE published_at IS NULL ORDER BY position LIMIT $1`, [limit])).rows as RawRow[]).map(toRow);
      if (rows.length === 0) return [];
      const batches = groupRows(rows, place, (t, p) => seqs[`${p}@${t}`] ?? 0);
      for (const b of batches) {
        await c.query("INSERT INTO outbox_relay_pending (relay_name, topic, partition, base_sequence, positions) VALUES ($1, $2, $3, $4, $5::bigint[])", [relay, b.topic, b.partition, b.baseSequence, b.rows.map((r) => r.position)]);
        seqs[`${b.partition}@${b.topic}`] = b.baseSequence + b.rows.length;
      }
      await c.query("UPDATE outbox_relay SET sequences = $2::jsonb WHERE relay_name = $1", [relay, JSON.stringify(seqs)]);
      return batches;
    });
  }

  complete(relay: string, batches: PlannedBatch[], publishedAt: number): Promise<void> {
    return this.tx(async (c) => {
      for (const b of batches) {
        await c.query("UPDATE message_outbox SET published_at = to_timestamp($1 / 1000.0) WHERE position = ANY($2::bigint[]) AND published_at IS NULL", [publishedAt, b.rows.map((r) => r.position)]);
        await c.query("DELETE FROM outbox_relay_pending WHERE relay_name = $1 AND topic = $2 AND partition = $3", [relay, b.topic, b.partition]);
      }
    });
  }

  async backlog(now: number): Promise<{ rows: number; oldestAgeMs: number }> {
    const r = await this.pool.query("SELECT count(*)::bigint AS n, (extract(epoch from min(created_at)) * 1000)::bigint AS oldest FROM message_outbox WHERE published_at IS NULL");
    const row = r.rows[0] as { n: string; oldest: string | null };
    return { rows: Number(row.n), oldestAgeMs: row.oldest === null ? 0 : Math.max(0, now - Number(row.oldest)) };
  }

  async waitForRows(maxWaitMs: number, signal: AbortSignal): Promise<void> {
    if (!this.listener) {
      const l = (await this.pool.connect()) as PgListenClient;
      l.on("notification", this.onNotify);
      await l.query(`LISTEN ${OUTBOX_CHANNEL}`);
      this.listener = l;
    }
    if (this.notified) {
      this.notified = false;
      return;
    }
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        this.wake = null;
        resolve();
      };
      const t = setTimeout(done, Math.min(maxWaitMs, this.opts.pollIntervalMs ?? 1000));
      signal.addEventListener("abort", done, { once: true });
      if (signal.aborted) done();
      this.wake = done;
    });
    this.notified = false;
  }

  async close(): Promise<void> {
    const l = this.listener;
    this.listener = null;
    if (l) {
      l.removeListener("notification", this.onNotify);
      await l.query(`UNLISTEN ${OUTBOX_CHANNEL}`).catch(() => {});
      l.release();
    }
  }

  private tx<R>(fn: (c: PgPoolClient) => Promise<R>): Promise<R> {
    return pgDatabase(this.pool).transaction((_sql, c) => fn(c));
  }

}
