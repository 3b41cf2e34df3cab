// SPDX-License-Identifier: Apache-2.0
/**
 * The idempotent consumer (INBOX-1) on SQLite (a temp file) and PostgreSQL (the local server,
 * in a schema of its own): duplicates skipped, a failing handler leaves nothing, external
 * offsets stored in the same transaction, and a redelivered stream applied once.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { Inbox, type InboxStore } from "../src/contracts/inbox.js";
import { SqliteInboxStore, type SqliteDatabase } from "../src/contracts/stores/sqlite-inbox.js";
import { PgInboxStore, type PgPoolClient } from "../src/contracts/stores/pg-inbox.js";
import { envelope, messageIdOf } from "../src/contracts/envelope.js";
import { openBroker } from "../src/broker/broker.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const dir = tempDir("sluice-inbox-");
const schema = `sluice_inbox_test_${process.pid}`;
const pgUrl = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const admin = new pg.Pool({ connectionString: pgUrl, max: 1 });
const pool = new pg.Pool({ connectionString: pgUrl, max: 4, options: `-c search_path=${schema}` });

after(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
  await pool.end();
  await admin.end();
  dir.cleanup();
});

/** One business table per database; `apply` writes a row in the handler's transaction. */
interface Backend<Tx> {
  name: string;
  store(): Promise<InboxStore<Tx>>;
  apply(tx: Tx, id: string, amount: number): Promise<void>;
  total(): Promise<{ rows: number; sum: number }>;
}

const sqlite: Backend<SqliteDatabase> = (() => {
  const db = new Database(join(dir.dir, "app.db"));
  db.pragma("journal_mode = WAL");
  db.exec("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)");
  return {
    name: "SQLite",
    store: async () => new SqliteInboxStore(db),
    apply: async (tx, id, amount) => void tx.prepare("INSERT INTO payments (id, amount) VALUES (?, ?)").run(id, amount),
    total: async () => {
      const r = db.prepare("SELECT count(*) AS n, coalesce(sum(amount), 0) AS s FROM payments").get() as { n: number; s: number };
      return { rows: r.n, sum: r.s };
    },
  };
})();

const postgres: Backend<PgPoolClient> = {
  name: "PostgreSQL",
  store: async () => {
    await admin.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
    await pool.query("CREATE TABLE IF NOT EXISTS payments (id text PRIMARY KEY, amount integer NOT NULL)");
    return new PgInboxStore(pool);
  },
  apply: async (tx, id, amount) => void (await tx.query("INSERT INTO payments (id, amount) VALUES ($1, $2)", [id, amount])),
  total: async () => {
    const r = await pool.query("SELECT count(*)::int AS n, coalesce(sum(amount), 0)::int AS s FROM payments");
    const row = r.rows[0] as { n: number; s: number };
    return { rows: row.n, sum: row.s };
  },
};

for (const backend of [sqlite, postgres] as Backend<unknown>[]) {
  test(`${backend.name}: a duplicate is skipped; a failing handler leaves neither its write nor the inbox row`, async () => {
    const inbox = new Inbox(await backend.store(), { consumer: "billing" });
    const msg = { headers: envelope({ type: "PaymentCaptured", messageId: "pay-1" }) };
    let calls = 0;
    const first = await inbox.handle(msg, async (tx) => (calls++, backend.apply(tx, "pay-1", 10)));
    assert.deepEqual(first, { duplicate: false, result: undefined });
    assert.deepEqual(await inbox.handle(msg, async (tx) => (calls++, backend.apply(tx, "pay-1", 10))), { duplicate: true });
    assert.equal(calls, 1);
    const failing = { headers: envelope({ type: "PaymentCaptured", messageId: "pay-2" }) };
    await assert.rejects(inbox.handle(failing, async (tx) => {
      await backend.apply(tx, "pay-2", 20);
      throw new Error("downstream said no");
    }), /downstream said no/);
    assert.equal(await inbox.isProcessed(failing), false, "rolled back: not recorded");
    assert.deepEqual(await backend.total(), { rows: 1, sum: 10 }, "the failed handler's write rolled back");
    await inbox.handle(failing, (tx) => backend.apply(tx, "pay-2", 20));
    assert.deepEqual(await backend.total(), { rows: 2, sum: 30 });
    // Another consumer processes the same message independently.
    const other = new Inbox(await backend.store(), { consumer: "audit" });
    assert.equal((await other.handle(msg, async () => 1)).duplicate, false);
  });

  test(`${backend.name}: a stream redelivered after a crash before its commits is applied once; offsets stored with the writes`, async () => {
    const d = tempDir("sluice-inbox-broker-");
    const topic = `payments-${backend.name}`;
    try {
      let broker = await openBroker({ dataDir: d.dir, retentionCheckIntervalMs: 0 });
      await broker.createTopic(topic, { partitions: 3 });
      // 150 facts, 30 of them published twice (a producer retry with the same envelope).
      const records = [];
      for (let i = 0; i < 150; i++) records.push({ key: `acct-${i % 7}`, value: { amount: 1 }, headers: envelope({ type: "PaymentCaptured", messageId: `${topic}-${i}` }) });
      for (let i = 0; i < 30; i++) records.push(records[i * 5]);
      await broker.publishBatch(topic, records);
      const inbox = new Inbox(await backend.store(), { consumer: `ledger-${topic}` });
      const before = await backend.total();
      // First run: handles everything but commits nothing to the broker (the crash window).
      let handled = 0;
      const sub1 = broker.subscribe<{ amount: number }>(topic, { group: "ledger", start: "earliest" });
      for await (const msg of sub1) {
        await inbox.handle(msg, (tx) => backend.apply(tx, messageIdOf(msg.headers)!, msg.value.amount), { storeOffset: true });
        if (++handled === records.length) break;
      }
      await sub1.close();
      await broker.close();
      broker = await openBroker({ dataDir: d.dir, retentionCheckIntervalMs: 0 });
      // Second run: everything is redelivered (no commit was made); every record is a duplicate.
      let dup = 0;
      const sub2 = broker.subscribe<{ amount: number }>(topic, { group: "ledger", start: "earliest" });
      for await (const msg of sub2) {
        const r = await inbox.handle(msg, (tx) => backend.apply(tx, "never", 0), { storeOffset: true });
        if (r.duplicate) dup++;
        void msg.commit();
        if (dup === records.length) break;
      }
      await sub2.close();
      const after = await backend.total();
      assert.equal(after.rows - before.rows, 150, "each fact applied once");
      assert.equal(after.sum - before.sum, 150);
      const offsets = await inbox.startOffsets(topic);
      const desc = await broker.describeTopic(topic);
      for (const p of desc.partitions) assert.equal(offsets.get(p.partition) ?? 0, p.highWatermark, `partition ${p.partition}: stored next offset`);
      await waitUntil(async () => (await broker.groupLag("ledger", topic)).totalRecords === 0, "commits durable");
      await broker.close();
    } finally {
      d.cleanup();
    }
  });
}

for (const backend of [sqlite, postgres] as Backend<unknown>[]) {
  test(`${backend.name}: handleBatch: one transaction per batch, duplicates (earlier or within the batch) left out, offsets stored`, async () => {
    const inbox = new Inbox(await backend.store(), { consumer: "batcher" });
    const m = (id: string, offset: number) => ({ headers: envelope({ type: "T", messageId: `b-${id}` }), topic: "t", partition: offset % 2, offset });
    await inbox.handle(m("1", 0), (tx) => backend.apply(tx, "b-1", 1));
    const before = await backend.total();
    const batch = [m("1", 0), m("2", 1), m("3", 2), m("2", 3), m("4", 4)];
    const r = await inbox.handleBatch(batch, async (tx, fresh) => {
      for (const f of fresh) await backend.apply(tx, f.headers["sluice-message-id"], 1);
      return fresh.length;
    }, { storeOffset: true });
    assert.deepEqual(r.fresh.map((f) => f.offset), [1, 2, 4]);
    assert.equal(r.duplicates, 2);
    assert.equal(r.result, 3);
    assert.equal((await backend.total()).rows - before.rows, 3);
    assert.deepEqual([...(await inbox.startOffsets("t"))].sort(), [[0, 5], [1, 4]]);
    await assert.rejects(inbox.handleBatch([m("5", 6)], async (tx) => {
      await backend.apply(tx, "b-5", 1);
      throw new Error("boom");
    }), /boom/);
    assert.equal(await inbox.isProcessed(m("5", 6)), false, "a failed batch records nothing");
  });
}

test("PostgreSQL: two deliveries of one id at once apply once", async () => {
  const inbox = new Inbox(await postgres.store(), { consumer: "race" });
  const msg = { headers: envelope({ type: "PaymentCaptured", messageId: "race-1" }) };
  const before = await postgres.total();
  const results = await Promise.all([0, 1, 2, 3].map(() => inbox.handle(msg, async (tx) => {
    await postgres.apply(tx, "race-1", 5);
    await new Promise((r) => setTimeout(r, 20)); // hold the transaction open while the others insert
  })));
  assert.equal(results.filter((r) => !r.duplicate).length, 1);
  assert.equal((await postgres.total()).rows - before.rows, 1);
});

for (const kind of ["SQLite", "PostgreSQL"] as const) {
  test(`${kind}: consumer processes SIGKILLed at random between the business write and the commit: every payment applied exactly once`, async (t) => {
    const kills = Number(process.env.SLUICE_INBOX_KILLS ?? 10);
    const child = join(fileURLToPath(new URL(".", import.meta.url)), "fixtures", "inbox-child.js");
    const d = tempDir("sluice-inbox-kill-");
    const dataDir = join(d.dir, "data");
    const killSchema = `sluice_inbox_kill_${process.pid}`;
    const where = kind === "SQLite" ? join(d.dir, "ledger.db") : `pg:${killSchema}`;
    if (kind === "PostgreSQL") {
      await admin.query(`DROP SCHEMA IF EXISTS ${killSchema} CASCADE`);
      await admin.query(`CREATE SCHEMA ${killSchema}`);
    }
    const n = 3000;
    /** Rows in the ledger, and ids applied more than once. */
    const ledger = async (): Promise<{ rows: number; distinct: number; doubled: unknown[] }> => {
      if (kind === "PostgreSQL") {
        const q = async (sql: string) => (await admin.query(sql).catch(() => ({ rows: [] as unknown[] }))).rows;
        const c = (await q(`SELECT count(*)::int AS n, count(DISTINCT id)::int AS d FROM ${killSchema}.ledger`))[0] as { n: number; d: number } | undefined;
        return { rows: c?.n ?? 0, distinct: c?.d ?? 0, doubled: await q(`SELECT id FROM ${killSchema}.ledger GROUP BY id HAVING count(*) > 1`) };
      }
      let db: Database.Database;
      try {
        db = new Database(where, { readonly: true, fileMustExist: true });
      } catch {
        return { rows: 0, distinct: 0, doubled: [] };
      }
      try {
        const c = db.prepare("SELECT count(*) AS n, count(DISTINCT id) AS d FROM ledger").get() as { n: number; d: number };
        return { rows: c.n, distinct: c.d, doubled: db.prepare("SELECT id FROM ledger GROUP BY id HAVING count(*) > 1").all() };
      } catch {
        return { rows: 0, distinct: 0, doubled: [] };
      } finally {
        db.close();
      }
    };
    try {
      const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
      await b.createTopic("payments", { partitions: 3, segmentBytes: 16384 });
      for (let i = 0; i < n; i += 500) await b.publishBatch("payments", Array.from({ length: 500 }, (_, k) => ({ key: `acct-${(i + k) % 17}`, value: { amount: 1 }, headers: envelope({ type: "PaymentCaptured", messageId: `pay-${i + k}` }) })));
      await b.close();
      let restartsWithWork = 0;
      for (let k = 0; k <= kills; k++) {
        const p = spawn(process.execPath, [child, dataDir, where], { stdio: ["ignore", "pipe", "inherit"] });
        const exited = new Promise((r) => p.once("exit", r));
        let out = "";
        p.stdout!.on("data", (x: Buffer) => (out += x.toString()));
        await waitUntil(() => out.includes("ready") || p.exitCode !== null, "child ready", 20_000);
        const before = (await ledger()).rows;
        if (k < kills) {
          const target = Math.min(n, before + 30 + Math.floor(Math.random() * 250));
          await waitUntil(async () => (await ledger()).rows >= target || Math.random() < 0.01, "progress", 30_000, 1);
          if (before > 0) restartsWithWork++;
        } else {
          await waitUntil(async () => (await ledger()).distinct >= n, "every payment applied", 60_000);
        }
        p.kill("SIGKILL");
        await exited;
      }
      const final = await ledger();
      t.diagnostic(`${kind}: ${kills} kills, ${restartsWithWork} restarts with earlier work`);
      assert.deepEqual(final.doubled, [], "no payment applied twice");
      assert.equal(final.distinct, n, "every payment applied");
      assert.equal(final.rows, n);
    } finally {
      if (kind === "PostgreSQL") await admin.query(`DROP SCHEMA IF EXISTS ${killSchema} CASCADE`).catch(() => {});
      d.cleanup();
    }
  });
}
