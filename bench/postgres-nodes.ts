// SPDX-License-Identifier: Apache-2.0
/**
 * Broker nodes on one PostgreSQL schema (part of the `postgres` section): the same work with 1,
 * 2 and 3 `sluice serve --engine` nodes, one client per node, the work split evenly over them,
 * and the same totals in every row (batches in flight, job concurrency), so a row differs only
 * in how many nodes carry it.
 *
 * What it shows on one machine: the nodes hold nothing durable and share the database, so the
 * nodes are not the limit as long as PostgreSQL (here on the same cores) is; the figures say
 * how much a node costs or adds, not what separate machines would give.
 */
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { Meter, runGroups, type BenchCase, type BenchGroup, type RunGroupOptions } from "./harness.js";
import { driveQueue, pumpWindow, stampedPayload } from "./peers/common.js";
import type { BenchRow } from "./report.js";
import { serve } from "./server.js";
import { fmt, JOB_BACKLOG, JOB_CONCURRENCY, JOB_DATA, JOB_ENQUEUE_BATCH, JOB_ENQUEUE_IN_FLIGHT, JOB_PRODUCER, JOB_WARMUP_MS, RECORD_BYTES } from "./shapes.js";

const BATCH = 1000;
const IN_FLIGHT = 8;
const PARTITIONS = 8;
const MAX_NODES = 3;

export const nodesSystem = (n: number): string => `sluice-server on PostgreSQL, ${n} node${n === 1 ? "" : "s"}`;

let seq = 0;

/** `total` split over `n` parts as evenly as possible (the first ones get the remainder). */
const split = (total: number, n: number): number[] => Array.from({ length: n }, (_, i) => Math.floor(total / n) + (i < total % n ? 1 : 0));

function publishCase(n: number, urls: string[], durability: string): BenchCase {
  return {
    system: nodesSystem(n),
    durability,
    shape: `publishBatch x${fmt(BATCH)}, ${IN_FLIGHT} in flight in all (round-robin over one client per node), ${RECORD_BYTES} B, ${PARTITIONS} partitions`,
    run: async (limits) => {
      const clients = await Promise.all(urls.slice(0, n).map((url) => connect({ url })));
      const topic = `bench-pg-nodes-${process.pid}-${seq++}`;
      try {
        await clients[0].createTopic(topic, { partitions: PARTITIONS });
        const values = Array.from({ length: BATCH }, () => stampedPayload(RECORD_BYTES, 0));
        const m = new Meter(limits);
        let call = 0;
        await pumpWindow(IN_FLIGHT, () => {
          if (m.done) return null;
          const i = call++;
          const partition = i % PARTITIONS;
          return clients[i % n].publishBatch(topic, values.map((value) => ({ value, partition }))).then((r) => void m.add(r.length));
        });
        return { values: { rate: m.rate() }, note: m.describe() };
      } finally {
        await clients[0].deleteTopic(topic).catch(() => {});
        await Promise.all(clients.map((c) => c.close()));
      }
    },
  };
}

function jobsCase(n: number, urls: string[], durability: string): BenchCase {
  const shares = split(JOB_CONCURRENCY, n);
  return {
    system: nodesSystem(n),
    durability,
    shape: `q.process(async () => {}, { concurrency }) on each node's client, ${JOB_CONCURRENCY} in all (${shares.join(" + ")}); ${JOB_PRODUCER} through node 1`,
    run: async (limits) => {
      const clients: RemoteBrokerHandle[] = await Promise.all(urls.slice(0, n).map((url) => connect({ url })));
      const name = `bench-pg-nodes-jobs-${process.pid}-${seq++}`;
      try {
        const items = Array.from({ length: JOB_ENQUEUE_BATCH }, () => ({ data: JOB_DATA }));
        const producer = clients[0].queue<typeof JOB_DATA>(name);
        const r = await driveQueue({
          durationMs: limits.maxMs,
          warmupMs: Math.max(limits.warmupMs, JOB_WARMUP_MS),
          enqueueBatch: JOB_ENQUEUE_BATCH,
          enqueueInFlight: JOB_ENQUEUE_IN_FLIGHT,
          maxBacklog: JOB_BACKLOG,
          enqueue: async () => void (await producer.enqueueBatch(items)),
          startWorkers: async (onAcked) => {
            const ac = new AbortController();
            const runs = clients.map((c, i) => c.queue<typeof JOB_DATA>(name).process(() => void onAcked(1), { concurrency: shares[i], signal: ac.signal }));
            return async () => {
              ac.abort();
              await Promise.all(runs);
            };
          },
        });
        await producer.purge().catch(() => {});
        return { values: { rate: r.jobsPerSec }, note: `n=${r.completed.toLocaleString("en-US")} in ${(r.elapsedMs / 1000).toFixed(2)} s` };
      } finally {
        await Promise.all(clients.map((c) => c.close()));
      }
    },
  };
}

/** Starts MAX_NODES servers on `engineUrl` (one schema), runs the rows, stops them. */
export async function runNodesBench(opts: { tmpDir: string; engineUrl: string; durability: string; run: RunGroupOptions; only: Set<string> | null }): Promise<BenchRow[]> {
  const servers: Awaited<ReturnType<typeof serve>>[] = [];
  try {
    for (let i = 0; i < MAX_NODES; i++) servers.push(await serve(`${opts.tmpDir}/pg-node-${i}`, ["--engine", opts.engineUrl]));
    const urls = servers.map((s) => s.url);
    const ns = Array.from({ length: MAX_NODES }, (_, i) => i + 1);
    const durability = `${opts.durability}; acknowledged after the transaction commits`;
    const ratios = ns.slice(1).map((n) => ({ sluice: nodesSystem(n), peer: nodesSystem(1) }));
    const groups: BenchGroup[] = [
      {
        id: "pg-nodes-publish",
        table: "batch",
        metrics: [{ key: "rate", name: `publish batches into PostgreSQL through 1, 2 and 3 broker nodes, ${fmt(BATCH)} x ${IN_FLIGHT} in flight in all`, unit: "msg/s" }],
        cases: ns.map((n) => publishCase(n, urls, durability)),
        ratios,
      },
      {
        id: "pg-nodes-jobs",
        table: "per-message",
        metrics: [{ key: "rate", name: `queue jobs in PostgreSQL end to end through 1, 2 and 3 broker nodes, concurrency ${JOB_CONCURRENCY} in all`, unit: "jobs/s" }],
        cases: ns.map((n) => jobsCase(n, urls, durability)),
        ratios,
        prime: true,
      },
    ];
    return await runGroups(groups, { ...opts.run, only: opts.only });
  } finally {
    for (const s of servers) await s.stop().catch(() => {});
  }
}
