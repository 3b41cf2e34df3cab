// SPDX-License-Identifier: Apache-2.0
/**
 * Prometheus metrics (docs/metrics.md): the exporter built from the METRICS table, the
 * scrape-time gauges with known values under a fake clock (lag in records and seconds,
 * retention headroom, queue depth and ages, drain estimate, skew), `/metrics` on a started
 * server, the caps on label sets, and docs/metrics.md listing exactly the table.
 */
import { CONTRACT_METRICS } from "../src/observability/contract-metrics.js";
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { request } from "node:http";
import { Registry } from "prom-client";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { startServer } from "../src/server/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { METRICS, type MetricDef } from "../src/observability/metrics.js";
import { prometheusMetrics } from "../src/observability/prometheus.js";
import type { Clock } from "../src/observability/telemetry.js";
import type { PrometheusOptions } from "../src/observability/prometheus.js";
import { get, key, parse, scrape } from "./fixtures/prom-text.js";

/** Wall time set by the test; monotonic time = real time + what the test adds. */
class ManualClock implements Clock {
  wall = Date.UTC(2026, 0, 1);
  mono = 0;
  now(): number {
    return this.wall;
  }
  monotonicMs(): number {
    return this.mono + performance.now();
  }
}

function near(actual: number, expected: number, tolerance: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= tolerance, `${what}: ${actual}, expected ${expected} ± ${tolerance}`);
}

async function open(dir: string, clock: Clock, metrics: Partial<PrometheusOptions> = {}): Promise<{ b: EmbeddedBroker; registry: Registry }> {
  const registry = new Registry();
  const b = await openBroker({ dataDir: dir, telemetry: { clock }, retentionCheckIntervalMs: 0, metrics: { registry, ...metrics } });
  return { b, registry };
}

/** `n` records on partition 0 with timestamps `firstTs`, `firstTs + stepMs`, ... */
async function publishTimed(b: EmbeddedBroker, topic: string, n: number, firstTs: number, stepMs: number): Promise<void> {
  const records = Array.from({ length: n }, (_, i) => ({ value: `r${i}`, partition: 0, timestamp: firstTs + i * stepMs }));
  await b.publishBatch(topic, records);
}

test("a lagging group: lag 60 records, lag seconds = now - ts(record 40), retention headroom from retentionMs", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  try {
    await b.createTopic("orders", { partitions: 1, retentionMs: 3_600_000 });
    await b.createTopic("forever", { partitions: 1, retentionMs: -1 });
    const first = clock.wall - 200_000;
    await publishTimed(b, "orders", 100, first, 1000); // record i has timestamp first + i s
    await publishTimed(b, "forever", 10, first, 1000);
    await b.resetGroup("billing", "orders", { offset: 40 }); // committed: next to read is 40
    await b.resetGroup("audit", "orders", "latest"); // caught up
    await b.resetGroup("billing", "forever", { offset: 5 });
    const g = { group: "billing", topic: "orders", partition: 0 };
    let m = await scrape(registry);
    assert.equal(get(m, METRICS.groupLagRecords, g), 60);
    const ts40 = first + 40_000;
    assert.equal(get(m, METRICS.groupLagSeconds, g), (clock.wall - ts40) / 1000); // 160 s
    assert.equal(get(m, METRICS.retentionHeadroom, g), (ts40 + 3_600_000 - clock.wall) / 1000); // 3440 s
    const caughtUp = { group: "audit", topic: "orders", partition: 0 };
    assert.equal(get(m, METRICS.groupLagRecords, caughtUp), 0);
    assert.equal(get(m, METRICS.groupLagSeconds, caughtUp), 0);
    assert.equal(get(m, METRICS.retentionHeadroom, caughtUp), 3600, "nothing needed yet: the whole retention");
    assert.equal(get(m, METRICS.retentionHeadroom, { group: "billing", topic: "forever", partition: 0 }), Infinity, "no time retention");
    assert.equal(get(m, METRICS.groupMembers, { group: "billing", topic: "orders" }), 0);
    // An hour later by the broker's clock: the needed record is past retention (overdue).
    clock.wall += 3_500_000;
    m = await scrape(registry);
    assert.equal(get(m, METRICS.groupLagSeconds, g), 3660);
    assert.equal(get(m, METRICS.retentionHeadroom, g), -60);
  } finally {
    await b.close();
  }
});

test("drain estimate from two scrapes: backlog / (consume rate - produce rate); -1 when not draining", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  try {
    await b.createTopic("flow", { partitions: 1 });
    const gt = { group: "etl", topic: "flow" };
    await publishTimed(b, "flow", 100, clock.wall, 1);
    await b.resetGroup("etl", "flow", { offset: 40 });
    let m = await scrape(registry);
    assert.equal(m.get(key(METRICS.groupDrainSeconds, gt)), undefined, "no rate after one scrape");
    // 10 s later: 50 produced (5/s), 80 consumed (8/s); backlog 150 - 120 = 30, shrinking 3/s.
    await publishTimed(b, "flow", 50, clock.wall, 1);
    await b.resetGroup("etl", "flow", { offset: 120 });
    clock.mono += 10_000;
    m = await scrape(registry);
    // Real time between the scrapes adds to the 10 s: a small tolerance.
    near(get(m, METRICS.groupBacklogGrowth, gt), -3, 0.05, "backlog growth");
    near(get(m, METRICS.groupDrainSeconds, gt), 10, 0.2, "drain time");
    // 10 s more: 100 produced, 10 consumed. Over the 20 s window: 7.5/s in, 4.5/s out.
    await publishTimed(b, "flow", 100, clock.wall, 1);
    await b.resetGroup("etl", "flow", { offset: 130 });
    clock.mono += 10_000;
    m = await scrape(registry);
    near(get(m, METRICS.groupBacklogGrowth, gt), 3, 0.05, "backlog growth");
    assert.equal(get(m, METRICS.groupDrainSeconds, gt), -1, "not draining");
    // Caught up: drain time 0.
    await b.resetGroup("etl", "flow", "latest");
    clock.mono += 10_000;
    m = await scrape(registry);
    assert.equal(get(m, METRICS.groupDrainSeconds, gt), 0);
  } finally {
    await b.close();
  }
});

test("a queue with a slow worker: depth, waiting, in flight, oldest waiting and lease ages, dead-letter depth", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  try {
    const q = b.queue<string>("emails", { visibilityTimeoutMs: 600_000 });
    await q.enqueueBatch([1, 2, 3, 4, 5].map((i) => ({ data: `job${i}` })));
    await using worker = q.work({ prefetch: 1 });
    const it = worker[Symbol.asyncIterator]();
    const held = await it.next(); // the slow worker: holds one job and does not settle it
    assert.equal(held.done, false);
    await waitUntil(async () => (await q.stats()).inFlight === 1, "one job leased");
    clock.wall += 30_000; // the 4 others have waited 30 s
    clock.mono += 20_000; // the lease is 20 s old
    const bad = b.queue<string>("bad");
    await bad.enqueue("poison");
    {
      await using w = bad.work({ prefetch: 1 });
      const j = await w[Symbol.asyncIterator]().next();
      assert.equal(j.done, false);
      if (!j.done) await j.value.nack({ requeue: false, reason: "malformed" });
    }
    const m = await scrape(registry);
    const e = { queue: "emails" };
    assert.equal(get(m, METRICS.queueDepth, e), 5);
    assert.equal(get(m, METRICS.queueWaiting, e), 4);
    assert.equal(get(m, METRICS.queueInFlight, e), 1);
    assert.equal(get(m, METRICS.queueDelayed, e), 0);
    assert.equal(get(m, METRICS.queueOldestWaitingAge, e), 30);
    near(get(m, METRICS.queueOldestLeaseAge, e), 20, 2, "oldest lease age");
    assert.equal(get(m, METRICS.queueCompleted, e), 0);
    assert.equal(get(m, METRICS.queueDeadLettered, { queue: "bad" }), 1);
    assert.equal(get(m, METRICS.queueDeadLetterDepth, { queue: "bad" }), 1);
    assert.equal(get(m, METRICS.queueDepth, { queue: "bad.dlq" }), 1);
    assert.equal(get(m, METRICS.queueDeadLetterDepth, e), 0, "its dead-letter queue exists (created with the queue), empty");
  } finally {
    await b.close();
  }
});

test("hot-path counters per partition, skew, retained bytes, disk space, rebalances, commit failures", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  try {
    await b.createTopic("hot", { partitions: 4 });
    await b.publishBatch("hot", Array.from({ length: 6 }, () => ({ value: "x", partition: 0 })));
    for (const p of [1, 2, 3]) await b.publishBatch("hot", [{ value: "y", partition: p }, { value: "y", partition: p }]);
    const assigned: number[] = [];
    const sub = b.subscribeMember("hot", { group: "workers", offsetReset: "earliest" }, { revoked: () => {}, assigned: (ps) => void assigned.push(...ps) });
    try {
      const reading = sub.nextRaw(1 << 20); // a member joins on its first read
      await waitUntil(() => assigned.length === 4, "all partitions assigned");
      // Past the high watermark: the engine refuses the commit.
      await assert.rejects(sub.commitOffsets(new Map([[0, 1000]])));
      const m = await scrape(registry);
      assert.equal(get(m, METRICS.appendedRecords, { topic: "hot", partition: 0 }), 6);
      assert.equal(get(m, METRICS.appendedRecords, { topic: "hot", partition: 3 }), 2);
      assert.ok(get(m, METRICS.appendedBytes, { topic: "hot", partition: 0 }) > 6);
      assert.equal(get(m, METRICS.partitionSkew, { topic: "hot" }), 0.5);
      assert.ok(get(m, METRICS.retainedBytes, { topic: "hot", partition: 0 }) > 0);
      assert.equal(get(m, METRICS.partitionHighWatermark, { topic: "hot", partition: 0 }), 6);
      assert.ok(get(m, METRICS.dataDirFree) > 0);
      assert.ok(get(m, METRICS.dataDirSize) >= get(m, METRICS.dataDirFree));
      assert.equal(get(m, METRICS.groupMembers, { group: "workers", topic: "hot" }), 1);
      assert.ok(get(m, METRICS.groupRebalances, { group: "workers", topic: "hot" }) >= 1);
      assert.equal(get(m, METRICS.commitFailures, { group: "workers", topic: "hot" }), 1);
      assert.equal(m.get(`${METRICS.appendDuration.name}_count{partition="0",topic="hot"}`), 1, "append histogram per partition");
      await sub.close();
      await reading;
    } finally {
      await sub.close();
    }
    // A subscription commits through the counting view of the engine like through the engine.
    {
      await using readers = b.subscribe<string>("hot", { group: "readers", start: "earliest" });
      let n = 0;
      for await (const msg of readers) {
        await msg.commit();
        if (++n === 12) break;
      }
    }
    const m = await scrape(registry);
    for (const p of [0, 1, 2, 3]) assert.equal(get(m, METRICS.groupLagRecords, { group: "readers", topic: "hot", partition: p }), 0);
    assert.equal(m.get(key(METRICS.commitFailures, { group: "readers", topic: "hot" })), undefined);
  } finally {
    await b.close();
  }
  assert.equal(registry.getSingleMetric(METRICS.groupLagRecords.name), undefined, "a closed broker's metrics leave the registry");
  const again = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0, metrics: { registry } });
  await again.close();
});

test("label sets are capped: groups x partitions and queues beyond the caps are counted as dropped", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock, { maxGroupPartitions: 10, maxQueues: 3 });
  try {
    await b.createTopic("wide", { partitions: 4 });
    await b.publishBatch("wide", [0, 1, 2, 3].map((p) => ({ value: "v", partition: p })));
    for (let i = 0; i < 5; i++) await b.resetGroup(`g${i}`, "wide", "earliest");
    for (let i = 0; i < 5; i++) await b.queue(`q${i}`).enqueue("j");
    const started = performance.now();
    const text = await registry.metrics();
    const tookMs = performance.now() - started;
    const m = parse(text);
    const groups = new Set<string>();
    const queues = new Set<string>();
    for (const k of m.keys()) {
      if (k.startsWith(`${METRICS.groupLagRecords.name}{`)) groups.add(/group="([^"]*)"/.exec(k)![1]);
      if (k.startsWith(`${METRICS.queueDepth.name}{`)) queues.add(/queue="([^"]*)"/.exec(k)![1]);
    }
    assert.deepEqual([...groups].sort(), ["g0", "g1"], "2 groups x 4 partitions fit in 10");
    // Each queue's dead-letter queue is created with it: 10 queues, 3 exported.
    assert.deepEqual([...queues].sort(), ["q0", "q0.dlq", "q1"]);
    assert.equal(get(m, METRICS.seriesDropped), 3 * 4 + 7, "12 group x partition sets and 7 queues left out");
    // Every sluice series has only bounded labels.
    for (const k of m.keys()) {
      if (!k.startsWith("sluice_")) continue;
      for (const [, name] of k.matchAll(/([a-z_]+)="/g)) assert.ok(["topic", "partition", "group", "queue", "le"].includes(name), `label ${name} in ${k}`);
    }
    assert.ok(tookMs < 2000, `scrape took ${tookMs.toFixed(0)} ms`);
    assert.ok(get(m, METRICS.collectDuration) < 2);
  } finally {
    await b.close();
  }
});

test("past the collection budget a scrape starts no further group or queue, and counts them as dropped", async () => {
  using tmp = tempDir();
  const { b, registry } = await open(tmp.dir, new ManualClock(), { collectBudgetMs: 0 });
  try {
    await b.createTopic("t", { partitions: 3 });
    await b.resetGroup("g1", "t", "earliest");
    await b.resetGroup("g2", "t", "earliest");
    await b.queue("q1").enqueue("j");
    const m = await scrape(registry);
    assert.equal([...m.keys()].filter((k) => k.startsWith(METRICS.groupLagRecords.name) || k.startsWith(METRICS.queueDepth.name)).length, 0);
    assert.equal(get(m, METRICS.seriesDropped), 2 * 3 + 2, "2 groups x 3 partitions, q1 and q1.dlq");
    assert.equal(get(m, METRICS.retainedBytes, { topic: "t", partition: 2 }), 0, "topics are still described");
  } finally {
    await b.close();
  }
});

test("scrape time stays bounded with many groups and queues", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  try {
    await b.createTopic("t", { partitions: 8 });
    await b.publishBatch("t", Array.from({ length: 800 }, (_, i) => ({ value: i, partition: i % 8 })));
    for (let i = 0; i < 200; i++) await b.resetGroup(`group-${i}`, "t", { offset: i % 100 });
    for (let i = 0; i < 50; i++) await b.queue(`queue-${i}`).enqueue(i);
    await scrape(registry); // opens the queues once
    const started = performance.now();
    const m = await scrape(registry);
    const tookMs = performance.now() - started;
    assert.equal(get(m, METRICS.groupLagRecords, { group: "group-7", topic: "t", partition: 3 }), 93);
    assert.equal(get(m, METRICS.seriesDropped), 0, "1600 group x partition sets are within the default cap");
    assert.ok(tookMs < 3000, `scrape of 200 groups x 8 partitions and 50 queues took ${tookMs.toFixed(0)} ms`);
    assert.ok(get(m, METRICS.collectDuration) < 3);
  } finally {
    await b.close();
  }
});

function httpGet(port: number, path: string): Promise<{ status: number; contentType: string; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method: "GET", path }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, contentType: String(res.headers["content-type"] ?? ""), text }));
    });
    req.on("error", reject);
    req.end();
  });
}

test("GET /metrics on a started server returns the broker's series in the Prometheus text format", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const { b, registry } = await open(tmp.dir, clock);
  const server = await startServer({ broker: b, port: 0, httpPort: 0, metrics: registry, dataDir: tmp.dir });
  try {
    await b.createTopic("web", { partitions: 1, retentionMs: 86_400_000 });
    await publishTimed(b, "web", 10, clock.wall - 5000, 100);
    await b.resetGroup("g", "web", { offset: 4 });
    await b.queue("jobs").enqueue("j");
    const r = await httpGet(server.httpPort!, "/metrics");
    assert.equal(r.status, 200);
    assert.match(r.contentType, /^text\/plain; version=0\.0\.4/);
    assert.match(r.text, /^# TYPE sluice_group_lag_records gauge$/m);
    assert.match(r.text, /^sluice_group_lag_records\{group="g",topic="web",partition="0"\} 6$/m);
    assert.match(r.text, /^sluice_group_lag_seconds\{group="g",topic="web",partition="0"\} 4\.6$/m);
    assert.match(r.text, /^sluice_group_retention_headroom_seconds\{group="g",topic="web",partition="0"\} 86395\.4$/m);
    assert.match(r.text, /^sluice_queue_depth\{queue="jobs"\} 1$/m);
    assert.match(r.text, /^sluice_records_appended_total\{topic="web",partition="0"\} 10$/m);
    const health = await httpGet(server.httpPort!, "/healthz");
    const h = JSON.parse(health.text);
    assert.equal(h.dataDir, tmp.dir);
    assert.equal(h.pid, process.pid);
    assert.equal(typeof h.version, "string");
    // Without a registry the route is not there.
    const bare = await startServer({ broker: b, port: 0, httpPort: 0 });
    try {
      assert.equal((await httpGet(bare.httpPort!, "/metrics")).status, 404);
    } finally {
      await bare.close();
    }
  } finally {
    await server.close();
    await b.close();
  }
});

test("prometheusMetrics() registers every METRICS entry once; a second broker on the same registry is refused", async () => {
  const registry = new Registry();
  const sink = prometheusMetrics({ registry });
  for (const d of Object.values(METRICS) as MetricDef[]) assert.ok(registry.getSingleMetric(d.name), `${d.name} registered`);
  sink.count(METRICS.appendedRecords.name, 3, { topic: "t", partition: 1 });
  sink.count(METRICS.appendedRecords.name, 1, { bogus: "label" }); // dropped, never thrown
  sink.count("sluice_not_declared_total", 1);
  assert.equal((await scrape(registry)).get(key(METRICS.appendedRecords, { topic: "t", partition: 1 })), 3);
  using tmp = tempDir();
  await assert.rejects(openBroker({ dataDir: tmp.dir, metrics: { registry } }), /already has sluice_/);
});

test("docs/metrics.md lists exactly the METRICS and CONTRACT_METRICS tables (name, type, labels)", () => {
  const doc = readFileSync(new URL("../../docs/metrics.md", import.meta.url), "utf8");
  const rows = doc.split("\n").filter((l) => l.startsWith("| `sluice_"));
  const documented = rows.map((r) => r.split("|").map((c) => c.trim()).slice(1, 4).join(" | "));
  const expected = ([...Object.values(METRICS), ...Object.values(CONTRACT_METRICS)] as MetricDef[]).map((d) => `\`${d.name}\` | ${d.kind} | ${d.labels.length === 0 ? "—" : d.labels.join(", ")}`);
  assert.deepEqual(documented.sort(), expected.sort());
});
