// SPDX-License-Identifier: Apache-2.0
/**
 * The server-mode consume path (issue 4): raw reads of stored batches (readRaw), their push to
 * remote members (PUSH_RECORD_BATCHES) and client-side decoding, credit-based flow control
 * with raw pushes, generation fencing of commits, and the group offsets log (append + fsync
 * per commit, compaction, torn tails).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, readdirSync, statSync, appendFileSync } from "node:fs";
import { join } from "node:path";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { TOPIC_DEFAULTS } from "../src/store/topic-config.js";
import { NodeFileSystem } from "../src/log/io.js";
import { verifyBatch, type PreparedRecord } from "../src/log/record-batch.js";
import { scanPushedBatches, readRecordInto, type RecordFields } from "../src/client/record-batches.js";
import { openBroker } from "../src/index.js";
import { startServer } from "../src/server/index.js";
import { connect } from "../src/client/index.js";
import { Op, type Frame } from "../src/wire/index.js";
import { CorruptRecordError, NotAssignedError, OffsetOutOfRangeError, ProtocolError } from "../src/errors.js";
import { splitRawChunk } from "../src/server/raw-split.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";

function records(from: number, n: number): PreparedRecord[] {
  return Array.from({ length: n }, (_, i) => ({
    key: i % 3 === 0 ? null : Buffer.from(`k${from + i}`),
    value: Buffer.from(`value-${from + i}`),
    valueKind: 0,
    timestamp: 1_700_000_000_000 + from + i,
    headers: i % 5 === 0 ? [["h", Buffer.from(`hv${from + i}`)]] : null,
  }));
}

async function engineWithBatches(dir: string, sizes: number[], fs = new NodeFileSystem()): Promise<DiskEngine> {
  const e = new DiskEngine({ dataDir: dir, fs });
  await e.open();
  await e.createTopic("t", { ...TOPIC_DEFAULTS, partitions: 1 });
  let next = 0;
  for (const n of sizes) {
    await e.append("t", 0, records(next, n));
    next += n;
  }
  return e;
}

/** Splits readRaw data into batches, verifying each (CRC included). */
function batchesOf(data: Buffer): { base: number; count: number; length: number }[] {
  const out: { base: number; count: number; length: number }[] = [];
  for (let pos = 0; pos < data.length; ) {
    const h = verifyBatch(data, pos, data.length);
    out.push({ base: h.baseOffset, count: h.count, length: h.length });
    pos += h.length;
  }
  return out;
}

test("readRaw returns whole verified batches from the one holding the offset, bounded by maxBytes and maxRecords", async () => {
  using tmp = tempDir();
  const e = await engineWithBatches(tmp.dir, [10, 10, 10, 10, 10]);
  try {
    // From inside the second batch: that whole batch comes back, records counts from 13.
    const all = await e.encoded.readRaw("t", 0, 13, 1 << 20);
    assert.deepEqual(batchesOf(all.data).map((b) => b.base), [10, 20, 30, 40]);
    assert.equal(all.records, 37);
    assert.equal(all.nextOffset, 50);
    const one = batchesOf(all.data)[0].length;
    // maxBytes: whole batches only, but always at least one.
    const two = await e.encoded.readRaw("t", 0, 0, 2 * one + 10);
    assert.deepEqual(batchesOf(two.data).map((b) => b.base), [0, 10]);
    assert.equal(two.nextOffset, 20);
    const tiny = await e.encoded.readRaw("t", 0, 25, 1);
    assert.deepEqual(batchesOf(tiny.data).map((b) => b.base), [20]);
    assert.equal(tiny.records, 5);
    assert.equal(tiny.nextOffset, 30);
    // maxRecords: no batch past the one that reaches it.
    const counted = await e.encoded.readRaw("t", 0, 5, 1 << 20, 6);
    assert.deepEqual(batchesOf(counted.data).map((b) => b.base), [0, 10]);
    assert.equal(counted.records, 15);
    // At the end: nothing.
    const end = await e.encoded.readRaw("t", 0, 50, 1 << 20);
    assert.equal(end.data.length, 0);
    assert.equal(end.nextOffset, 50);
  } finally {
    await e.close();
  }
});

test("a chunk read ahead is pushed only as far as the credit reaches: split at batch boundaries, no bytes copied", async () => {
  using tmp = tempDir();
  const e = await engineWithBatches(tmp.dir, [10, 10, 10, 10]);
  try {
    const read = await e.encoded.readRaw("t", 0, 13, 1 << 20);
    const chunk = { partition: 0, generation: 3, from: 13, data: read.data, nextOffset: read.nextOffset, records: read.records, replayUntil: 0, signal: new AbortController().signal };
    // 7 records of the first batch (13..19) reach a credit of 5: only that batch goes.
    const a = splitRawChunk(chunk, 5);
    assert.deepEqual(batchesOf(a.head.data).map((b) => b.base), [10]);
    assert.deepEqual([a.head.from, a.head.records, a.head.nextOffset], [13, 7, 20]);
    assert.ok(a.rest);
    assert.deepEqual(batchesOf(a.rest.data).map((b) => b.base), [20, 30]);
    assert.deepEqual([a.rest.from, a.rest.records, a.rest.nextOffset, a.rest.generation], [20, 20, 40, 3]);
    assert.equal(a.head.data.buffer, chunk.data.buffer, "a view, not a copy");
    // A credit of 8 is reached inside the second batch: two batches.
    const b = splitRawChunk(chunk, 8);
    assert.deepEqual([b.head.records, b.head.nextOffset, b.rest?.records], [17, 30, 10]);
    // A credit covering the chunk takes it whole.
    const c = splitRawChunk(chunk, 27);
    assert.equal(c.head, chunk);
    assert.equal(c.rest, null);
    assert.throws(() => splitRawChunk(chunk, 0));
  } finally {
    await e.close();
  }
});

test("readRaw never returns a damaged batch: damage at the offset is a CorruptRecordError, later damage ends the result", async () => {
  using tmp = tempDir();
  let e = await engineWithBatches(tmp.dir, [10, 10, 10]);
  const lengths = batchesOf((await e.encoded.readRaw("t", 0, 0, 1 << 20)).data).map((b) => b.length);
  await e.close();
  const dir = join(tmp.dir, "topics", "t", "0");
  const file = join(dir, readdirSync(dir).find((n) => n.endsWith(".log"))!);
  const bytes = readFileSync(file);
  bytes[lengths[0] + 60] ^= 0xff; // a record byte of the second batch
  writeFileSync(file, bytes);
  e = new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem() });
  await e.open();
  try {
    const head = await e.encoded.readRaw("t", 0, 0, 1 << 20);
    assert.deepEqual(batchesOf(head.data).map((b) => b.base), [0], "only the intact batch before the damage");
    assert.equal(head.nextOffset, 10);
    await assert.rejects(e.encoded.readRaw("t", 0, 10, 1 << 20), (err: unknown) => err instanceof CorruptRecordError && err.nextOffset === 20);
    const tail = await e.encoded.readRaw("t", 0, 20, 1 << 20);
    assert.deepEqual(batchesOf(tail.data).map((b) => b.base), [20]);
  } finally {
    await e.close();
  }
});

test("client decoding of pushed batches skips offsets below the requested one and rejects damaged bodies", async () => {
  using tmp = tempDir();
  const e = await engineWithBatches(tmp.dir, [7, 7]);
  const raw = await e.encoded.readRaw("t", 0, 4, 1 << 20);
  await e.close();
  const table = scanPushedBatches(raw.data, 4);
  assert.equal(table.count, 10);
  assert.deepEqual([...table.offset.subarray(0, table.count)], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
  const expected = [...records(0, 7), ...records(7, 7)];
  for (let i = 0; i < table.count; i++) {
    const want = expected[table.offset[i]];
    const got: RecordFields = { key: null, value: null, headers: {} };
    readRecordInto(got, table.buf, table.pos[i]);
    assert.equal(table.timestamp[i], want.timestamp);
    assert.deepEqual(got.key === null ? null : Buffer.from(got.key), want.key);
    assert.deepEqual(Buffer.from(got.value as Uint8Array), want.value);
    assert.deepEqual(
      Object.entries(got.headers).map(([k, v]) => [k, Buffer.from(v)]),
      want.headers ?? [],
    );
  }
  // Damaged or truncated bodies are protocol errors, never over-reads.
  assert.throws(() => scanPushedBatches(raw.data.subarray(0, raw.data.length - 3), 0), ProtocolError);
  assert.throws(() => scanPushedBatches(raw.data.subarray(0, 30), 0), ProtocolError);
  const bad = Buffer.from(raw.data);
  bad.writeUInt32BE(1 << 30, 12); // record count
  assert.throws(() => scanPushedBatches(bad, 0), ProtocolError);
  const bad2 = Buffer.from(raw.data);
  bad2[56] = 0x7f; // first record's length varint: runs past the batch
  assert.throws(() => scanPushedBatches(bad2, 0), ProtocolError);
  for (let i = 0; i < 300; i++) {
    const fuzz = Buffer.from(raw.data);
    const at = 56 + Math.floor(Math.random() * (fuzz.length - 56));
    fuzz[at] = Math.floor(Math.random() * 256);
    try {
      scanPushedBatches(fuzz, 0);
    } catch (err) {
      assert.ok(err instanceof ProtocolError, `fuzzed body: ${String(err)}`);
    }
  }
});

async function withBrokerServer(fn: (url: string) => Promise<void>): Promise<void> {
  using tmp = tempDir();
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  try {
    await fn(srv.url);
  } finally {
    await srv.close({ graceMs: 100 });
    await broker.close();
  }
}

test("raw pushes respect credit: a stalled consumer holds at most its window plus one stored batch", async () => {
  await withBrokerServer(async (url) => {
    const admin = await connect({ url });
    await admin.createTopic("flow", { partitions: 1 });
    // Stored batches of 50 records.
    for (let i = 0; i < 60; i++) await admin.publishBatch("flow", Array.from({ length: 50 }, (_, j) => ({ value: i * 50 + j, partition: 0 })));
    await admin.close();
    const client = await connect({ url, subscriptionWindowMessages: 120 });
    const pushes: number[] = [];
    const orig = client.transport.onPush;
    client.transport.onPush = (f: Frame) => {
      if (f.op === Op.PushRecordBatches) pushes.push(Number(f.meta.records));
      orig(f);
    };
    try {
      const sub = client.subscribe<number>("flow", { group: "slow", start: "earliest" });
      const it = sub[Symbol.asyncIterator]();
      assert.equal((await it.next()).value!.value, 0);
      for (let i = 0; i < 20; i++) await client.listTopics(); // round trips: every chance to push more
      const total = pushes.reduce((a, b) => a + b, 0);
      assert.ok(pushes.length > 0, "records arrived as raw pushes");
      assert.ok(total - pushes[pushes.length - 1] < 120, `pushes ${pushes} started only with credit left`);
      assert.ok(total <= 120 - 1 + 50, `pushed ${total} records for a window of 120 and batches of 50`);
      // Consuming returns credit: the rest flows, in order; the server reads ahead once the
      // credit is spent, yet never pushes beyond it (window plus one stored batch, always).
      let highest = 0;
      for (let expect = 1; expect < 3000; expect++) {
        assert.equal((await it.next()).value!.value, expect);
        const pushed = pushes.reduce((a, b) => a + b, 0);
        highest = Math.max(highest, pushed - expect);
        assert.ok(pushed - expect <= 120 + 50, `after ${expect} taken, ${pushed} pushed: beyond the window`);
      }
      assert.ok(highest >= 100, `the window was used (${highest} ahead at most)`);
      await sub.close();
    } finally {
      await client.close();
    }
  });
});

test("a client that does not announce record batches in SUBSCRIBE gets PUSH_MESSAGES", async () => {
  await withBrokerServer(async (url) => {
    const client = await connect({ url });
    try {
      await client.createTopic("old", { partitions: 1 });
      await client.publishBatch("old", Array.from({ length: 10 }, (_, i) => ({ value: i })));
      const ops: number[] = [];
      const orig = client.transport.onPush;
      client.transport.onPush = (f: Frame) => {
        if (f.meta.sub === 999) ops.push(f.op);
        else orig(f);
      };
      await client.transport.request(Op.Subscribe, { sub: 999, topic: "old", group: "g", start: "earliest", credit: 100, sessionTimeoutMs: 10_000 }, null);
      await waitUntil(() => ops.includes(Op.PushMessages), "a PUSH_MESSAGES frame");
      assert.ok(!ops.includes(Op.PushRecordBatches));
      await client.transport.request(Op.Unsubscribe, { sub: 999 }, null);
    } finally {
      await client.close();
    }
  });
});

test("a stored batch larger than a push frame is decoded and sent in bounded PUSH_MESSAGES frames", async () => {
  using tmp = tempDir();
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  // Frames of at most 256 KiB: pushes are capped at 192 KiB, below the one 400 KiB batch.
  const srv = await startServer({ broker, port: 0, httpPort: null, limits: { maxFrameBytes: 256 * 1024 } });
  const client = await connect({ url: srv.url, subscriptionWindowMessages: 5000 });
  try {
    await broker.createTopic("big", { partitions: 1 });
    await broker.publishBatch("big", Array.from({ length: 1000 }, (_, i) => ({ value: `${i}:`.padEnd(400, "x") })));
    const frames: { op: number; bytes: number }[] = [];
    const orig = client.transport.onPush;
    client.transport.onPush = (f: Frame) => {
      if (f.op === Op.PushMessages || f.op === Op.PushRecordBatches) frames.push({ op: f.op, bytes: f.body.length });
      orig(f);
    };
    const sub = client.subscribe<string>("big", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    for (let i = 0; i < 1000; i++) assert.equal((await it.next()).value!.value, `${i}:`.padEnd(400, "x"));
    assert.ok(frames.length > 1 && frames.every((f) => f.op === Op.PushMessages && f.bytes <= 192 * 1024), JSON.stringify(frames));
    await sub.close();
  } finally {
    await client.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
  }
});

test("batches() of N raise the window to 2N so the next batch arrives while one is processed", async () => {
  await withBrokerServer(async (url) => {
    const client = await connect({ url, subscriptionWindowMessages: 100 });
    await client.createTopic("w", { partitions: 1 });
    await client.publishBatch("w", Array.from({ length: 1000 }, (_, i) => ({ value: i })));
    let pushed = 0;
    const orig = client.transport.onPush;
    client.transport.onPush = (f: Frame) => {
      if (f.op === Op.PushRecordBatches) pushed += Number(f.meta.records);
      orig(f);
    };
    try {
      const sub = client.subscribe<number>("w", { group: "g", start: "earliest" });
      const it = sub.batches({ maxMessages: 300, maxWaitMs: 1000 })[Symbol.asyncIterator]();
      const first = (await it.next()).value!;
      assert.equal(first.messages.length, 300);
      // Without taking the next batch, the server may push up to the raised window (600).
      await waitUntil(() => pushed >= 600, "a second batch's worth pushed ahead");
      assert.ok(pushed <= 1000);
      await first.commit();
      await sub.close();
    } finally {
      await client.close();
    }
  });
});

test("commits are fenced by generation: records of an earlier ownership period cannot be committed", async () => {
  await withBrokerServer(async (url) => {
    const a = await connect({ url });
    await a.createTopic("f", { partitions: 2 });
    for (let p = 0; p < 2; p++) await a.publishBatch("f", Array.from({ length: 20 }, (_, i) => ({ value: i, partition: p })));
    const subA = a.subscribe<number>("f", { group: "g", start: "earliest" });
    const itA = subA[Symbol.asyncIterator]();
    const firstOf = new Map<number, { offset: number; commit(): Promise<void> }>();
    while (firstOf.size < 2) {
      const m = (await itA.next()).value!;
      if (!firstOf.has(m.partition)) firstOf.set(m.partition, m);
    }
    const gen1 = (subA as unknown as { generation: number }).generation;
    const memberId = (subA as unknown as { member: { id: number } }).member.id;
    // A second member takes one partition; when it leaves, the partition comes back to A in a
    // later generation.
    const b = await connect({ url });
    const subB = b.subscribe("f", { group: "g", start: "earliest" });
    await waitUntil(() => subA.assignment().length === 1, "A lost a partition");
    const moved = [0, 1].find((p) => !subA.assignment().includes(p))!;
    await subB.close();
    await b.close();
    await waitUntil(() => subA.assignment().length === 2, "the partition came back to A");
    const old = firstOf.get(moved)!;
    await assert.rejects(old.commit(), NotAssignedError, "the client refuses a message of a revoked period");
    // The server refuses it too, whatever the client says.
    await assert.rejects(
      a.transport.request(Op.Commit, { sub: memberId, offsets: [[moved, old.offset, gen1]] }, null),
      NotAssignedError,
    );
    // Records of the current period commit fine.
    for (;;) {
      const m = (await itA.next()).value!;
      if (m.partition === moved) {
        await m.commit();
        break;
      }
    }
    await subA.close();
    await a.close();
  });
});

// ------------------------------------------------------------------------------------------
// Group offsets log

const engineFs = new WeakMap<DiskEngine, FaultyFileSystem>();

async function openEngine(dir: string, fs: FaultyFileSystem = new FaultyFileSystem(), compact?: number): Promise<DiskEngine> {
  const e = new DiskEngine({ dataDir: dir, fs, offsetsLogCompactBytes: compact });
  await e.open();
  engineFs.set(e, fs);
  if (!(await e.listTopics()).includes("t")) {
    await e.createTopic("t", { ...TOPIC_DEFAULTS, partitions: 4 });
    // Commits may not point past the log (META-3): give every partition records to commit.
    const recs = Array.from({ length: 200 }, () => ({ key: null, value: Buffer.from("r"), valueKind: 0 as const, timestamp: Date.now(), headers: null }));
    for (let p = 0; p < 4; p++) await e.append("t", p, recs);
  }
  return e;
}

/** Abandons an engine as a killed process would: no close, its directory lock released. */
async function abandon(e: DiskEngine): Promise<void> {
  await engineFs.get(e)!.crash("abandoned");
}

async function committed(e: DiskEngine, group = "g"): Promise<Record<number, number>> {
  return Object.fromEntries([...(await e.getCommitted(group, "t"))].map(([p, c]) => [p, c.offset]));
}

test("a commit past the high watermark is refused: committed offsets never claim more than the log holds", async () => {
  using tmp = tempDir();
  const e = await openEngine(tmp.dir);
  await assert.rejects(e.commitOffsets("g", "t", new Map([[0, 201]])), (err: unknown) => err instanceof OffsetOutOfRangeError);
  assert.deepEqual((await committed(e)), {}, "nothing committed");
  await e.commitOffsets("g", "t", new Map([[0, 200]]));
  assert.deepEqual((await committed(e)), { 0: 200 });
  await e.close();
});

test("offsets log: every commit is durable on its own, replayed on open, and folded into the snapshot", async () => {
  using tmp = tempDir();
  let e = await openEngine(tmp.dir, new FaultyFileSystem(), 2048);
  for (let i = 1; i <= 100; i++) await e.commitOffsets("g", "t", new Map([[i % 4, i]]));
  // Concurrent commits share appends and all land.
  await Promise.all(Array.from({ length: 50 }, (_, i) => e.commitOffsets("g", "t", new Map([[i % 4, 100 + i + 1]]))));
  const want = (await committed(e));
  assert.deepEqual(want, { 0: 149, 1: 150, 2: 147, 3: 148 });
  const logSize = statSync(join(tmp.dir, "groups", "g.log")).size;
  // 150 records of ~100 bytes were logged: far more than what is left after compactions
  // (the threshold plus the last coalesced append).
  assert.ok(logSize < 8000, `the log was compacted (size ${logSize})`);
  assert.ok(statSync(join(tmp.dir, "groups", "g.json")).size > 0, "a snapshot exists");
  // Abandon without close (no final snapshot): reopen replays snapshot + log.
  await abandon(e);
  e = await openEngine(tmp.dir);
  assert.deepEqual((await committed(e)), want);
  await e.close();
});

test("offsets log: a torn tail is cut off on open; a failed append makes the next write a snapshot", async () => {
  using tmp = tempDir();
  let e = await openEngine(tmp.dir);
  await e.commitOffsets("g", "t", new Map([[0, 5]]));
  await e.commitOffsets("g", "t", new Map([[1, 7]]));
  // A torn append (crash mid-write): half a record at the end.
  await abandon(e);
  appendFileSync(join(tmp.dir, "groups", "g.log"), Buffer.from([0, 0, 0, 40, 1, 2, 3, 4, 5]));
  e = await openEngine(tmp.dir);
  assert.deepEqual((await committed(e)), { 0: 5, 1: 7 });
  await e.commitOffsets("g", "t", new Map([[2, 9]]));
  await abandon(e);
  e = await openEngine(tmp.dir);
  assert.deepEqual((await committed(e)), { 0: 5, 1: 7, 2: 9 }, "appends continue where the valid log ends");
  await e.close();

  const fs = new FaultyFileSystem();
  e = await openEngine(tmp.dir, fs);
  fs.failNext("write", "EIO", { pathIncludes: "g.log", tornBytes: 6 });
  await assert.rejects(e.commitOffsets("g", "t", new Map([[3, 11]])));
  assert.deepEqual((await committed(e)), { 0: 5, 1: 7, 2: 9 }, "a failed commit is not visible");
  await e.commitOffsets("g", "t", new Map([[0, 12]]));
  // The ambiguous commit may be saved by the later write (as in Kafka); the later one is.
  const after = (await committed(e));
  assert.equal(after[0], 12);
  await abandon(e);
  e = await openEngine(tmp.dir);
  assert.deepEqual((await committed(e)), after);
  await e.close();
});

test("offsets log: power loss after a commit resolved never loses it; a crash between snapshot and log reset replays safely", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  let e = await openEngine(tmp.dir, fs, 512);
  for (let i = 1; i <= 30; i++) await e.commitOffsets("g", "t", new Map([[i % 4, i]]));
  // Compaction whose log reset fails: the snapshot is written, the old log stays.
  fs.failNext("truncate", "EIO", { pathIncludes: "g.log" });
  let failed = false;
  for (let i = 31; i <= 60 && !failed; i++) {
    try {
      await e.commitOffsets("g", "t", new Map([[i % 4, i]]));
    } catch {
      failed = true;
    }
  }
  assert.ok(failed, "the injected truncate failure was hit by a compaction");
  const before = (await committed(e));
  await fs.powerLoss(3);
  e = await openEngine(tmp.dir);
  for (const [p, o] of Object.entries(before)) assert.ok((await committed(e))[Number(p)] >= o, `partition ${p}: ${(await committed(e))[Number(p)]} >= ${o}`);
  await e.commitOffsets("g", "t", new Map([[0, 199]]));
  await abandon(e);
  e = await openEngine(tmp.dir);
  assert.equal((await committed(e))[0], 199);
  await e.close();
});

test("offsets log: a commit resolves only once its O_DSYNC write is durable; a failed sync is an error and power loss keeps every resolved commit", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  let e = await openEngine(tmp.dir, fs);
  await e.commitOffsets("g", "t", new Map([[0, 3]]));
  await e.commitOffsets("g", "t", new Map([[1, 4]]));
  // The durable write reaches the page cache but its sync fails: the commit must fail and
  // must not become visible.
  fs.failNext("datasync", "EIO", { pathIncludes: "g.log" });
  await assert.rejects(e.commitOffsets("g", "t", new Map([[2, 5]])));
  assert.deepEqual((await committed(e)), { 0: 3, 1: 4 }, "a commit whose sync failed is not visible");
  // After a failure the next write is a snapshot; the ones after it are log appends again.
  await e.commitOffsets("g", "t", new Map([[3, 6]]));
  await e.commitOffsets("g", "t", new Map([[0, 10]]));
  await e.commitOffsets("g", "t", new Map([[1, 11]]));
  const resolved = (await committed(e));
  assert.deepEqual([resolved[0], resolved[1], resolved[3]], [10, 11, 6]);
  // Power loss drops whatever was not durable; every resolved commit is durable.
  await fs.powerLoss();
  e = await openEngine(tmp.dir);
  const after = (await committed(e));
  for (const [p, o] of Object.entries(resolved)) assert.equal(after[Number(p)], o, `partition ${p} kept its resolved commit`);
  await e.close();
});
