// SPDX-License-Identifier: Apache-2.0
/**
 * Runs the StorageEngine contract against the PostgreSQL engine, each fixture in a schema of
 * its own (dropped afterwards). Needs a PostgreSQL server: SLUICE_TEST_PG_URL, default
 * postgres://postgres@127.0.0.1:5432/test. An unreachable server fails the tests (it does not
 * skip them): a green run always means the contract was checked.
 */
import { randomBytes } from "node:crypto";
import pg from "pg";
import { defineEngineContract } from "../src/testing/engine-contract.js";
import { PostgresEngine } from "../src/store/postgres/postgres-engine.js";

const URL = process.env.SLUICE_TEST_PG_URL ?? "postgres://postgres@127.0.0.1:5432/test";

async function dropSchema(schema: string): Promise<void> {
  const c = new pg.Client({ connectionString: URL });
  await c.connect();
  try {
    await c.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  } finally {
    await c.end();
  }
}

async function openEngine(schema: string): Promise<PostgresEngine> {
  const engine = new PostgresEngine({ connectionString: URL, schema, poolSize: 4 });
  try {
    await engine.open();
  } catch (e) {
    await engine.close().catch(() => {});
    throw new Error(`PostgreSQL engine tests need a PostgreSQL server at ${URL} (set SLUICE_TEST_PG_URL): ${(e as Error).message}`, { cause: e });
  }
  return engine;
}

defineEngineContract("postgres", async () => {
  const schema = `sluice_test_${randomBytes(6).toString("hex")}`;
  let engine = await openEngine(schema);
  const fixture = {
    engine,
    async reopen() {
      await engine.close();
      engine = await openEngine(schema);
      fixture.engine = engine;
      return engine;
    },
    async cleanup() {
      await engine.close();
      await dropSchema(schema);
    },
  };
  return fixture;
});
