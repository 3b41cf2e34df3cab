/**
 * pg-boss as a job-queue peer: jobs/s end to end (enqueue with insert() in batches, workers that
 * fetch in batches and complete() them, which is pg-boss's ack).
 *
 * Durability: PostgreSQL with `synchronous_commit = on` and `fsync = on` (the defaults, read
 * from the server at run time and printed) flushes the WAL to disk before a commit returns, so
 * each enqueue batch, fetch (it marks jobs active) and completion is durable when it resolves.
 * That is the same promise as sluice's `durability: "always"`.
 */
import PgBoss from "pg-boss";
import pg from "pg";
import { METRIC, unavailableRow, type BenchRow } from "../report.js";
import { driveQueue, durationOf, warmupOf, runId, withTimeout, type PeerOptions } from "./common.js";

export const PGBOSS_SYSTEM = "pg-boss";
export const PG_CONNECTION = "postgres://postgres@127.0.0.1:5432/test";
/** A schema of our own so a concurrently running pg-boss (another bench) never shares tables. */
export const PGBOSS_SCHEMA = "sluice_bench_pgboss";

export type PgBossOptions = PeerOptions & {
  connectionString?: string;
  /** Concurrent fetch-and-complete loops (default 4). */
  concurrency?: number;
  /** Jobs per fetch (default 50). */
  fetchBatch?: number;
  /** Jobs per insert() (default 100). */
  enqueueBatch?: number;
  maxBacklog?: number;
};

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

export async function pgbossJobsPerSec(opts: PgBossOptions = {}): Promise<BenchRow> {
  const connectionString = opts.connectionString ?? PG_CONNECTION;
  const concurrency = opts.concurrency ?? 4;
  const fetchBatch = opts.fetchBatch ?? 50;
  const enqueueBatch = opts.enqueueBatch ?? 100;
  const durationMs = durationOf(opts);
  let durability = "PostgreSQL (unreachable)";
  let boss: PgBoss | undefined;
  const name = `sluice-bench-${runId()}`;
  let queueCreated = false;
  try {
    durability = await describePostgresDurability(connectionString);
    boss = new PgBoss({
      connectionString,
      schema: PGBOSS_SCHEMA,
      max: concurrency + 2,
      // No background maintenance or cron during the measurement.
      supervise: false,
      schedule: false,
      migrate: true,
    });
    boss.on("error", () => {});
    await withTimeout(boss.start(), 30_000, "pg-boss start");
    await boss.createQueue(name);
    queueCreated = true;
    const b = boss;
    const payload = { data: "x".repeat(200) };
    const r = await withTimeout(
      driveQueue({
        durationMs,
        warmupMs: warmupOf(opts),
        enqueueBatch,
        maxBacklog: opts.maxBacklog ?? 5000,
        enqueue: async (count, seq) => {
          await b.insert(Array.from({ length: count }, (_, i) => ({ name, data: { ...payload, seq: seq + i } })));
        },
        startWorkers: async (onCompleted) => {
          let running = true;
          const loops = Array.from({ length: concurrency }, async () => {
            while (running) {
              const jobs = await b.fetch(name, { batchSize: fetchBatch });
              if (jobs.length === 0) {
                // pg-boss workers poll; 5 ms keeps an empty queue from spinning on the database.
                await new Promise((res) => setTimeout(res, 5));
                continue;
              }
              await b.complete(name, jobs.map((j) => j.id));
              onCompleted(jobs.length);
            }
          });
          return async () => {
            running = false;
            await Promise.allSettled(loops);
          };
        },
      }),
      durationMs + 30_000,
      "pg-boss run",
    );
    return {
      name: METRIC.jobs,
      system: PGBOSS_SYSTEM,
      durability,
      value: r.jobsPerSec,
      unit: "jobs/s",
      note: `${concurrency} fetch loops x batch ${fetchBatch}, insert ${enqueueBatch}, ${r.completed} jobs`,
    };
  } catch (err) {
    return unavailableRow(METRIC.jobs, PGBOSS_SYSTEM, durability, "jobs/s", err);
  } finally {
    if (boss) {
      if (queueCreated) await boss.deleteQueue(name).catch(() => {});
      await boss.stop({ graceful: false, wait: true, timeout: 5000 }).catch(() => {});
    }
  }
}

export async function runPgBossPeer(opts: PgBossOptions = {}): Promise<BenchRow[]> {
  opts.log?.("pg-boss on PostgreSQL 127.0.0.1:5432/test");
  return [await pgbossJobsPerSec(opts)];
}
