// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's checkpoint (CMP-6): after a restart a compacted partition is not dirty again,
 * and a damaged or too-high checkpoint costs only compaction work, never a latest value.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { CLEANER_CHECKPOINT_FILE } from "../src/log/cleaner.js";
import { NodeFileSystem } from "../src/log/io.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";

async function open(dir: string): Promise<{ broker: Broker; engine: DiskEngine }> {
  const engine = new DiskEngine({ dataDir: dir, fs: new NodeFileSystem(), cleanerIntervalMs: 0 });
  return { engine, broker: await openBroker({ engine, retentionCheckIntervalMs: 0 }) };
}

async function latest(b: Broker): Promise<Map<string, unknown>> {
  const p = (await b.describeTopic("t")).partitions[0];
  const m = new Map<string, unknown>();
  for (let off = p.logStartOffset; off < p.highWatermark; ) {
    const r = await b.fetch("t", 0, off);
    for (const rec of r.records) m.set(String(rec.key), rec.value);
    off = r.nextOffset;
  }
  return m;
}

async function write(b: Broker, round: number): Promise<void> {
  for (let i = 0; i < 60; i++) await b.publishBatch("t", Array.from({ length: 5 }, (_, j) => ({ key: `k${(i * 5 + j) % 13}`, value: { round, i, j }, partition: 0 })));
}

test("cleaner checkpoint: a restart keeps the partition clean; a damaged or inflated checkpoint loses no latest value", async () => {
  using tmp = tempDir("sluice-cleaner-ckpt-");
  let { broker, engine } = await open(tmp.dir);
  await broker.createTopic("t", { segmentBytes: 1024, cleanupPolicy: "compact" });
  await write(broker, 1);
  await engine.compact();
  const want = await latest(broker);
  assert.equal((await broker.describeTopic("t")).partitions[0].cleanerDirtyRatio, 0);
  await broker.close();

  ({ broker, engine } = await open(tmp.dir));
  const p = (await broker.describeTopic("t")).partitions[0];
  assert.equal(p.cleanerDirtyRatio, 0, "clean after a restart");
  await engine.compact();
  assert.equal((await broker.describeTopic("t")).partitions[0].cleanerPasses ?? 0, 0, "nothing to do: no pass");
  assert.deepEqual(await latest(broker), want);
  await broker.close();

  // A damaged checkpoint: everything is dirty again, and a pass still keeps every latest value.
  const ckpt = join(tmp.dir, "topics", "t", "0", CLEANER_CHECKPOINT_FILE);
  writeFileSync(ckpt, "{not json");
  ({ broker, engine } = await open(tmp.dir));
  assert.equal((await broker.describeTopic("t")).partitions[0].cleanerDirtyRatio, 1);
  await write(broker, 2);
  await engine.compact();
  const want2 = await latest(broker);
  assert.equal(want2.size, 13);
  for (const v of want2.values()) assert.equal((v as { round: number }).round, 2);
  await broker.close();

  // A checkpoint claiming more than the log holds is clamped to the sealed log.
  writeFileSync(ckpt, JSON.stringify({ version: 1, firstDirty: 1e12 }));
  ({ broker, engine } = await open(tmp.dir));
  await write(broker, 3);
  await engine.compact();
  const want3 = await latest(broker);
  for (const v of want3.values()) assert.equal((v as { round: number }).round, 3);
  assert.ok(((await broker.describeTopic("t")).partitions[0].bytesReclaimed ?? 0) > 0, "the new records were compacted");
  await broker.close();
});
