// SPDX-License-Identifier: Apache-2.0
/**
 * Consumer-contract figures (the `contracts` section), embedded sluice, all in one run:
 *
 * - `inbox`: consuming a backlog with the README loop (one handler call and one un-awaited
 *   `msg.commit()` per message), plain, and with the handler writing one row per message to
 *   SQLite / PostgreSQL, without and with the inbox (the business row and the
 *   `processed_messages` row in one transaction). Each database transaction commits durably
 *   (SQLite WAL with synchronous=FULL; PostgreSQL synchronous_commit=on), one per message.
 * - `outbox`: an `OutboxRelay` draining a pre-filled `message_outbox` (SQLite / PostgreSQL) to
 *   a topic, 500 rows per round: rows published per second.
 */
import Database from "better-sqlite3";
import pg from "pg";
import { join } from "node:path";
import { mkdtempSync } from "node:fs";
import { openBroker } from "../src/broker/broker.js";
import type { Broker } from "../src/types.js";
import { Inbox } from "../src/contracts/inbox.js";
import { SqliteInboxStore } from "../src/contracts/stores/sqlite-inbox.js";
import { PgInboxStore } from "../src/contracts/stores/pg-inbox.js";
import { envelope } from "../src/contracts/envelope.js";
import { OutboxRelay } from "../src/contracts/outbox-relay.js";
import { addToOutbox, SqliteOutboxStore } from "../src/contracts/stores/sqlite-outbox.js";
import { PgOutboxStore } from "../src/contracts/stores/pg-outbox.js";
import { Meter, runGroups, type BenchCase, type BenchGroup, type Limits, type RunGroupOptions } from "./harness.js";
import type { BenchRow } from "./report.js";
import { SLUICE_DURABILITY } from "./sluice-topics.js";

const PG_URL = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const BACKLOG = 30_000;
/** Plain consumption outruns a 30,000 backlog within the warm-up: it gets enough for the run. */
const PLAIN_BACKLOG = 1_200_000;
let seq = 0;

type Handler = (msg: { value: unknown; headers: Record<string, Uint8Array>; offset: number; partition: number }) => Promise<void> | void;

/** Consumes a fresh backlog with the README loop and `handle` per message; messages/s. */
async function consume(broker: Broker, limits: Limits, handle: Handler, backlog = BACKLOG): Promise<{ values: { rate: number }; note: string }> {
  const topic = `contracts-bench-${process.pid}-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  for (let i = 0; i < backlog; i += 1000) {
    await broker.publishBatch(topic, Array.from({ length: 1000 }, (_, k) => ({ key: `acct-${(i + k) % 64}`, value: { id: i + k, amount: 1 }, headers: envelope({ type: "PaymentCaptured", messageId: `${topic}-${i + k}` }) })));
  }
  const meter = new Meter(limits);
  const ac = new AbortController();
  const sub = broker.subscribe(topic, { group: "bench", start: "earliest", signal: ac.signal });
  let seen = 0;
  for await (const msg of sub) {
    await handle(msg);
    void msg.commit();
    seen++;
    if (meter.add(1) || seen === backlog) break;
  }
  meter.finish();
  await sub.close();
  await broker.deleteTopic(topic);
  return { values: { rate: meter.rate() }, note: meter.describe() };
}

/** Consumes a fresh backlog in batches of 500 with `handle` per batch and `batch.commit()`. */
async function consumeBatches(broker: Broker, limits: Limits, handle: (msgs: { value: unknown; headers: Record<string, Uint8Array>; offset: number; partition: number; topic: string }[]) => Promise<void>) {
  const topic = `contracts-bench-${process.pid}-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  for (let i = 0; i < BACKLOG; i += 1000) {
    await broker.publishBatch(topic, Array.from({ length: 1000 }, (_, k) => ({ key: `acct-${(i + k) % 64}`, value: { id: i + k, amount: 1 }, headers: envelope({ type: "PaymentCaptured", messageId: `${topic}-${i + k}` }) })));
  }
  const meter = new Meter(limits);
  const sub = broker.subscribe(topic, { group: "bench", start: "earliest" });
  let seen = 0;
  for await (const batch of sub.batches({ maxMessages: 500, maxWaitMs: 0 })) {
    await handle(batch.messages);
    void batch.commit();
    seen += batch.messages.length;
    if (meter.add(batch.messages.length) || seen >= BACKLOG) break;
  }
  meter.finish();
  await sub.close();
  await broker.deleteTopic(topic);
  return { values: { rate: meter.rate() }, note: meter.describe() };
}

function sqlite(dir: string) {
  const db = new Database(join(dir, `app-${seq++}.db`));
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = FULL");
  db.exec("CREATE TABLE IF NOT EXISTS payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)");
  return db;
}

async function pgPool(): Promise<pg.Pool> {
  const schema = `sluice_bench_contracts`;
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.end();
  const pool = new pg.Pool({ connectionString: PG_URL, max: 4, options: `-c search_path=${schema}` });
  await pool.query("CREATE TABLE IF NOT EXISTS payments (id text PRIMARY KEY, amount integer NOT NULL)");
  return pool;
}

function inboxGroup(broker: Broker, dir: string, pool: () => Promise<pg.Pool>): BenchGroup {
  const shape = "README loop: for await (msg of sub) { handler; void msg.commit() }, 4 partitions, backlog 30,000";
  const idOf = (m: { value: unknown }) => String((m.value as { id: number }).id) + `-${seq}`;
  const cases: BenchCase[] = [
    { system: "sluice-embedded (plain)", durability: SLUICE_DURABILITY, shape: `${shape.replace("backlog 30,000", "backlog 1,200,000")}; no database`, run: (l) => consume(broker, l, () => {}, PLAIN_BACKLOG) },
    {
      system: "SQLite: business row only",
      durability: "SQLite WAL, synchronous=FULL: one transaction per message",
      shape: `${shape}; INSERT one row per message (autocommit)`,
      run: (l) => {
        const db = sqlite(dir);
        const ins = db.prepare("INSERT INTO payments (id, amount) VALUES (?, ?)");
        return consume(broker, l, (m) => void ins.run(idOf(m), 1)).finally(() => db.close());
      },
    },
    {
      system: "SQLite: inbox",
      durability: "SQLite WAL, synchronous=FULL: one transaction per message",
      shape: `${shape}; inbox.handle(): business row + processed_messages in one transaction`,
      run: (l) => {
        const db = sqlite(dir);
        const inbox = new Inbox(new SqliteInboxStore(db), { consumer: `bench-${seq}` });
        const ins = db.prepare("INSERT INTO payments (id, amount) VALUES (?, ?)");
        return consume(broker, l, (m) => inbox.handle(m, () => void ins.run(idOf(m), 1)).then(() => {})).finally(() => db.close());
      },
    },
    {
      system: "PostgreSQL: business row only",
      durability: "PostgreSQL synchronous_commit=on: one transaction per message",
      shape: `${shape}; INSERT one row per message (autocommit)`,
      run: async (l) => {
        const p = await pool();
        return consume(broker, l, async (m) => void (await p.query("INSERT INTO payments (id, amount) VALUES ($1, $2)", [idOf(m), 1])));
      },
    },
    {
      system: "PostgreSQL: inbox",
      durability: "PostgreSQL synchronous_commit=on: one transaction per message",
      shape: `${shape}; inbox.handle(): business row + processed_messages in one transaction`,
      run: async (l) => {
        const p = await pool();
        const inbox = new Inbox(new PgInboxStore(p), { consumer: `bench-${seq}` });
        return consume(broker, l, (m) => inbox.handle(m, async (tx) => void (await tx.query("INSERT INTO payments (id, amount) VALUES ($1, $2)", [idOf(m), 1]))).then(() => {}));
      },
    },
    {
      system: "SQLite: inbox, batches of 500",
      durability: "SQLite WAL, synchronous=FULL: one transaction per batch",
      shape: "sub.batches({ maxMessages: 500 }); inbox.handleBatch(): the batch's business rows + processed_messages in one transaction; void batch.commit()",
      run: (l) => {
        const db = sqlite(dir);
        const inbox = new Inbox(new SqliteInboxStore(db), { consumer: `bench-${seq}` });
        const ins = db.prepare("INSERT INTO payments (id, amount) VALUES (?, ?)");
        return consumeBatches(broker, l, (msgs) => inbox.handleBatch(msgs, (_tx, fresh) => { for (const m of fresh) ins.run(idOf(m), 1); }).then(() => {})).finally(() => db.close());
      },
    },
    {
      system: "PostgreSQL: inbox, batches of 500",
      durability: "PostgreSQL synchronous_commit=on: one transaction per batch",
      shape: "sub.batches({ maxMessages: 500 }); inbox.handleBatch(): the batch's business rows + processed_messages in one transaction; void batch.commit()",
      run: async (l) => {
        const p = await pool();
        const inbox = new Inbox(new PgInboxStore(p), { consumer: `bench-${seq}` });
        return consumeBatches(broker, l, (msgs) =>
          inbox.handleBatch(msgs, async (tx, fresh) => { for (const m of fresh) await tx.query("INSERT INTO payments (id, amount) VALUES ($1, $2)", [idOf(m), 1]); }).then(() => {}),
        );
      },
    },
  ];
  return { id: "inbox", table: "info", metrics: [{ key: "rate", name: "consume with the inbox, embedded (README loop)", unit: "msg/s" }], cases };
}

/** Fills an outbox with `n` rows, then times a relay draining it. */
async function relayRun(broker: Broker, limits: Limits, fill: (n: number) => Promise<void>, store: () => SqliteOutboxStore | PgOutboxStore, n: number) {
  const topic = `outbox-bench-${process.pid}-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  await fill(n);
  const relay = new OutboxRelay(broker, store(), { topic, name: topic, batchSize: 500 });
  const meter = new Meter({ ...limits, warmupMs: 0 });
  meter.add(0);
  for (;;) {
    const k = await relay.runOnce();
    if (k === 0 || meter.add(k)) break;
  }
  meter.finish();
  await broker.deleteTopic(topic);
  return { values: { rate: meter.rate() }, note: meter.describe() };
}

function outboxGroup(broker: Broker, dir: string, pool: () => Promise<pg.Pool>): BenchGroup {
  const n = 20_000;
  const shape = `relay.runOnce() rounds of 500 rows (plan transaction, publishBatch per partition, complete transaction) over ${n.toLocaleString("en-US")} pre-filled rows, 4 partitions`;
  return {
    id: "outbox",
    table: "info",
    metrics: [{ key: "rate", name: "outbox relay, embedded broker", unit: "rows/s" }],
    cases: [
      {
        system: "SQLite outbox",
        durability: "SQLite WAL, synchronous=FULL; sluice fdatasync before ack",
        shape,
        run: (l) => {
          const db = sqlite(dir);
          const store = new SqliteOutboxStore(db);
          const fill = async (k: number) => {
            await store.ensureSchema();
            db.exec("DELETE FROM message_outbox");
            db.transaction(() => {
              for (let i = 0; i < k; i++) addToOutbox(db, { aggregateType: "order", aggregateId: `o-${i % 500}`, type: "OrderAccepted", payload: { i } });
            })();
          };
          return relayRun(broker, l, fill, () => store, n).finally(() => db.close());
        },
      },
      {
        system: "PostgreSQL outbox",
        durability: "PostgreSQL synchronous_commit=on; sluice fdatasync before ack",
        shape,
        run: async (l) => {
          const p = await pool();
          const store = new PgOutboxStore(p);
          const fill = async (k: number) => {
            await store.ensureSchema();
            await p.query("DELETE FROM message_outbox");
            await p.query("INSERT INTO message_outbox (message_id, aggregate_type, aggregate_id, message_type, payload) SELECT gen_random_uuid()::text, 'order', 'o-' || (g % 500), 'OrderAccepted', jsonb_build_object('i', g) FROM generate_series(1, $1) g", [k]);
          };
          return relayRun(broker, l, fill, () => store, n).finally(() => store.close());
        },
      },
    ],
  };
}

export async function runContractsBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const dir = mkdtempSync(join(opts.tmpDir, "contracts-bench-"));
  const broker = await openBroker({ dataDir: join(dir, "data"), retentionCheckIntervalMs: 0 });
  let shared: pg.Pool | null = null;
  const pool = async () => (shared ??= await pgPool());
  try {
    return await runGroups([inboxGroup(broker, dir, pool), outboxGroup(broker, dir, pool)], { ...opts.run, only: opts.only });
  } finally {
    await broker.close();
    await (shared as pg.Pool | null)?.end();
  }
}
