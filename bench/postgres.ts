// SPDX-License-Identifier: Apache-2.0
/**
 * Topics in PostgreSQL (the `postgres` section): sluice on its PostgreSQL engine against the
 * fastest durable way to put the same records into the same PostgreSQL server by hand, one
 * multi-row INSERT per batch (`INSERT ... SELECT unnest($1::bytea[])`, autocommit), in the
 * same shape: batches of 1,000 records of 256 B, 8 batches in flight, each acknowledged only
 * once its transaction committed (synchronous_commit as the server has it, read and printed).
 *
 * sluice orders appends per partition (one transaction at a time per partition, so offsets
 * are gap-free and a producer's pipelined batches keep their order), so the shape is run twice:
 * 8 partitions (8 batches can commit at once, as the peer's 8 connections can) and 1
 * partition (a single ordered log). The goal (at least as fast as the raw INSERT) is on the
 * first; both print.
 *
 * Jobs: the queue bench's closed loop (a producer enqueueing batches of 100, workers acking
 * each job) with sluice's queue on the PostgreSQL engine against pg-boss on the same server
 * (goal: 10x).
 *
 * Nodes: publishing and jobs through 1, 2 and 3 broker nodes on one schema (postgres-nodes.ts).
 */
import pg from "pg";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { postgresEngine } from "../src/store/postgres/index.js";
import type { Broker } from "../src/types.js";
import { Meter, runGroups, type BenchCase, type BenchGroup, type RunGroupOptions } from "./harness.js";
import { describePostgresDurability, PG_CONNECTION, pgbossJobs, PGBOSS_SYSTEM } from "./peers/pgboss.js";
import { processCase } from "./queues.js";
import { JOB_CONCURRENCY } from "./shapes.js";
import { pumpWindow, stampedPayload } from "./peers/common.js";
import type { BenchRow } from "./report.js";
import { serve } from "./server.js";
import { runNodesBench } from "./postgres-nodes.js";
import { fmt, RECORD_BYTES } from "./shapes.js";

const BATCH = 1000;
const IN_FLIGHT = 8;
const SCHEMA = "sluice_bench";
const RAW_TABLE = "sluice_bench_raw_insert";
export const SLUICE_PG = "sluice on PostgreSQL (embedded)";
export const SLUICE_PG_SERVER = "sluice-server on PostgreSQL";
export const RAW_INSERT = "PostgreSQL multi-row INSERT";

let seq = 0;

function sluiceCase(system: string, durability: string, open: () => Promise<Broker>, close: (b: Broker) => Promise<void>, partitions: number): BenchCase {
  return {
    system: partitions === 1 ? `${system}, 1 partition` : system,
    durability,
    shape: `publishBatch x${fmt(BATCH)}, ${IN_FLIGHT} in flight, ${RECORD_BYTES} B, ${partitions} partition${partitions === 1 ? "" : "s"} (calls round-robin over them)`,
    run: async (limits) => {
      const b = await open();
      const topic = `bench-pg-${process.pid}-${seq++}`;
      try {
        await b.createTopic(topic, { partitions });
        const values = Array.from({ length: BATCH }, () => stampedPayload(RECORD_BYTES, 0));
        const m = new Meter(limits);
        let call = 0;
        await pumpWindow(IN_FLIGHT, () => {
          if (m.done) return null;
          const partition = call++ % partitions;
          return b.publishBatch(topic, values.map((value) => ({ value, partition }))).then((r) => void m.add(r.length));
        });
        return { values: { rate: m.rate() }, note: m.describe() };
      } finally {
        await b.deleteTopic(topic).catch(() => {});
        await close(b);
      }
    },
  };
}

function rawInsertCase(durability: string): BenchCase {
  return {
    system: RAW_INSERT,
    durability,
    shape: `INSERT ... SELECT unnest($1::bytea[]) of ${fmt(BATCH)} rows of ${RECORD_BYTES} B per statement, autocommit, ${IN_FLIGHT} in flight (${IN_FLIGHT} connections), one table (bigserial id, bytea)`,
    run: async (limits) => {
      const pool = new pg.Pool({ connectionString: PG_CONNECTION, max: IN_FLIGHT });
      pool.on("error", () => {});
      try {
        await pool.query(`DROP TABLE IF EXISTS ${RAW_TABLE}`);
        await pool.query(`CREATE TABLE ${RAW_TABLE} (id bigserial PRIMARY KEY, payload bytea NOT NULL)`);
        const values = Array.from({ length: BATCH }, () => stampedPayload(RECORD_BYTES, 0));
        const m = new Meter(limits);
        await pumpWindow(IN_FLIGHT, () => (m.done ? null : pool.query(`INSERT INTO ${RAW_TABLE} (payload) SELECT unnest($1::bytea[])`, [values]).then(() => void m.add(BATCH))));
        return { values: { rate: m.rate() }, note: m.describe() };
      } finally {
        await pool.query(`DROP TABLE IF EXISTS ${RAW_TABLE}`).catch(() => {});
        await pool.end();
      }
    },
  };
}

async function dropSchema(): Promise<void> {
  const c = new pg.Client({ connectionString: PG_CONNECTION });
  await c.connect();
  try {
    await c.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`);
  } finally {
    await c.end();
  }
}

export async function runPostgresBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const durability = await describePostgresDurability(PG_CONNECTION);
  await dropSchema();
  const broker = await openBroker({ engine: postgresEngine({ connectionString: PG_CONNECTION, schema: SCHEMA }) });
  let server: Awaited<ReturnType<typeof serve>> | null = null;
  try {
    const embedded = { open: async () => broker, close: async () => {} };
    const groups: BenchGroup[] = [
      {
        id: "pg-publish-batch",
        table: "batch",
        metrics: [{ key: "rate", name: `publish batches into PostgreSQL, ${fmt(BATCH)} x ${IN_FLIGHT} in flight, acknowledged once committed`, unit: "msg/s" }],
        cases: [
          sluiceCase(SLUICE_PG, `${durability}; acknowledged after the batch's transaction commits`, embedded.open, embedded.close, IN_FLIGHT),
          sluiceCase(SLUICE_PG, `${durability}; acknowledged after the batch's transaction commits`, embedded.open, embedded.close, 1),
          rawInsertCase(durability),
        ],
        ratios: [{ sluice: SLUICE_PG, peer: RAW_INSERT, goal: { atLeast: 1 } }],
      },
      {
        // pg-boss is a library on the application's pool, as this embedded broker is: the same
        // PostgreSQL server, the same closed loop, the same concurrency.
        id: "pg-jobs",
        table: "per-message",
        metrics: [{ key: "rate", name: `queue jobs in PostgreSQL end to end (enqueue, receive, ack), concurrency ${JOB_CONCURRENCY}`, unit: "jobs/s" }],
        cases: [{ ...processCase(SLUICE_PG, { open: async () => broker, release: async () => {} }, JOB_CONCURRENCY), durability: `${durability}; each enqueue batch, grant round and settlement one transaction` }, pgbossJobs(durability)],
        ratios: [{ sluice: SLUICE_PG, peer: PGBOSS_SYSTEM, goal: { atLeast: 10 } }],
        prime: true,
      },
    ];
    const rows = await runGroups(groups, { ...opts.run, only: opts.only });
    // The same through a server on the engine (the embedded broker closes first, so the server's figure is its own).
    if (!opts.only || opts.only.has("pg-publish-server")) {
      await broker.close();
      server = await serve(`${opts.tmpDir}/pg-node`, ["--engine", `${PG_CONNECTION}?schema=${SCHEMA}`]);
      const url = server.url;
      rows.push(
        ...(await runGroups(
          [
            {
              id: "pg-publish-server",
              table: "batch",
              metrics: [{ key: "rate", name: `publish batches into PostgreSQL through sluice serve --engine, ${fmt(BATCH)} x ${IN_FLIGHT} in flight`, unit: "msg/s" }],
              cases: [sluiceCase(SLUICE_PG_SERVER, `${durability}; acknowledged after the batch's transaction commits`, () => connect({ url }), (b) => b.close(), IN_FLIGHT), rawInsertCase(durability)],
              ratios: [{ sluice: SLUICE_PG_SERVER, peer: RAW_INSERT, goal: { atLeast: 1 } }],
            },
          ],
          { ...opts.run, only: null },
        )),
      );
    }
    await server?.stop();
    server = null;
    if (!opts.only || opts.only.has("pg-nodes-publish") || opts.only.has("pg-nodes-jobs")) {
      await broker.close();
      const only = opts.only ? new Set([...opts.only].filter((id) => id.startsWith("pg-nodes"))) : null;
      rows.push(...(await runNodesBench({ tmpDir: opts.tmpDir, engineUrl: `${PG_CONNECTION}?schema=${SCHEMA}`, durability, run: opts.run, only })));
    }
    return rows;
  } finally {
    await broker.close().catch(() => {});
    await server?.stop().catch(() => {});
    await dropSchema().catch(() => {});
  }
}
