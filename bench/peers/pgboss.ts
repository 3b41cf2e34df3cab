// SPDX-License-Identifier: Apache-2.0
/**
 * pg-boss as a job-queue peer: jobs/s end to end (enqueue with insert() in batches, workers that
 * fetch and complete(), pg-boss's ack).
 *
 * Durability: PostgreSQL with `synchronous_commit = on` and `fsync = on` (read from the server
 * at run time and printed) flushes the WAL before a commit returns, so each enqueue batch, fetch
 * (it marks jobs active) and completion is durable when it resolves: the same promise as
 * sluice's `durability: "always"`.
 */
import PgBoss from "pg-boss";
import pg from "pg";
import type { BenchCase } from "../harness.js";
import { JOB_BACKLOG, JOB_CONCURRENCY, JOB_DATA, JOB_ENQUEUE_BATCH, JOB_ENQUEUE_IN_FLIGHT, JOB_PRODUCER, JOB_WARMUP_MS } from "../shapes.js";
import { driveQueue, runId, withTimeout } from "./common.js";

export const PGBOSS_SYSTEM = "pg-boss";
export const PG_CONNECTION = "postgres://postgres@127.0.0.1:5432/test";
/** A schema of our own so a concurrently running pg-boss (another bench) never shares tables. */
export const PGBOSS_SCHEMA = "sluice_bench_pgboss";

/** Reads synchronous_commit and fsync so the label reflects the server, not an assumption. */
export async function describePostgresDurability(connectionString = PG_CONNECTION): Promise<string> {
  const c = new pg.Client({ connectionString, connectionTimeoutMillis: 2000 });
  await c.connect();
  try {
    const sc = (await c.query("SHOW synchronous_commit")).rows[0].synchronous_commit as string;
    const fs = (await c.query("SHOW fsync")).rows[0].fsync as string;
    const flushes = sc !== "off" && fs === "on";
    return `PostgreSQL synchronous_commit=${sc}, fsync=${fs}${flushes ? ": WAL flushed before each commit returns" : ": commits NOT flushed before returning"}`;
  } finally {
    await c.end().catch(() => {});
  }
}

/**
 * `JOB_CONCURRENCY` loops, each `fetch(batchSize 1)` then `complete(id)`: 50 jobs in flight,
 * one ack per job, as the other systems' workers. (pg-boss' `work()` polls at >= 0.5 s between
 * empty fetches, which would measure the polling interval.)
 */
export function pgbossJobs(durability: string): BenchCase {
  return {
    system: PGBOSS_SYSTEM,
    durability,
    shape: `${JOB_CONCURRENCY} loops of fetch(batchSize 1) + complete(id): concurrency ${JOB_CONCURRENCY}, ack per job; ${JOB_PRODUCER} (insert())`,
    run: async (limits) => {
      const boss = new PgBoss({ connectionString: PG_CONNECTION, schema: PGBOSS_SCHEMA, max: JOB_CONCURRENCY + 2, supervise: false, schedule: false, migrate: true });
      boss.on("error", () => {});
      const name = `sluice-bench-${runId()}`;
      let created = false;
      try {
        await withTimeout(boss.start(), 30_000, "pg-boss start");
        await boss.createQueue(name);
        created = true;
        const r = await driveQueue({
          durationMs: limits.maxMs,
          warmupMs: Math.max(limits.warmupMs, JOB_WARMUP_MS),
          enqueueBatch: JOB_ENQUEUE_BATCH,
          enqueueInFlight: JOB_ENQUEUE_IN_FLIGHT,
          maxBacklog: JOB_BACKLOG,
          enqueue: async (count, seq) => {
            await boss.insert(Array.from({ length: count }, (_, i) => ({ name, data: { ...JOB_DATA, seq: seq + i } })));
          },
          startWorkers: async (onCompleted) => {
            let running = true;
            const loops = Array.from({ length: JOB_CONCURRENCY }, async () => {
              while (running) {
                const jobs = await boss.fetch(name, { batchSize: 1 });
                if (jobs.length === 0) {
                  // pg-boss workers poll; 5 ms keeps an empty queue from spinning on the database.
                  await new Promise((res) => setTimeout(res, 5));
                  continue;
                }
                await boss.complete(name, jobs[0].id);
                onCompleted(1);
              }
            });
            return async () => {
              running = false;
              await Promise.allSettled(loops);
            };
          },
        });
        return { values: { rate: r.jobsPerSec }, note: `n=${r.completed.toLocaleString("en-US")} in ${(r.elapsedMs / 1000).toFixed(2)} s` };
      } finally {
        if (created) await boss.deleteQueue(name).catch(() => {});
        await boss.stop({ graceful: false, wait: true, timeout: 5000 }).catch(() => {});
      }
    },
  };
}
