// SPDX-License-Identifier: Apache-2.0
/**
 * The order-status projection (group "order-status"): one row per order with its status and
 * version (1 = accepted, 2 = reserved or rejected), in its own SQLite database. Each fact is
 * applied once through the inbox, which also stores the partition offsets in the same
 * transaction: the projection's database knows exactly which records its rows reflect.
 *
 * Rebuild: the database is deleted; a snapshot (rows and the offsets they reflect) is
 * restored, the later records are replayed, every order's versions are checked contiguous, and
 * rows and offsets are written in one transaction. The checksum must equal the live one's.
 */
import { Inbox, projectionChecksum, readEnvelope, rebuildProjection, SqliteInboxStore, type Broker, type ConsumedRecord, type ProjectionSnapshot, type SqliteDatabase } from "sluice";
import type Database from "better-sqlite3";
import { TOPIC, untilCaughtUp, type OrderFact } from "./setup.js";

export interface StatusRow {
  orderId: string;
  customer: string;
  status: "accepted" | "reserved" | "rejected";
  total: number;
  version: number;
}
type State = Record<string, StatusRow>;

const VERSION: Record<string, number> = { OrderAccepted: 1, InventoryReserved: 2, InventoryRejected: 2 };

/** The projection's one rule, shared by the live consumer and the rebuild. */
export function applyFact(row: StatusRow | undefined, type: string, fact: OrderFact): StatusRow | undefined {
  const version = VERSION[type];
  if (version === undefined || (row && row.version >= version)) return row; // unknown type, or already applied
  if ("customer" in fact) return { orderId: fact.orderId, customer: fact.customer, status: "accepted", total: fact.total, version };
  if (!row) throw new Error(`${type} for ${fact.orderId} before its OrderAccepted`);
  return { ...row, status: fact.reserved ? "reserved" : "rejected", version };
}

export function createProjection(db: Database.Database): void {
  db.exec("CREATE TABLE IF NOT EXISTS order_status (order_id TEXT PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL, total INT NOT NULL, version INT NOT NULL)");
}

const readRow = (db: SqliteDatabase, id: string): StatusRow | undefined => {
  const r = db.prepare("SELECT order_id, customer, status, total, version FROM order_status WHERE order_id = ?").get(id) as { order_id: string; customer: string; status: StatusRow["status"]; total: number; version: number } | undefined;
  return r && { orderId: r.order_id, customer: r.customer, status: r.status, total: r.total, version: r.version };
};
const writeRow = (db: SqliteDatabase, r: StatusRow): void =>
  void db.prepare("INSERT INTO order_status (order_id, customer, status, total, version) VALUES (?, ?, ?, ?, ?) ON CONFLICT (order_id) DO UPDATE SET status = excluded.status, version = excluded.version").run(r.orderId, r.customer, r.status, r.total, r.version);

export async function runProjector(broker: Broker, db: Database.Database): Promise<number> {
  createProjection(db);
  const inbox = new Inbox(new SqliteInboxStore(db), { consumer: "order-status" });
  const stop = untilCaughtUp(broker, "order-status");
  const sub = broker.subscribe<OrderFact>(TOPIC, { group: "order-status", start: "earliest", signal: stop.signal });
  let applied = 0;
  for await (const msg of sub) {
    const type = readEnvelope(msg.headers)?.type ?? "";
    const r = await inbox.handle(
      msg,
      (tx) => {
        const next = applyFact(readRow(tx, msg.value.orderId), type, msg.value);
        if (next) writeRow(tx, next);
      },
      { storeOffset: true },
    );
    if (!r.duplicate) applied++;
    await msg.commit();
  }
  await stop.done;
  return applied;
}

/** Rows and the offsets they reflect, read in one transaction. */
export function takeSnapshot(db: Database.Database): ProjectionSnapshot<State> {
  return db.transaction(() => {
    const state: State = {};
    for (const r of db.prepare("SELECT order_id FROM order_status").all() as { order_id: string }[]) state[r.order_id] = readRow(db, r.order_id)!;
    const offsets: Record<number, number> = {};
    for (const r of db.prepare("SELECT partition, next_offset FROM consumer_offsets WHERE consumer_name = 'order-status' AND topic = ?").all(TOPIC) as { partition: number; next_offset: number }[]) offsets[r.partition] = r.next_offset;
    return { state, offsets };
  })();
}

export function liveChecksum(db: Database.Database): string {
  return projectionChecksum(takeSnapshot(db).state);
}

/** Rebuilds into a fresh database from `snapshot` plus replay; returns its checksum and the version gaps. */
export async function rebuild(broker: Broker, db: Database.Database, snapshot: ProjectionSnapshot<State>): Promise<{ checksum: string; replayed: number; gaps: number }> {
  const r = await rebuildProjection<State>({
    broker,
    topic: TOPIC,
    snapshot: { offsets: snapshot.offsets, state: structuredClone(snapshot.state) },
    apply: (state, rec: ConsumedRecord) => {
      const fact = rec.value as OrderFact;
      const next = applyFact(state[fact.orderId], readEnvelope(rec.headers)?.type ?? "", fact);
      if (next) state[fact.orderId] = next;
    },
    versionOf: (rec) => {
      const v = VERSION[readEnvelope(rec.headers)?.type ?? ""];
      return v === undefined ? null : { entityId: (rec.value as OrderFact).orderId, version: v };
    },
  });
  createProjection(db);
  const store = new SqliteInboxStore(db);
  await store.ensureSchema();
  // Rows and offsets in one transaction: the rebuilt database claims exactly what it reflects.
  db.transaction(() => {
    for (const row of Object.values(r.state)) writeRow(db, row);
    for (const [p, next] of Object.entries(r.offsets)) db.prepare("INSERT INTO consumer_offsets (consumer_name, topic, partition, next_offset, updated_at) VALUES ('order-status', ?, ?, ?, ?)").run(TOPIC, Number(p), next, Date.now());
  })();
  return { checksum: projectionChecksum(r.state), replayed: r.records, gaps: r.gaps.length };
}
