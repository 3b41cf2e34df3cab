// SPDX-License-Identifier: Apache-2.0
/**
 * The telemetry seam: one object (logger, metrics sink, clock) handed from openBroker() down to
 * the engine and its partitions. Metrics arrive in the sink under the names declared in
 * src/observability/metrics.ts; the clock is the one the log reads (segment age, retention).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { METRICS } from "../src/observability/metrics.js";
import type { Clock, MetricLabels, MetricsSink } from "../src/observability/telemetry.js";

class CapturingSink implements MetricsSink {
  readonly counts = new Map<string, number>();
  readonly observations = new Map<string, number[]>();
  count(name: string, value = 1, labels?: MetricLabels): void {
    const k = `${name}${labels ? JSON.stringify(labels) : ""}`;
    this.counts.set(k, (this.counts.get(k) ?? 0) + value);
  }
  observe(name: string, value: number): void {
    const l = this.observations.get(name) ?? [];
    l.push(value);
    this.observations.set(name, l);
  }
  gauge(): void {}
}

class ManualClock implements Clock {
  wall = Date.now();
  mono = 0;
  now(): number {
    return this.wall;
  }
  monotonicMs(): number {
    return this.mono + performance.now();
  }
}

test("metrics reach the sink: appended records, append and fdatasync durations, partition faults and recoveries", async () => {
  using tmp = tempDir();
  const metrics = new CapturingSink();
  const fs = new FaultyFileSystem();
  const b = await openBroker({ dataDir: tmp.dir, fs, telemetry: { metrics }, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("m", { partitions: 1 });
    await b.publishBatch("m", [{ value: "a" }, { value: "b" }, { value: "c" }]);
    assert.equal(metrics.counts.get(`${METRICS.appendedRecords.name}{"topic":"m","partition":0}`), 3);
    const appendLat = metrics.observations.get(METRICS.appendDuration.name) ?? [];
    assert.equal(appendLat.length, 1, "one append, one observation");
    assert.ok(appendLat[0] >= 0 && appendLat[0] < 60, `append latency in seconds: ${appendLat[0]}`);
    assert.ok((metrics.observations.get(METRICS.fsyncDuration.name) ?? []).length >= 1, "fdatasync durations observed");
    fs.failNext("datasync", "EIO", { pathIncludes: ".log" });
    await assert.rejects(b.publish("m", "x", { partition: 0 }));
    assert.equal(metrics.counts.get(`${METRICS.partitionFaults.name}{"topic":"m"}`), 1);
    await waitUntil(() => metrics.counts.get(`${METRICS.partitionRecoveries.name}{"topic":"m"}`) === 1, "recovery counted");
  } finally {
    await b.close();
  }
});

test("the log reads time from the telemetry clock: a segment rolls when the clock passes segmentMs, without waiting", async () => {
  using tmp = tempDir();
  const clock = new ManualClock();
  const b = await openBroker({ dataDir: tmp.dir, telemetry: { clock }, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("aged", { partitions: 1, segmentMs: 60_000 });
    await b.publish("aged", "first", { partition: 0 });
    await b.publish("aged", "second", { partition: 0 });
    assert.equal((await b.describeTopic("aged")).partitions[0].segments, 1);
    clock.wall += 61_000; // a minute later, by the broker's clock
    await b.publish("aged", "third", { partition: 0 });
    assert.equal((await b.describeTopic("aged")).partitions[0].segments, 2, "the old segment was rolled by age");
  } finally {
    await b.close();
  }
});
