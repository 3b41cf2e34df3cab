// SPDX-License-Identifier: Apache-2.0
/**
 * The cost of Prometheus metrics (the `metrics` section): embedded brokers with
 * `metrics: { registry }`, scraped every second (harsher than Prometheus's usual 15 s), and
 * without, each repetition on a fresh broker, in 6 interleaved repetitions whose order alternates (on first, then off
 * first: the second of two back-to-back runs pays the first's garbage, which measured as a
 * 5-10% "cost" of metrics with a fixed order); the ratio on / off (goal: at least 0.97, i.e.
 * within 3%), and the CPU per message on / off (goal: at most 1.03) of the whole process and of
 * the main thread alone (where metric code runs; without the thread pool's fdatasyncs, so it
 * does not swing with the disk the way throughput does). Shapes: `publish()` per message with
 * 1,000 in flight, and the README consume loop (`for await (msg of sub) { void msg.commit() }`)
 * over a 4-partition backlog.
 */
import { join } from "node:path";
import { mkdtempSync } from "node:fs";
import { Registry } from "prom-client";
import { openBroker } from "../src/broker/broker.js";
import type { Broker } from "../src/types.js";
import { mainThreadCpuMs, Meter, runGroups, type BenchGroup, type Limits, type RunGroupOptions } from "./harness.js";
import type { BenchRow } from "./report.js";
import { SLUICE_DURABILITY } from "./sluice-topics.js";

const WINDOW = 1000;
const BACKLOG = 1_000_000;
let seq = 0;

/** Scrapes `registry` every second while `fn` runs (the metrics-on side). */
async function scraped<T>(registry: Registry | null, fn: () => Promise<T>): Promise<T> {
  if (registry === null) return fn();
  const timer = setInterval(() => void registry.metrics().catch(() => {}), 1000);
  try {
    return await fn();
  } finally {
    clearInterval(timer);
  }
}

/** CPU per message, in µs, since `start`: of the whole process (all threads: main, thread pool) and of the main thread alone. */
interface CpuStart {
  all: NodeJS.CpuUsage;
  mainMs: number;
}
const cpuStart = (): CpuStart => ({ all: process.cpuUsage(), mainMs: mainThreadCpuMs() });
function cpuPerMessage(start: CpuStart, messages: number): { cpu: number; mainCpu: number } {
  const d = process.cpuUsage(start.all);
  if (messages === 0) return { cpu: 0, mainCpu: 0 };
  return { cpu: (d.user + d.system) / messages, mainCpu: ((mainThreadCpuMs() - start.mainMs) * 1000) / messages };
}

async function publishOne(broker: Broker, registry: Registry | null, limits: Limits): Promise<{ values: { rate: number; cpu: number; mainCpu: number }; note: string }> {
  const topic = `metrics-bench-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  const meter = new Meter(limits);
  const cpu0 = cpuStart();
  let sent = 0;
  await scraped(registry, async () => {
    let inFlight = 0;
    let i = 0;
    await new Promise<void>((resolve, reject) => {
      const pump = (): void => {
        while (inFlight < WINDOW && !meter.done) {
          inFlight++;
          broker.publish(topic, { n: i }, { key: `k${i++ % 64}` }).then(() => {
            inFlight--;
            sent++;
            if (meter.add(1) && inFlight === 0) resolve();
            else pump();
          }, reject);
        }
        if (meter.done && inFlight === 0) resolve();
      };
      pump();
    });
  });
  meter.finish();
  const cpu = cpuPerMessage(cpu0, sent);
  await broker.deleteTopic(topic);
  return { values: { rate: meter.rate(), ...cpu }, note: meter.describe() };
}

async function consume(broker: Broker, registry: Registry | null, limits: Limits): Promise<{ values: { rate: number; cpu: number; mainCpu: number }; note: string }> {
  const topic = `metrics-bench-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  for (let i = 0; i < BACKLOG; i += 4000) await broker.publishBatch(topic, Array.from({ length: 4000 }, (_, k) => ({ key: `k${(i + k) % 64}`, value: { n: i + k } })));
  const meter = new Meter(limits);
  const cpu0 = cpuStart();
  let seen = 0;
  await scraped(registry, async () => {
    const sub = broker.subscribe(topic, { group: "bench", start: "earliest" });
    for await (const msg of sub) {
      void msg.commit();
      if (meter.add(1) || ++seen === BACKLOG) break;
    }
    await sub.close();
  });
  meter.finish();
  const cpu = cpuPerMessage(cpu0, seen);
  await broker.deleteTopic(topic);
  return { values: { rate: meter.rate(), ...cpu }, note: meter.describe() };
}

/**
 * A fresh broker for one repetition (its own data dir; closed after): two long-lived brokers in
 * one process measured differently depending on which was opened first (the first one ran ~5%
 * more CPU per message with or without metrics), which read as a cost of metrics.
 */
async function withBroker<T>(dir: string, metrics: boolean, fn: (b: Broker, registry: Registry | null) => Promise<T>): Promise<T> {
  const registry = metrics ? new Registry() : null;
  const b = await openBroker({ dataDir: join(dir, `b${seq++}`), retentionCheckIntervalMs: 0, ...(registry ? { metrics: { registry } } : {}) });
  try {
    return await fn(b, registry);
  } finally {
    await b.close();
  }
}

type Run = (b: Broker, registry: Registry | null, limits: Limits) => Promise<{ values: { rate: number; cpu: number; mainCpu: number }; note: string }>;

const ON = "sluice-embedded, metrics on (scraped every 1 s)";
const OFF = "sluice-embedded, metrics off";

/** One row: `run` on a fresh broker with metrics and on one without, throughput and CPU per message, ratios on / off. */
function onOff(dir: string, id: string, label: string, shape: string, run: Run): BenchGroup {
  return {
    id,
    table: "info",
    metrics: [
      { key: "rate", name: `${label} with and without metrics`, unit: "msg/s" },
      { key: "cpu", name: `${label}: process CPU per message`, unit: "us" },
      { key: "mainCpu", name: `${label}: main-thread CPU per message`, unit: "us" },
    ],
    cases: [
      { system: ON, durability: SLUICE_DURABILITY, shape, run: (l) => withBroker(dir, true, (b, r) => run(b, r, l)) },
      { system: OFF, durability: SLUICE_DURABILITY, shape, run: (l) => withBroker(dir, false, (b, r) => run(b, r, l)) },
    ],
    ratios: [
      { sluice: ON, peer: OFF, goal: { atLeast: 0.97 } },
      { sluice: ON, peer: OFF, key: "cpu", goal: { atMost: 1.03 } },
      { sluice: ON, peer: OFF, key: "mainCpu", goal: { atMost: 1.03 } },
    ],
    alternate: true,
    reps: 6,
  };
}

function groups(dir: string): BenchGroup[] {
  const pub = `publish() per message, ${WINDOW.toLocaleString("en-US")} in flight, 4 partitions`;
  const con = `README loop: for await (msg of sub) { void msg.commit() }, 4 partitions, backlog ${BACKLOG.toLocaleString("en-US")}`;
  return [onOff(dir, "metrics-publish", "publish per message", pub, publishOne), onOff(dir, "metrics-consume", "consume (README loop)", con, consume)];
}

export async function runMetricsBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const dir = mkdtempSync(join(opts.tmpDir, "metrics-bench-"));
  return runGroups(groups(dir), { ...opts.run, only: opts.only });
}
