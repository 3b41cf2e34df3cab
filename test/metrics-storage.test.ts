// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's and the archive's scrape-time metrics (docs/metrics.md "Compaction",
 * "Archive"): after a compaction run and a retention run that archives segments, and reads
 * below the online log start, the series carry what describeTopic reports and what the
 * manifests hold; the archive's lag is the bytes retention waits to delete while the archive
 * cannot be written, and 0 once they are archived.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Registry } from "prom-client";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { IoBudget } from "../src/log/io-budget.js";
import { NodeFileSystem } from "../src/log/io.js";
import { PartitionLog } from "../src/log/partition-log.js";
import { METRICS } from "../src/observability/metrics.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { get, key, scrape } from "./fixtures/prom-text.js";

async function open(dir: string): Promise<{ b: EmbeddedBroker; engine: DiskEngine; registry: Registry }> {
  const registry = new Registry();
  const engine = new DiskEngine({ dataDir: dir, fs: new NodeFileSystem(), cleanerIntervalMs: 0 });
  const b = await openBroker({ engine, retentionCheckIntervalMs: 0, metrics: { registry } });
  return { b, engine, registry };
}

/** Reads every record of partition 0 from offset 0 (below the online log start: the archive). */
async function readAll(b: EmbeddedBroker, topic: string): Promise<number> {
  const hwm = (await b.describeTopic(topic)).partitions[0].highWatermark;
  let n = 0;
  for (let off = 0; off < hwm; ) {
    const r = await b.fetch(topic, 0, off, { maxBytes: 2000 });
    n += r.records.length;
    assert.ok(r.nextOffset > off);
    off = r.nextOffset;
  }
  return n;
}

test("cleaner series: dirty ratio, bytes reclaimed, passes and last pass as describeTopic reports them; none for other topics", async () => {
  using tmp = tempDir("sluice-metrics-cleaner-");
  const { b, engine, registry } = await open(tmp.dir);
  try {
    await b.createTopic("table", { segmentBytes: 1024, cleanupPolicy: "compact" });
    await b.createTopic("plain", {});
    for (let i = 0; i < 40; i++) await b.publishBatch("table", [0, 1, 2].map((j) => ({ key: `k${(i * 3 + j) % 4}`, value: i * 3 + j, partition: 0 })));
    await b.publish("plain", "x");
    const tp = { topic: "table", partition: 0 };
    let m = await scrape(registry);
    assert.equal(get(m, METRICS.cleanerDirtyRatio, tp), 1, "nothing compacted yet");
    assert.equal(get(m, METRICS.cleanerBytesReclaimed, tp), 0);
    assert.equal(get(m, METRICS.cleanerPasses, tp), 0);
    assert.equal(m.get(key(METRICS.cleanerLastPass, tp)), undefined, "no pass yet: no timestamp");
    const before = Date.now();
    await engine.compact();
    const after = Date.now();
    m = await scrape(registry);
    const d = (await b.describeTopic("table")).partitions[0];
    assert.ok(d.bytesReclaimed! > 0);
    assert.equal(get(m, METRICS.cleanerBytesReclaimed, tp), d.bytesReclaimed);
    assert.equal(get(m, METRICS.cleanerDirtyRatio, tp), d.cleanerDirtyRatio);
    assert.ok(d.cleanerDirtyRatio! < 1, "the pass covered the sealed segments");
    assert.equal(get(m, METRICS.cleanerPasses, tp), 1);
    assert.equal(d.cleanerPasses, 1);
    const last = get(m, METRICS.cleanerLastPass, tp);
    assert.ok(last * 1000 >= before && last * 1000 <= after, `last pass at ${last}`);
    assert.equal(m.get(key(METRICS.cleanerPassProgress, tp)), undefined, "no pass running");
    assert.equal(d.cleanerPassProgress, null);
    for (const def of [METRICS.cleanerDirtyRatio, METRICS.cleanerBytesReclaimed, METRICS.archiveBytes, METRICS.archiveReadBytes]) {
      assert.equal(m.get(key(def, { topic: "plain", partition: 0 })), undefined, `${def.name} only for the topics it concerns`);
    }
  } finally {
    await b.close();
  }
});

test("archive series: bytes and segments as the manifests list them, lag while the archive cannot be written, read bytes", async () => {
  using tmp = tempDir("sluice-metrics-archive-");
  const data = join(tmp.dir, "data");
  const archive = join(tmp.dir, "archive");
  mkdirSync(archive);
  const { b, engine, registry } = await open(data);
  try {
    // Every record is past retention: all sealed segments are due for deletion.
    await b.createTopic("cold", { segmentBytes: 4096, retentionMs: 60_000, archive: { dir: archive } });
    // The archive cannot be written: a file where the topic's directory would go.
    writeFileSync(join(archive, "cold"), "in the way");
    const old = Date.now() - 3_600_000;
    for (let i = 0; i < 50; i++) await b.publishBatch("cold", Array.from({ length: 4 }, (_, j) => ({ value: `record ${i}.${j} `.repeat(12), partition: 0, timestamp: old + i })));
    const log = engine.log("cold", 0);
    const sealed = log.describeSegments().slice(0, -1);
    assert.ok(sealed.length >= 3, `${sealed.length} sealed segments`);
    const tp = { topic: "cold", partition: 0 };
    let m = await scrape(registry);
    assert.equal(get(m, METRICS.archiveLagBytes, tp), 0, "retention has not run");
    assert.equal(get(m, METRICS.archiveBytes, tp), 0);
    await assert.rejects(b.enforceRetention(Date.now()), "retention fails: nothing is deleted before it is archived (ARC-1)");
    m = await scrape(registry);
    const due = sealed.reduce((a, s) => a + s.size, 0);
    assert.equal(get(m, METRICS.archiveLagBytes, tp), due, "the sealed segments retention waits to delete");
    assert.equal((await b.describeTopic("cold")).partitions[0].archiveLagBytes, due);
    assert.equal(log.describeSegments().length, sealed.length + 1, "all still local");

    rmSync(join(archive, "cold"));
    await b.enforceRetention(Date.now());
    m = await scrape(registry);
    const manifests = log.archive!.list();
    assert.equal(manifests.length, sealed.length);
    const archivedBytes = manifests.reduce((a, x) => a + x.bytes, 0);
    assert.equal(archivedBytes, due);
    assert.equal(get(m, METRICS.archiveBytes, tp), archivedBytes);
    assert.equal(get(m, METRICS.archiveSegments, tp), manifests.length);
    assert.equal(get(m, METRICS.archiveLagBytes, tp), 0, "all archived");
    assert.equal(get(m, METRICS.archiveReadBytes, tp), 0, "nothing read from the archive yet");
    const d = (await b.describeTopic("cold")).partitions[0];
    assert.equal(d.archiveStartOffset, 0);
    assert.equal(d.archivedSegments, manifests.length);

    assert.equal(await readAll(b, "cold"), 200);
    m = await scrape(registry);
    const read = get(m, METRICS.archiveReadBytes, tp);
    // Each archived batch was served once (a read ends at a segment's end).
    assert.equal(read, archivedBytes, "every archived byte served once");
    await b.fetch("cold", 0, 0, { maxBytes: 1 });
    assert.ok(get(await scrape(registry), METRICS.archiveReadBytes, tp) > read, "a counter: it only grows");
  } finally {
    await b.close();
  }
});

test("a running compaction pass reports its progress (0..1), and none once it ended", async () => {
  using tmp = tempDir("sluice-cleaner-progress-");
  const config = { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "never" as const, flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1, cleanupPolicy: "compact" as const, minCompactionLagMs: 0, deleteRetentionMs: 86_400_000 };
  // 16 KiB/s: the pass reads and writes about 40 KiB, so it runs for a second or two.
  const log = await PartitionLog.open({ fs: new NodeFileSystem(), dir: tmp.dir, topic: "t", partition: 0, config, preallocate: "off", cleanerBudget: new IoBudget(16 * 1024) });
  try {
    for (let i = 0; i < 120; i++) await log.append([{ key: Buffer.from(`k${i % 5}`), value: Buffer.from("v".repeat(60)), valueKind: 0, timestamp: 1_000_000 + i, headers: [] }]);
    assert.equal(log.cleanerStats().passProgress, null, "no pass yet");
    const run = log.compact();
    const seen = await waitUntil(() => {
      const p = log.cleanerStats().passProgress;
      return p !== null && p > 0 && p < 1 ? p : null;
    }, "a pass part-way done");
    assert.ok(seen > 0 && seen < 1);
    // The budget's waits do not keep the process alive (unref'd timers): poll until it ends.
    await waitUntil(() => log.cleanerStats().passProgress === null, "the pass ended");
    const r = await run;
    assert.equal(r.passes, 1);
    const st = log.cleanerStats();
    assert.equal(st.passProgress, null);
    assert.equal(st.passes, 1);
    assert.ok(st.bytesReclaimed > 0);
  } finally {
    await log.close();
  }
});
