// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueueing inside the application's own PostgreSQL transaction (`queue.enqueue(data, {
 * transaction })`): nothing of a rolled-back transaction is left (no job id used, no dedupe or
 * singleton key taken, no event, no count); a committed one's jobs are delivered once; they are
 * invisible until the commit, the queue's other enqueues wait for it, and workers waiting here
 * or on another node wake after it; an ack and a lease expiry of the same queue wait for it and
 * finish after it (no lock cycle); an application SIGKILLed between its insert and its commit
 * loses nothing it committed. Refused clearly where it cannot work: the disk engine, a network
 * client, options that cannot apply inside a transaction, a client outside a transaction.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import pg from "pg";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { QueueFullError, StorageError, ValidationError } from "../src/errors.js";
import { startServer } from "../src/server/index.js";
import { PostgresEngine } from "../src/store/postgres/postgres-engine.js";
import { nextJob } from "../src/testing/conformance-helpers.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { EmbeddedBroker as Broker } from "../src/broker/broker.js";
import type { Job, QueueEvent } from "../src/index.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine, PG_TEST_URL } from "./fixtures/postgres.js";

const CHILD = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "pg-tx-enqueue-child.js");
const ROUNDS = Number(process.env.SLUICE_PG_TX_KILLS ?? 5);

const openPg = (schema: string): Promise<Broker> => needingPostgres(() => openBroker({ engine: newPgEngine(schema, { exclusive: false }), retentionCheckIntervalMs: 0 }));

async function withPg<T>(fn: (broker: Broker, pool: pg.Pool, schema: string) => Promise<T>): Promise<T> {
  const schema = freshSchema();
  const broker = await openPg(schema);
  const pool = new pg.Pool({ connectionString: PG_TEST_URL, max: 4 });
  try {
    return await fn(broker, pool, schema);
  } finally {
    await broker.close();
    await pool.end();
    await dropSchema(schema);
  }
}

/** Runs `fn` in a transaction on its own connection, then commits or rolls back. */
async function inTx<T>(pool: pg.Pool, commit: boolean, fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    const r = await fn(c);
    await c.query(commit ? "COMMIT" : "ROLLBACK");
    return r;
  } catch (e) {
    await c.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    c.release();
  }
}

/** Whether at least `n` sessions wait for a lock (a queue's row, held by an open transaction). */
async function someoneWaits(pool: pg.Pool, n = 1): Promise<boolean> {
  return (await pool.query("SELECT count(DISTINCT pid)::int AS n FROM pg_locks WHERE NOT granted")).rows[0].n >= n;
}

/** Every event the queue keeps, from the oldest. */
async function allEvents(b: Broker, queue: string): Promise<QueueEvent[]> {
  const out: QueueEvent[] = [];
  let from = "earliest";
  for (;;) {
    const page = await b.queue(queue).readEvents(from, 100, 0);
    if (page.events.length === 0) return out;
    out.push(...page.events);
    from = page.position;
  }
}

/** Takes `n` jobs from a worker and acks each; returns their data by job id. */
async function drain(b: Broker, queue: string, n: number): Promise<Map<string, { data: string; attempt: number }>> {
  const w = b.queue<string>(queue).work({ prefetch: 8 });
  const it = w[Symbol.asyncIterator]();
  const got = new Map<string, { data: string; attempt: number }>();
  try {
    while (got.size < n) {
      const j = await nextJob(it);
      assert.ok(!got.has(j.id), `job ${j.id} delivered once`);
      got.set(j.id, { data: j.data, attempt: j.attempt });
      await j.ack();
    }
  } finally {
    await w.close();
  }
  return got;
}

test("a rolled-back transaction enqueues nothing, not even a job id or an event; a committed one's jobs are delivered once and acked", async () => {
  await withPg(async (broker, pool) => {
    const q = broker.queue<string>("jobs");
    const ids: Record<string, string[]> = {};
    for (const [name, commit] of [["A", false], ["B", true], ["C", false], ["D", true]] as const) {
      ids[name] = await inTx(pool, commit, async (c) => {
        const one = await q.enqueue(name, { transaction: c });
        const two = await q.enqueueBatch([{ data: `${name}+1` }, { data: `${name}+2`, delayMs: 0 }], { transaction: c });
        return [one, ...two].map((r) => r.id);
      });
    }
    const e = await q.enqueue("E"); // a plain enqueue after them
    assert.deepEqual(ids.A, ["0", "1", "2"]);
    assert.deepEqual(ids.B, ids.A, "the rolled-back ids are taken by the next transaction: no gap");
    assert.deepEqual(ids.D, ids.C);
    assert.deepEqual(ids.D, ["3", "4", "5"]);
    assert.equal(e.id, "6");
    const s = await q.stats();
    assert.equal(s.waiting, 7);
    assert.equal(s.depth, 7, "the queue counts the committed jobs only");
    const enqueued = (await allEvents(broker, "jobs")).filter((x) => x.type === "enqueued");
    assert.deepEqual(enqueued.map((x) => x.position), ["1", "2", "3", "4", "5", "6", "7"], "event positions without a hole where A and C were");
    assert.deepEqual(enqueued.map((x) => (x as { jobId: string }).jobId), ["0", "1", "2", "3", "4", "5", "6"]);
    const got = await drain(broker, "jobs", 7);
    assert.deepEqual([...got.values()].map((j) => j.data).sort(), ["B", "B+1", "B+2", "D", "D+1", "D+2", "E"]);
    assert.ok([...got.values()].every((j) => j.attempt === 1), "each delivered once");
    const after = await q.stats();
    assert.equal(after.depth, 0);
    assert.equal(after.completed, 7);
  });
});

test("until the commit the jobs are invisible and other enqueues to the queue wait; workers waiting in this process and on another node wake after it", async () => {
  const schema = freshSchema();
  const a = await openPg(schema);
  const b = await openPg(schema);
  const pool = new pg.Pool({ connectionString: PG_TEST_URL, max: 4 });
  const listener = new pg.Client({ connectionString: PG_TEST_URL });
  try {
    // Declared with a config: handles declaring it again inside the transaction must not wait for it.
    const config = { visibilityTimeoutMs: 30_000 };
    await a.queue<string>("mail", config).stats();
    await listener.connect();
    // The channel is the database's: only this queue's notifications count.
    const queueId = (await pool.query(`SELECT queue_id FROM "${schema}".queues WHERE name = 'mail'`)).rows[0].queue_id as string;
    const notified: string[] = [];
    listener.on("notification", (n) => void (n.payload?.startsWith(`${queueId}:`) && notified.push(n.payload)));
    await listener.query("LISTEN sluice_queue");
    const wa = a.queue<string>("mail").work({ prefetch: 1 });
    const wb = b.queue<string>("mail").work({ prefetch: 1 });
    const gotA = nextJob(wa[Symbol.asyncIterator](), 20_000);
    const gotB = nextJob(wb[Symbol.asyncIterator](), 20_000);
    // Awaited below; a failure before that must report itself, not these.
    for (const p of [gotA, gotB]) p.catch(() => {});
    const c = await pool.connect();
    try {
      await c.query("BEGIN");
      const r1 = await a.queue<string>("mail", config).enqueue("first", { transaction: c });
      const r2 = await a.queue<string>("mail", config).enqueue("second", { transaction: c, key: "k" });
      assert.deepEqual([r1.id, r2.id], ["0", "1"]);
      assert.equal((await b.queue("mail").stats()).depth, 0, "not counted before the commit");
      assert.equal(await b.queue("mail").getJob(r1.id), null, "not known before the commit");
      let plainDone = false;
      const plain = b.queue<string>("mail").enqueue("plain").then((x) => ((plainDone = true), x));
      await waitUntil(() => someoneWaits(pool), "the plain enqueue waiting for the queue's lock");
      assert.equal(plainDone, false);
      assert.equal(notified.length, 0, "no wake-up before the commit");
      await c.query("COMMIT");
      assert.equal((await plain).id, "2", "the plain enqueue takes the next id once the transaction ends");
    } finally {
      c.release();
    }
    // Addressed to every store, the enqueuing node's own included (it does not see the commit).
    await waitUntil(() => notified.some((p) => p.endsWith(":app")), () => `the transaction's NOTIFY delivered at the commit (got ${JSON.stringify(notified)})`);
    const [ja, jb] = await Promise.all([gotA, gotB]);
    assert.deepEqual([ja.data, jb.data].sort(), ["first", "second"], "each node's waiting worker got one of the committed jobs");
    await Promise.all([ja.ack(), jb.ack()]);
    await wa.close();
    await wb.close();
  } finally {
    await listener.end();
    await pool.end();
    await a.close();
    await b.close();
    await dropSchema(schema);
  }
});

test("an ack and a lease expiry of the queue wait for the open transaction and finish after it, with no lock cycle", async () => {
  await withPg(async (broker, pool) => {
    const q = broker.queue<string>("work", { visibilityTimeoutMs: 60_000, dedupeWindowMs: 3_600_000 });
    await q.enqueueBatch([{ data: "to-ack" }, { data: "to-expire" }]);
    const w = q.work({ prefetch: 2 });
    const it = w[Symbol.asyncIterator]();
    const held = [await nextJob(it), await nextJob(it)];
    const toAck = held.find((j) => j.data === "to-ack")!;
    const toExpire = held.find((j) => j.data === "to-expire")!;
    const c = await pool.connect();
    let acked = false;
    let ack: Promise<void>;
    try {
      await c.query("BEGIN");
      await q.enqueue("in-tx-1", { transaction: c, dedupeId: "d1" });
      ack = toAck.ack().then(() => void (acked = true));
      await waitUntil(() => someoneWaits(pool), "the ack waiting for the queue's lock");
      // The lease expires (this node's timer): its requeue waits for the lock as well.
      await toExpire.extend(1);
      await waitUntil(() => someoneWaits(pool, 2), "the ack and the expired lease's requeue both waiting");
      // The transaction goes on while both wait: they hold nothing it needs next.
      await q.enqueue("in-tx-2", { transaction: c, dedupeId: "d2", singletonKey: "s" });
      assert.equal(acked, false);
      await c.query("COMMIT");
    } finally {
      c.release();
    }
    await ack;
    const next: Job<string>[] = [];
    while (next.length < 3) {
      const j = await nextJob(it);
      next.push(j);
      await j.ack();
    }
    assert.deepEqual(next.map((j) => j.data).sort(), ["in-tx-1", "in-tx-2", "to-expire"]);
    assert.equal(next.find((j) => j.data === "to-expire")!.attempt, 2, "the expired job redelivered after the commit");
    await w.close();
    const s = await q.stats();
    assert.equal(s.depth, 0);
    assert.equal(s.completed, 4);
  });
});

test("the sweep's cleanup skips a dedupe entry an open transaction took again, so the transaction can take another: no lock cycle", { timeout: 60_000 }, async () => {
  const schema = freshSchema();
  let skew = 0;
  const broker = await needingPostgres(() => openBroker({ engine: new PostgresEngine({ connectionString: PG_TEST_URL, schema, poolSize: 4, now: () => Date.now() + skew }), retentionCheckIntervalMs: 0 }));
  const pool = new pg.Pool({ connectionString: PG_TEST_URL, max: 4 });
  const dedupeRows = async (id: string): Promise<number> => (await pool.query(`SELECT count(*)::int AS n FROM "${schema}".queue_dedupe WHERE dedupe_id = $1`, [id])).rows[0].n;
  try {
    const q = broker.queue<string>("dd", { dedupeWindowMs: 60_000 });
    await q.enqueueBatch([{ data: "a", dedupeId: "d1" }, { data: "b", dedupeId: "d2" }]);
    skew = 120_000; // both entries expired: the cleanup may delete them
    let tx1 = "";
    await inTx(pool, true, async (c) => {
      tx1 = (await q.enqueue("a2", { dedupeId: "d1", transaction: c })).id;
      // The cleanup (every few seconds) deletes d2 while the transaction holds d1's row.
      await waitUntil(async () => (await dedupeRows("d2")) === 0, "the sweep's cleanup deleting the other expired entry", 30_000, 100);
      assert.equal(await dedupeRows("d1"), 1, "the entry the transaction holds is left to it");
      assert.equal((await q.enqueue("b2", { dedupeId: "d2", transaction: c })).duplicate, false);
    });
    assert.deepEqual(await q.enqueue("a3", { dedupeId: "d1" }), { id: tx1, duplicate: true }, "the committed transaction's entry counts");
    assert.equal((await q.stats()).depth, 4);
  } finally {
    await broker.close();
    await pool.end();
    await dropSchema(schema);
  }
});

test("dedupe ids, singleton keys and debounced jobs of a rolled-back transaction are as before it; a refused call leaves the transaction usable", async () => {
  await withPg(async (broker, pool, schema) => {
    const q = broker.queue<string>("keys", { dedupeWindowMs: 3_600_000, maxDepth: 4 });
    const debounced = await q.enqueue("old", { singletonKey: "deb", singletonMode: "debounce" });
    await inTx(pool, false, async (c) => {
      assert.equal((await q.enqueue("x", { dedupeId: "d", transaction: c })).duplicate, false);
      assert.equal((await q.enqueue("y", { singletonKey: "s", transaction: c })).duplicate, false);
      const r = await q.enqueue("new", { singletonKey: "deb", singletonMode: "debounce", transaction: c });
      assert.equal(r.replaced, debounced.id);
    });
    assert.equal((await q.getJob(debounced.id))?.state, "waiting", "the debounced job is back with the rollback");
    const d = await q.enqueue("x2", { dedupeId: "d" });
    assert.equal(d.duplicate, false, "the dedupe id is free again");
    const s = await q.enqueue("y2", { singletonKey: "s" });
    assert.equal(s.duplicate, false, "the singleton key is free again");
    assert.equal((await q.stats()).depth, 3);
    // Inside a committed transaction, the keys taken since count.
    await inTx(pool, true, async (c) => {
      assert.deepEqual(await q.enqueue("x3", { dedupeId: "d", transaction: c }), { id: d.id, duplicate: true });
      assert.deepEqual(await q.enqueue("y3", { singletonKey: "s", transaction: c }), { id: s.id, duplicate: true });
    });
    // A full queue refuses at once; the transaction goes on and commits its own rows.
    await pool.query(`CREATE TABLE "${schema}".app_rows (id text PRIMARY KEY)`);
    await inTx(pool, true, async (c) => {
      await c.query(`INSERT INTO "${schema}".app_rows VALUES ('before')`);
      await q.enqueue("fill", { transaction: c });
      await assert.rejects(q.enqueue("one too many", { transaction: c }), QueueFullError);
      // A debounce that replaced a job, then found no room: replaced job restored, nothing else.
      await assert.rejects(q.enqueueBatch([{ data: "n1" }, { data: "deb2", singletonKey: "deb", singletonMode: "debounce" }], { transaction: c }), QueueFullError);
      await c.query(`INSERT INTO "${schema}".app_rows VALUES ('after')`);
    });
    assert.deepEqual((await pool.query(`SELECT id FROM "${schema}".app_rows ORDER BY id`)).rows.map((r) => r.id), ["after", "before"]);
    assert.equal((await q.getJob(debounced.id))?.state, "waiting");
    assert.equal((await q.stats()).depth, 4);
    assert.deepEqual([...(await drain(broker, "keys", 4)).values()].map((j) => j.data).sort(), ["fill", "old", "x2", "y2"]);
  });
});

test(`an application SIGKILLed between its insert and its commit (${ROUNDS} rounds) loses no committed job and leaves no trace of the open one`, { timeout: 120_000 }, async (t) => {
  const schema = freshSchema();
  const admin = new pg.Client({ connectionString: PG_TEST_URL });
  let broker = await openPg(schema);
  await broker.queue("orders", { dedupeWindowMs: 3_600_000 }).stats();
  await broker.close();
  await admin.connect();
  const committed = new Map<string, string>();
  const killedOpen: string[] = [];
  try {
    await admin.query(`CREATE TABLE "${schema}".app_orders (id text PRIMARY KEY)`);
    let nextId = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const before = 3 + Math.floor(Math.random() * 20);
      await runChildUntilKilled([PG_TEST_URL, schema, "orders", String(before), String(nextId)], committed, killedOpen);
      nextId += before + 1;
    }
    broker = await openPg(schema);
    const q = broker.queue<string>("orders");
    // The killed sessions' locks go when PostgreSQL notices; the work waits for them.
    const jobs = await drain(broker, "orders", committed.size);
    assert.deepEqual(new Map([...jobs].map(([id, j]) => [j.data, id])), committed, "exactly the committed jobs, with the ids their enqueues returned");
    for (const id of killedOpen) assert.ok(![...jobs.values()].some((j) => j.data === id), `${id} (open at the kill) was not stored`);
    const ids = [...jobs.keys()].map(Number).sort((x, y) => x - y);
    assert.deepEqual(ids, ids.map((_, i) => i), "job ids 0.. without a gap where the killed transactions were");
    const s = await q.stats();
    assert.equal(s.depth, 0, "nothing else in the queue");
    assert.equal(s.completed, committed.size);
    const rows = (await admin.query<{ id: string }>(`SELECT id FROM "${schema}".app_orders`)).rows.map((r) => r.id);
    assert.deepEqual(new Set(rows), new Set(committed.keys()), "the business rows are exactly those of the committed jobs");
    const enqueued = (await allEvents(broker, "orders")).filter((e) => e.type === "enqueued");
    assert.equal(enqueued.length, committed.size, "an enqueued event per committed job, none for the open ones");
    // A dedupe id of a killed transaction is free: enqueueing it again stores a new job.
    if (killedOpen.length > 0) assert.equal((await q.enqueue(killedOpen[0], { dedupeId: killedOpen[0] })).duplicate, false);
    t.diagnostic(`${committed.size} committed transactions over ${ROUNDS} kills with one open each: all delivered once, none of the open ones`);
  } finally {
    await broker.close().catch(() => {});
    await admin.end();
    await dropSchema(schema);
  }
});

/** Runs the child until it says it holds an open transaction, then SIGKILLs it. */
async function runChildUntilKilled(args: string[], committed: Map<string, string>, killedOpen: string[]): Promise<void> {
  const child = spawn(process.execPath, [CHILD, ...args], { stdio: ["ignore", "pipe", "pipe"] });
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
        if (line.committed) committed.set(line.committed, line.job);
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
}

test("refused where it cannot work: the disk engine, a network client, a signal, a job carrying it, a client outside a transaction", async () => {
  const fake = { query: async () => ({ rows: [], rowCount: 0 }) };
  const tmp = tempDir();
  const disk = await openBroker({ dataDir: tmp.dir });
  try {
    const dq = disk.queue<string>("q");
    await assert.rejects(dq.enqueue("x", { transaction: fake }), (e: unknown) => e instanceof ValidationError && /PostgreSQL engine/.test(e.message) && /disk/.test(e.message));
    assert.deepEqual(await disk.listQueues(), [], "a refused call creates nothing");
    const server = await startServer({ broker: disk, port: 0, httpPort: null });
    const client = await connect({ url: server.url });
    try {
      const rq = client.queue<string>("q");
      await assert.rejects(rq.enqueue("x", { transaction: fake }), (e: unknown) => e instanceof ValidationError && /embedded broker/.test(e.message));
      await assert.rejects(rq.enqueueBatch([{ data: "x" }], { transaction: fake }), ValidationError);
      await assert.rejects(rq.enqueueFlow({ data: "p", children: [{ data: "c" }] }, { transaction: fake }), ValidationError);
    } finally {
      await client.close();
      await server.close();
    }
    assert.deepEqual(await disk.listQueues(), []);
  } finally {
    await disk.close();
    tmp.cleanup();
  }
  await withPg(async (broker, pool) => {
    const q = broker.queue<string>("q");
    await q.stats().catch(() => {});
    const c = await pool.connect();
    try {
      await assert.rejects(q.enqueue("x", { transaction: c }), (e: unknown) => e instanceof ValidationError && /BEGIN/.test(e.message), "a client outside a transaction");
      await c.query("BEGIN");
      await assert.rejects(q.enqueue("x", { transaction: c, signal: new AbortController().signal }), (e: unknown) => e instanceof ValidationError && /no signal/.test(e.message));
      await assert.rejects(q.enqueueBatch([{ data: "x", transaction: c } as never]), (e: unknown) => e instanceof ValidationError && /option of the call/.test(e.message));
      await assert.rejects(q.enqueue("x", { transaction: {} as never }), ValidationError);
      await c.query("SELECT 1/0").catch(() => {});
      await assert.rejects(q.enqueue("x", { transaction: c }), (e: unknown) => e instanceof ValidationError && /roll it back/.test(e.message), "a transaction that already failed");
      await c.query("ROLLBACK");
    } finally {
      c.release();
    }
    assert.equal((await q.stats()).depth, 0, "nothing stored by the refused calls");
    // REPEATABLE READ: fine on a queue unchanged since the snapshot; a retriable failure otherwise.
    const rr = async (changeFirst: boolean): Promise<void> => {
      const tx = await pool.connect();
      try {
        await tx.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
        await tx.query("SELECT 1");
        if (changeFirst) await q.enqueue("plain");
        await q.enqueue("rr", { transaction: tx });
        await tx.query("COMMIT");
      } finally {
        await tx.query("ROLLBACK").catch(() => {});
        tx.release();
      }
    };
    await rr(false);
    await assert.rejects(rr(true), (e: unknown) => e instanceof StorageError && /serialize/.test(e.message));
    assert.equal((await q.stats()).depth, 2, "the first repeatable-read transaction's job and the plain one");
    // A flow in a transaction: all of it at the commit.
    const flow = await inTx(pool, true, (tx) => q.enqueueFlow({ data: "parent", children: [{ data: "child" }] }, { transaction: tx }));
    assert.equal((await q.getJob(flow.id))?.state, "waiting-children");
  });
});
