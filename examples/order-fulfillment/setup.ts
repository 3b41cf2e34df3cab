// SPDX-License-Identifier: Apache-2.0
/**
 * What every part of the order-fulfillment system shares: the broker (embedded, or a server
 * when SLUICE_URL is set: the only difference), the PostgreSQL schema of this run, the SQLite
 * files, and two small tools: `check` (the system verifies its own outcome) and
 * `untilCaughtUp` (consumers in this demo stop once their group has processed everything).
 */
import Database from "better-sqlite3";
import pg from "pg";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { connect, openBroker, type Broker } from "sluice";

export const TOPIC = "orders";
export const INVENTORY_QUEUE = "inventory";
/** The inventory queue keeps each command's result for an hour, readable by job id (`getJob`). */
export const INVENTORY_CONFIG = { resultRetentionMs: 3_600_000, maxAttempts: 5 } as const;

export interface System {
  broker: Broker;
  /** Where the broker runs: "embedded" or the server URL. */
  mode: string;
  dataDir: string;
  /** A pool on this run's own PostgreSQL schema (dropped at the end). */
  pg: pg.Pool;
  schema: string;
  sqlite(name: string): Database.Database;
  sqlitePath(name: string): string;
  close(): Promise<void>;
}

export async function openSystem(): Promise<System> {
  const dataDir = process.env.SLUICE_DATA ?? "./data/order-fulfillment";
  mkdirSync(dataDir, { recursive: true });
  const url = process.env.SLUICE_URL || undefined; // empty counts as unset
  const broker: Broker = url ? await connect({ url }) : await openBroker({ dataDir: join(dataDir, "broker") });
  const pgUrl = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  // Each run gets its own schema, so runs never see each other's orders.
  const schema = `of_${randomBytes(5).toString("hex")}`;
  const admin = new pg.Client({ connectionString: pgUrl });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.end();
  const pool = new pg.Pool({ connectionString: pgUrl, max: 8, options: `-c search_path=${schema}` });
  const dbs: Database.Database[] = [];
  const sqlitePath = (name: string) => join(dataDir, `${name}.db`);
  return {
    broker,
    mode: url ?? "embedded",
    dataDir,
    pg: pool,
    schema,
    sqlitePath,
    sqlite(name) {
      const db = new Database(sqlitePath(name));
      db.pragma("journal_mode = WAL");
      dbs.push(db);
      return db;
    },
    async close() {
      for (const db of dbs) if (db.open) db.close();
      await pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
      await pool.end();
      await broker.close();
    },
  };
}

/** The system checks its own outcome: a failed check ends the run with exit code 1. */
export function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`check failed: ${what}`);
  console.log(`  ok  ${what}`);
}

/**
 * An AbortSignal that fires once `group` has processed every record of the topic that exists
 * now (lag 0), or throws after `deadlineMs`. A service would keep consuming; a demo stops.
 */
export function untilCaughtUp(broker: Broker, group: string, deadlineMs = 30_000): { signal: AbortSignal; done: Promise<void> } {
  const ac = new AbortController();
  const started = Date.now();
  const done = (async () => {
    for (;;) {
      const lag = await broker.groupLag(group, TOPIC);
      if (lag.totalRecords === 0 && lag.partitions.every((p) => p.committedOffset !== null || p.highWatermark === 0)) break;
      if (Date.now() - started > deadlineMs) throw new Error(`group ${group} did not catch up within ${deadlineMs} ms (lag ${lag.totalRecords})`);
      await new Promise((r) => setTimeout(r, 20));
    }
    ac.abort();
  })();
  return { signal: ac.signal, done };
}

/** Waits for `cond` with a deadline (polling: the demo's stand-in for watching metrics). */
export async function waitFor(what: string, cond: () => Promise<boolean>, deadlineMs = 30_000): Promise<void> {
  const started = Date.now();
  while (!(await cond())) {
    if (Date.now() - started > deadlineMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export interface OrderAccepted {
  orderId: string;
  customer: string;
  sku: string;
  quantity: number;
  total: number;
}

/** Facts on the orders topic: OrderAccepted (version 1 of an order), then InventoryReserved or InventoryRejected (version 2). */
export type OrderFact = OrderAccepted | { orderId: string; commandId: string; reserved: boolean };
