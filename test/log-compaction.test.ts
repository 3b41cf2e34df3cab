// SPDX-License-Identifier: Apache-2.0
/**
 * Key compaction (src/log/cleaner.ts), model-based: random keyed writes with tombstones into
 * tiny segments, compaction runs interleaved (with key maps small enough to force several
 * passes), reads from random positions. What is read must match the model (CMP-2..CMP-5):
 * offsets unchanged and increasing, every key's latest value retained, tombstones visible
 * while retained, a read from an offset compacted away starts at the next kept record, and a
 * reader that kept up with the writer saw every record.
 */
import { test } from "node:test";
import { readdirSync } from "node:fs";
import assert from "node:assert/strict";
import { NodeFileSystem } from "../src/log/io.js";
import { PartitionLog, type LogConfig } from "../src/log/partition-log.js";
import type { PreparedRecord, StoredRecord } from "../src/log/record-batch.js";
import { OFFSET_MAP_BYTES_PER_KEY } from "../src/log/offset-map.js";
import { prng, tempDir, waitUntil } from "../src/testing/helpers.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { openBroker } from "../src/broker/broker.js";

interface ModelRec {
  key: string;
  value: string | null;
  ts: number;
}

const T0 = 1_000_000;

function config(deleteRetentionMs: number): LogConfig {
  return { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "never", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1, cleanupPolicy: "compact", minCompactionLagMs: 0, deleteRetentionMs };
}

async function readAllFrom(log: PartitionLog, from: number): Promise<StoredRecord[]> {
  const out: StoredRecord[] = [];
  let off = from;
  while (off < log.highWatermark) {
    const r = await log.read(off, 300);
    out.push(...r.records);
    assert.ok(r.nextOffset > off, `read from ${off} made progress`);
    off = r.nextOffset;
  }
  return out;
}

/** Checks a read from `p` against the model; `retainTombstones` when deleteRetentionMs is huge. */
async function checkFrom(log: PartitionLog, model: ModelRec[], p: number, retainTombstones: boolean): Promise<StoredRecord[]> {
  const recs = await readAllFrom(log, p);
  let prev = p - 1;
  const present = new Set<number>();
  for (const r of recs) {
    assert.ok(r.offset > prev, `offsets increase from ${p}: ${r.offset} after ${prev}`);
    prev = r.offset;
    const m = model[r.offset];
    assert.equal(r.key?.toString(), m.key, `key at ${r.offset}`);
    assert.equal(r.value === null ? null : r.value.toString(), m.value, `value at ${r.offset}`);
    assert.equal(r.timestamp, m.ts);
    present.add(r.offset);
  }
  const latest = new Map<string, number>();
  model.forEach((m, o) => latest.set(m.key, o));
  for (const [k, o] of latest) {
    if (o < p) continue;
    if (model[o].value !== null || retainTombstones) assert.ok(present.has(o), `latest record of ${k} (offset ${o}) is readable from ${p}`);
  }
  const activeBase = log.describeSegments().at(-1)!.baseOffset;
  for (let o = Math.max(p, activeBase); o < model.length; o++) assert.ok(present.has(o), `record ${o} of the active segment is readable`);
  return recs;
}

/** After a completed compaction: below `sealedEnd` no key twice, no expired tombstone. */
async function checkCompacted(log: PartitionLog, sealedEnd: number, tombstonesExpired: boolean): Promise<void> {
  const seen = new Set<string>();
  for (const r of await readAllFrom(log, log.logStartOffset)) {
    if (r.offset >= sealedEnd) break;
    const k = r.key!.toString();
    assert.ok(!seen.has(k), `key ${k} appears once below ${sealedEnd} (again at ${r.offset})`);
    seen.add(k);
    if (tombstonesExpired) assert.notEqual(r.value, null, `expired tombstone at ${r.offset} was removed`);
  }
}

for (const [seed, retainTombstones] of [[1, true], [2, false], [3, true], [4, false]] as const) {
  test(`compaction model: random keys, tombstones, tiny segments and maps (seed ${seed}, tombstones ${retainTombstones ? "retained" : "expire"})`, async () => {
    using tmp = tempDir("sluice-compact-");
    const rnd = prng(seed);
    const fs = new NodeFileSystem();
    const cfg = config(retainTombstones ? 1e12 : 0);
    let log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
    const model: ModelRec[] = [];
    const tailSeen: number[] = [];
    let tail = 0;
    const keys = 6 + Math.floor(rnd() * 20);
    let compactions = 0;
    let seq = 0;
    try {
      for (let step = 0; step < 250; step++) {
        const n = 1 + Math.floor(rnd() * 4);
        const recs: PreparedRecord[] = [];
        for (let i = 0; i < n; i++) {
          const key = `k${Math.floor(rnd() * keys)}`;
          const value = rnd() < 0.15 ? null : `v${step}.${i}${"x".repeat(Math.floor(rnd() * 40))}`;
          const ts = T0 + model.length;
          model.push({ key, value, ts });
          recs.push({ key: Buffer.from(key), value: value === null ? null : Buffer.from(value), valueKind: 1, timestamp: ts, headers: null });
        }
        const idempotent = rnd() < 0.3;
        const r = await log.append(recs, idempotent ? { producerId: 7, producerEpoch: 0, baseSequence: seq } : undefined);
        if (idempotent) seq += n;
        assert.equal(r.baseOffset, model.length - n);
        // The reader that keeps up: everything since its position, at once.
        for (const rec of await readAllFrom(log, tail)) tailSeen.push(rec.offset);
        tail = log.highWatermark;
        if (rnd() < 0.08) {
          const sealedEnd = log.describeSegments().at(-1)!.baseOffset;
          const mapBytes = rnd() < 0.5 ? OFFSET_MAP_BYTES_PER_KEY * (1 + Math.floor(rnd() * 4)) : undefined;
          await log.compact(T0 + model.length, mapBytes);
          compactions++;
          await checkCompacted(log, sealedEnd, !retainTombstones);
        }
        if (rnd() < 0.15) {
          const p = log.logStartOffset + Math.floor(rnd() * (log.highWatermark - log.logStartOffset + 1));
          await checkFrom(log, model, p, retainTombstones);
        }
      }
      assert.deepEqual(tailSeen, model.map((_, o) => o), "a reader that kept up saw every record, in order");
      assert.ok(compactions > 5);
      const sealedEnd = log.describeSegments().at(-1)!.baseOffset;
      // Nothing dirty may be left since the last run (then no pass): either way all is compacted.
      await log.compact(T0 + model.length, OFFSET_MAP_BYTES_PER_KEY * 2);
      await checkCompacted(log, sealedEnd, !retainTombstones);
      const all = await checkFrom(log, model, 0, retainTombstones);
      assert.ok(all.length < model.length, "compaction removed records");
      assert.ok(log.cleanerStats().bytesReclaimed > 0);
      // Time lookups over the gaps: the first kept record at or after the time.
      for (let i = 0; i < 20; i++) {
        const ts = T0 + Math.floor(rnd() * model.length);
        const want = all.find((r) => r.timestamp >= ts)?.offset ?? log.highWatermark;
        assert.equal(await log.offsetForTimestamp(ts), want, `offsetForTimestamp(${ts})`);
      }
      // Reopened (indexes of compacted segments loaded or rebuilt), the same log.
      await log.close();
      log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
      assert.equal(log.highWatermark, model.length);
      assert.deepEqual((await checkFrom(log, model, 0, retainTombstones)).map((r) => r.offset), all.map((r) => r.offset));
      for (let i = 0; i < 10; i++) await checkFrom(log, model, Math.floor(rnd() * model.length), retainTombstones);
    } finally {
      await log.close();
    }
  });
}

test("a reader holding a segment keeps reading it while compaction replaces it", async () => {
  using tmp = tempDir("sluice-compact-");
  const fs = new NodeFileSystem();
  const log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: config(1e12), preallocate: "off" });
  try {
    for (let i = 0; i < 60; i++) await log.append([{ key: Buffer.from(`k${i % 3}`), value: Buffer.from(`v${i}`.padEnd(40, ".")), valueKind: 1, timestamp: T0 + i, headers: null }]);
    assert.ok(log.segmentCount > 2);
    // A read started before the swap, finishing after it, sees the old file whole.
    const reading = log.read(0, 1 << 20);
    const compacting = log.compact(T0 + 100);
    const before = await reading;
    await compacting;
    assert.equal(before.records[0].offset, 0);
    assert.ok(before.records.length >= 3);
    // Offset 0 was compacted away: reading from it goes on at the next kept record.
    const after = await readAllFrom(log, 0);
    const activeBase = log.describeSegments().at(-1)!.baseOffset;
    const sealed = after.filter((r) => r.offset < activeBase);
    assert.ok(sealed.length <= 3 && new Set(sealed.map((r) => r.key!.toString())).size === sealed.length, "one record per key in the sealed segments");
    assert.deepEqual(after.filter((r) => r.offset >= activeBase).map((r) => r.offset), Array.from({ length: 60 - activeBase }, (_, i) => activeBase + i));
    assert.ok(after[0].offset > 0);
  } finally {
    await log.close();
  }
});

test("the engine's background cleaner compacts compacted topics and reports it in describeTopic; other topics are untouched", async () => {
  using tmp = tempDir("sluice-compact-bg-");
  const engine = new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem(), cleanerIntervalMs: 10 });
  const b = await openBroker({ engine, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("plain", { segmentBytes: 1024 });
    await b.createTopic("table", { segmentBytes: 1024, cleanupPolicy: "compact" });
    for (let i = 0; i < 100; i++) {
      await b.publish("table", `v${i}`.padEnd(30, "."), { key: `k${i % 3}` });
      await b.publish("plain", `v${i}`.padEnd(30, "."), { key: `k${i % 3}` });
    }
    const p = await waitUntil(async () => {
      const d = (await b.describeTopic("table")).partitions[0];
      // A pass may have run while the records were still being published (every 10 ms): wait
      // for one that covers what is dirty now.
      return d.bytesReclaimed! > 0 && d.cleanerDirtyRatio! < 1 ? d : null;
    }, "the background cleaner compacted the topic");
    assert.equal(typeof p.lastCleanedAt, "number");
    assert.ok(p.cleanerDirtyRatio! < 1);
    const plain = (await b.describeTopic("plain")).partitions[0];
    assert.equal("bytesReclaimed" in plain, false, "a topic without the new config is described as before");
    const got: { offset: number; key: string; value: string }[] = [];
    let off = 0;
    while (off < p.highWatermark) {
      const r = await b.fetch("table", 0, off);
      for (const m of r.records) got.push({ offset: m.offset, key: String(m.key), value: String(m.value) });
      off = r.nextOffset;
    }
    assert.ok(got.length < 100);
    for (let k = 0; k < 3; k++) {
      const last = got.filter((g) => g.key === `k${k}`).at(-1)!;
      assert.equal(last.offset, 99 - ((99 - k) % 3), `latest of k${k}`);
      assert.equal(last.value, `v${last.offset}`.padEnd(30, "."));
    }
    let plainCount = 0;
    off = 0;
    while (off < 100) {
      const r = await b.fetch("plain", 0, off);
      plainCount += r.records.length;
      off = r.nextOffset;
    }
    assert.equal(plainCount, 100, "a delete-policy topic keeps every record");
  } finally {
    await b.close();
  }
});

test("closing a partition while it is being compacted stops the pass and leaves a whole log", async () => {
  using tmp = tempDir("sluice-compact-close-");
  const fs = new NodeFileSystem();
  const cfg = config(1e12);
  const model: ModelRec[] = [];
  let log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
  for (let i = 0; i < 200; i++) {
    const key = `k${i % 7}`;
    const value = `v${i}`.padEnd(30, "-");
    model.push({ key, value, ts: T0 + i });
    await log.append([{ key: Buffer.from(key), value: Buffer.from(value), valueKind: 1, timestamp: T0 + i, headers: null }]);
  }
  const compacting = log.compact(T0 + 1000);
  await log.close();
  await compacting; // resolves: a stop is not an error
  assert.deepEqual(readdirSync(tmp.dir).filter((n) => n.endsWith(".cleaned") || n.endsWith(".swap")), []);
  log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
  try {
    await checkFrom(log, model, 0, true);
    await log.compact(T0 + 1000);
    await checkCompacted(log, log.describeSegments().at(-1)!.baseOffset, false);
    await checkFrom(log, model, 0, true);
  } finally {
    await log.close();
  }
});

test("idempotent producer state rebuilt from compacted (sparse) batches: a retry of the last batch is a duplicate, the next sequence goes on", async () => {
  using tmp = tempDir("sluice-compact-");
  const fs = new NodeFileSystem();
  const cfg: LogConfig = { ...config(1e12), durability: "always" };
  let log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
  const producer = (seq: number) => ({ producerId: 9, producerEpoch: 0, baseSequence: seq });
  const batch = (i: number): PreparedRecord[] =>
    // Keys repeat across batches, and the last record of each batch repeats the next batch's
    // first key: compaction cuts records out of the middle and the end of batches.
    [0, 1, 2, 3].map((j) => ({ key: Buffer.from(`k${(i * 3 + j) % 7}`), value: Buffer.from(`v${i}.${j}`.padEnd(40, ".")), valueKind: 1, timestamp: T0 + i, headers: null }));
  let seq = 0;
  let last: PreparedRecord[] = [];
  try {
    for (let i = 0; i < 80; i++) {
      last = batch(i);
      await log.append(last, producer(seq));
      seq += last.length;
    }
    await log.compact(T0 + 1000);
    const sealedEnd = log.describeSegments().at(-1)!.baseOffset;
    assert.ok(sealedEnd > 0 && log.cleanerStats().bytesReclaimed > 0);
    await log.close();
    // Without the snapshot the state is rebuilt by replaying the batches (sparse ones included).
    if (readdirSync(tmp.dir).includes("producers.json")) await fs.unlink(`${tmp.dir}/producers.json`);
    log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config: cfg, preallocate: "off" });
    const hwm = log.highWatermark;
    const retry = await log.append(last, producer(seq - last.length));
    assert.equal(retry.duplicate, true, "the retry of the last batch is recognised");
    assert.equal(log.highWatermark, hwm, "nothing stored twice");
    const next = await log.append(batch(80), producer(seq));
    assert.equal(next.duplicate, false);
    assert.equal(next.baseOffset, hwm);
    await assert.rejects(log.append(batch(81), producer(seq + 100)), /sequence/i);
  } finally {
    await log.close();
  }
});
