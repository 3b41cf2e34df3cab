// SPDX-License-Identifier: Apache-2.0
/**
 * The embedded broker's publish accumulator (src/broker/publish-accumulator.ts): publish()
 * calls made while their partition's appends are in flight share the next append; a lone
 * publish goes to the engine at once; per-record validation (RecordTooLargeError at the exact
 * recordSize() boundary) fails only its record; per-key order holds across publish() and
 * publishBatch(); close() answers every accepted publish.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { MAX_APPENDS_IN_FLIGHT, MIN_SPLIT_RECORDS } from "../src/broker/publish-accumulator.js";
import { RecordTooLargeError, TopicNotFoundError, ValidationError } from "../src/errors.js";
import { NodeFileSystem } from "../src/log/io.js";
import { recordSize } from "../src/log/record-batch.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { CountingEngine } from "../src/testing/counting-engine.js";
import { tempDir } from "../src/testing/helpers.js";
import type { PublishReceipt } from "../src/types.js";

async function env(): Promise<{ broker: EmbeddedBroker; engine: CountingEngine; [Symbol.asyncDispose](): Promise<void> }> {
  const tmp = tempDir("sluice-acc-");
  const engine = new CountingEngine(new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem() }));
  const broker = await openBroker({ engine, retentionCheckIntervalMs: 0 });
  return {
    broker,
    engine,
    async [Symbol.asyncDispose]() {
      await broker.close();
      tmp.cleanup();
    },
  };
}

const appends = (e: CountingEngine): number => e.calls.get("append") ?? 0;

test("publish(): calls made while appends are in flight share appends; receipts are per record, in order", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 2 });
  await b.publish("t", "warm-up", { partition: 0 });
  const before = appends(e.engine);
  const n = 2000;
  const rs = await Promise.all(Array.from({ length: n }, (_, i) => b.publish("t", `v${i}`, { partition: i % 2 })));
  const used = appends(e.engine) - before;
  assert.ok(used <= 2 * MAX_APPENDS_IN_FLIGHT + 10, `${n} publishes took ${used} appends`);
  const next = [1, 0];
  rs.forEach((r, i) => {
    assert.equal(r.partition, i % 2);
    assert.equal(r.offset, next[r.partition]++, `record ${i}: offsets follow call order`);
    assert.equal(r.synced, true);
    assert.equal(r.duplicate, false);
  });
  const got = await b.fetch("t", 1, 0, { maxBytes: 1 << 20 });
  assert.deepEqual(
    got.records.slice(0, 5).map((x) => x.value),
    ["v1", "v3", "v5", "v7", "v9"],
  );
});

test("publish(): a burst with nothing in flight goes as two appends (the second a turn later), in call order; a small one as one", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  await b.publish("t", "warm-up");
  let before = appends(e.engine);
  const n = 4 * MIN_SPLIT_RECORDS;
  const burst = Array.from({ length: n }, (_, i) => b.publish("t", { i }));
  await Promise.resolve();
  // Half at once; the rest waits for the next turn (the first half's write is under way).
  assert.equal(appends(e.engine) - before, 1);
  await new Promise((r) => setImmediate(r));
  assert.equal(appends(e.engine) - before, 2);
  const rs = await Promise.all(burst);
  rs.forEach((r, i) => assert.equal(r.offset, 1 + i, `record ${i}: offsets follow call order`));
  const got = await b.fetch("t", 0, 1, { maxBytes: 1 << 20 });
  assert.deepEqual(
    got.records.map((x) => (x.value as { i: number }).i),
    Array.from({ length: n }, (_, i) => i),
  );
  before = appends(e.engine);
  await Promise.all(Array.from({ length: 2 * MIN_SPLIT_RECORDS - 1 }, (_, i) => b.publish("t", `s${i}`)));
  assert.equal(appends(e.engine) - before, 1, "fewer than 2 x MIN_SPLIT_RECORDS: one append");
});

test("publish(): a lone publish reaches the engine before the event loop turns (no linger)", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  await b.publish("t", "first");
  const before = appends(e.engine);
  const p = b.publish("t", "lone");
  let turned = false;
  setImmediate(() => (turned = true));
  // Only microtasks run in between.
  for (let i = 0; i < 10 && appends(e.engine) === before; i++) await Promise.resolve();
  assert.equal(turned, false);
  assert.equal(appends(e.engine), before + 1, "appended within the same turn");
  assert.equal((await p).offset, 1);
});

test("publish(): an oversized record fails alone at the exact recordSize() boundary; its batch-mates are stored", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { maxMessageBytes: 1024 });
  // recordSize of a 1017-byte value without key or headers is exactly 1024.
  const exact = Buffer.alloc(1017, 1);
  assert.equal(recordSize({ key: null, value: exact, valueKind: 0, timestamp: 0, headers: null }), 1024);
  const calls = [
    b.publish("t", "a"),
    b.publish("t", Buffer.alloc(1018)),
    b.publish("t", exact),
    b.publish("t", "b", { timestamp: -1 }),
    b.publish("t", "c", { timestamp: 1 }),
  ];
  const out = await Promise.allSettled(calls);
  assert.equal(out[0].status, "fulfilled");
  assert.equal(out[2].status, "fulfilled");
  assert.equal(out[4].status, "fulfilled");
  assert.ok(out[1].status === "rejected" && out[1].reason instanceof RecordTooLargeError);
  const tooLarge = (out[1] as PromiseRejectedResult).reason as RecordTooLargeError;
  assert.equal(tooLarge.sizeBytes, 1025);
  assert.equal(tooLarge.maxBytes, 1024);
  assert.ok(out[3].status === "rejected" && out[3].reason instanceof ValidationError);
  const offsets = [out[0], out[2], out[4]].map((r) => (r as PromiseFulfilledResult<PublishReceipt>).value.offset);
  assert.deepEqual(offsets, [0, 1, 2]);
  const got = await b.fetch("t", 0, 0);
  assert.deepEqual(got.records.map((r) => r.offset), [0, 1, 2]);
  assert.equal(got.records[2].timestamp, 1);
});

test("publish() and publishBatch() of one key keep call order, idempotent batches included", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 3 });
  const { producerId, producerEpoch } = await b.initProducer();
  const calls: Promise<PublishReceipt | PublishReceipt[]>[] = [];
  const expect: string[] = [];
  let seq = 0;
  for (let round = 0; round < 50; round++) {
    for (let i = 0; i < 5; i++) {
      calls.push(b.publish("t", `p${round}.${i}`, { key: "k" }));
      expect.push(`p${round}.${i}`);
    }
    calls.push(b.publishBatch("t", [{ key: "k", value: `b${round}.0` }, { key: "k", value: `b${round}.1` }]));
    expect.push(`b${round}.0`, `b${round}.1`);
    if (round % 10 === 0) {
      calls.push(b.publishBatch("t", [{ key: "k", value: `i${round}` }], { producerId, producerEpoch, baseSequence: seq++ }));
      expect.push(`i${round}`);
    }
  }
  const rs = (await Promise.all(calls)).flat();
  const p = rs[0].partition;
  assert.ok(rs.every((r) => r.partition === p));
  assert.deepEqual(
    rs.map((r) => r.offset),
    rs.map((_, i) => i),
    "offsets in call order",
  );
  const got = await b.fetch("t", p, 0, { maxBytes: 1 << 20 });
  assert.deepEqual(
    got.records.map((r) => r.value),
    expect,
  );
  // A retry of the first idempotent batch returns its original offset.
  const again = await b.publishBatch("t", [{ key: "k", value: "i0" }], { producerId, producerEpoch, baseSequence: 0 });
  assert.equal(again[0].duplicate, true);
  assert.equal(again[0].offset, expect.indexOf("i0"));
});

test("publish(): close() answers every publish accepted before it; later ones fail; a deleted topic is looked up again", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  const pending = Promise.allSettled(Array.from({ length: 500 }, (_, i) => b.publish("t", i)));
  await b.deleteTopic("t").catch(() => {});
  // Publishes accepted before the delete either landed or failed with TopicNotFoundError.
  for (const r of await pending) if (r.status === "rejected") assert.ok(r.reason instanceof TopicNotFoundError, String(r.reason));
  await assert.rejects(b.publish("t", "gone"), TopicNotFoundError);
  await b.createTopic("t", { partitions: 2 });
  const r = await b.publish("t", "again", { partition: 1 });
  assert.deepEqual([r.partition, r.offset], [1, 0]);
  const accepted = Promise.allSettled(Array.from({ length: 300 }, (_, i) => b.publish("t", i, { partition: 0 })));
  const closing = b.close();
  const outcome = await accepted;
  await closing;
  assert.ok(
    outcome.every((o) => o.status === "fulfilled"),
    "accepted publishes are appended before the engine closes",
  );
  await assert.rejects(b.publish("t", "late"));
});
