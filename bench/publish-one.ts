// SPDX-License-Identifier: Apache-2.0
/**
 * Micro-bench of the embedded per-message publish row (bench/sluice-topics.ts publishPerMessage):
 * publish() per message, 1,000 calls awaiting their ack, the README's order as a JSON value,
 * 1 partition. Prints msgs/s and CPU µs per message (process.cpuUsage), the figure to compare
 * while other work shares the cores.
 *
 *   node dist/bench/publish-one.js [seconds=4] [distDir] [null-disk]
 *
 * `distDir` (default: this build) lets an old build be measured by the same driver (A/B).
 * `null-disk`: segment writes and syncs complete at once without touching the file (not
 * durable: a measure of the JS pipeline's CPU per message, without the disk's latency).
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { Broker } from "../src/types.js";

interface NullableFs {
  open(path: string, mode: string): Promise<{ write(...a: unknown[]): Promise<void>; writeDurable(...a: unknown[]): Promise<void>; datasync(): Promise<void> }>;
}

const ORDER = { id: "o-000001", customer: "customer-7", total: 42 } as const;
const WINDOW = 1000;

async function main(): Promise<void> {
  const seconds = Number(process.argv[2] ?? 4);
  const dist = process.argv[3] ? resolve(process.argv[3]) : resolve(import.meta.dirname, "..");
  const nullDisk = process.argv[4] === "null-disk";
  const load = (m: string) => import(pathToFileURL(join(dist, m)).href);
  const { openBroker } = (await load("src/broker/broker.js")) as { openBroker(o: { dataDir?: string; engine?: unknown; retentionCheckIntervalMs?: number }): Promise<Broker> };
  const dir = mkdtempSync(join(tmpdir(), "pub-one-"));
  let b: Broker;
  if (nullDisk) {
    // CPU of the JS pipeline alone: writes and syncs of segment files complete at once, untouched.
    const { NodeFileSystem } = (await load("src/log/io.js")) as { NodeFileSystem: new () => NullableFs };
    const { DiskEngine } = (await load("src/store/disk/disk-engine.js")) as { DiskEngine: new (o: { dataDir: string; fs: unknown }) => unknown };
    const fs = new NodeFileSystem();
    const open = fs.open.bind(fs);
    fs.open = async (path: string, mode: string) => {
      const h = await open(path, mode);
      if (path.endsWith(".log")) h.write = h.writeDurable = h.datasync = () => Promise.resolve();
      return h;
    };
    b = await openBroker({ engine: new DiskEngine({ dataDir: dir, fs }), retentionCheckIntervalMs: 0 });
  } else b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { partitions: 1 });
    // Warm-up (JIT), then the measured run.
    await run(b, 1);
    const appends = countAppends(b);
    const cpu0 = process.cpuUsage();
    const main0 = mainThreadCpuUs();
    const t0 = performance.now();
    const n = await run(b, seconds);
    const ms = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    const mainUs = mainThreadCpuUs() - main0;
    const rate = (n / ms) * 1000;
    const us = (cpu.user + cpu.system) / n;
    console.log(JSON.stringify({ build: dist, msgsPerSec: Math.round(rate), cpuUsPerMsg: +us.toFixed(3), mainThreadUsPerMsg: +(mainUs / n).toFixed(3), perAppend: Math.round(n / Math.max(1, appends.n)), userUs: +(cpu.user / n).toFixed(3), sysUs: +(cpu.system / n).toFixed(3), n }));
  } finally {
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * CPU time of the main thread alone (the event loop, which bounds the rate), in µs: utime +
 * stime of /proc/self/task/<pid>/stat, in clock ticks (10 ms: read over seconds). Linux only; 0 elsewhere.
 */
function mainThreadCpuUs(): number {
  try {
    const stat = readFileSync(`/proc/self/task/${process.pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) * 10_000;
  } catch {
    return 0;
  }
}

/** Counts the engine appends made from now on (an instance property shadows the method; diagnostics only). */
function countAppends(b: Broker): { n: number } {
  const c = { n: 0 };
  const engine = (b as unknown as { engine?: { append(...a: unknown[]): Promise<unknown> } }).engine;
  if (engine === undefined) return c;
  const orig = engine.append.bind(engine);
  engine.append = (...a: unknown[]) => {
    c.n++;
    return orig(...a);
  };
  return c;
}

/** publish() with WINDOW calls in flight for `seconds`; resolves with the messages acked. */
function run(b: Broker, seconds: number): Promise<number> {
  const end = performance.now() + seconds * 1000;
  return new Promise((done, fail) => {
    let inflight = 0;
    let acked = 0;
    let stopped = false;
    const onAck = (): void => {
      acked++;
      inflight--;
      if (!stopped && (acked & 1023) === 0 && performance.now() >= end) stopped = true;
      if (!stopped) fill();
      else if (inflight === 0) done(acked);
    };
    const fill = (): void => {
      while (inflight < WINDOW) {
        inflight++;
        b.publish("t", ORDER).then(onAck, fail);
      }
    };
    fill();
  });
}

await main();
