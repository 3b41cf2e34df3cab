// SPDX-License-Identifier: Apache-2.0
/**
 * Topic figures (the `server` section): sluice embedded and a `sluice serve` child process with
 * the TypeScript client, beside Redis Streams (appendfsync always, and in memory for
 * information), NATS JetStream and RabbitMQ, every system in the same client shape per row
 * (bench/shapes.ts), repetitions interleaved across systems (bench/harness.ts).
 *
 * Embedded and server figures are separate rows; ratios are only ever server vs peer (or
 * embedded vs server), never embedded sluice vs a networked peer.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/index.js";
import { connect } from "../src/client/index.js";
import type { Broker } from "../src/types.js";
import { runGroups, type BenchCase, type BenchGroup, type GroupRatio, type RunGroupOptions } from "./harness.js";
import { rawDiskAppend, rawDiskPacedLatency } from "./raw-disk.js";
import { encodeBatch, prepareValue } from "../src/log/record-batch.js";
import { printByTable, type BenchRow } from "./report.js";
import { fmt, LATENCY_RATE, ORDER, PUBLISH_BATCH_SHAPES, PUBLISH_WINDOW, RECORD_BYTES } from "./shapes.js";
import { consumeBatches, consumePerMessage, latency, publishBatches, publishPerMessage, SLUICE_DURABILITY, type SluiceTarget } from "./sluice-topics.js";
import {
  describeRedisDurability,
  natsConsume,
  natsLatency,
  natsPublishBatches,
  natsPublishPerMessage,
  rabbitConsume,
  rabbitLatency,
  rabbitPublishBatches,
  rabbitPublishPerMessage,
  redisConsume,
  redisLatency,
  redisPid,
  redisPublishBatches,
  redisPublishPerMessage,
  REDIS_FSYNC_PORT,
  REDIS_FSYNC_SYSTEM,
  REDIS_MEMORY_PORT,
  REDIS_SYSTEM,
  startRedisFsync,
  type RedisFsyncServer,
  type RedisTarget,
} from "./peers/index.js";

export const SERVER = "sluice-server";
export const EMBEDDED = "sluice-embedded";

interface Served {
  child: ChildProcess;
  url: string;
  stop(): Promise<void>;
}

/** Starts `sluice serve` on a free port and waits for its "listening" line. */
export async function serve(dataDir: string, extraArgs: string[] = []): Promise<Served> {
  const main = fileURLToPath(new URL("../src/cli/main.js", import.meta.url));
  const child = spawn(process.execPath, [main, "serve", "--data", dataDir, "--port", "0", "--http-port", "off", "--log-level", "warn", ...extraArgs], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => reject(new Error("sluice serve did not start within 15 s")), 15_000);
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      for (const line of buf.split("\n")) {
        try {
          const j = JSON.parse(line);
          if (j.event === "listening") {
            clearTimeout(timer);
            resolve(j.url);
          }
        } catch {
          /* partial line */
        }
      }
    });
    child.once("exit", (code) => reject(new Error(`sluice serve exited with ${code}`)));
  });
  return {
    child,
    url,
    stop: async () => {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/** The client of `sluice serve`, one connection per repetition, with default options. */
export function serverTarget(served: Served): SluiceTarget {
  return {
    system: SERVER,
    durability: SLUICE_DURABILITY,
    embedded: false,
    open: () => connect({ url: served.url }),
    release: (b) => b.close(),
    pid: served.child.pid,
  };
}

function embeddedTarget(broker: Broker): SluiceTarget {
  return { system: EMBEDDED, durability: SLUICE_DURABILITY, embedded: true, open: async () => broker, release: async () => {} };
}

/** The disk's own latency floor at the same rate: write + fdatasync, group commit, open loop. */
function rawDiskFloor(dir: string): BenchCase {
  return {
    system: "raw disk, preallocated",
    durability: "write + fdatasync (group commit) over synced zeros: the floor for any fsync-before-ack broker",
    shape: `open loop ${fmt(LATENCY_RATE)}/s, each step writes what arrived and fdatasyncs once; synchronous calls, no network`,
    run: async (limits) => {
      const f = rawDiskPacedLatency({ dir, recordBytes: 64, ratePerSec: LATENCY_RATE, durationMs: limits.maxMs, preallocate: true });
      return { values: { p50: f.p50Ms, p99: f.p99Ms }, note: `n=${f.count}` };
    },
  };
}

/**
 * The disk's limit for the per-message publish row: the same 1,000 records in flight, each
 * needing an fdatasync after its write before it is acknowledged, written as one write of all
 * of them (at the size sluice stores the README's order) + one fdatasync, one group at a time,
 * synchronous calls, no JavaScript between the groups: no system with this window can ack faster.
 */
function rawPublishWindow(dir: string): BenchCase {
  const { value, valueKind } = prepareValue(ORDER);
  const perBatch = 500; // sluice's group commit splits the window in about two rounds
  const bytes = Math.ceil(encodeBatch(Array.from({ length: perBatch }, () => ({ key: null, value, valueKind, timestamp: Date.now(), headers: null }))).length / perBatch);
  return {
    system: "raw disk",
    durability: "write + fdatasync per group of records",
    shape: `one write of ${fmt(PUBLISH_WINDOW)} records x ${bytes} B (the README's order as sluice stores it) + one fdatasync, one group at a time, synchronous calls: the ceiling for ${fmt(PUBLISH_WINDOW)} in flight`,
    run: async (limits) => {
      mkdirSync(dir, { recursive: true });
      try {
        const x = await rawDiskAppend({ dir, recordBytes: bytes, recordsPerBatch: PUBLISH_WINDOW, batches: Math.ceil(limits.maxMessages / PUBLISH_WINDOW), maxDurationMs: limits.maxMs });
        return { values: { rate: x.recordsPerSec }, note: `n=${x.records.toLocaleString("en-US")} in ${(x.elapsedMs / 1000).toFixed(2)} s; fdatasync p50 ${x.p50Ms.toFixed(2)} ms, p99 ${x.p99Ms.toFixed(2)} ms` };
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

const versus = (sluice: string, peers: string[], key?: string): GroupRatio[] => peers.map((peer) => ({ sluice, peer, key }));

function groups(emb: SluiceTarget, srv: SluiceTarget, fsync: RedisTarget, mem: RedisTarget, dataDir: string): BenchGroup[] {
  const peers = [REDIS_FSYNC_SYSTEM, "nats-jetstream", "rabbitmq"];
  const out: BenchGroup[] = [
    {
      id: "consume-msg",
      table: "per-message",
      metrics: [{ key: "rate", name: "consume from backlog, commit/ack every message", unit: "msg/s" }],
      cases: [
        consumePerMessage(emb, "readme"),
        consumePerMessage(srv, "readme"),
        redisConsume(fsync, true),
        natsConsume(true),
        rabbitConsume(true),
        consumePerMessage(emb, "awaited"),
        consumePerMessage(srv, "awaited"),
      ],
      ratios: versus(SERVER, peers),
    },
    {
      id: "publish-msg",
      table: "per-message",
      metrics: [{ key: "rate", name: `publish per message, window ${fmt(1000)}, acked`, unit: "msg/s" }],
      cases: [publishPerMessage(emb), publishPerMessage(srv), redisPublishPerMessage(fsync), natsPublishPerMessage(), rabbitPublishPerMessage(), rawPublishWindow(join(dataDir, "raw-publish"))],
      // Embedded against the disk's limit for the same window (the 600,000 msg/s goal is
      // that limit on a disk with ~1.5 ms fdatasyncs); the server against each peer.
      ratios: [...versus(SERVER, peers), { sluice: EMBEDDED, peer: "raw disk" }],
    },
    {
      id: "latency",
      table: "per-message",
      metrics: [
        { key: "p50", name: `e2e latency p50 @ ${fmt(LATENCY_RATE)} msg/s`, unit: "ms" },
        { key: "p99", name: `e2e latency p99 @ ${fmt(LATENCY_RATE)} msg/s`, unit: "ms" },
        { key: "cpu", name: `server CPU per message @ ${fmt(LATENCY_RATE)} msg/s`, unit: "us" },
      ],
      cases: [latency(srv, LATENCY_RATE), redisLatency(fsync, LATENCY_RATE), natsLatency(LATENCY_RATE), rabbitLatency(LATENCY_RATE), redisLatency(mem, LATENCY_RATE), rawDiskFloor(join(dataDir, "raw"))],
      ratios: [...versus(SERVER, peers, "p99"), ...versus(SERVER, [REDIS_FSYNC_SYSTEM], "cpu")],
    },
    {
      id: "consume-batch",
      table: "batch",
      metrics: [{ key: "rate", name: `consume from backlog, batches, commit/ack per batch`, unit: "msg/s" }],
      cases: [consumeBatches(emb), consumeBatches(srv), redisConsume(fsync, false), natsConsume(false), rabbitConsume(false), redisConsume(mem, false)],
      ratios: [{ sluice: EMBEDDED, peer: SERVER }, ...versus(SERVER, [...peers, REDIS_SYSTEM])],
    },
  ];
  for (const [batch, window] of PUBLISH_BATCH_SHAPES) {
    out.push({
      id: `publish-batch-${batch}x${window}`,
      table: "batch",
      metrics: [{ key: "rate", name: `publish ${fmt(batch)} x ${window} in flight, ${RECORD_BYTES} B, acked`, unit: "msg/s" }],
      cases: [
        publishBatches(srv, batch, window),
        redisPublishBatches(fsync, batch, window),
        natsPublishBatches(batch, window),
        rabbitPublishBatches(batch, window),
        // In-memory Redis for information, in one shape only (time budget).
        ...(batch === PUBLISH_BATCH_SHAPES[0][0] ? [redisPublishBatches(mem, batch, window)] : []),
      ],
      ratios: versus(SERVER, batch === PUBLISH_BATCH_SHAPES[0][0] ? [...peers, REDIS_SYSTEM] : peers),
    });
  }
  return out;
}

export async function runServerBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const dataDir = join(opts.tmpDir, "server-bench");
  const embDir = join(opts.tmpDir, "embedded-topics");
  mkdirSync(dataDir, { recursive: true });
  let served: Served | undefined;
  let broker: Broker | undefined;
  let fsyncServer: RedisFsyncServer | undefined;
  try {
    served = await serve(dataDir);
    broker = await openBroker({ dataDir: embDir, retentionCheckIntervalMs: 0 });
    fsyncServer = await startRedisFsync(REDIS_FSYNC_PORT).catch((err) => {
      console.error(`# redis appendfsync always unavailable: ${(err as Error).message}`);
      return undefined;
    });
    const fsync: RedisTarget = {
      port: REDIS_FSYNC_PORT,
      system: REDIS_FSYNC_SYSTEM,
      durability: await describeRedisDurability(REDIS_FSYNC_PORT).catch(() => "AOF appendfsync always (unreachable)"),
      pid: fsyncServer?.pid,
    };
    const mem: RedisTarget = {
      port: REDIS_MEMORY_PORT,
      system: REDIS_SYSTEM,
      durability: `${await describeRedisDurability(REDIS_MEMORY_PORT).catch(() => "unreachable")} (information only)`,
      pid: redisPid(REDIS_MEMORY_PORT),
    };
    const rows = await runGroups(groups(embeddedTarget(broker), serverTarget(served), fsync, mem, dataDir), { ...opts.run, only: opts.only });
    return rows;
  } finally {
    await broker?.close().catch(() => {});
    await served?.stop().catch(() => {});
    await fsyncServer?.stop().catch(() => {});
  }
}

// Run directly: node dist/bench/server.js [--quick]
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { mkdtempSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { FULL_LIMITS, QUICK_LIMITS } = await import("./harness.js");
  const quick = process.argv.includes("--quick");
  const dir = mkdtempSync(join(tmpdir(), "sluice-server-bench-"));
  try {
    printByTable(await runServerBench({ tmpDir: dir, run: { limits: quick ? QUICK_LIMITS : FULL_LIMITS, reps: quick ? 1 : 3 } }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
