// SPDX-License-Identifier: Apache-2.0
/**
 * Runs the StorageEngine contract against the PostgreSQL engine, each fixture in a schema of
 * its own (dropped afterwards). Needs a PostgreSQL server: SLUICE_PG_URL, default
 * postgres://postgres@127.0.0.1:5432/postgres. An unreachable server fails the tests (it does not
 * skip them): a green run always means the contract was checked.
 */
import { defineEngineContract } from "../src/testing/engine-contract.js";
import { dropSchema, freshSchema, openPgEngine } from "./fixtures/postgres.js";

defineEngineContract("postgres", async () => {
  const schema = freshSchema();
  let engine = await openPgEngine(schema);
  const fixture = {
    engine,
    async reopen() {
      await engine.close();
      engine = await openPgEngine(schema);
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
