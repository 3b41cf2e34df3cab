// SPDX-License-Identifier: Apache-2.0
/**
 * Producer state never claims more than the log holds (PROD-1), the partition is fenced
 * before any await when an append fails (LOG-11), and the handle cache has one owner.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { openBroker, StorageError, OutOfOrderSequenceError, type EmbeddedBroker } from "../src/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir } from "../src/testing/helpers.js";
import { PartitionLog } from "../src/log/partition-log.js";
import { NodeFileSystem, type FileHandle, type OpenMode } from "../src/log/io.js";
import type { PreparedRecord } from "../src/log/record-batch.js";

const SEG = "00000000000000000010.log";

function records(from: number, n: number): { value: string; partition: number }[] {
  return Array.from({ length: n }, (_, i) => ({ value: `record-${from + i}-`.padEnd(1000, "x"), partition: 0 }));
}

async function valueAt(b: EmbeddedBroker, topic: string, offset: number): Promise<string> {
  const r = await b.fetch(topic, 0, offset, { maxBytes: 4096 });
  assert.equal(r.records[0]?.offset, offset);
  return String(r.records[0].value).slice(0, 16);
}

test("a failed write right after a segment roll leaves no phantom producer state: after a crash the next batch is refused and the retry is stored", async () => {
  using tmp = tempDir("sluice-phantom-");
  const dir = tmp.dir;
  const fs = new FaultyFileSystem();
  const b = await openBroker({ dataDir: dir, fs });
  await b.createTopic("t", { partitions: 1, segmentBytes: 16384 });
  const { producerId, producerEpoch } = await b.initProducer();
  const first = await b.publishBatch("t", records(0, 10), { producerId, producerEpoch, baseSequence: 0 });
  assert.deepEqual(first.map((r) => r.offset), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  // The batch at sequence 10 rolls to a new segment at offset 10; its write there fails.
  fs.failNext("write", "EIO", { pathIncludes: SEG });
  await assert.rejects(b.publishBatch("t", records(10, 10), { producerId, producerEpoch, baseSequence: 10 }), StorageError);
  // Whatever producers.json says now must describe only what the log holds (offsets 0..9).
  const snap = JSON.parse(readFileSync(join(dir, "topics", "t", "0", "producers.json"), "utf8")) as { offset: number; producers: [number, { batches: { baseOffset: number; count: number }[] }][] };
  for (const [, e] of snap.producers) for (const bt of e.batches) assert.ok(bt.baseOffset + bt.count <= snap.offset, `snapshot at ${snap.offset} names batch at ${bt.baseOffset}`);
  assert.ok(snap.offset <= 10);

  // A crash now: copy the data dir as the page cache holds it, open the copy.
  using copyTmp = tempDir("sluice-phantom-copy-");
  const copy = copyTmp.dir;
  cpSync(dir, copy, { recursive: true });
  const c = await openBroker({ dataDir: copy });
  try {
    // Sequence 20 would skip the batch that was never stored: refused, nothing stored.
    await assert.rejects(c.publishBatch("t", records(20, 10), { producerId, producerEpoch, baseSequence: 20 }), OutOfOrderSequenceError);
    assert.equal((await c.describeTopic("t")).partitions[0].highWatermark, 10);
    // The retry of sequence 10 is new to the log: stored at 10, not answered as a duplicate.
    const retry = await c.publishBatch("t", records(10, 10), { producerId, producerEpoch, baseSequence: 10 });
    assert.equal(retry[0].offset, 10);
    assert.equal(retry[0].duplicate, false);
    assert.equal(await valueAt(c, "t", 10), "record-10-xxxxxx");
    // And only now is sequence 20 next.
    const next = await c.publishBatch("t", records(20, 10), { producerId, producerEpoch, baseSequence: 20 });
    assert.equal(next[0].offset, 20);
    assert.equal(await valueAt(c, "t", 20), "record-20-xxxxxx");
  } finally {
    await c.close();
    await b.close();
  }
});

test("a retry of a batch still being written waits for it: stored -> its offsets, failed -> its error, never another batch's offsets", async () => {
  using tmp = tempDir("sluice-inflight-dup-");
  const dir = tmp.dir;
  const fs = new FaultyFileSystem();
  const b = await openBroker({ dataDir: dir, fs });
  try {
    await b.createTopic("t", { partitions: 1 });
    const { producerId, producerEpoch } = await b.initProducer();
    // Original and retry in the same tick: the retry finds the original unpublished.
    const [orig, dup] = await Promise.all([
      b.publishBatch("t", records(0, 3), { producerId, producerEpoch, baseSequence: 0 }),
      b.publishBatch("t", records(0, 3), { producerId, producerEpoch, baseSequence: 0 }),
    ]);
    assert.equal(orig[0].offset, 0);
    assert.equal(orig[0].duplicate, false);
    assert.equal(dup[0].offset, 0);
    assert.equal(dup[0].duplicate, true);
    // Now the original fails (a full disk: the partition takes appends again afterwards).
    fs.failNext("write", "ENOSPC");
    const r = await Promise.allSettled([
      b.publishBatch("t", records(3, 3), { producerId, producerEpoch, baseSequence: 3 }),
      b.publishBatch("t", records(3, 3), { producerId, producerEpoch, baseSequence: 3 }),
    ]);
    assert.equal(r[0].status, "rejected");
    assert.equal(r[1].status, "rejected", "the retry shares the original's failure");
    // Other appends fill offsets 3..; the failed sequence must not be answered with them.
    await b.publishBatch("t", [{ value: "other", partition: 0 }]);
    const again = await b.publishBatch("t", records(3, 3), { producerId, producerEpoch, baseSequence: 3 });
    assert.equal(again[0].duplicate, false);
    assert.equal(again[0].offset, 4);
    assert.equal(await valueAt(b, "t", 4), "record-3-xxxxxxx");
  } finally {
    await b.close();
  }
});

const rec = (i: number): PreparedRecord => ({ key: null, value: Buffer.from(`v${i}`.padEnd(200, ".")), valueKind: 0, timestamp: Date.now(), headers: null });

test("concurrent reads of many sealed segments never race on a handle (more sealed segments than open handles)", async () => {
  using tmp = tempDir("sluice-handles-");
  const dir = tmp.dir;
  const log = await PartitionLog.open({
    fs: new NodeFileSystem(),
    dir,
    topic: "t",
    partition: 0,
    config: { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 },
  });
  try {
    for (let i = 0; i < 200; i++) await log.append([rec(i)]);
    assert.ok(log.segmentCount > 20, `segments: ${log.segmentCount}`);
    // Many readers at once over every sealed segment, interleaved with appends that roll.
    const reads: Promise<unknown>[] = [];
    for (let round = 0; round < 5; round++) {
      for (let off = 0; off < 200; off += 3) reads.push(log.read(off, 256).then((r) => assert.equal(r.records[0].offset, off)));
      reads.push(log.append([rec(1000 + round)]));
    }
    await Promise.all(reads);
  } finally {
    await log.close();
  }
});

/** Closing a handle takes a while (a busy thread pool), so two evictions can interleave. */
class SlowCloseFs extends NodeFileSystem {
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await super.open(path, mode);
    const close = h.close.bind(h);
    h.close = async () => {
      await new Promise((r) => setTimeout(r, 5));
      await close();
    };
    return h;
  }
}

test("two evictions of idle segment handles at once never close one handle twice (handle race)", async () => {
  using tmp = tempDir("sluice-handle-race-");
  const log = await PartitionLog.open({
    fs: new SlowCloseFs(),
    dir: tmp.dir,
    topic: "t",
    partition: 0,
    config: { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 },
  });
  try {
    for (let i = 0; i < 120; i++) await log.append([rec(i)]);
    const segs = log.describeSegments().filter((s) => s.sealed);
    assert.ok(segs.length >= 14, `sealed segments: ${segs.length}`);
    for (let round = 0; round < 3; round++) {
      // Leave many idle handles open: concurrent readers of 10 segments, all done.
      await Promise.all(segs.slice(0, 10).map((s) => log.read(s.baseOffset, 256)));
      // Two new readers at once: each open is followed by an eviction of several handles.
      const [a, b] = await Promise.all([log.read(segs[11 + (round % 2)].baseOffset, 256), log.read(segs[13].baseOffset, 256)]);
      assert.equal(a.records[0].offset, segs[11 + (round % 2)].baseOffset);
      assert.equal(b.records[0].offset, segs[13].baseOffset);
    }
    // The partition still takes appends (a failed eviction used to fault a roll).
    const r = await log.append([rec(9999)]);
    assert.equal(r.baseOffset, 120);
  } finally {
    await log.close();
  }
});

test("a new partition's first segment is durable in its directory before its first record is acknowledged (FS-2)", async () => {
  using tmp = tempDir("sluice-first-seg-");
  const fs = new FaultyFileSystem({ crashModel: { scratchDir: join(tmp.dir, "scratch") } });
  const dataDir = join(tmp.dir, "data");
  const b = await openBroker({ dataDir, fs, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: 1 });
  const r = await b.publish("t", "acknowledged", { partition: 0 });
  assert.equal(r.offset, 0);
  // Power loss: every directory entry not fsynced and every byte not fdatasynced is lost.
  await fs.powerLoss({ mode: "drop", seed: 0 });
  const b2 = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    assert.deepEqual((await b2.fetch("t", 0, 0)).records.map((x) => x.value), ["acknowledged"]);
  } finally {
    await b2.close();
  }
});
