// SPDX-License-Identifier: Apache-2.0
/**
 * Smoke run of every peer in quick mode (one repetition, ~1 s per figure), per-message shapes:
 * `npx tsc -p tsconfig.json && node dist/bench/peers/smoke.js [--json]`.
 */
import { QUICK_LIMITS, runGroups, type BenchGroup } from "../harness.js";
import { printTable, type BenchRow } from "../report.js";
import { LATENCY_RATE } from "../shapes.js";
import {
  bullmqJobs,
  BULLMQ_FSYNC_SYSTEM,
  describePostgresDurability,
  describeRedisDurability,
  natsConsume,
  natsLatency,
  natsPublishPerMessage,
  pgbossJobs,
  rabbitConsume,
  rabbitLatency,
  rabbitPublishPerMessage,
  redisConsume,
  redisLatency,
  redisPublishPerMessage,
  REDIS_FSYNC_PORT,
  REDIS_FSYNC_SYSTEM,
  startRedisFsync,
} from "./index.js";

const started = performance.now();
const fsync = await startRedisFsync(REDIS_FSYNC_PORT).catch(() => null);
const dur = await describeRedisDurability(REDIS_FSYNC_PORT).catch(() => "unavailable");
const redis = { port: REDIS_FSYNC_PORT, system: REDIS_FSYNC_SYSTEM, durability: dur, pid: fsync?.pid };
const rate = { key: "rate", name: "smoke", unit: "msg/s" };
const groups: BenchGroup[] = [
  { id: "publish", table: "per-message", metrics: [{ ...rate, name: "publish per message" }], cases: [redisPublishPerMessage(redis), natsPublishPerMessage(), rabbitPublishPerMessage()] },
  { id: "consume", table: "per-message", metrics: [{ ...rate, name: "consume, ack per message" }], cases: [redisConsume(redis, true), natsConsume(true), rabbitConsume(true)] },
  {
    id: "latency",
    table: "per-message",
    metrics: [
      { key: "p99", name: "e2e latency p99", unit: "ms" },
      { key: "cpu", name: "server CPU per message", unit: "us" },
    ],
    cases: [redisLatency(redis, LATENCY_RATE), natsLatency(LATENCY_RATE), rabbitLatency(LATENCY_RATE)],
  },
  {
    id: "jobs",
    table: "per-message",
    metrics: [{ key: "rate", name: "jobs", unit: "jobs/s" }],
    cases: [bullmqJobs(REDIS_FSYNC_PORT, BULLMQ_FSYNC_SYSTEM, `Redis ${dur}`), pgbossJobs(await describePostgresDurability().catch(() => "unavailable"))],
  },
];
let rows: BenchRow[] = [];
try {
  rows = await runGroups(groups, { limits: QUICK_LIMITS, reps: 1 });
} finally {
  await fsync?.stop();
}
printTable(rows, { title: "peer smoke run (quick mode, one repetition)" });
if (process.argv.includes("--json")) console.log(JSON.stringify(rows));
console.error(`# done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
