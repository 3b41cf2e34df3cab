// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, producing and fetching: value kinds, key partitioning, batches,
 * size limits, idempotent producing, fetch bounds and long polls, lookup by time. Registered
 * by `defineConformanceSuite` (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { BrokerError, OffsetOutOfRangeError, ProducerFencedError, RecordTooLargeError, ValidationError } from "../errors.js";
import { partitionForKey } from "../streams/murmur2.js";
import type { Broker } from "../types.js";
import { readAll, uniq, type DefineTest } from "./conformance-helpers.js";

export function produceTests(t: DefineTest): void {
  t("values keep their kind: bytes, string, JSON, null; keys, headers and timestamps round-trip", valueKinds);
  t("a key picks the partition with Kafka's murmur2; receipts carry partition and offset", keyPartitioning);
  t("publishBatch returns one receipt per record in order; explicit partitions are honoured", publishBatchReceipts);
  t("a record over maxMessageBytes fails with RecordTooLargeError and nothing of it is stored", recordTooLarge);
  t("concurrent publish() calls: receipts in call order per key; an invalid or oversized record fails alone", concurrentPublishes);
  t("maxMessageBytes is measured by recordSize(): a record of exactly the limit is stored whatever its batch-mates' timestamps", exactRecordSize);
  t("idempotent producing: a retried batch returns the original offsets with duplicate=true", idempotentProducing);
  t("fetch honours maxBytes (at least one record), nextOffset and offsets out of range", fetchBounds);
  t("fetch long-polls: a waiting fetch returns as soon as a record arrives", fetchLongPoll);
  t("offsetForTimestamp finds the first record at or after a time", offsetForTimestamp);
}

async function valueKinds(b: Broker): Promise<void> {
  const name = uniq("kinds");
  await b.createTopic(name);
  const ts = 1_700_000_000_123;
  const inputs: unknown[] = [Buffer.from([0, 1, 2, 255]), "héllo ✓", { a: [1, "two", null], b: { c: true } }, 42, true, null, ""];
  for (const v of inputs) await b.publish(name, v as never, { key: "k", headers: { h1: "v1", h2: Buffer.from([7, 8]) }, timestamp: ts });
  const r = await b.fetch(name, 0, 0);
  assert.equal(r.records.length, inputs.length);
  r.records.forEach((rec, i) => {
    const want = inputs[i];
    if (want instanceof Uint8Array) {
      assert.ok(rec.value instanceof Uint8Array, "bytes come back as Uint8Array");
      assert.deepEqual(Buffer.from(rec.value as Uint8Array), Buffer.from(want));
    } else assert.deepEqual(rec.value, want);
    assert.equal(rec.topic, name);
    assert.equal(rec.partition, 0);
    assert.equal(rec.offset, i);
    assert.equal(rec.timestamp, ts);
    assert.deepEqual(Buffer.from(rec.key!), Buffer.from("k"));
    assert.deepEqual(Buffer.from(rec.headers.h1), Buffer.from("v1"));
    assert.deepEqual(Buffer.from(rec.headers.h2), Buffer.from([7, 8]));
  });
}

async function keyPartitioning(b: Broker): Promise<void> {
  const name = uniq("keys");
  await b.createTopic(name, { partitions: 6 });
  const next = new Map<number, number>();
  for (let i = 0; i < 60; i++) {
    const key = `customer-${i % 12}`;
    const r = await b.publish(name, i, { key });
    assert.equal(r.partition, partitionForKey(Buffer.from(key), 6));
    assert.equal(r.offset, next.get(r.partition) ?? 0, "offsets are contiguous per partition");
    assert.equal(r.topic, name);
    assert.equal(r.duplicate, false);
    assert.equal(r.synced, true, "durability always acknowledges after fsync");
    next.set(r.partition, r.offset + 1);
  }
}

async function publishBatchReceipts(b: Broker): Promise<void> {
  const name = uniq("batch");
  await b.createTopic(name, { partitions: 3 });
  const recs = Array.from({ length: 30 }, (_, i) => ({ value: `v${i}`, partition: i % 3 }));
  const receipts = await b.publishBatch(name, recs);
  assert.equal(receipts.length, 30);
  receipts.forEach((r, i) => {
    assert.equal(r.partition, i % 3);
    assert.equal(r.offset, Math.floor(i / 3));
  });
  const all = await readAll(b, name);
  assert.deepEqual(all.get(1), Array.from({ length: 10 }, (_, k) => `v${k * 3 + 1}`));
  await assert.rejects(b.publishBatch(name, []), ValidationError);
  await assert.rejects(b.publish(name, "x", { partition: 3 }), (e: unknown) => e instanceof BrokerError && !e.retriable);
  // Keyless records spread over partitions (not all on one).
  const spread = new Set<number>();
  for (let i = 0; i < 12; i++) spread.add((await b.publish(name, i)).partition);
  assert.ok(spread.size > 1, "keyless publishes are spread over partitions");
}

async function recordTooLarge(b: Broker): Promise<void> {
  const name = uniq("large");
  await b.createTopic(name, { maxMessageBytes: 1024 });
  await b.publish(name, "small");
  await assert.rejects(b.publish(name, "x".repeat(5000)), (e: unknown) => e instanceof RecordTooLargeError && e.maxBytes === 1024);
  await assert.rejects(b.publishBatch(name, [{ value: "ok" }, { value: Buffer.alloc(4096) }]), RecordTooLargeError);
  const d = await b.describeTopic(name);
  assert.equal(d.partitions[0].highWatermark, 1);
  await b.publish(name, "after");
  assert.deepEqual((await readAll(b, name)).get(0), ["small", "after"]);
}

async function concurrentPublishes(b: Broker): Promise<void> {
  const name = uniq("concurrent");
  await b.createTopic(name, { partitions: 3, maxMessageBytes: 1024 });
  const n = 600;
  const calls = Array.from({ length: n }, (_, i) => {
    if (i === 100) return b.publish(name, Buffer.alloc(2000), { key: "k" });
    if (i === 200) return b.publish(name, "bad", { key: "k", timestamp: -5 });
    return b.publish(name, `v${i}`, { key: i % 2 === 0 ? "k" : "other" });
  });
  const out = await Promise.allSettled(calls);
  out.forEach((o, i) => {
    if (i === 100) assert.ok(o.status === "rejected" && o.reason instanceof RecordTooLargeError && o.reason.maxBytes === 1024, `record ${i}: ${String((o as PromiseRejectedResult).reason)}`);
    else if (i === 200) assert.ok(o.status === "rejected" && o.reason instanceof ValidationError, `record ${i}`);
    else assert.equal(o.status, "fulfilled", `record ${i}: ${String((o as PromiseRejectedResult).reason)}`);
  });
  const byKey = new Map<string, number[]>();
  out.forEach((o, i) => {
    if (o.status !== "fulfilled") return;
    const k = i % 2 === 0 ? "k" : "other";
    if (!byKey.has(k)) byKey.set(k, []);
    byKey.get(k)!.push(o.value.offset);
    assert.equal(o.value.partition, partitionForKey(Buffer.from(k), 3));
  });
  for (const [k, offs] of byKey) {
    for (let i = 1; i < offs.length; i++) assert.ok(offs[i] > offs[i - 1], `key ${k}: offsets follow call order`);
  }
  const all = await readAll(b, name);
  const kp = partitionForKey(Buffer.from("k"), 3);
  const want = Array.from({ length: n }, (_, i) => i).filter((i) => i % 2 === 0 && i !== 100 && i !== 200);
  const got = all.get(kp)!.filter((v) => typeof v === "string" && want.includes(Number((v as string).slice(1))));
  assert.deepEqual(got, want.map((i) => `v${i}`), "stored in call order, the refused ones absent");
}

async function exactRecordSize(b: Broker): Promise<void> {
  const name = uniq("exact");
  await b.createTopic(name, { maxMessageBytes: 1024 });
  // recordSize() of a 1017-byte value without key or headers is exactly 1024; in a batch whose
  // first record is years older, its timestamp delta takes 6 bytes instead of 1.
  const exact = Buffer.alloc(1017, 7);
  const rs = await b.publishBatch(name, [
    { value: "old", timestamp: 1 },
    { value: exact, timestamp: 1_700_000_000_000 },
  ]);
  assert.deepEqual(rs.map((r) => r.offset), [0, 1]);
  await assert.rejects(b.publish(name, Buffer.alloc(1018)), (e: unknown) => e instanceof RecordTooLargeError && e.sizeBytes === 1025 && e.maxBytes === 1024);
  const got = await b.fetch(name, 0, 0);
  assert.equal(got.records.length, 2);
  assert.equal(Buffer.from(got.records[1].value as Uint8Array).length, 1017);
}

async function idempotentProducing(b: Broker): Promise<void> {
  const name = uniq("idem");
  await b.createTopic(name, { partitions: 2 });
  const { producerId, producerEpoch } = await b.initProducer();
  const batch = [
    { value: "a", partition: 1 },
    { value: "b", partition: 1 },
  ];
  const first = await b.publishBatch(name, batch, { producerId, producerEpoch, baseSequence: 0 });
  const retry = await b.publishBatch(name, batch, { producerId, producerEpoch, baseSequence: 0 });
  assert.deepEqual(
    retry.map((r) => [r.partition, r.offset, r.duplicate]),
    first.map((r) => [r.partition, r.offset, true]),
  );
  const next = await b.publishBatch(name, [{ value: "c", partition: 1 }], { producerId, producerEpoch, baseSequence: 2 });
  assert.equal(next[0].offset, 2);
  assert.equal(next[0].duplicate, false);
  assert.deepEqual((await readAll(b, name)).get(1), ["a", "b", "c"]);
  // Re-initialising the same id bumps the epoch and fences the older instance.
  const bumped = await b.initProducer(producerId);
  assert.equal(bumped.producerId, producerId);
  assert.ok(bumped.producerEpoch > producerEpoch);
  await assert.rejects(
    b.publishBatch(name, [{ value: "zombie", partition: 1 }], { producerId, producerEpoch, baseSequence: 3 }),
    ProducerFencedError,
  );
  assert.deepEqual((await readAll(b, name)).get(1), ["a", "b", "c"]);
}

async function fetchBounds(b: Broker): Promise<void> {
  const name = uniq("fetch");
  await b.createTopic(name);
  await b.publishBatch(name, Array.from({ length: 50 }, (_, i) => ({ value: "x".repeat(100) + i })));
  const small = await b.fetch(name, 0, 0, { maxBytes: 1 });
  assert.ok(small.records.length >= 1);
  assert.equal(small.nextOffset, small.records.at(-1)!.offset + 1);
  assert.equal(small.highWatermark, 50);
  assert.equal(small.logStartOffset, 0);
  const mid = await b.fetch(name, 0, 20);
  assert.equal(mid.records[0].offset, 20);
  const atEnd = await b.fetch(name, 0, 50);
  assert.equal(atEnd.records.length, 0);
  await assert.rejects(b.fetch(name, 0, 51), OffsetOutOfRangeError);
  await assert.rejects(b.fetch(name, 7, 0), (e: unknown) => e instanceof BrokerError && !e.retriable);
}

async function fetchLongPoll(b: Broker): Promise<void> {
  const name = uniq("longpoll");
  await b.createTopic(name);
  const started = Date.now();
  const waiting = b.fetch(name, 0, 0, { maxWaitMs: 10_000 });
  // Whether the fetch is already waiting or arrives after the publish, it must return the record.
  await b.publish(name, "wake");
  const r = await waiting;
  assert.equal(r.records[0].value, "wake");
  assert.ok(Date.now() - started < 9_000, "returned on data, not on timeout");
  const empty = await b.fetch(name, 0, 1, { maxWaitMs: 50 });
  assert.equal(empty.records.length, 0);
  // Aborting a long poll ends it promptly (empty result or an abort error, never a hang).
  const ac = new AbortController();
  const t0 = Date.now();
  const aborted = b.fetch(name, 0, 1, { maxWaitMs: 10_000, signal: ac.signal });
  ac.abort();
  const settled = await aborted.then((x) => x.records.length, () => 0);
  assert.equal(settled, 0);
  assert.ok(Date.now() - t0 < 5_000, "abort ends the long poll");
}

async function offsetForTimestamp(b: Broker): Promise<void> {
  const name = uniq("ts");
  await b.createTopic(name);
  await b.publishBatch(name, [10, 20, 30, 40].map((s) => ({ value: s, timestamp: 1_000_000 + s })));
  assert.equal(await b.offsetForTimestamp(name, 0, 1_000_000), 0);
  assert.equal(await b.offsetForTimestamp(name, 0, 1_000_025), 2);
  assert.equal(await b.offsetForTimestamp(name, 0, 1_000_040), 3);
  assert.equal(await b.offsetForTimestamp(name, 0, 9_000_000), 4, "past the end: the high watermark");
}
