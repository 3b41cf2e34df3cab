// SPDX-License-Identifier: Apache-2.0
/**
 * Retention: by size and by time it deletes whole sealed segments only, never the active one;
 * the log start offset moves durably; readers below it get OffsetOutOfRangeError and groups
 * follow their offsetReset policy. Segments roll by age.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { OffsetOutOfRangeError } from "../src/errors.js";
import type { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { Message, TopicConfig } from "../src/types.js";

interface Env {
  dataDir: string;
  broker: EmbeddedBroker;
  reopen(): Promise<EmbeddedBroker>;
  [Symbol.asyncDispose](): Promise<void>;
}

async function env(): Promise<Env> {
  const tmp = tempDir("sluice-retention-");
  const dataDir = tmp.dir;
  const e: Env = {
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

type Seg = { baseOffset: number; endOffset: number; size: number; sealed: boolean; file: string };

function segments(b: EmbeddedBroker, topic: string, partition = 0): Seg[] {
  return (b.engine as DiskEngine).log(topic, partition).describeSegments();
}

function logFilesOnDisk(dataDir: string, topic: string, partition = 0): string[] {
  return readdirSync(join(dataDir, "topics", topic, String(partition)))
    .filter((n) => /^\d{20}\.(log|index|timeindex)$/.test(n))
    .sort();
}

const RECORDS_PER_BATCH = 4;
const VALUE = Buffer.alloc(200, 0x61);

/** Appends `batches` batches of 4 x 200 B records (about 4 batches per 4 KiB segment). */
async function fill(b: EmbeddedBroker, topic: string, batches: number, timestamp?: number): Promise<void> {
  for (let i = 0; i < batches; i++) {
    await b.publishBatch(
      topic,
      Array.from({ length: RECORDS_PER_BATCH }, () => ({ value: VALUE, partition: 0, timestamp })),
    );
  }
}

async function start(b: EmbeddedBroker, topic: string): Promise<{ logStartOffset: number; highWatermark: number; segments: number; sizeBytes: number }> {
  const p = (await b.describeTopic(topic)).partitions[0];
  return { logStartOffset: p.logStartOffset, highWatermark: p.highWatermark, segments: p.segments, sizeBytes: p.sizeBytes };
}

/** Checks that `after` is a suffix of `before` whose first element is the new log start, and that files match. */
function assertWholeSegmentsDeleted(before: Seg[], after: Seg[], dataDir: string, topic: string): void {
  assert.ok(after.length >= 1);
  const k = before.length - after.length;
  assert.ok(k >= 0);
  assert.deepEqual(
    after.map((s) => [s.baseOffset, s.endOffset, s.size]),
    before.slice(k).map((s) => [s.baseOffset, s.endOffset, s.size]),
    "remaining segments are exactly the newest ones, unchanged (whole segments deleted only)",
  );
  assert.equal(after[after.length - 1].sealed, false, "the active segment is still there");
  const expectedFiles = new Set(after.map((s) => s.file.split(/[\\/]/).pop()!));
  const logs = logFilesOnDisk(dataDir, topic).filter((n) => n.endsWith(".log"));
  assert.deepEqual(logs, [...expectedFiles].sort(), "segment files on disk match the remaining segments");
  for (const gone of before.slice(0, k)) {
    const stem = gone.file.split(/[\\/]/).pop()!.replace(/\.log$/, "");
    assert.deepEqual(logFilesOnDisk(dataDir, topic).filter((n) => n.startsWith(stem)), [], `files of deleted segment ${stem} are gone`);
  }
}

test("retention by size deletes whole sealed segments, moves the log start durably, and readers below it get OffsetOutOfRangeError", async () => {
  await using e = await env();
  let b = e.broker;
  const retentionBytes = 3 * 4096;
  await b.createTopic("t", { segmentBytes: 4096, retentionBytes });
  await fill(b, "t", 100);
  const before = segments(b, "t");
  const s0 = await start(b, "t");
  assert.ok(before.length >= 15, `${before.length} segments rolled`);
  assert.equal(s0.highWatermark, 100 * RECORDS_PER_BATCH);
  assert.ok(before.every((s) => s.size <= 4096), "segments respect segmentBytes");

  await b.enforceRetention(Date.now());
  const after = segments(b, "t");
  assertWholeSegmentsDeleted(before, after, e.dataDir, "t");
  const total = after.reduce((s, x) => s + x.size, 0);
  assert.ok(after.length < before.length, "something was deleted");
  assert.ok(total >= retentionBytes, `kept ${total} bytes, at least retentionBytes`);
  assert.ok(total - after[0].size < retentionBytes, "deleting one more segment would go below retentionBytes");
  const s1 = await start(b, "t");
  assert.equal(s1.logStartOffset, after[0].baseOffset);
  assert.equal(s1.highWatermark, s0.highWatermark, "retention never touches the end");
  assert.equal(s1.sizeBytes, total);

  const check = async (bk: EmbeddedBroker): Promise<void> => {
    const { logStartOffset: ls, highWatermark: hw } = await start(bk, "t");
    assert.equal(ls, s1.logStartOffset);
    for (const off of [0, ls - 1]) {
      await assert.rejects(
        bk.fetch("t", 0, off),
        (err: unknown) => err instanceof OffsetOutOfRangeError && err.logStartOffset === ls && err.offset === off,
        `fetch at ${off} below start ${ls}`,
      );
    }
    const first = await bk.fetch("t", 0, ls);
    assert.equal(first.records[0].offset, ls);
    assert.equal(first.logStartOffset, ls);
    // Everything from the start to the end is still there and contiguous.
    let off = ls;
    let expected = ls;
    while (off < hw) {
      const r = await bk.fetch("t", 0, off);
      assert.ok(r.records.length > 0);
      for (const rec of r.records) assert.equal(rec.offset, expected++);
      off = r.nextOffset;
    }
    assert.equal(off, hw);
    assert.equal(await bk.offsetForTimestamp("t", 0, 0), ls, "time lookups start at the log start");
  };
  await check(b);
  // Running retention again changes nothing.
  await b.enforceRetention(Date.now());
  assert.equal(segments(b, "t").length, after.length);
  // The new start survives a restart.
  b = await e.reopen();
  await check(b);
  assert.deepEqual(segments(b, "t").map((s) => [s.baseOffset, s.endOffset]), after.map((s) => [s.baseOffset, s.endOffset]));
  // Appends continue after the end.
  const r = await b.publish("t", "after", { partition: 0 });
  assert.equal(r.offset, s0.highWatermark);
});

test("alterTopic: retention set on a live topic applies at the next check, and after a restart", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { segmentBytes: 4096 }); // kept forever
  await fill(b, "t", 100);
  const before = segments(b, "t");
  await b.enforceRetention(Date.now());
  assert.equal(segments(b, "t").length, before.length, "no retention yet: nothing deleted");
  await b.alterTopic("t", { retentionBytes: 3 * 4096 });
  await b.enforceRetention(Date.now());
  const after = segments(b, "t");
  assert.ok(after.length < before.length, `the new retention deleted segments (${before.length} -> ${after.length})`);
  assert.ok((await start(b, "t")).logStartOffset > 0);
  const again = await e.reopen();
  assert.equal((await again.describeTopic("t")).config.retentionBytes, 3 * 4096, "the change survived the restart");
});

test("retention never deletes the active segment, even with retentionBytes 0 and every record expired", async () => {
  await using e = await env();
  let b = e.broker;
  const old = Date.now() - 10 * 86_400_000;
  await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 0, retentionMs: 1000 });
  await fill(b, "t", 30, old);
  const before = segments(b, "t");
  assert.ok(before.length > 3);
  await b.enforceRetention(Date.now());
  const after = segments(b, "t");
  assert.equal(after.length, 1);
  assertWholeSegmentsDeleted(before, after, e.dataDir, "t");
  const s = await start(b, "t");
  assert.equal(s.logStartOffset, before[before.length - 1].baseOffset);
  assert.equal(s.highWatermark, 30 * RECORDS_PER_BATCH);
  const rest = await b.fetch("t", 0, s.logStartOffset);
  assert.ok(rest.records.length > 0, "records of the active segment stay readable");
  assert.equal(rest.records[rest.records.length - 1].offset, s.highWatermark - 1);
  b = await e.reopen();
  assert.equal((await start(b, "t")).logStartOffset, s.logStartOffset);
  // A partition with only an active segment (nothing sealed): nothing to delete.
  await b.createTopic("one", { retentionBytes: 0, retentionMs: 1 });
  await b.publish("one", "x", { timestamp: old });
  await b.enforceRetention(Date.now());
  assert.equal((await start(b, "one")).logStartOffset, 0);
  assert.equal((await b.fetch("one", 0, 0)).records[0].value, "x");
});

test("retention by time deletes sealed segments whose newest record is older than retentionMs, oldest first", async () => {
  await using e = await env();
  let b = e.broker;
  const now = Date.now();
  const hour = 3_600_000;
  await b.createTopic("t", { segmentBytes: 4096, retentionMs: 60_000 });
  await fill(b, "t", 40, now - hour); // offsets [0, 160): an hour old
  const oldEnd = 40 * RECORDS_PER_BATCH;
  await fill(b, "t", 40, now); // offsets [160, 320): fresh
  const before = segments(b, "t");
  assert.ok(before.length > 10);

  // As seen from two hours ago nothing has expired yet.
  await b.enforceRetention(now - 2 * hour);
  assert.equal(segments(b, "t").length, before.length);
  assert.equal((await start(b, "t")).logStartOffset, 0);

  // Now: exactly the sealed segments holding only old records go.
  await b.enforceRetention(now);
  const after = segments(b, "t");
  assertWholeSegmentsDeleted(before, after, e.dataDir, "t");
  const holding = before.find((s) => s.baseOffset <= oldEnd && oldEnd < s.endOffset)!;
  assert.ok(holding, "a segment holds the first fresh record");
  const s = await start(b, "t");
  assert.equal(s.logStartOffset, holding.baseOffset, "segments with any fresh record are kept");
  assert.ok(s.logStartOffset > 0);
  await assert.rejects(b.fetch("t", 0, s.logStartOffset - 1), OffsetOutOfRangeError);
  const fresh = await b.fetch("t", 0, oldEnd);
  assert.equal(fresh.records[0].offset, oldEnd);
  assert.equal(fresh.records[0].timestamp, now);

  // Survives restart; then two hours later everything sealed is gone, the active segment stays.
  b = await e.reopen();
  assert.equal((await start(b, "t")).logStartOffset, s.logStartOffset);
  await b.enforceRetention(now + 2 * hour);
  const last = segments(b, "t");
  assert.equal(last.length, 1);
  assert.equal(last[0].baseOffset, before[before.length - 1].baseOffset);
  assert.equal((await start(b, "t")).logStartOffset, last[0].baseOffset);
  assert.equal((await start(b, "t")).highWatermark, 80 * RECORDS_PER_BATCH);
});

async function firstMessage<T>(it: AsyncIterator<Message<T>>): Promise<Message<T>> {
  const r = await it.next();
  assert.equal(r.done, false);
  return r.value as Message<T>;
}

test("groups whose committed offset fell below the log start follow offsetReset: earliest (default), latest, error", async () => {
  await using e = await env();
  const b = e.broker;
  await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096 });
  await fill(b, "t", 40);
  for (const g of ["g-default", "g-earliest", "g-latest", "g-error"]) await b.resetGroup(g, "t", { offset: 2 });
  await b.enforceRetention(Date.now());
  const { logStartOffset: ls, highWatermark: hw } = await start(b, "t");
  assert.ok(ls > 2, `log start ${ls} moved past the committed offset`);

  // Lag is counted from the log start, not from the stale committed offset.
  const lag = await b.groupLag("g-default", "t");
  assert.equal(lag.partitions[0].committedOffset, 2);
  assert.equal(lag.partitions[0].lagRecords, hw - ls);

  // Default policy: resume at the log start.
  {
    const sub = b.subscribe("t", { group: "g-default" });
    const it = sub[Symbol.asyncIterator]();
    const m = await firstMessage(it);
    assert.equal(m.offset, ls);
    await m.commit();
    await sub.close();
    assert.equal((await b.groupLag("g-default", "t")).partitions[0].committedOffset, ls + 1);
  }
  {
    const sub = b.subscribe("t", { group: "g-earliest", offsetReset: "earliest" });
    const m = await firstMessage(sub[Symbol.asyncIterator]());
    assert.equal(m.offset, ls);
    await sub.close();
  }
  // "error": the iterator throws OffsetOutOfRangeError instead of skipping silently.
  {
    const sub = b.subscribe("t", { group: "g-error", offsetReset: "error" });
    await assert.rejects(
      sub[Symbol.asyncIterator]().next(),
      (err: unknown) => err instanceof OffsetOutOfRangeError && err.offset === 2 && err.logStartOffset === ls,
    );
    await sub.close();
    // Its committed offset is left alone for an operator to decide.
    assert.equal((await b.groupLag("g-error", "t")).partitions[0].committedOffset, 2);
  }
  // "latest": skip to the end; the next record published is the first delivered.
  {
    const sub = b.subscribe("t", { group: "g-latest", offsetReset: "latest" });
    const it = sub[Symbol.asyncIterator]();
    const next = it.next();
    // Publish until the waiting member sees something; the first thing it sees is at the old end.
    let got: IteratorResult<Message<unknown>> | null = null;
    void next.then((r) => (got = r));
    // Let the member join and resolve its position (at the end) before the new record exists.
    await waitUntil(() => sub.assignment().length > 0, "member to be assigned partition 0", 10_000);
    await new Promise((r) => setImmediate(r));
    assert.equal(got, null, "nothing delivered before the new record");
    await b.publish("t", "fresh", { partition: 0 });
    await waitUntil(() => got, "latest-policy member to receive the fresh record", 10_000);
    const m = (got as unknown as IteratorResult<Message<unknown>>).value as Message<unknown>;
    assert.equal(m.offset, hw);
    assert.equal(m.value, "fresh");
    await sub.close();
  }
});

test("segments roll by age (segmentMs) so time retention can free them", async () => {
  await using e = await env();
  const b = e.broker;
  const segmentMs = 300;
  const old = Date.now() - 86_400_000;
  await b.createTopic("t", { segmentMs, retentionMs: 60_000 });
  await b.publish("t", "a", { timestamp: old });
  const firstAt = Date.now();
  await b.publish("t", "b", { timestamp: old });
  assert.equal(segments(b, "t").length, 1, "young segment does not roll");
  // Wait for the age to pass (a condition, not a sleep for luck).
  await waitUntil(() => Date.now() - firstAt > segmentMs + 5, "segment age to exceed segmentMs", 5_000);
  const r = await b.publish("t", "c");
  const segs = segments(b, "t");
  assert.equal(segs.length, 2, "the next append rolled the segment");
  assert.equal(segs[0].sealed, true);
  assert.equal(segs[0].endOffset, 2);
  assert.equal(segs[1].baseOffset, 2);
  assert.equal(r.offset, 2);
  // Time retention can now delete the old sealed segment.
  await b.enforceRetention(Date.now());
  assert.equal((await start(b, "t")).logStartOffset, 2);
  assert.equal((await b.fetch("t", 0, 2)).records[0].value, "c");
  // An empty active segment never rolls by age (no empty segments pile up).
  const idle = await b.createTopic("idle", { segmentMs: 1 });
  const createdAt = idle.createdAt;
  await waitUntil(() => Date.now() - createdAt > 5, "idle topic to age", 5_000);
  await b.publish("idle", "only");
  assert.equal(segments(b, "idle").length, 1);
  assert.equal(segments(b, "idle")[0].baseOffset, 0);
});

test("segment age (mocked clock, no restart): rolls once the segment is older than segmentMs", async (t) => {
  t.mock.timers.enable({ apis: ["Date"], now: Date.UTC(2030, 0, 1) });
  await using e = await env();
  const b = e.broker;
  const minute = 60_000;
  await b.createTopic("t", { segmentMs: 60 * minute });
  await b.publish("t", "first");
  t.mock.timers.tick(59 * minute);
  await b.publish("t", "young");
  assert.equal(segments(b, "t").length, 1);
  t.mock.timers.tick(2 * minute);
  await b.publish("t", "old");
  assert.equal(segments(b, "t").length, 2);
});

test("segment age is measured from its first record, also across a restart", async (t) => {
  // Mock only Date: real timers (fsync, group commit) keep working.
  t.mock.timers.enable({ apis: ["Date"], now: Date.UTC(2030, 0, 1) });
  await using e = await env();
  let b = e.broker;
  const minute = 60_000;
  await b.createTopic("t", { segmentMs: 60 * minute });
  await b.publish("t", "first");
  t.mock.timers.tick(50 * minute);
  b = await e.reopen();
  t.mock.timers.tick(11 * minute); // first record now 61 minutes old
  await b.publish("t", "after-an-hour");
  assert.equal(segments(b, "t").length, 2, "the active segment rolled: its first record is older than segmentMs");
});
