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
