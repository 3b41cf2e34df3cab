// SPDX-License-Identifier: Apache-2.0
/**
 * The broker conformance suite on the PostgreSQL engine, embedded (`openBroker({ engine })`)
 * and through a network server in front of it, each target in a schema of its own on the
 * local PostgreSQL (test/fixtures/postgres.ts). `reopen` opens a new engine on the same
 * schema: a restart of a stateless node.
 *
 * Scope: the PostgreSQL engine has topics, producing, groups, commits, replay and every queue
 * area; key-compacted topics are not on it yet (it refuses them with a ValidationError), so
 * that area is not registered here.
 */
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { defineConformanceSuite, type ConformanceScope } from "../src/testing/conformance.js";
import type { Broker } from "../src/types.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine } from "./fixtures/postgres.js";

const SCOPE: ConformanceScope = { queues: true, compaction: false };

const openOn = (schema: string) => needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));

defineConformanceSuite(
  "postgres engine, embedded",
  async () => {
    const schema = freshSchema();
    const target = {
      broker: (await openOn(schema)) as Broker,
      async reopen() {
        await target.broker.close();
        target.broker = await openOn(schema);
        return target.broker;
      },
      async cleanup() {
        await target.broker.close();
        await dropSchema(schema);
      },
    };
    return target;
  },
  SCOPE,
);

defineConformanceSuite(
  "postgres engine, server",
  async () => {
    const schema = freshSchema();
    const broker = await openOn(schema);
    const server = await startServer({ broker, port: 0, httpPort: null });
    const client = await connect({ url: server.url });
    return {
      broker: client,
      async cleanup() {
        await client.close();
        await server.close();
        await broker.close();
        await dropSchema(schema);
      },
    };
  },
  SCOPE,
);
