// SPDX-License-Identifier: Apache-2.0
/**
 * BullMQ as a job-queue peer: jobs/s end to end (enqueue with addBulk, a Worker with
 * concurrency, job completion = BullMQ's ack, one Lua script per job).
 *
 * Durability is whatever the Redis under it does: on the spawned Redis with appendfsync always
 * (6380) every enqueue and completion is fsynced before its reply, the like-for-like setting for
 * sluice's `durability: "always"`; on the machine's Redis (6379) nothing is on disk (shown for
 * information).
 */
import { Queue, Worker } from "bullmq";
import type { BenchCase } from "../harness.js";
import { JOB_BACKLOG, JOB_CONCURRENCY, JOB_DATA, JOB_ENQUEUE_BATCH, JOB_ENQUEUE_IN_FLIGHT, JOB_PRODUCER, JOB_WARMUP_MS } from "../shapes.js";
import { driveQueue, runId, withTimeout } from "./common.js";
import { REDIS_HOST } from "./redis.js";

export const BULLMQ_SYSTEM = "bullmq";
export const BULLMQ_FSYNC_SYSTEM = "bullmq-redis-fsync";

/** A variant of the jobs row: per-job options (priorities), worker options (a limiter), and how the shape says it. */
export interface BullmqVariant {
  shape: string;
  jobOpts?: (seq: number) => Record<string, unknown>;
  workerOpts?: Record<string, unknown>;
}

export function bullmqJobs(port: number, system: string, durability: string, variant?: BullmqVariant): BenchCase {
  return {
    system,
    durability,
    shape: `Worker concurrency ${JOB_CONCURRENCY}, trivial handler, completion per job; ${JOB_PRODUCER} (addBulk)${variant ? `; ${variant.shape}` : ""}`,
    run: async (limits) => {
      const name = `sluice-bench-${runId()}`;
      // maxRetriesPerRequest null is what BullMQ workers require.
      const connection = { host: REDIS_HOST, port, maxRetriesPerRequest: null, connectTimeout: 2000 };
      let queue: Queue | undefined;
      let worker: Worker | undefined;
      try {
        queue = new Queue(name, { connection, defaultJobOptions: { removeOnComplete: true, removeOnFail: true } });
        queue.on("error", () => {});
        await withTimeout(queue.waitUntilReady(), 5000, "bullmq queue ready");
        const r = await driveQueue({
          durationMs: limits.maxMs,
          warmupMs: Math.max(limits.warmupMs, JOB_WARMUP_MS),
          enqueueBatch: JOB_ENQUEUE_BATCH,
          enqueueInFlight: JOB_ENQUEUE_IN_FLIGHT,
          maxBacklog: JOB_BACKLOG,
          enqueue: async (count, seq) => {
            await queue!.addBulk(Array.from({ length: count }, (_, i) => ({ name: "j", data: { ...JOB_DATA, seq: seq + i }, ...(variant?.jobOpts ? { opts: variant.jobOpts(seq + i) } : {}) })));
          },
          startWorkers: async (onCompleted) => {
            worker = new Worker(name, async () => undefined, { connection, concurrency: JOB_CONCURRENCY, autorun: true, ...variant?.workerOpts });
            worker.on("error", () => {});
            worker.on("completed", () => onCompleted(1));
            await worker.waitUntilReady();
            return async () => {
              await worker!.close(true);
            };
          },
        });
        return { values: { rate: r.jobsPerSec }, note: `n=${r.completed.toLocaleString("en-US")} in ${(r.elapsedMs / 1000).toFixed(2)} s` };
      } finally {
        await worker?.close(true).catch(() => {});
        if (queue) {
          await withTimeout(queue.obliterate({ force: true }), 10_000, "obliterate").catch(() => {});
          await queue.close().catch(() => {});
        }
      }
    },
  };
}
