// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine beyond the shared contract: `exclusive: true` (one broker node per
 * schema, for deployments that want it) and several engines on one schema, the default
 * (concurrent migrations, a waitFor on one engine woken by an append on another).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { hostname } from "node:os";
import pg from "pg";
import { DataDirLockedError, StorageError } from "../src/errors.js";
import { PostgresEngine } from "../src/store/postgres/postgres-engine.js";
import { resolveTopicConfig } from "../src/store/topic-config.js";
import { waitUntil } from "../src/testing/helpers.js";
import { dropSchema, freshSchema, needingPostgres, openPgEngine, PG_TEST_URL } from "./fixtures/postgres.js";

const rec = (v: string) => ({ key: null, value: Buffer.from(v), valueKind: 1 as const, timestamp: Date.now(), headers: [] });

test("exclusive: a second node on the same schema is refused, naming the holder; once the first closes it opens", async () => {
  const schema = freshSchema();
  const a = await openPgEngine(schema, { exclusive: true });
  try {
    const b = new PostgresEngine({ connectionString: PG_TEST_URL, schema, exclusive: true });
    const err = await b.open().then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof DataDirLockedError, `expected DataDirLockedError, got ${String(err)}`);
    assert.equal(err.code, "DATA_DIR_LOCKED");
    assert.equal(err.retriable, false);
    assert.equal(err.pid, process.pid);
    assert.equal(err.host, hostname());
    assert.match(err.message, new RegExp(`PostgreSQL schema "${schema}"`));
    await a.createTopic("t", resolveTopicConfig({}));
    await a.close();
    const c = await openPgEngine(schema, { exclusive: true });
    assert.deepEqual(await c.listTopics(), ["t"], "the refused node changed nothing; the next one sees the data");
    await c.close();
  } finally {
    await a.close();
    await dropSchema(schema);
  }
});

test("exclusive: a node whose lock connection is cut refuses calls (retriable) until it holds the lock again", async () => {
  const schema = freshSchema();
  const e = await openPgEngine(schema, { exclusive: true });
  const admin = new pg.Client({ connectionString: PG_TEST_URL });
  await admin.connect();
  try {
    await e.createTopic("t", resolveTopicConfig({}));
    const pid = e.schemaLock!.backendPid;
    assert.ok(pid !== null);
    await admin.query("SELECT pg_terminate_backend($1)", [pid]);
    const refused = await waitUntil(
      () => e.listTopics().then(() => null, (x: unknown) => x),
      "calls refused after the lock connection was cut",
    );
    assert.ok(refused instanceof StorageError, `expected StorageError, got ${String(refused)}`);
    assert.equal(refused.retriable, true);
    assert.match(refused.message, /lost its lock/);
    await waitUntil(() => e.listTopics().then(() => true, () => false), "calls served again once the lock is back");
    assert.notEqual(e.schemaLock!.backendPid, pid, "a new session holds it");
    const r = await e.append("t", 0, [rec("after")]);
    assert.equal(r.baseOffset, 0);
  } finally {
    await admin.end();
    await e.close();
    await dropSchema(schema);
  }
});

test("several engines opening one schema at once migrate it once; an append on one wakes a waitFor on the other", async () => {
  const schema = freshSchema();
  const engines = [0, 1, 2].map(() => new PostgresEngine({ connectionString: PG_TEST_URL, schema, poolSize: 2 }));
  try {
    await needingPostgres(() => Promise.all(engines.map((x) => x.open())));
    const [a, b] = engines;
    await a.createTopic("t", resolveTopicConfig({}));
    const woke = b.waitFor("t", 0, 0, 10_000);
    await a.append("t", 0, [rec("x")]);
    assert.equal(await woke, true);
    assert.equal((await b.read("t", 0, 0, 1 << 20)).records.length, 1);
  } finally {
    for (const x of engines) await x.close();
    await dropSchema(schema);
  }
});

test("time index: the first record at or after a time, with timestamps out of order and after retention; a schema from before the index gets it on open", async () => {
  const schema = freshSchema();
  const at = (v: string, timestamp: number) => ({ ...rec(v), timestamp });
  let e = await openPgEngine(schema);
  const admin = new pg.Client({ connectionString: PG_TEST_URL });
  await admin.connect();
  try {
    await e.createTopic("t", resolveTopicConfig({}));
    // Batches (offsets): [0,1] ts 100,300; [2] ts 200; [3,4] ts 400,500; [5] ts 350.
    await e.append("t", 0, [at("a", 100), at("b", 300)]);
    await e.append("t", 0, [at("c", 200)]);
    await e.append("t", 0, [at("d", 400), at("e", 500)]);
    await e.append("t", 0, [at("f", 350)]);
    const expect = async (label: string): Promise<void> => {
      // Kafka's rule: the earliest offset whose timestamp is at or after the time.
      for (const [ts, offset] of [[0, 0], [100, 0], [150, 1], [300, 1], [301, 3], [450, 4], [500, 4], [501, 6]] as const) {
        assert.equal(await e.offsetForTimestamp("t", 0, ts), offset, `${label}: offsetForTimestamp(${ts})`);
      }
    };
    await expect("indexed");
    // A schema migrated before the time index existed: the columns and the index are rebuilt from the batches.
    await e.close();
    const s = `"${schema}"`;
    await admin.query(`DROP INDEX ${s}.batches_time`);
    await admin.query(`ALTER TABLE ${s}.batches DROP COLUMN time_index`);
    await admin.query(`ALTER TABLE ${s}.partitions DROP COLUMN max_timestamp`);
    await admin.query(`DELETE FROM ${s}.schema_version WHERE version >= 4`);
    e = await openPgEngine(schema);
    await expect("after the migration");
    await e.append("t", 0, [at("g", 360)]);
    assert.equal(await e.offsetForTimestamp("t", 0, 501), 7, "an append after the migration continues the index");
  } finally {
    await admin.end();
    await e.close();
    await dropSchema(schema);
  }
});
