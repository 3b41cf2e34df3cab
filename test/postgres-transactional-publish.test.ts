// SPDX-License-Identifier: Apache-2.0
/**
 * Publishing inside the application's own PostgreSQL transaction (`publish(..., { transaction
 * })`): nothing of a rolled-back transaction is ever readable, not even an offset; a committed
 * one is delivered exactly once to each group; the record is invisible until the commit, and
 * other appends to its partition wait for it; an application SIGKILLed between its insert and
 * its commit loses nothing it committed (its business rows and its records agree). Refused
 * clearly where it cannot work: the disk engine, a network client, with a producer id.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import pg from "pg";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { DataDirLockedError, ValidationError } from "../src/errors.js";
import { startServer } from "../src/server/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine, PG_TEST_URL } from "./fixtures/postgres.js";

const CHILD = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "pg-tx-child.js");
const ROUNDS = Number(process.env.SLUICE_PG_TX_KILLS ?? 5);

async function withPg<T>(fn: (broker: Broker, pool: pg.Pool, schema: string) => Promise<T>): Promise<T> {
  const schema = freshSchema();
  const broker = await needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));
  const pool = new pg.Pool({ connectionString: PG_TEST_URL, max: 4 });
  try {
    return await fn(broker, pool, schema);
  } finally {
    await broker.close();
    await pool.end();
    await dropSchema(schema);
  }
}

/** Every record of a topic, by partition, checking offsets are contiguous from the log start. */
async function readAll(b: Broker, topic: string, partitions: number): Promise<{ value: string; partition: number; offset: number }[]> {
  const out: { value: string; partition: number; offset: number }[] = [];
  for (let p = 0; p < partitions; p++) {
    let offset = 0;
    for (;;) {
      const r = await b.fetch(topic, p, offset, { maxBytes: 1 << 20 });
      for (const rec of r.records) {
        assert.equal(rec.offset, offset, `partition ${p}: offsets are gap-free`);
        out.push({ value: rec.value as string, partition: p, offset: rec.offset });
        offset++;
      }
      if (offset >= r.highWatermark) break;
    }
  }
  return out;
}

test("a rolled-back transaction publishes nothing, not even an offset; a committed one is delivered exactly once to each group", async () => {
  await withPg(async (broker, pool) => {
    await broker.createTopic("t", { partitions: 1 });
    const inTx = async (value: string, commit: boolean): Promise<void> => {
      const c = await pool.connect();
      try {
        await c.query("BEGIN");
        await broker.publish("t", value, { transaction: c });
        await broker.publishBatch("t", [{ value: `${value}+1` }, { value: `${value}+2` }], { transaction: c });
        await c.query(commit ? "COMMIT" : "ROLLBACK");
      } finally {
        c.release();
      }
    };
    await inTx("A", false);
    await inTx("B", true);
    await inTx("C", false);
    await inTx("D", true);
    await broker.publish("t", "E"); // a plain publish after them: the end marker
    const expected = ["B", "B+1", "B+2", "D", "D+1", "D+2", "E"];
    assert.deepEqual((await readAll(broker, "t", 1)).map((r) => `${r.offset}:${r.value}`), expected.map((v, i) => `${i}:${v}`), "offsets 0.. with no hole where A and C were");
    for (const group of ["g1", "g2"]) {
      const seen: string[] = [];
      for await (const msg of broker.subscribe<string>("t", { group, start: "earliest" })) {
        seen.push(msg.value);
        await msg.commit();
        if (msg.value === "E") break;
      }
      assert.deepEqual(seen, expected, `group ${group}`);
    }
  });
});

test("until the commit the record is invisible and other appends to its partition wait; after it a waiting consumer wakes", async () => {
  await withPg(async (broker, pool) => {
    await broker.createTopic("t", { partitions: 1 });
    const ac = new AbortController();
    const got: string[] = [];
    const consuming = (async () => {
      for await (const msg of broker.subscribe<string>("t", { group: "g", start: "earliest", signal: ac.signal })) {
        got.push(msg.value);
        await msg.commit();
      }
    })();
    const c = await pool.connect();
    try {
      await c.query("BEGIN");
      const r = await broker.publish("t", "in-tx", { transaction: c });
      assert.equal(r.offset, 0);
      assert.equal((await broker.fetch("t", 0, 0)).highWatermark, 0, "not readable before the commit");
      let plainDone = false;
      const plain = broker.publish("t", "plain").then((x) => ((plainDone = true), x));
      // The plain append waits on the partition's row lock held by the open transaction.
      await waitUntil(async () => (await pool.query("SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted")).rows[0].n > 0, "the plain append waiting for the lock");
      assert.equal(plainDone, false);
      assert.deepEqual(got, []);
      await c.query("COMMIT");
      assert.equal((await plain).offset, 1, "the plain append takes the next offset once the transaction ends");
      await waitUntil(() => got.length === 2, () => `the consumer to receive both (got ${JSON.stringify(got)})`);
      assert.deepEqual(got, ["in-tx", "plain"]);
    } finally {
      c.release();
      ac.abort();
      await consuming.catch(() => {});
    }
  });
});

test(`an application SIGKILLed between its insert and its commit (${ROUNDS} rounds) loses nothing committed; records and business rows agree`, { timeout: 120_000 }, async (t) => {
  const schema = freshSchema();
  let broker = await needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));
  await broker.createTopic("orders", { partitions: 3 });
  await broker.close();
  const admin = new pg.Client({ connectionString: PG_TEST_URL });
  await admin.connect();
  const committed = new Map<string, { partition: number; offset: number }>();
  const killedOpen: string[] = [];
  try {
    await admin.query(`CREATE TABLE "${schema}".app_orders (id text PRIMARY KEY)`);
    let nextId = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const before = 3 + Math.floor(Math.random() * 30);
      const child = spawn(process.execPath, [CHILD, PG_TEST_URL, schema, "orders", String(before), String(nextId)], { stdio: ["ignore", "pipe", "pipe"] });
      let stderr = "";
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
      const exited = new Promise<void>((r) => child.once("exit", () => r()));
      let buf = "";
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on("data", (d: Buffer) => {
          buf += d.toString();
          let i: number;
          while ((i = buf.indexOf("\n")) >= 0) {
            const line = JSON.parse(buf.slice(0, i));
            buf = buf.slice(i + 1);
            if (line.committed) committed.set(line.committed, { partition: line.partition, offset: line.offset });
            if (line.inserted) {
              killedOpen.push(line.inserted);
              child.kill("SIGKILL");
              resolve();
            }
          }
        });
        void exited.then(() => reject(new Error(`the child exited before its open transaction: ${stderr}`)));
      });
      await exited;
      nextId += before + 1;
    }
    // The killed application's session (and its lock on the schema) ends when PostgreSQL notices.
    broker = await waitUntil(
      () => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }).catch((e: unknown) => (e instanceof DataDirLockedError ? null : Promise.reject(e))),
      "the schema free again after the last kill",
      20_000,
      100,
    );
    const records = await readAll(broker, "orders", 3);
    const stored = new Map(records.map((r) => [r.value, { partition: r.partition, offset: r.offset }]));
    assert.equal(stored.size, records.length, "no record stored twice");
    assert.deepEqual(new Set(stored.keys()), new Set(committed.keys()), "exactly the committed transactions' records");
    for (const [id, at] of committed) assert.deepEqual(stored.get(id), at, `${id} where its receipt said`);
    for (const id of killedOpen) assert.ok(!stored.has(id), `${id} (open at the kill) is not readable`);
    const rows = (await admin.query<{ id: string }>(`SELECT id FROM "${schema}".app_orders`)).rows.map((r) => r.id);
    assert.deepEqual(new Set(rows), new Set(committed.keys()), "the business rows are exactly those of the committed records");
    t.diagnostic(`${committed.size} committed transactions over ${ROUNDS} kills with one open each: all present once, none of the open ones`);
  } finally {
    await broker.close().catch(() => {});
    await admin.end();
    await dropSchema(schema);
  }
});

test("refused where it cannot work: the disk engine, a network client, together with a producer id", async () => {
  const fake = { query: async () => ({ rows: [], rowCount: 0 }) };
  const tmp = tempDir();
  const disk = await openBroker({ dataDir: tmp.dir });
  try {
    await disk.createTopic("t");
    await assert.rejects(disk.publish("t", "x", { transaction: fake }), (e: unknown) => e instanceof ValidationError && /PostgreSQL engine/.test(e.message));
    const server = await startServer({ broker: disk, port: 0, httpPort: null });
    const client = await connect({ url: server.url });
    try {
      await assert.rejects(client.publish("t", "x", { transaction: fake }), (e: unknown) => e instanceof ValidationError && /embedded broker/.test(e.message));
      await assert.rejects(client.publishBatch("t", [{ value: "x" }], { transaction: fake }), ValidationError);
    } finally {
      await client.close();
      await server.close();
    }
    assert.equal((await disk.fetch("t", 0, 0)).highWatermark, 0, "nothing stored");
  } finally {
    await disk.close();
    tmp.cleanup();
  }
  await withPg(async (broker, pool) => {
    await broker.createTopic("t");
    const { producerId, producerEpoch } = await broker.initProducer();
    const c = await pool.connect();
    try {
      await assert.rejects(broker.publishBatch("t", [{ value: "x", partition: 0 }], { transaction: c, producerId, producerEpoch, baseSequence: 0 }), ValidationError);
    } finally {
      c.release();
    }
  });
});
