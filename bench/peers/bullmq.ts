/**
 * BullMQ as a job-queue peer: jobs/s end to end (enqueue with addBulk, a Worker with
 * concurrency, job completion = BullMQ's ack, which moves the job out of "active").
 *
 * Durability is whatever the Redis under it does: the machine's Redis on 6379 keeps nothing on
 * disk (save "", appendonly no), so a completed job or an enqueue survives nothing; optionally
 * the run is repeated against a spawned Redis on 6380 with appendfsync always (fsync before
 * every reply), the like-for-like setting for sluice's `durability: "always"`.
 */
import { Queue, Worker } from "bullmq";
import { METRIC, unavailableRow, type BenchRow } from "../report.js";
import { driveQueue, durationOf, warmupOf, runId, withTimeout, type PeerOptions } from "./common.js";
import { describeRedisDurability, REDIS_FSYNC_PORT, REDIS_HOST, REDIS_MEMORY_PORT, startRedisFsync, type RedisFsyncServer } from "./redis.js";

export const BULLMQ_SYSTEM = "bullmq";
export const BULLMQ_FSYNC_SYSTEM = "bullmq-redis-fsync";

export type QueuePeerOptions = PeerOptions & {
  /** Worker concurrency (default 100: on this 2-core machine 200 beat 50 by ~35%, 100 is the middle). */
  concurrency?: number;
  /** Jobs per addBulk / insert (default 100). */
  enqueueBatch?: number;
  /** Most jobs waiting or active at once (default 5,000). */
  maxBacklog?: number;
};

export async function bullmqJobsPerSec(port: number, system: string, durability: string, opts: QueuePeerOptions = {}): Promise<BenchRow> {
  const concurrency = opts.concurrency ?? 100;
  const enqueueBatch = opts.enqueueBatch ?? 100;
  const durationMs = durationOf(opts);
  const name = `sluice-bench-${runId()}`;
  // Fail fast: BullMQ itself would retry a dead connection forever.
  const connection = { host: REDIS_HOST, port, maxRetriesPerRequest: null, enableOfflineQueue: true, connectTimeout: 2000 };
  let queue: Queue | undefined;
  let worker: Worker | undefined;
  try {
    await describeRedisDurability(port);
    queue = new Queue(name, { connection, defaultJobOptions: { removeOnComplete: true, removeOnFail: true } });
    queue.on("error", () => {});
    await withTimeout(queue.waitUntilReady(), 5000, "bullmq queue ready");
    const payload = { data: "x".repeat(200) };
    const r = await withTimeout(
      driveQueue({
        durationMs,
        warmupMs: warmupOf(opts),
        enqueueBatch,
        maxBacklog: opts.maxBacklog ?? 5000,
        enqueue: async (count, seq) => {
          await queue!.addBulk(Array.from({ length: count }, (_, i) => ({ name: "j", data: { ...payload, seq: seq + i } })));
        },
        startWorkers: async (onCompleted) => {
          worker = new Worker(name, async () => undefined, { connection, concurrency, autorun: true });
          worker.on("error", () => {});
          worker.on("completed", () => onCompleted(1));
          await worker.waitUntilReady();
          return async () => {
            await worker!.close(true);
          };
        },
      }),
      durationMs + 30_000,
      "bullmq run",
    );
    return {
      name: METRIC.jobs,
      system,
      durability,
      value: r.jobsPerSec,
      unit: "jobs/s",
      note: `concurrency ${concurrency}, addBulk ${enqueueBatch}, ${r.completed} jobs`,
    };
  } catch (err) {
    return unavailableRow(METRIC.jobs, system, durability, "jobs/s", err);
  } finally {
    await worker?.close(true).catch(() => {});
    if (queue) {
      await withTimeout(queue.obliterate({ force: true }), 10_000, "obliterate").catch(() => {});
      await queue.close().catch(() => {});
    }
  }
}

/** BullMQ on 6379 (as configured) and, unless `includeFsync: false`, on a spawned 6380 (appendfsync always). */
export async function runBullmqPeer(opts: QueuePeerOptions & { includeFsync?: boolean; fsyncServer?: RedisFsyncServer } = {}): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  const memDurability = await describeRedisDurability(REDIS_MEMORY_PORT)
    .then((d) => `Redis ${d}`)
    .catch(() => "Redis (unreachable)");
  opts.log?.(`bullmq on :${REDIS_MEMORY_PORT} (${memDurability})`);
  rows.push(await bullmqJobsPerSec(REDIS_MEMORY_PORT, BULLMQ_SYSTEM, memDurability, opts));
  if (opts.includeFsync) {
    const durability = "Redis AOF appendfsync always (fsync before reply)";
    let server: RedisFsyncServer | undefined;
    try {
      server = opts.fsyncServer ?? (await startRedisFsync(REDIS_FSYNC_PORT));
      opts.log?.(`bullmq on :${REDIS_FSYNC_PORT} (${durability})`);
      rows.push(await bullmqJobsPerSec(server.port, BULLMQ_FSYNC_SYSTEM, durability, opts));
    } catch (err) {
      rows.push(unavailableRow(METRIC.jobs, BULLMQ_FSYNC_SYSTEM, durability, "jobs/s", err));
    } finally {
      if (!opts.fsyncServer) await server?.stop().catch(() => {});
    }
  }
  return rows;
}
