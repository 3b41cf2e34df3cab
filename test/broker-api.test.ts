// SPDX-License-Identifier: Apache-2.0
/**
 * The embedded broker's public API: topics, names, configs, publishing and partitioning,
 * fetch/long-poll, offset lookups, value kinds, idempotent producing and durability acks.
 * Every test opens a fresh broker on a fresh temp dir.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import {
  AbortedError,
  BrokerClosedError,
  InvalidNameError,
  OffsetOutOfRangeError,
  OutOfOrderSequenceError,
  PartitionNotFoundError,
  ProducerFencedError,
  RecordTooLargeError,
  TopicExistsError,
  TopicNotFoundError,
  ValidationError,
} from "../src/errors.js";
import { partitionForKey } from "../src/streams/murmur2.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { PublishValue, TopicConfig } from "../src/types.js";

interface Env {
  root: string;
  dataDir: string;
  broker: EmbeddedBroker;
  reopen(): Promise<EmbeddedBroker>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** A broker on `<tmp>/data`, so a path escaping the data dir would show up in `<tmp>`. */
async function env(): Promise<Env> {
  const tmp = tempDir("sluice-api-");
  const dataDir = join(tmp.dir, "data");
  const e: Env = {
    root: tmp.dir,
    dataDir,
    broker: await openBroker({ dataDir, retentionCheckIntervalMs: 0 }),
    async reopen() {
      await e.broker.close();
      e.broker = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
      return e.broker;
    },
    async [Symbol.asyncDispose]() {
      await e.broker.close();
      tmp.cleanup();
    },
  };
  return e;
}

async function hwms(b: EmbeddedBroker, topic: string): Promise<number[]> {
  return (await b.describeTopic(topic)).partitions.map((p) => p.highWatermark);
}

async function fetchAll(b: EmbeddedBroker, topic: string, partition: number, from = 0) {
  const out = [];
  let off = from;
  for (;;) {
    const r = await b.fetch(topic, partition, off);
    if (r.records.length === 0) return out;
    out.push(...r.records);
    off = r.nextOffset;
  }
}

// ─────────────────────────────── topics ───────────────────────────────

test("topics: create, list, describe, delete", async () => {
  await using e = await env();
  const b = e.broker;
  assert.deepEqual(await b.listTopics(), []);
  const d = await b.createTopic("orders", { partitions: 3, retentionMs: 60_000 });
  assert.equal(d.name, "orders");
  assert.equal(typeof d.topicId, "string");
  assert.ok(d.topicId.length > 0);
  assert.ok(Math.abs(d.createdAt - Date.now()) < 60_000);
  assert.equal(d.config.partitions, 3);
  assert.equal(d.config.retentionMs, 60_000);
  // Defaults are filled in.
  assert.equal(d.config.durability, "always");
  assert.equal(d.config.retentionBytes, -1);
  assert.equal(d.config.maxMessageBytes, 1024 * 1024);
  assert.equal(d.partitions.length, 3);
  for (const [i, p] of d.partitions.entries()) {
    assert.equal(p.partition, i);
    assert.equal(p.logStartOffset, 0);
    assert.equal(p.logEndOffset, 0);
    assert.equal(p.highWatermark, 0);
  }
  await b.createTopic("alpha");
  assert.deepEqual(await b.listTopics(), ["alpha", "orders"]);
  assert.equal((await b.describeTopic("alpha")).partitions.length, 1);
  await b.deleteTopic("orders");
  assert.deepEqual(await b.listTopics(), ["alpha"]);
  await assert.rejects(b.describeTopic("orders"), (err: unknown) => err instanceof TopicNotFoundError && err.code === "TOPIC_NOT_FOUND");
  await assert.rejects(b.deleteTopic("orders"), TopicNotFoundError);
  await assert.rejects(b.publish("orders", "x"), TopicNotFoundError);
  await assert.rejects(b.fetch("orders", 0, 0), TopicNotFoundError);
  // Topics survive a restart.
  const b2 = await e.reopen();
  assert.deepEqual(await b2.listTopics(), ["alpha"]);
  assert.ok(!existsSync(join(e.dataDir, "topics", "orders")));
});

test("topics: duplicate create is TopicExistsError", async () => {
  await using e = await env();
  const first = await e.broker.createTopic("t", { partitions: 2 });
  await assert.rejects(e.broker.createTopic("t"), (err: unknown) => err instanceof TopicExistsError && err.code === "TOPIC_EXISTS" && !err.retriable);
  // The original is untouched.
  assert.equal((await e.broker.describeTopic("t")).topicId, first.topicId);
  assert.equal((await e.broker.describeTopic("t")).partitions.length, 2);
  // Concurrent creates of one name: exactly one wins.
  const rs = await Promise.allSettled([e.broker.createTopic("race"), e.broker.createTopic("race"), e.broker.createTopic("race")]);
  assert.equal(rs.filter((r) => r.status === "fulfilled").length, 1);
  for (const r of rs) if (r.status === "rejected") assert.ok(r.reason instanceof TopicExistsError);
});

test("names: allow-list [a-zA-Z0-9._-], 1-249 chars, not . or ..; nothing is created on disk", async () => {
  await using e = await env();
  const b = e.broker;
  const before = readdirSync(e.root).sort();
  const dataBefore = readdirSync(e.dataDir).sort();
  const bad = ["", ".", "..", "../x", "../../x", "a/b", "a\\b", "/abs", "x".repeat(250), "with space", "nul\0x", "ü", "tab\t", "a:b", "*", "..\\x"];
  for (const name of bad) {
    await assert.rejects(
      b.createTopic(name),
      (err: unknown) => err instanceof InvalidNameError && err.code === "INVALID_NAME",
      `createTopic(${JSON.stringify(name)})`,
    );
    await assert.rejects(b.describeTopic(name), InvalidNameError, `describeTopic(${JSON.stringify(name)})`);
    await assert.rejects(b.deleteTopic(name), InvalidNameError, `deleteTopic(${JSON.stringify(name)})`);
    await assert.rejects(b.publish(name, "v"), InvalidNameError, `publish(${JSON.stringify(name)})`);
  }
  // Non-strings are rejected too (JS callers).
  await assert.rejects(b.createTopic(42 as unknown as string), InvalidNameError);
  assert.deepEqual(await b.listTopics(), []);
  assert.deepEqual(readdirSync(e.root).sort(), before, "nothing created next to the data dir");
  assert.deepEqual(readdirSync(e.dataDir).sort(), dataBefore, "nothing created in the data dir");
  for (const d of ["topics", "tmp", "trash"]) assert.deepEqual(readdirSync(join(e.dataDir, d)), [], `${d}/ is empty`);
  // Boundary names that are allowed.
  const good = ["a", "A.b_c-D9", "...", ".hidden", "-", "x".repeat(200)];
  for (const name of good) await b.createTopic(name);
  assert.deepEqual(await b.listTopics(), [...good].sort());
  assert.deepEqual(readdirSync(join(e.dataDir, "topics")).sort(), [...good].sort());
  // Group names are checked the same way.
  await assert.rejects(b.resetGroup("../g", "a", "earliest"), InvalidNameError);
  await assert.rejects(b.groupLag("a/b", "a"), InvalidNameError);
  assert.throws(() => b.subscribe("a", { group: ".." }), InvalidNameError);
  assert.deepEqual(readdirSync(join(e.dataDir, "groups")), []);
});

test("names: a 249-character topic name (the documented maximum) can be created, used, deleted and re-created", async () => {
  await using e = await env();
  const b = e.broker;
  const name = "x".repeat(249);
  await b.createTopic(name);
  assert.deepEqual(await b.listTopics(), [name]);
  assert.equal((await b.publish(name, "v")).offset, 0);
  await b.deleteTopic(name);
  await b.createTopic(name);
  assert.deepEqual((await b.fetch(name, 0, 0)).records, []);
  // Group names have the same limit.
  await b.publish(name, "w");
  const g = "g".repeat(249);
  await b.resetGroup(g, name, "earliest");
  assert.equal((await b.groupLag(g, name)).partitions[0].committedOffset, 0);
});

test("configs: invalid values are ValidationError and create nothing", async () => {
  await using e = await env();
  const bad: unknown[] = [
    { partitions: 0 },
    { partitions: -1 },
    { partitions: 1.5 },
    { partitions: "2" },
    { partitions: 10_001 },
    { partitions: Number.NaN },
    { retentionMs: -2 },
    { retentionBytes: -5 },
    { retentionBytes: 1.25 },
    { segmentBytes: 100 },
    { segmentBytes: 2 ** 31 },
    { segmentMs: 0 },
    { maxMessageBytes: 0 },
    { segmentBytes: 4096, maxMessageBytes: 8192 },
    { durability: "sometimes" },
    { flushIntervalMs: 0 },
    { unknownKey: 1 },
    null,
    "partitions=3",
  ];
  for (const c of bad) {
    await assert.rejects(
      e.broker.createTopic("t", c as TopicConfig),
      (err: unknown) => err instanceof ValidationError && err.code === "VALIDATION",
      `config ${JSON.stringify(c)}`,
    );
  }
  assert.deepEqual(await e.broker.listTopics(), []);
  assert.deepEqual(readdirSync(join(e.dataDir, "topics")), []);
  // And valid edge values are accepted.
  const d = await e.broker.createTopic("t", { partitions: 1, retentionMs: -1, retentionBytes: 0, segmentBytes: 1024, maxMessageBytes: 1024, durability: "never" });
  assert.equal(d.config.segmentBytes, 1024);
});

test("delete then re-create never resurrects old records or old committed group offsets", async () => {
  await using e = await env();
  let b = e.broker;
  const old = await b.createTopic("t", { partitions: 2 });
  for (let i = 0; i < 10; i++) await b.publish("t", `old-${i}`, { partition: i % 2 });
  await b.resetGroup("g", "t", { offset: 3 });
  assert.deepEqual((await b.groupLag("g", "t")).partitions.map((p) => p.committedOffset), [3, 3]);
  await b.deleteTopic("t");
  const fresh = await b.createTopic("t", { partitions: 2 });
  assert.notEqual(fresh.topicId, old.topicId);
  const check = async (): Promise<void> => {
    assert.deepEqual(await hwms(b, "t"), [0, 0]);
    assert.deepEqual((await b.fetch("t", 0, 0)).records, []);
    const lag = await b.groupLag("g", "t");
    assert.deepEqual(lag.partitions.map((p) => p.committedOffset), [null, null]);
    assert.equal(lag.totalRecords, 0);
  };
  await check();
  // Also across a restart (the group file still names the old topic incarnation).
  b = await e.reopen();
  await check();
  // New data starts at offset 0 and is only the new data.
  const r = await b.publish("t", "new", { partition: 0 });
  assert.equal(r.offset, 0);
  const all = await fetchAll(b, "t", 0);
  assert.deepEqual(all.map((x) => x.value), ["new"]);
  // A group subscribing with start "earliest" sees only the new record, not a stale offset 3.
  const sub = b.subscribe("t", { group: "g", start: "earliest" });
  const it = sub[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  assert.equal((first.value as { value: unknown }).value, "new");
  await sub.close();
});

// ───────────────────────────── publishing ─────────────────────────────

test("publish: a key lands on partitionForKey(key, n); the same key always on the same partition", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 7, durability: "never" });
  const seen = new Map<string, number>();
  for (let round = 0; round < 2; round++) {
    for (let i = 0; i < 60; i++) {
      const key = `user-${i}`;
      const r = await b.publish("t", { i, round }, { key });
      assert.equal(r.partition, partitionForKey(Buffer.from(key, "utf8"), 7), key);
      if (seen.has(key)) assert.equal(r.partition, seen.get(key));
      seen.set(key, r.partition);
    }
  }
  assert.ok(new Set(seen.values()).size > 3, "keys spread over partitions");
  // A Uint8Array key (a view with an offset) hashes its own bytes only.
  const backing = new Uint8Array([9, 9, 1, 2, 3, 9]);
  const view = backing.subarray(2, 5);
  const r = await b.publish("t", "bytes-key", { key: view });
  assert.equal(r.partition, partitionForKey(Uint8Array.from([1, 2, 3]), 7));
  const got = (await b.fetch("t", r.partition, r.offset)).records[0];
  assert.deepEqual([...got.key!], [1, 2, 3]);
  // Keys inside a batch follow the same rule.
  const rs = await b.publishBatch("t", ["a", "b", "c", "a"].map((k) => ({ key: k, value: k })));
  for (const [i, k] of ["a", "b", "c", "a"].entries()) assert.equal(rs[i].partition, partitionForKey(Buffer.from(k), 7));
});

test("publish: keyless records spread across partitions (sticky within a batch)", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 4, durability: "never" });
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < 200; i++) counts[(await b.publish("t", `m${i}`)).partition]++;
  for (const [p, c] of counts.entries()) assert.ok(c > 0, `partition ${p} got no keyless record: ${counts}`);
  // A small keyless batch sticks to one partition (one batch, one append).
  const small = await b.publishBatch("t", Array.from({ length: 20 }, (_, i) => ({ value: `s${i}` })));
  assert.equal(new Set(small.map((r) => r.partition)).size, 1);
  // A large one moves on after ~16 KiB, in contiguous runs.
  const big = await b.publishBatch("t", Array.from({ length: 800 }, () => ({ value: Buffer.alloc(200) })));
  const parts = big.map((r) => r.partition);
  assert.equal(new Set(parts).size, 4);
  let switches = 0;
  for (let i = 1; i < parts.length; i++) if (parts[i] !== parts[i - 1]) switches++;
  assert.ok(switches < 20, `sticky runs, not per-record scatter (${switches} switches)`);
});

test("publish: explicit partition; out of range is ValidationError; offsets are contiguous per partition", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 3, durability: "never" });
  const r = await b.publish("t", "x", { partition: 2, key: "ignored-for-routing" });
  assert.equal(r.partition, 2);
  assert.equal(r.offset, 0);
  assert.equal(r.topic, "t");
  assert.equal(r.duplicate, false);
  for (const p of [3, -1, 1.5, Number.NaN]) await assert.rejects(b.publish("t", "x", { partition: p }), ValidationError, `partition ${p}`);
  await assert.rejects(b.fetch("t", 3, 0), PartitionNotFoundError);
  assert.deepEqual(await hwms(b, "t"), [0, 0, 1]);
  // A mixed batch: per partition the offsets are contiguous and in record order.
  const recs = Array.from({ length: 30 }, (_, i) => ({ value: i, partition: i % 3 }));
  const rs = await b.publishBatch("t", recs);
  const next = [0, 0, 1];
  for (const [i, x] of rs.entries()) {
    assert.equal(x.partition, i % 3);
    assert.equal(x.offset, next[x.partition]++, `record ${i}`);
  }
  // Concurrent publishes to one partition get distinct, gap-free offsets.
  const conc = await Promise.all(Array.from({ length: 50 }, (_, i) => b.publish("t", i, { partition: 1 })));
  const offs = conc.map((x) => x.offset).sort((a, c) => a - c);
  assert.deepEqual(offs, Array.from({ length: 50 }, (_, i) => 10 + i));
  const all = await fetchAll(b, "t", 1);
  assert.deepEqual(all.map((x) => x.offset), Array.from({ length: 60 }, (_, i) => i));
  // An invalid record anywhere in a batch stores nothing of it.
  await assert.rejects(b.publishBatch("t", [{ value: 1, partition: 0 }, { value: 2, partition: 9 }]), ValidationError);
  await assert.rejects(b.publishBatch("t", []), ValidationError);
  assert.deepEqual(await hwms(b, "t"), [10, 60, 11]);
});

test("publish: RecordTooLargeError when a record exceeds maxMessageBytes, and nothing of the batch is stored", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 1, maxMessageBytes: 1024 });
  await b.publish("t", Buffer.alloc(900));
  const isTooLarge = (err: unknown): boolean => err instanceof RecordTooLargeError && err.code === "RECORD_TOO_LARGE" && err.maxBytes === 1024 && err.sizeBytes > 1024;
  await assert.rejects(b.publish("t", Buffer.alloc(1025)), isTooLarge);
  await assert.rejects(b.publish("t", "x".repeat(2000)), isTooLarge);
  // Headers and key count toward the record's size.
  await assert.rejects(b.publish("t", "small", { headers: { big: Buffer.alloc(1100) } }), isTooLarge);
  await assert.rejects(b.publish("t", "small", { key: Buffer.alloc(1100) }), isTooLarge);
  await assert.rejects(b.publishBatch("t", [{ value: "a" }, { value: Buffer.alloc(5000) }, { value: "c" }]), isTooLarge);
  assert.deepEqual(await hwms(b, "t"), [1]);
  assert.equal((await fetchAll(b, "t", 0)).length, 1);
});

test("publish: a too-large record in a multi-partition batch stores nothing on any partition", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 2, maxMessageBytes: 1024 });
  await assert.rejects(
    b.publishBatch("t", [
      { value: "fine", partition: 0 },
      { value: Buffer.alloc(5000), partition: 1 },
    ]),
    RecordTooLargeError,
  );
  await assert.rejects(
    b.publishBatch("t", [
      { value: "fine", partition: 0 },
      { value: "bad timestamp", partition: 1, timestamp: -1 },
    ]),
    ValidationError,
  );
  // close() drains every append that was started, so what is on disk after reopen is final.
  const b2 = await e.reopen();
  assert.deepEqual(await hwms(b2, "t"), [0, 0], "partition 0 must not hold part of a rejected batch");
});

// ─────────────────────────────── fetch ───────────────────────────────

test("fetch: maxBytes bounds the response (at least one record), paging returns everything in order", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { durability: "never" });
  for (let i = 0; i < 40; i++) await b.publish("t", Buffer.alloc(1000, i));
  const one = await b.fetch("t", 0, 0, { maxBytes: 1 });
  assert.equal(one.records.length, 1, "at least one record even when it exceeds maxBytes");
  assert.equal(one.nextOffset, 1);
  const some = await b.fetch("t", 0, 5, { maxBytes: 3000 });
  assert.ok(some.records.length >= 1 && some.records.length <= 4, `${some.records.length} records for 3000 bytes`);
  assert.equal(some.records[0].offset, 5);
  assert.equal(some.nextOffset, 5 + some.records.length);
  assert.equal(some.highWatermark, 40);
  assert.equal(some.logStartOffset, 0);
  const all = await b.fetch("t", 0, 0, { maxBytes: 1024 * 1024 });
  assert.equal(all.records.length, 40);
  const paged = [];
  for (let off = 0; off < 40; ) {
    const r = await b.fetch("t", 0, off, { maxBytes: 2500 });
    assert.ok(r.records.length > 0);
    paged.push(...r.records);
    off = r.nextOffset;
  }
  assert.deepEqual(paged.map((r) => r.offset), Array.from({ length: 40 }, (_, i) => i));
  assert.deepEqual(paged.map((r) => (r.value as Uint8Array)[0]), Array.from({ length: 40 }, (_, i) => i));
  // At the end: empty, nextOffset unchanged.
  const end = await b.fetch("t", 0, 40);
  assert.deepEqual(end.records, []);
  assert.equal(end.nextOffset, 40);
  for (const bad of [0, -1, 1.5, 2 ** 40]) await assert.rejects(b.fetch("t", 0, 0, { maxBytes: bad }), ValidationError, `maxBytes ${bad}`);
  await assert.rejects(b.fetch("t", 0, 0, { maxWaitMs: -1 }), ValidationError);
});

test("fetch: offsets below the log start or beyond the high watermark are OffsetOutOfRangeError", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  for (let i = 0; i < 3; i++) await b.publish("t", i);
  for (const off of [4, 100, -1]) {
    await assert.rejects(
      b.fetch("t", 0, off),
      (err: unknown) => err instanceof OffsetOutOfRangeError && err.code === "OFFSET_OUT_OF_RANGE" && err.offset === off && err.logStartOffset === 0 && err.logEndOffset === 3,
      `offset ${off}`,
    );
  }
  // A long-poll beyond the end is also out of range, not a wait.
  await assert.rejects(b.fetch("t", 0, 5, { maxWaitMs: 60_000 }), OffsetOutOfRangeError);
  await assert.rejects(b.fetch("t", 0, 1.5), ValidationError);
});

test("fetch: long-poll returns when a record is published; times out empty otherwise; abort ends it with AbortedError", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  await b.publish("t", "first");
  // Timeout: nothing arrives, the fetch returns empty after about maxWaitMs.
  const t0 = Date.now();
  const empty = await b.fetch("t", 0, 1, { maxWaitMs: 60 });
  const waited = Date.now() - t0;
  assert.deepEqual(empty.records, []);
  assert.equal(empty.nextOffset, 1);
  assert.ok(waited >= 50, `returned after ${waited} ms, before maxWaitMs`);
  // Wake-up: a long fetch is parked; a publish completes it long before its deadline.
  let done = false;
  const started = Date.now();
  const pending = b.fetch("t", 0, 1, { maxWaitMs: 30_000 }).then((r) => {
    done = true;
    return r;
  });
  await new Promise((r) => setImmediate(r));
  assert.equal(done, false, "the fetch waits while nothing is there");
  await b.publish("t", "second");
  const got = await pending;
  assert.ok(Date.now() - started < 10_000, "woken by the publish, not by the timeout");
  assert.deepEqual(got.records.map((r) => [r.offset, r.value]), [[1, "second"]]);
  // Abort: an AbortSignal ends the wait early with AbortedError (as a client's fetch does).
  const ac = new AbortController();
  let outcome: unknown = "pending";
  void b.fetch("t", 0, 2, { maxWaitMs: 30_000, signal: ac.signal }).then(
    (r) => (outcome = r),
    (err: unknown) => (outcome = err),
  );
  await new Promise((r) => setImmediate(r));
  ac.abort();
  await waitUntil(() => outcome !== "pending", "aborted fetch to end", 5_000);
  assert.ok(outcome instanceof AbortedError, `ended with ${String(outcome)}`);
});

test("fetch: earliest, latest and offsetForTimestamp (first offset with ts >= target; beyond all -> hwm)", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { durability: "never" });
  const ts = [1000, 2000, 3000, 2500, 4000, 4000, 3500];
  for (const t of ts) await b.publish("t", t, { timestamp: t });
  const d = await b.describeTopic("t");
  assert.equal(d.partitions[0].logStartOffset, 0); // earliest
  assert.equal(d.partitions[0].highWatermark, ts.length); // latest
  const expected = (target: number): number => {
    const i = ts.findIndex((t) => t >= target);
    return i < 0 ? ts.length : i;
  };
  for (const target of [0, 999, 1000, 1001, 2000, 2400, 2600, 3000, 3001, 3500, 4000, 4001, 1e13]) {
    assert.equal(await b.offsetForTimestamp("t", 0, target), expected(target), `ts ${target}`);
  }
  // Timestamps round trip exactly.
  assert.deepEqual((await fetchAll(b, "t", 0)).map((r) => r.timestamp), ts);
  await assert.rejects(b.offsetForTimestamp("t", 0, Number.NaN), ValidationError);
  await assert.rejects(b.offsetForTimestamp("t", 1, 0), PartitionNotFoundError);
  await assert.rejects(b.publish("t", "x", { timestamp: -5 }), ValidationError);
  // Empty partition: hwm (0).
  await b.createTopic("empty");
  assert.equal(await b.offsetForTimestamp("empty", 0, 0), 0);
});

test("fetch: offsetForTimestamp across many segments (index lookups) and after a restart", async () => {
  await using e = await env();
  let b = e.broker;
  await b.createTopic("t", { segmentBytes: 1024, durability: "never" });
  const ts: number[] = [];
  for (let i = 0; i < 120; i++) {
    // Mostly rising with some going backwards, several batches per segment.
    const t = 10_000 + i * 10 - (i % 7 === 3 ? 25 : 0);
    ts.push(t);
    await b.publish("t", Buffer.alloc(100, i), { timestamp: t });
  }
  assert.ok((await b.describeTopic("t")).partitions[0].segments > 5);
  const expected = (target: number): number => {
    const i = ts.findIndex((t) => t >= target);
    return i < 0 ? ts.length : i;
  };
  const check = async (): Promise<void> => {
    for (let target = 9_990; target <= 11_220; target += 7) assert.equal(await b.offsetForTimestamp("t", 0, target), expected(target), `ts ${target}`);
  };
  await check();
  b = await e.reopen();
  await check();
});

// ────────────────────────────── values ──────────────────────────────

test("values: Buffer/Uint8Array -> Uint8Array, string -> string, object -> object, null -> null; headers and keys round trip", async () => {
  await using e = await env();
  let b = e.broker;
  await b.createTopic("t");
  const backing = Uint8Array.from([7, 7, 1, 2, 3, 7]);
  const values: PublishValue[] = [
    Buffer.from([0, 1, 2, 255]),
    backing.subarray(2, 5),
    new Uint8Array(0),
    "plain",
    "",
    "ünïcødé ☃ 𝄞",
    { a: 1, b: [1, "two", null], c: { d: true } },
    [1, 2, 3],
    42,
    0,
    true,
    false,
    null,
  ];
  const headers = { trace: "abc-123", bin: Uint8Array.from([0, 255, 10]), empty: "", "ключ": "значение" };
  for (const [i, v] of values.entries()) await b.publish("t", v, { headers: i === 0 ? headers : undefined, key: i % 2 === 0 ? `k${i}` : null });
  const check = async (): Promise<void> => {
    const got = await fetchAll(b, "t", 0);
    assert.equal(got.length, values.length);
    for (const [i, v] of values.entries()) {
      const g = got[i].value;
      if (v instanceof Uint8Array) {
        assert.ok(g instanceof Uint8Array, `value ${i} is bytes`);
        assert.deepEqual([...(g as Uint8Array)], [...v], `bytes of value ${i}`);
      } else assert.deepEqual(g, v, `value ${i}`);
      if (i % 2 === 0) assert.equal(Buffer.from(got[i].key!).toString(), `k${i}`);
      else assert.equal(got[i].key, null);
    }
    const h = got[0].headers;
    assert.deepEqual(Object.keys(h).sort(), Object.keys(headers).sort());
    for (const [k, v] of Object.entries(headers)) {
      assert.ok(h[k] instanceof Uint8Array, `header ${k} is bytes`);
      assert.deepEqual([...h[k]], [...(typeof v === "string" ? Buffer.from(v, "utf8") : v)], `header ${k}`);
    }
    assert.deepEqual(got[1].headers, {});
  };
  await check();
  b = await e.reopen();
  await check();
  await assert.rejects(b.publish("t", "x", { headers: { bad: 5 as unknown as string } }), ValidationError);
  await assert.rejects(b.publish("t", "x", { key: 5 as unknown as string }), ValidationError);
  await assert.rejects(b.publish("t", (() => 1) as unknown as string), ValidationError);
});

// ─────────────────────────── idempotent producer ───────────────────────────

test("idempotent producer: a retried batch returns the original offsets with duplicate: true and is stored once, across a restart", async () => {
  await using e = await env();
  let b = e.broker;
  await b.createTopic("t", { partitions: 2 });
  const { producerId, producerEpoch } = await b.initProducer();
  assert.ok(Number.isInteger(producerId) && producerId >= 0);
  assert.equal(producerEpoch, 0);
  const other = await b.initProducer();
  assert.notEqual(other.producerId, producerId);
  const batch = (seq: number, n: number) => Array.from({ length: n }, (_, i) => ({ value: `s${seq + i}`, partition: 1 }));
  const opts = (baseSequence: number) => ({ producerId, producerEpoch, baseSequence });
  const first = await b.publishBatch("t", batch(0, 3), opts(0));
  assert.deepEqual(first.map((r) => [r.partition, r.offset, r.duplicate]), [[1, 0, false], [1, 1, false], [1, 2, false]]);
  const retry = await b.publishBatch("t", batch(0, 3), opts(0));
  assert.deepEqual(retry.map((r) => [r.partition, r.offset, r.duplicate]), [[1, 0, true], [1, 1, true], [1, 2, true]]);
  const second = await b.publishBatch("t", batch(3, 2), opts(3));
  assert.deepEqual(second.map((r) => [r.offset, r.duplicate]), [[3, false], [4, false]]);
  // An older batch still in the window is still recognised.
  assert.deepEqual((await b.publishBatch("t", batch(0, 3), opts(0))).map((r) => r.duplicate), [true, true, true]);
  assert.deepEqual(await hwms(b, "t"), [0, 5]);
  // Out-of-order: a gap in sequence numbers; nothing stored.
  await assert.rejects(b.publishBatch("t", batch(9, 1), opts(9)), (err: unknown) => err instanceof OutOfOrderSequenceError && err.code === "OUT_OF_ORDER_SEQUENCE");
  // A retry with a different record count is not a duplicate.
  await assert.rejects(b.publishBatch("t", batch(3, 1), opts(3)), OutOfOrderSequenceError);
  assert.deepEqual(await hwms(b, "t"), [0, 5]);
  // Restart: the duplicate window is recovered.
  b = await e.reopen();
  const after = await b.publishBatch("t", batch(3, 2), opts(3));
  assert.deepEqual(after.map((r) => [r.offset, r.duplicate]), [[3, true], [4, true]]);
  assert.deepEqual(await hwms(b, "t"), [0, 5]);
  await assert.rejects(b.publishBatch("t", batch(6, 1), opts(6)), OutOfOrderSequenceError);
  const next = await b.publishBatch("t", batch(5, 1), opts(5));
  assert.deepEqual(next.map((r) => [r.offset, r.duplicate]), [[5, false]]);
  const values = (await fetchAll(b, "t", 1)).map((r) => r.value);
  assert.deepEqual(values, ["s0", "s1", "s2", "s3", "s4", "s5"], "each batch stored exactly once");
  // Producer ids keep increasing after a restart (never re-issued).
  const third = await b.initProducer();
  assert.ok(third.producerId > other.producerId);
});

test("idempotent producer: sequences are per partition; invalid producer fields are ValidationError", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { partitions: 2 });
  const { producerId, producerEpoch } = await b.initProducer();
  const r0 = await b.publishBatch("t", [{ value: "a", partition: 0 }], { producerId, producerEpoch, baseSequence: 0 });
  const r1 = await b.publishBatch("t", [{ value: "b", partition: 1 }], { producerId, producerEpoch, baseSequence: 0 });
  assert.equal(r0[0].duplicate, false);
  assert.equal(r1[0].duplicate, false);
  await assert.rejects(b.publishBatch("t", [{ value: "x", partition: 0 }], { producerId, producerEpoch, baseSequence: -1 }), ValidationError);
  await assert.rejects(b.publishBatch("t", [{ value: "x", partition: 0 }], { producerId, producerEpoch }), ValidationError);
  await assert.rejects(
    b.publishBatch("t", [{ value: "x", partition: 0 }, { value: "y", partition: 1 }], { producerId, producerEpoch, baseSequence: 1 }),
    ValidationError,
  );
  await assert.rejects(b.initProducer(10_000), ValidationError);
  assert.deepEqual(await hwms(b, "t"), [1, 1]);
});

test("idempotent producer: after initProducer(sameId), the new epoch fences the old one", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  const old = await b.initProducer();
  await b.publishBatch("t", [{ value: "old-0" }], { ...old, baseSequence: 0 });
  const bumped = await b.initProducer(old.producerId);
  assert.equal(bumped.producerId, old.producerId);
  assert.equal(bumped.producerEpoch, old.producerEpoch + 1);
  await b.publishBatch("t", [{ value: "new-0" }], { ...bumped, baseSequence: 0 });
  await assert.rejects(
    b.publishBatch("t", [{ value: "old-1" }], { ...old, baseSequence: 1 }),
    (err: unknown) => err instanceof ProducerFencedError && err.code === "PRODUCER_FENCED",
  );
  assert.deepEqual((await fetchAll(b, "t", 0)).map((r) => r.value), ["old-0", "new-0"]);
});

test("idempotent producer: the old epoch is fenced as soon as initProducer(sameId) returns, before the new epoch writes", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t");
  const old = await b.initProducer();
  await b.publishBatch("t", [{ value: "old-0" }], { ...old, baseSequence: 0 });
  await b.initProducer(old.producerId);
  // The zombie keeps going with its next sequence number: it must be fenced, not appended.
  await assert.rejects(b.publishBatch("t", [{ value: "zombie" }], { ...old, baseSequence: 1 }), ProducerFencedError);
  assert.deepEqual((await fetchAll(b, "t", 0)).map((r) => r.value), ["old-0"]);
});

// ───────────────────────────── durability ─────────────────────────────

test("durability: 'always' acks synced:true, 'interval' and 'never' ack synced:false; data readable and durable after close", async () => {
  await using e = await env();
  let b = e.broker;
  await b.createTopic("a", { durability: "always" });
  await b.createTopic("i", { durability: "interval", flushIntervalMs: 20 });
  await b.createTopic("n", { durability: "never" });
  const ra = await b.publish("a", "x");
  const ri = await b.publish("i", "x");
  const rn = await b.publish("n", "x");
  assert.equal(ra.synced, true);
  assert.equal(ri.synced, false);
  assert.equal(rn.synced, false);
  const batch = await b.publishBatch("a", [{ value: 1 }, { value: 2 }]);
  assert.ok(batch.every((r) => r.synced));
  for (const t of ["a", "i", "n"]) assert.equal((await b.fetch(t, 0, 0)).records[0].value, "x");
  b = await e.reopen();
  for (const t of ["a", "i", "n"]) assert.equal((await b.fetch(t, 0, 0)).records[0].value, "x", `${t} after clean restart`);
});

test("closed broker: calls fail with BrokerClosedError", async () => {
  await using e = await env();
  await e.broker.createTopic("t");
  await e.broker.close();
  await assert.rejects(e.broker.publish("t", "x"), BrokerClosedError);
  await assert.rejects(e.broker.fetch("t", 0, 0), BrokerClosedError);
  await assert.rejects(e.broker.createTopic("u"), BrokerClosedError);
  await e.broker.close(); // idempotent
});
