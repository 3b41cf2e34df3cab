// SPDX-License-Identifier: Apache-2.0
/**
 * Contract tests for a StorageEngine (src/store/engine.ts). Every engine (the on-disk engine
 * today, a PostgreSQL engine later) must pass them: register with
 * `defineEngineContract("disk", async () => ({ engine, reopen, cleanup }))`.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { EncodedBatches, StorageEngine } from "../store/engine.js";
import { resolveTopicConfig } from "../store/topic-config.js";
import { decodeRecords, encodeBatch, stampBatch, verifyBatch, type PreparedRecord } from "../log/record-batch.js";
import { BrokerClosedError, InvalidBatchError, OffsetOutOfRangeError, ProducerFencedError, RecordTooLargeError, TopicExistsError, TopicNotFoundError, OutOfOrderSequenceError } from "../errors.js";

export interface EngineFixture {
  engine: StorageEngine;
  /** Closes and reopens the same storage (for durability checks). */
  reopen(): Promise<StorageEngine>;
  cleanup(): Promise<void>;
}

const rec = (v: string, ts = Date.now(), key: string | null = null): PreparedRecord => ({
  key: key === null ? null : Buffer.from(key),
  value: Buffer.from(v),
  valueKind: 1,
  timestamp: ts,
  headers: [["h", Buffer.from("x")]],
});

export function defineEngineContract(name: string, factory: () => Promise<EngineFixture>): void {
  const withEngine = (title: string, fn: (f: EngineFixture) => Promise<void>) =>
    test(`[engine ${name}] ${title}`, async () => {
      const f = await factory();
      try {
        await fn(f);
      } finally {
        await f.cleanup();
      }
    });
  // Registration order is report order: keep it.
  withEngine("topics: create, list, describe, delete; re-create is a new incarnation", topicIncarnations);
  withEngine("group offsets: the last resets are remembered, newest first, bounded and durable", resetHistory);
  withEngine("append/read: contiguous offsets, record fields, bounds, durability across reopen", appendAndRead);
  withEngine("readRaw and appendEncoded (the optional encoded capability): whole stored batches as bytes; client batches validated, stored as sent", encodedBatches);
  withEngine("waitFor resolves when data arrives and false on timeout", waitFor);
  withEngine("group offsets are durable and per topic incarnation", groupOffsets);
  withEngine("replay marks: a reset back sets one in the same write, a commit or reset reaching it clears it, durable across reopen", replayMarks);
  withEngine("idempotent producers: duplicates, sequence gaps, epoch fencing, across reopen", idempotentProducers);
  withEngine("a closed engine serves no reads (BrokerClosedError), raw or decoded", closedReads);
}

async function closedReads(f: EngineFixture): Promise<void> {
  const e = f.engine;
  await e.createTopic("t", resolveTopicConfig({}));
  await e.append("t", 0, [rec("a")]);
  assert.equal((await e.read("t", 0, 0, 1 << 20)).records.length, 1);
  await e.close();
  await assert.rejects(e.read("t", 0, 0, 1 << 20), BrokerClosedError);
  if (e.encoded) await assert.rejects(e.encoded.readRaw("t", 0, 0, 1 << 20), BrokerClosedError);
}

async function topicIncarnations(f: EngineFixture): Promise<void> {
  const e = f.engine;
  const t = await e.createTopic("a", resolveTopicConfig({ partitions: 2 }));
  await assert.rejects(e.createTopic("a", resolveTopicConfig({})), TopicExistsError);
  assert.deepEqual(await e.listTopics(), ["a"]);
  assert.equal((await e.describeTopic("a")).partitions.length, 2);
  await e.append("a", 0, [rec("old")]);
  await e.commitOffsets("g", "a", new Map([[0, 1]]));
  await e.deleteTopic("a");
  await assert.rejects(e.getTopic("a"), TopicNotFoundError);
  const t2 = await e.createTopic("a", resolveTopicConfig({ partitions: 2 }));
  assert.notEqual(t2.topicId, t.topicId);
  assert.equal((await e.offsets("a", 0)).highWatermark, 0, "no resurrected records");
  assert.equal((await e.getCommitted("g", "a")).size, 0, "no resurrected offsets");
}

async function appendAndRead(f: EngineFixture): Promise<void> {
  let e = f.engine;
  await e.createTopic("t", resolveTopicConfig({}));
  const r1 = await e.append("t", 0, [rec("a", 1000, "k"), rec("b", 2000)]);
  const r2 = await e.append("t", 0, [rec("c", 3000)]);
  assert.equal(r1.baseOffset, 0);
  assert.equal(r2.baseOffset, 2);
  assert.equal(r1.synced, true);
  const got = await e.read("t", 0, 1, 1 << 20);
  assert.deepEqual(got.records.map((r) => [r.offset, r.value?.toString(), r.timestamp]), [[1, "b", 2000], [2, "c", 3000]]);
  assert.equal(got.nextOffset, 3);
  await assert.rejects(e.read("t", 0, 4, 100), OffsetOutOfRangeError);
  assert.equal(await e.offsetForTimestamp("t", 0, 1500), 1);
  assert.equal(await e.offsetForTimestamp("t", 0, 9999), 3);
  e = await f.reopen();
  const all = await e.read("t", 0, 0, 1 << 20);
  assert.equal(all.records.length, 3);
  assert.equal(all.records[0].key?.toString(), "k");
  assert.equal(all.records[0].headers?.[0][0], "h");
}

async function encodedBatches(f: EngineFixture): Promise<void> {
  let e = f.engine;
  // Optional: an engine without it is served by the broker's fallbacks.
  if (!e.encoded) return;
  const enc0 = (x: StorageEngine): EncodedBatches => x.encoded!;
  await e.createTopic("t", resolveTopicConfig({ maxMessageBytes: 200 }));
  await e.append("t", 0, [rec("a", 1000), rec("b", 2000)]);
  const client = encodeBatch([rec("c", 3000), rec("d", 4000)]);
  stampBatch(client, 0);
  const enc = await enc0(e).appendEncoded("t", 0, Buffer.from(client));
  assert.deepEqual([enc.baseOffset, enc.count, enc.duplicate], [2, 2, false]);
  const big = encodeBatch([rec("x".repeat(300))]);
  stampBatch(big, 0);
  await assert.rejects(enc0(e).appendEncoded("t", 0, big), RecordTooLargeError);
  const bad = Buffer.from(client);
  bad[bad.length - 2] ^= 1;
  await assert.rejects(enc0(e).appendEncoded("t", 0, bad), InvalidBatchError);
  assert.equal((await e.offsets("t", 0)).highWatermark, 4, "refused batches store nothing");
  // Before and after a reopen. (The array literal `[e, (e = await f.reopen())]` closed the
  // first engine before its turn, so that turn read from a closed engine.)
  for (const again of [false, true]) {
    if (again) e = await f.reopen();
    const engine = e;
    // From offset 1: the first whole batch (offsets 0-1) comes back; records counts only 1..3.
    const raw = await enc0(engine).readRaw("t", 0, 1, 1 << 20);
    assert.equal(raw.nextOffset, 4);
    assert.equal(raw.records, 3);
    const seen: string[] = [];
    for (let pos = 0; pos < raw.data.length; ) {
      const h = verifyBatch(raw.data, pos, raw.data.length);
      for (const r of decodeRecords(raw.data, pos, h, 1)) seen.push(`${r.offset}:${r.value?.toString()}`);
      pos += h.length;
    }
    assert.deepEqual(seen, ["1:b", "2:c", "3:d"]);
    // maxRecords stops after the batch that reaches it.
    assert.equal((await enc0(engine).readRaw("t", 0, 0, 1 << 20, 1)).nextOffset, 2);
    assert.equal((await enc0(engine).readRaw("t", 0, 4, 1 << 20)).records, 0);
  }
}

async function waitFor(f: EngineFixture): Promise<void> {
  const e = f.engine;
  await e.createTopic("t", resolveTopicConfig({}));
  assert.equal(await e.waitFor("t", 0, 0, 10), false);
  const w = e.waitFor("t", 0, 0, 10_000);
  await e.append("t", 0, [rec("x")]);
  assert.equal(await w, true);
}

async function groupOffsets(f: EngineFixture): Promise<void> {
  let e = f.engine;
  await e.createTopic("t", resolveTopicConfig({ partitions: 3 }));
  for (const p of [0, 2]) await e.append("t", p, Array.from({ length: 8 }, (_, i) => rec(String(i))));
  // META-3: a committed position never lies beyond what the log holds.
  await assert.rejects(e.commitOffsets("g", "t", new Map([[0, 9]])), OffsetOutOfRangeError);
  await e.commitOffsets("g", "t", new Map([[0, 5], [2, 7]]));
  e = await f.reopen();
  const c = await e.getCommitted("g", "t");
  assert.equal(c.get(0)?.offset, 5);
  assert.equal(c.get(2)?.offset, 7);
  assert.equal(c.has(1), false);
}

/** Per partition: [offset, replayUntil] (null: no mark). */
async function marks(e: StorageEngine, group: string, topic: string): Promise<Record<number, [number, number | null]>> {
  const out: Record<number, [number, number | null]> = {};
  for (const [p, c] of await e.getCommitted(group, topic)) out[p] = [c.offset, c.replayUntil ?? null];
  return out;
}

async function replayMarks(f: EngineFixture): Promise<void> {
  let e = f.engine;
  await e.createTopic("t", resolveTopicConfig({ partitions: 3 }));
  for (const p of [0, 1, 2]) await e.append("t", p, Array.from({ length: 20 }, (_, i) => rec(String(i))));
  await e.commitOffsets("g", "t", new Map([[0, 10], [1, 10]]));
  // META-4: back -> mark at the previous offset; forward or unmoved -> none; a partition
  // without an offset gets none; partitions not named keep theirs.
  await e.resetOffsets("g", "t", new Map([[0, 3], [1, 12], [2, 0]]));
  assert.deepEqual(await marks(e, "g", "t"), { 0: [3, 10], 1: [12, null], 2: [0, null] });
  await assert.rejects(e.resetOffsets("g", "t", new Map([[0, 21]])), OffsetOutOfRangeError);
  e = await f.reopen();
  assert.deepEqual(await marks(e, "g", "t"), { 0: [3, 10], 1: [12, null], 2: [0, null] }, "the mark is as durable as the offset");
  // Commits below the mark keep it; resets keep the higher of the mark and the offset.
  await e.commitOffsets("g", "t", new Map([[0, 8]]));
  assert.deepEqual((await marks(e, "g", "t"))[0], [8, 10]);
  await e.resetOffsets("g", "t", new Map([[0, 5], [1, 4]]));
  assert.deepEqual(await marks(e, "g", "t"), { 0: [5, 10], 1: [4, 12], 2: [0, null] });
  await e.resetOffsets("g", "t", new Map([[0, 7]]));
  assert.deepEqual((await marks(e, "g", "t"))[0], [7, 10], "a reset forward below the mark keeps it");
  // A commit reaching the mark clears it (durably); so does a reset reaching it.
  await e.commitOffsets("g", "t", new Map([[0, 10], [1, 11]]));
  assert.deepEqual(await marks(e, "g", "t"), { 0: [10, null], 1: [11, 12], 2: [0, null] });
  await e.resetOffsets("g", "t", new Map([[1, 15]]));
  e = await f.reopen();
  assert.deepEqual(await marks(e, "g", "t"), { 0: [10, null], 1: [15, null], 2: [0, null] });
  // Per group and per topic incarnation.
  assert.deepEqual(await marks(e, "other", "t"), {});
  await e.resetOffsets("g", "t", new Map([[2, 0]]));
  await e.commitOffsets("g", "t", new Map([[2, 6]]));
  await e.resetOffsets("g", "t", new Map([[2, 1]]));
  await e.deleteTopic("t");
  await e.createTopic("t", resolveTopicConfig({ partitions: 3 }));
  assert.deepEqual(await marks(e, "g", "t"), {}, "no resurrected marks");
  if (e.recentResets) assert.deepEqual(await e.recentResets("g", "t"), [], "no resurrected reset history");
}

/** Resets are remembered (newest first, bounded, durable, through a compaction of the offsets log); commits are not resets. */
async function resetHistory(f: EngineFixture): Promise<void> {
  let e = f.engine;
  if (!e.recentResets) return; // optional capability
  await e.createTopic("t", resolveTopicConfig({ partitions: 2 }));
  for (const p of [0, 1]) await e.append("t", p, Array.from({ length: 20 }, (_, i) => rec(String(i))));
  await e.commitOffsets("g", "t", new Map([[0, 10]]));
  const before = Date.now();
  await e.resetOffsets("g", "t", new Map([[0, 2], [1, 5]]));
  await e.commitOffsets("g", "t", new Map([[0, 6]]));
  await e.resetOffsets("g", "t", new Map([[0, 20]]));
  const want = [
    { partitions: [{ partition: 0, from: 6, to: 20 }] },
    { partitions: [{ partition: 0, from: 10, to: 2 }, { partition: 1, from: null, to: 5 }] },
  ];
  const strip = (rs: { at: number; partitions: unknown[] }[]) => rs.map((r) => ({ partitions: r.partitions }));
  const got = await e.recentResets("g", "t");
  assert.deepEqual(strip(got), want, "newest first, each partition's offset before and after");
  assert.ok(got.every((r) => r.at >= before - 1000 && r.at <= Date.now() + 1000), "stamped with the time of the reset");
  e = await f.reopen();
  assert.deepEqual(strip(await e.recentResets!("g", "t")), want, "durable");
  for (let i = 0; i < 12; i++) await e.resetOffsets("g", "t", new Map([[1, i]]));
  const last = await e.recentResets!("g", "t");
  assert.equal(last.length, 10, "bounded");
  assert.deepEqual(last[0].partitions, [{ partition: 1, from: 10, to: 11 }]);
  assert.deepEqual(await e.recentResets!("other", "t"), []);
}

async function idempotentProducers(f: EngineFixture): Promise<void> {
  let e = f.engine;
  await e.createTopic("t", resolveTopicConfig({}));
  const p = await e.allocateProducer();
  const a = await e.append("t", 0, [rec("1"), rec("2")], { ...p, baseSequence: 0 });
  const dup = await e.append("t", 0, [rec("1"), rec("2")], { ...p, baseSequence: 0 });
  assert.equal(dup.duplicate, true);
  assert.equal(dup.baseOffset, a.baseOffset);
  await assert.rejects(e.append("t", 0, [rec("x")], { ...p, baseSequence: 5 }), OutOfOrderSequenceError);
  // Pipelined batches of one producer (sent before the earlier ones are answered) are
  // checked and stored in arrival order: none is refused as out of sequence.
  const piped = await Promise.all([2, 3, 4].map((seq) => e.append("t", 0, [rec(`p${seq}`)], { ...p, baseSequence: seq })));
  assert.deepEqual(piped.map((r) => [r.baseOffset, r.duplicate]), [[a.baseOffset + 2, false], [a.baseOffset + 3, false], [a.baseOffset + 4, false]]);
  e = await f.reopen();
  const again = await e.append("t", 0, [rec("1"), rec("2")], { ...p, baseSequence: 0 });
  assert.equal(again.duplicate, true);
  const bumped = await e.allocateProducer(p.producerId);
  assert.equal(bumped.producerEpoch, p.producerEpoch + 1);
  await assert.rejects(e.append("t", 0, [rec("3")], { ...p, baseSequence: 5 }), ProducerFencedError);
  assert.equal((await e.offsets("t", 0)).highWatermark, 5);
}
