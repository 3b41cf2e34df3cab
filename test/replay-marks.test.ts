// SPDX-License-Identifier: Apache-2.0
/**
 * Replay marks in the disk engine's group offsets (META-4): a reset writes the offsets and
 * their marks in one record, so a torn or failed write leaves neither; snapshots carry marks;
 * groups written before marks existed still load; a commit reaching a mark clears it. And the
 * network's message pushes (PUSH_MESSAGES) carry it, for clients without record batches and
 * for stored batches larger than a frame (the conformance suite covers PUSH_RECORD_BATCHES).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { TOPIC_DEFAULTS } from "../src/store/topic-config.js";
import { crc32c } from "../src/log/crc32c.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { openBroker } from "../src/index.js";
import { startServer } from "../src/server/index.js";
import { connect } from "../src/client/index.js";
import { decodeConsumedRecords, Op, type Frame } from "../src/wire/index.js";

const engineFs = new WeakMap<DiskEngine, FaultyFileSystem>();

async function openEngine(dir: string, fs = new FaultyFileSystem(), compact?: number): Promise<DiskEngine> {
  const e = new DiskEngine({ dataDir: dir, fs, offsetsLogCompactBytes: compact });
  await e.open();
  engineFs.set(e, fs);
  if (!(await e.listTopics()).includes("t")) {
    await e.createTopic("t", { ...TOPIC_DEFAULTS, partitions: 2 });
    const recs = Array.from({ length: 100 }, () => ({ key: null, value: Buffer.from("r"), valueKind: 0 as const, timestamp: Date.now(), headers: null }));
    for (const p of [0, 1]) await e.append("t", p, recs);
  }
  return e;
}

/** As a killed process: no close, its directory lock released. */
async function abandon(e: DiskEngine): Promise<void> {
  await engineFs.get(e)!.crash("abandoned");
}

async function marks(e: DiskEngine): Promise<Record<number, [number, number | null]>> {
  const out: Record<number, [number, number | null]> = {};
  for (const [p, c] of await e.getCommitted("g", "t")) out[p] = [c.offset, c.replayUntil ?? null];
  return out;
}

test("a commit reaching the mark clears it; commits below keep it (unit)", async () => {
  using tmp = tempDir();
  const e = await openEngine(tmp.dir);
  await e.commitOffsets("g", "t", new Map([[0, 50]]));
  await e.resetOffsets("g", "t", new Map([[0, 20]]));
  for (const o of [21, 30, 49]) {
    await e.commitOffsets("g", "t", new Map([[0, o]]));
    assert.deepEqual((await marks(e))[0], [o, 50], `a commit of ${o} keeps the mark`);
  }
  await e.commitOffsets("g", "t", new Map([[0, 50]]));
  assert.deepEqual((await marks(e))[0], [50, null], "a commit of the mark clears it");
  await e.close();
});

test("a torn reset record leaves neither its offsets nor its marks; a resolved one survives power loss", async () => {
  using tmp = tempDir();
  let e = await openEngine(tmp.dir);
  await e.commitOffsets("g", "t", new Map([[0, 40], [1, 60]]));
  const log = join(tmp.dir, "groups", "g.log");
  const before = statSync(log).size;
  await e.resetOffsets("g", "t", new Map([[0, 10], [1, 5]]));
  const after = statSync(log).size;
  assert.ok(after > before, "the reset was one log append");
  await abandon(e);
  // A crash mid-append: part of the reset's record reached the disk.
  truncateSync(log, before + Math.floor((after - before) / 2));
  e = await openEngine(tmp.dir);
  assert.deepEqual(await marks(e), { 0: [40, null], 1: [60, null] }, "the reset is all gone");
  const fs = new FaultyFileSystem();
  await e.close();
  e = await openEngine(tmp.dir, fs);
  await e.resetOffsets("g", "t", new Map([[0, 10], [1, 5]]));
  await fs.powerLoss();
  e = await openEngine(tmp.dir);
  assert.deepEqual(await marks(e), { 0: [10, 40], 1: [5, 60] }, "a resolved reset keeps offsets and marks");
  await e.close();
});

test("a failed reset write is not visible; snapshots (compaction) carry the marks", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  let e = await openEngine(tmp.dir, fs, 512);
  await e.commitOffsets("g", "t", new Map([[0, 90], [1, 90]]));
  fs.failNext("write", "EIO", { pathIncludes: "g.log", tornBytes: 6 });
  await assert.rejects(e.resetOffsets("g", "t", new Map([[0, 1]])));
  assert.deepEqual(await marks(e), { 0: [90, null], 1: [90, null] }, "a failed reset is not visible");
  await e.resetOffsets("g", "t", new Map([[0, 2], [1, 3]]));
  // Enough commits below the marks to fold the log into snapshots several times.
  for (let i = 0; i < 40; i++) await e.commitOffsets("g", "t", new Map([[i % 2, 4 + i]]));
  const want = await marks(e);
  assert.deepEqual(want, { 0: [42, 90], 1: [43, 90] });
  assert.ok(statSync(join(tmp.dir, "groups", "g.json")).size > 0, "a snapshot was written");
  await abandon(e);
  e = await openEngine(tmp.dir);
  assert.deepEqual(await marks(e), want);
  await e.close();
});

test("groups written before replay marks existed still load, and resets on them mark", async () => {
  using tmp = tempDir();
  let e = await openEngine(tmp.dir);
  const topicId = (await e.getTopic("t")).topicId;
  await e.close();
  // The format without marks: a snapshot and a logged commit (no `replayUntil`, no `m`).
  const groups = join(tmp.dir, "groups");
  mkdirSync(groups, { recursive: true });
  writeFileSync(join(groups, "g.json"), JSON.stringify({ group: "g", topics: { t: { topicId, offsets: { "0": { offset: 30, committedAt: 1 } } } }, logEpoch: 2 }));
  const payload = Buffer.from(JSON.stringify({ e: 2, t: "t", i: topicId, c: 2, o: [[1, 25]] }));
  const head = Buffer.alloc(8);
  head.writeUInt32BE(payload.length, 0);
  head.writeUInt32BE(crc32c(payload), 4);
  writeFileSync(join(groups, "g.log"), Buffer.concat([head, payload]));
  e = await openEngine(tmp.dir);
  assert.deepEqual(await marks(e), { 0: [30, null], 1: [25, null] });
  await e.resetOffsets("g", "t", new Map([[0, 0]]));
  await e.close();
  e = await openEngine(tmp.dir);
  assert.deepEqual(await marks(e), { 0: [0, 30], 1: [25, null] });
  await e.close();
});

test("PUSH_MESSAGES says which records are replays (meta replay: [[partition, mark]])", async () => {
  using tmp = tempDir();
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const client = await connect({ url: srv.url });
  try {
    await broker.createTopic("old", { partitions: 1 });
    await broker.publishBatch("old", Array.from({ length: 10 }, (_, i) => ({ value: i })));
    await broker.resetGroup("g", "old", "latest");
    await broker.resetGroup("g", "old", { partitions: { 0: 3 } });
    await broker.publishBatch("old", [{ value: 10 }, { value: 11 }]);
    const got: [number, boolean][] = [];
    const orig = client.transport.onPush;
    client.transport.onPush = (f: Frame) => {
      if (f.meta.sub !== 999) return orig(f);
      if (f.op !== Op.PushMessages) return;
      const bound = new Map((f.meta.replay as [number, number][] | undefined) ?? []);
      for (const r of decodeConsumedRecords("old", f.body)) got.push([r.offset, r.offset < (bound.get(r.partition) ?? 0)]);
    };
    // A client that does not announce record batches (as older ones) gets PUSH_MESSAGES.
    await client.transport.request(Op.Subscribe, { sub: 999, topic: "old", group: "g", credit: 100, sessionTimeoutMs: 10_000 }, null);
    await waitUntil(() => got.length >= 9, "9 pushed records");
    assert.deepEqual(got, Array.from({ length: 9 }, (_, i) => [3 + i, 3 + i < 10]));
    await client.transport.request(Op.Unsubscribe, { sub: 999 }, null);
  } finally {
    await client.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
  }
});

test("a stored batch larger than a push frame keeps msg.replay (decoded into PUSH_MESSAGES)", async () => {
  using tmp = tempDir();
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null, limits: { maxFrameBytes: 256 * 1024 } });
  const client = await connect({ url: srv.url, subscriptionWindowMessages: 5000 });
  try {
    await broker.createTopic("big", { partitions: 1 });
    // One stored batch of ~400 KiB (appended in-process), over a 256 KiB frame.
    await broker.publishBatch("big", Array.from({ length: 1000 }, (_, i) => ({ value: `${i}:`.padEnd(400, "x") })));
    await broker.resetGroup("g", "big", "latest");
    await broker.resetGroup("g", "big", { partitions: { 0: 500 } });
    const sub = client.subscribe<string>("big", { group: "g" });
    const it = sub[Symbol.asyncIterator]();
    for (let i = 500; i < 1000; i++) {
      const m = (await it.next()).value!;
      assert.deepEqual([m.offset, m.replay], [i, true]);
    }
    await client.publish("big", "new");
    const m = (await it.next()).value!;
    assert.deepEqual([m.offset, m.value, m.replay], [1000, "new", false]);
    await sub.close();
  } finally {
    await client.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
  }
});
