// SPDX-License-Identifier: Apache-2.0
/**
 * The transactional outbox and its relay (OUTBOX-1) on SQLite and PostgreSQL: rows of
 * committed transactions are published once each, keyed by aggregate (per-aggregate order),
 * rolled-back rows never; a relay that dies between publishing and marking published
 * re-publishes a batch the broker recognises as a duplicate. The SIGKILL test kills relay
 * processes (and every third time the server) at random while the application keeps inserting.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import pg from "pg";
import { OutboxRelay } from "../src/contracts/outbox-relay.js";
import type { OutboxStore } from "../src/contracts/outbox.js";
import { addToOutbox, SqliteOutboxStore } from "../src/contracts/stores/sqlite-outbox.js";
import { addToOutboxPg, PgOutboxStore } from "../src/contracts/stores/pg-outbox.js";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import type { Broker, ConsumedRecord } from "../src/types.js";
import { readEnvelope } from "../src/contracts/envelope.js";
import { partitionForKey } from "../src/streams/murmur2.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const CHILD = join(fileURLToPath(new URL(".", import.meta.url)), "fixtures", "outbox-relay-child.js");
const pgUrl = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const admin = new pg.Pool({ connectionString: pgUrl, max: 1 });
const schemas: string[] = [];
const dir = tempDir("sluice-outbox-");

after(async () => {
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  await admin.end();
  dir.cleanup();
});

/** An application database with an outbox: `insert` adds rows in a transaction that commits or rolls back. */
interface App {
  store(): OutboxStore;
  insert(aggregate: string, n: number, commit: boolean): Promise<string[]>;
  close(): Promise<void>;
}

let seq = 0;

function sqliteApp(file: string): App {
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 10000");
  const s = new SqliteOutboxStore(db, { pollIntervalMs: 5 });
  db.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)");
  return {
    store: () => s,
    insert: async (aggregate, n, commit) => {
      await s.ensureSchema();
      const ids: string[] = [];
      const tx = db.transaction(() => {
        for (let i = 0; i < n; i++) {
          const id = `o-${process.pid}-${seq++}`;
          db.prepare("INSERT INTO orders (id) VALUES (?)").run(id);
          ids.push(addToOutbox(db, { aggregateType: "order", aggregateId: aggregate, type: "OrderAccepted", payload: { id, aggregate, n: i } }));
        }
        if (!commit) throw new Error("rollback");
      });
      try {
        tx();
      } catch (e) {
        if (commit) throw e;
      }
      return commit ? ids : [];
    },
    close: async () => void db.close(),
  };
}

async function pgApp(): Promise<App & { schema: string }> {
  const schema = `sluice_outbox_test_${process.pid}_${schemas.length}`;
  schemas.push(schema);
  await admin.query(`CREATE SCHEMA ${schema}`);
  const pool = new pg.Pool({ connectionString: pgUrl, max: 4, options: `-c search_path=${schema}` });
  const s = new PgOutboxStore(pool, { pollIntervalMs: 50 });
  await s.ensureSchema();
  return {
    schema,
    store: () => s,
    insert: async (aggregate, n, commit) => {
      const c = await pool.connect();
      const ids: string[] = [];
      try {
        await c.query("BEGIN");
        for (let i = 0; i < n; i++) ids.push(await addToOutboxPg(c, { aggregateType: "order", aggregateId: aggregate, type: "OrderAccepted", payload: { aggregate, n: i } }));
        await c.query(commit ? "COMMIT" : "ROLLBACK");
      } finally {
        c.release();
      }
      return commit ? ids : [];
    },
    close: async () => {
      await s.close();
      await pool.end();
    },
  };
}

async function readAll(b: Broker, topic: string): Promise<ConsumedRecord[]> {
  const out: ConsumedRecord[] = [];
  for (const p of (await b.describeTopic(topic)).partitions) {
    let offset = p.logStartOffset;
    while (offset < p.highWatermark) {
      const r = await b.fetch(topic, p.partition, offset, { maxBytes: 1 << 20 });
      out.push(...r.records);
      offset = r.nextOffset;
    }
  }
  return out;
}

/** Every committed id exactly once, no other; within an aggregate, in insertion order. */
function checkTopic(records: ConsumedRecord[], committed: Map<string, string[]>): void {
  const ids = records.map((r) => readEnvelope(r.headers)!.messageId);
  const counts = new Map<string, number>();
  for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
  const dups = [...counts].filter(([, n]) => n > 1);
  assert.deepEqual(dups, [], "no row published twice");
  const expected = [...committed.values()].flat();
  assert.equal(ids.length, expected.length, "every committed row published, no rolled-back one");
  for (const id of expected) assert.ok(counts.has(id), `row ${id} published`);
  for (const [agg, list] of committed) {
    const seen = records.filter((r) => Buffer.from(r.key!).toString() === agg).map((r) => readEnvelope(r.headers)!.messageId);
    assert.deepEqual(seen, list, `aggregate ${agg} in order`);
  }
}

for (const kind of ["SQLite", "PostgreSQL"] as const) {
  test(`${kind}: committed rows published once in aggregate order; a crash between publish and complete re-publishes a duplicate`, async () => {
    const d = tempDir("sluice-outbox-broker-");
    const app = kind === "SQLite" ? sqliteApp(join(dir.dir, "unit.db")) : await pgApp();
    const broker = await openBroker({ dataDir: d.dir, retentionCheckIntervalMs: 0 });
    try {
      await broker.createTopic("orders", { partitions: 3 });
      const committed = new Map<string, string[]>();
      for (let i = 0; i < 40; i++) {
        const agg = `agg-${i % 6}`;
        const ids = await app.insert(agg, 1 + (i % 4), i % 7 !== 3);
        committed.set(agg, [...(committed.get(agg) ?? []), ...ids]);
      }
      const store = app.store();
      // The crash window: a relay plans and publishes, then dies before completing.
      const dying = new OutboxRelay(broker, store, { topic: "orders", batchSize: 25 });
      await dying.runOnce();
      const planned = await store.plan("default", 25, (r) => ({ topic: "orders", partition: partitionForKey(Buffer.from(r.aggregateId), 3) }));
      assert.ok(planned.length > 0);
      const id = (await store.loadIdentity("default"))!;
      for (const b of planned) {
        await broker.publishBatch(
          b.topic,
          b.rows.map((r) => ({ partition: b.partition, key: r.aggregateId, value: JSON.parse(r.payloadJson), headers: { "sluice-message-id": r.messageId, "sluice-type": r.type, "sluice-occurred-at": String(r.createdAt) } })),
          { producerId: id.producerId, producerEpoch: id.producerEpoch, baseSequence: b.baseSequence },
        );
      }
      // A new relay finds the pending batch, re-publishes it (a duplicate), and goes on.
      const relay = new OutboxRelay(broker, store, { topic: "orders", batchSize: 25 });
      while ((await relay.runOnce()) > 0);
      assert.deepEqual(await relay.backlog().then((b) => b.rows), 0);
      checkTopic(await readAll(broker, "orders"), committed);
    } finally {
      await broker.close();
      await app.close();
      d.cleanup();
    }
  });
}

test("relay processes SIGKILLed at random (and the server every third time) while the application inserts: every row once, in aggregate order", async (t) => {
  const kills = Number(process.env.SLUICE_OUTBOX_KILLS ?? 8);
  for (const kind of ["sqlite", "pg"] as const) {
    const data = tempDir("sluice-outbox-srv-");
    const serverArgs = (port: number) => ["--data", data.dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
    let server: SpawnedServer = await spawnServer(serverArgs(0));
    const port = server.port;
    const app = kind === "sqlite" ? sqliteApp(join(dir.dir, "kill.db")) : await pgApp();
    const where = kind === "sqlite" ? join(dir.dir, "kill.db") : (app as App & { schema: string }).schema;
    const topic = `orders-${kind}`;
    const committed = new Map<string, string[]>();
    let pendingFound = 0;
    const t0 = Date.now();
    try {
      const admin = await connect({ url: server.url });
      await admin.createTopic(topic, { partitions: 4, segmentBytes: 16384 });
      await admin.close();
      let inserting = true;
      const producer = (async () => {
        // Paced (about one transaction per 3 ms), so the backlog stays in the hundreds
        // and every relay process gets killed in the middle of real work.
        for (let i = 0; inserting; i++) {
          const agg = `agg-${i % 9}`;
          const ids = await app.insert(agg, 1 + (i % 5), i % 11 !== 5);
          committed.set(agg, [...(committed.get(agg) ?? []), ...ids]);
          await new Promise((r) => setTimeout(r, 3));
        }
      })();
      for (let k = 0; k < kills; k++) {
        const child = spawn(process.execPath, [CHILD, `sluice://127.0.0.1:${port}`, kind, where, topic, "7"], { stdio: ["ignore", "pipe", "inherit"] });
        const exited = new Promise((r) => child.once("exit", r));
        let out = "";
        child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
        await waitUntil(() => out.includes('"started"'), "relay child started", 20_000);
        pendingFound += JSON.parse(out.split("\n")[0]).pending > 0 ? 1 : 0;
        // Every other kill lands right after an acknowledged publish (before its rows are marked
        // published, unless the relay is quicker than the signal); the others at a random moment.
        if (k % 2 === 0) {
          const nth = 1 + Math.floor(Math.random() * 4);
          await waitUntil(() => out.split('"published"').length - 1 >= nth, "publishes", 20_000, 1);
        } else {
          await waitUntil(() => Math.random() < 0.05, "a random moment", 20_000, 2 + Math.floor(Math.random() * 20));
        }
        child.kill("SIGKILL");
        await exited;
        if (k % 3 === 2) {
          server.proc.kill("SIGKILL");
          await server.exited;
          server = await spawnServer(serverArgs(port));
        }
      }
      inserting = false;
      await producer;
      // A last relay drains the backlog.
      const b = await connect({ url: server.url });
      const relay = new OutboxRelay(b, app.store(), { topic, batchSize: 500 });
      await waitUntil(async () => (await relay.runOnce(), (await relay.backlog()).rows === 0), "backlog drained", 60_000);
      checkTopic(await readAll(b, topic), committed);
      await b.close();
      t.diagnostic(`${kind}: ${Date.now() - t0} ms, ${kills} relay kills, ${pendingFound} found a pending batch, ${[...committed.values()].flat().length} rows`);
      assert.ok(pendingFound > 0, `${kind}: no kill landed between planning and completing in ${kills} kills; the test did not hunt`);
    } finally {
      server.proc.kill("SIGKILL");
      await server.exited;
      await app.close();
      data.cleanup();
    }
  }
});
