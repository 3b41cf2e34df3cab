// SPDX-License-Identifier: Apache-2.0
/**
 * The cost of Prometheus metrics (the `metrics` section): two embedded brokers side by side,
 * one with `metrics: { registry }` and scraped every second (harsher than Prometheus's usual
 * 15 s), one without, in 6 interleaved repetitions whose order alternates (on first, then off
 * first: the second of two back-to-back runs pays the first's garbage, which measured as a
 * 5-10% "cost" of metrics with a fixed order); the ratio on / off (goal: at least 0.97, i.e.
 * within 3%), and the process's CPU per message on / off (goal: at most 1.03), which does not
 * depend on the disk's speed the way throughput does. Shapes: `publish()` per message with
 * 1,000 in flight, and the README consume loop (`for await (msg of sub) { void msg.commit() }`)
 * over a 4-partition backlog.
 */
import { join } from "node:path";
import { mkdtempSync } from "node:fs";
import { Registry } from "prom-client";
import { openBroker } from "../src/broker/broker.js";
import type { Broker } from "../src/types.js";
import { Meter, runGroups, type BenchGroup, type Limits, type RunGroupOptions } from "./harness.js";
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

/** CPU of this process (all threads: main, thread pool) per message, in µs: independent of the disk's speed. */
function cpuPerMessage(start: NodeJS.CpuUsage, messages: number): number {
  const d = process.cpuUsage(start);
  return messages === 0 ? 0 : (d.user + d.system) / messages;
}

async function publishOne(broker: Broker, registry: Registry | null, limits: Limits): Promise<{ values: { rate: number; cpu: number }; note: string }> {
  const topic = `metrics-bench-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  const meter = new Meter(limits);
  const cpu0 = process.cpuUsage();
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
  return { values: { rate: meter.rate(), cpu }, note: meter.describe() };
}

async function consume(broker: Broker, registry: Registry | null, limits: Limits): Promise<{ values: { rate: number; cpu: number }; note: string }> {
  const topic = `metrics-bench-${seq++}`;
  await broker.createTopic(topic, { partitions: 4 });
  for (let i = 0; i < BACKLOG; i += 4000) await broker.publishBatch(topic, Array.from({ length: 4000 }, (_, k) => ({ key: `k${(i + k) % 64}`, value: { n: i + k } })));
  const meter = new Meter(limits);
  const cpu0 = process.cpuUsage();
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
  return { values: { rate: meter.rate(), cpu }, note: meter.describe() };
}

function groups(on: Broker, registry: Registry, off: Broker): BenchGroup[] {
  const ON = "sluice-embedded, metrics on (scraped every 1 s)";
  const OFF = "sluice-embedded, metrics off";
  const pub = `publish() per message, ${WINDOW.toLocaleString("en-US")} in flight, 4 partitions`;
  const con = `README loop: for await (msg of sub) { void msg.commit() }, 4 partitions, backlog ${BACKLOG.toLocaleString("en-US")}`;
  return [
    {
      id: "metrics-publish",
      table: "info",
      metrics: [
        { key: "rate", name: "publish per message with and without metrics", unit: "msg/s" },
        { key: "cpu", name: "publish per message: process CPU per message", unit: "us" },
      ],
      cases: [
        { system: ON, durability: SLUICE_DURABILITY, shape: pub, run: (l) => publishOne(on, registry, l) },
        { system: OFF, durability: SLUICE_DURABILITY, shape: pub, run: (l) => publishOne(off, null, l) },
      ],
      ratios: [
        { sluice: ON, peer: OFF, goal: { atLeast: 0.97 } },
        { sluice: ON, peer: OFF, key: "cpu", goal: { atMost: 1.03 } },
      ],
      alternate: true,
      reps: 6,
    },
    {
      id: "metrics-consume",
      table: "info",
      metrics: [
        { key: "rate", name: "consume (README loop) with and without metrics", unit: "msg/s" },
        { key: "cpu", name: "consume (README loop): process CPU per message", unit: "us" },
      ],
      cases: [
        { system: ON, durability: SLUICE_DURABILITY, shape: con, run: (l) => consume(on, registry, l) },
        { system: OFF, durability: SLUICE_DURABILITY, shape: con, run: (l) => consume(off, null, l) },
      ],
      ratios: [
        { sluice: ON, peer: OFF, goal: { atLeast: 0.97 } },
        { sluice: ON, peer: OFF, key: "cpu", goal: { atMost: 1.03 } },
      ],
      alternate: true,
      reps: 6,
    },
  ];
}

export async function runMetricsBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const dir = mkdtempSync(join(opts.tmpDir, "metrics-bench-"));
  const registry = new Registry();
  const on = await openBroker({ dataDir: join(dir, "on"), retentionCheckIntervalMs: 0, metrics: { registry } });
  const off = await openBroker({ dataDir: join(dir, "off"), retentionCheckIntervalMs: 0 });
  try {
    return await runGroups(groups(on, registry, off), { ...opts.run, only: opts.only });
  } finally {
    await on.close();
    await off.close();
  }
}
