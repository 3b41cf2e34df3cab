// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance (issue 2, item 3) and fault handling: torn tails, flipped bits in sealed
 * segments, misplaced batches, deleted or garbage indexes, ENOSPC, EIO and power loss.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, writeFileSync, unlinkSync, statSync, existsSync } from "node:fs";
import { join } from "node:path";
import { openBroker, CorruptRecordError, StorageFullError, StorageError, type EmbeddedBroker } from "../src/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { Logger } from "../src/observability/telemetry.js";

function captureLogger(): Logger & { lines: { level: string; obj: unknown; msg?: string }[] } {
  const lines: { level: string; obj: unknown; msg?: string }[] = [];
  const mk = (level: string) => (obj: unknown, msg?: string) => void lines.push({ level, obj, msg });
  return { lines, debug: mk("debug"), info: mk("info"), warn: mk("warn"), error: mk("error") };
}

const partDir = (data: string, topic: string, p = 0) => join(data, "topics", topic, String(p));
const logFiles = (dir: string) => readdirSync(dir).filter((n) => n.endsWith(".log")).sort();

/** Byte positions of the batches in a segment file (walks the length fields). */
function batchPositions(file: string): { pos: number; len: number }[] {
  const b = readFileSync(file);
  const out: { pos: number; len: number }[] = [];
  let pos = 0;
  while (pos + 4 <= b.length) {
    const len = b.readUInt32BE(pos);
    if (len === 0 || pos + len > b.length) break;
    out.push({ pos, len });
    pos += len;
  }
  return out;
}

async function readAll(b: EmbeddedBroker, topic: string, p = 0): Promise<{ offsets: number[]; errors: CorruptRecordError[] }> {
  const d = await b.describeTopic(topic);
  const part = d.partitions[p];
  const offsets: number[] = [];
  const errors: CorruptRecordError[] = [];
  let off = part.logStartOffset;
  while (off < part.highWatermark) {
    try {
      const r = await b.fetch(topic, p, off, { maxBytes: 1 << 20 });
      for (const rec of r.records) offsets.push(rec.offset);
      assert.ok(r.nextOffset > off, "progress");
      off = r.nextOffset;
    } catch (e) {
      if (!(e instanceof CorruptRecordError)) throw e;
      errors.push(e);
      assert.ok(e.nextOffset !== undefined && e.nextOffset > off);
      off = e.nextOffset!;
    }
  }
  return { offsets, errors };
}

async function fill(b: EmbeddedBroker, topic: string, batches: number, perBatch = 5): Promise<void> {
  for (let i = 0; i < batches; i++)
    await b.publishBatch(topic, Array.from({ length: perBatch }, (_, k) => ({ value: `b${i}r${k}-${"x".repeat(50)}`, partition: 0 })));
}

test("torn tail of the active segment is truncated to the last valid batch and logged", async () => {
  using tmp = tempDir();
  const fs1 = new FaultyFileSystem();
  const b1 = await openBroker({ dataDir: tmp.dir, fs: fs1, retentionCheckIntervalMs: 0 });
  await b1.createTopic("t");
  await fill(b1, "t", 10);
  // Abandon b1 as a killed process would (no close, no clean marker, its lock released), then
  // tear the last batch in half.
  await fs1.crash("abandoned");
  const dir = partDir(tmp.dir, "t");
  const file = join(dir, logFiles(dir).at(-1)!);
  const pos = batchPositions(file);
  const last = pos.at(-1)!;
  const size = statSync(file).size;
  writeFileSync(file, readFileSync(file).subarray(0, last.pos + Math.floor(last.len / 2)));
  const logger = captureLogger();
  const b2 = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0, logger });
  const d = await b2.describeTopic("t");
  assert.equal(d.partitions[0].highWatermark, 45, "9 intact batches of 5 remain");
  const { offsets, errors } = await readAll(b2, "t");
  assert.equal(errors.length, 0);
  assert.deepEqual(offsets, Array.from({ length: 45 }, (_, i) => i));
  const warn = logger.lines.find((l) => l.level === "warn" && /torn tail/.test(l.msg ?? ""));
  assert.ok(warn, "truncation is logged");
  const o = warn!.obj as { file: string; position: number; bytesDropped: number };
  assert.equal(o.file, file);
  assert.equal(o.position, last.pos);
  assert.equal(o.bytesDropped, last.pos + Math.floor(last.len / 2) - last.pos);
  assert.ok(size > statSync(file).size);
  // The next append reuses no acknowledged offset: it continues at 45.
  const r = await b2.publish("t", "after", { partition: 0 });
  assert.equal(r.offset, 45);
  await b2.close();
  await b1.close().catch(() => {});
});

test("one flipped bit in a sealed segment: typed error for that batch, the rest readable", async () => {
  using tmp = tempDir();
  let b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { segmentBytes: 4096 });
  await fill(b, "t", 40);
  await b.close();
  const dir = partDir(tmp.dir, "t");
  const files = logFiles(dir);
  assert.ok(files.length >= 3, "several segments");
  const file = join(dir, files[0]);
  const pos = batchPositions(file);
  const victim = pos[2];
  const bytes = readFileSync(file);
  bytes[victim.pos + victim.len - 7] ^= 0x10; // one bit inside the records
  writeFileSync(file, bytes);
  b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await assert.rejects(b.fetch("t", 0, 10), (e: unknown) => {
    assert.ok(e instanceof CorruptRecordError);
    assert.equal(e.code, "CORRUPT_RECORD");
    assert.equal(e.topic, "t");
    assert.equal(e.partition, 0);
    assert.equal(e.offset, 10);
    assert.equal(e.nextOffset, 15);
    return true;
  });
  await assert.rejects(b.fetch("t", 0, 12), CorruptRecordError);
  // Before: readable up to the damaged batch (and not past it).
  const before = await b.fetch("t", 0, 0, { maxBytes: 1 << 20 });
  assert.deepEqual(before.records.map((r) => r.offset), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  // After: readable.
  const after = await b.fetch("t", 0, 15);
  assert.equal(after.records[0].offset, 15);
  const { offsets, errors } = await readAll(b, "t");
  assert.equal(errors.length, 1);
  assert.equal(offsets.length, 195);
  await b.close();
});

test("a flipped bit in a batch length field and a misplaced batch are detected, never served", async () => {
  using tmp = tempDir();
  let b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { segmentBytes: 4096 });
  await fill(b, "t", 40);
  await b.close();
  const dir = partDir(tmp.dir, "t");
  const files = logFiles(dir);
  // Length field of batch 1 in segment 0.
  const f0 = join(dir, files[0]);
  const p0 = batchPositions(f0);
  const bytes0 = readFileSync(f0);
  bytes0[p0[1].pos + 2] ^= 0x04;
  writeFileSync(f0, bytes0);
  // Segment 1: overwrite batch 3 with a copy of batch 2 (same length, valid CRC, wrong offset).
  const f1 = join(dir, files[1]);
  const p1 = batchPositions(f1);
  const bytes1 = readFileSync(f1);
  assert.equal(p1[2].len, p1[3].len);
  bytes1.copy(bytes1, p1[3].pos, p1[2].pos, p1[2].pos + p1[2].len);
  writeFileSync(f1, bytes1);
  b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const { offsets, errors } = await readAll(b, "t");
  assert.equal(errors.length, 2);
  assert.match(errors[1].message, /claims offset/);
  assert.equal(offsets.length, 190);
  assert.equal(new Set(offsets).size, offsets.length, "no offset served twice");
  await b.close();
});

test("deleted or garbage index files are rebuilt from the log", async () => {
  using tmp = tempDir();
  let b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { segmentBytes: 8192 });
  await fill(b, "t", 60);
  const ts = Date.now();
  await b.publish("t", "late", { partition: 0, timestamp: ts + 60_000 });
  await b.close();
  const dir = partDir(tmp.dir, "t");
  const idx = readdirSync(dir).filter((n) => n.endsWith(".index") || n.endsWith(".timeindex"));
  assert.ok(idx.length >= 4);
  for (const n of idx.slice(0, 3)) unlinkSync(join(dir, n));
  writeFileSync(join(dir, idx[3]), Buffer.from("garbage-garbage-garbage"));
  b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const { offsets } = await readAll(b, "t");
  assert.equal(offsets.length, 301);
  assert.equal(await b.offsetForTimestamp("t", 0, ts + 1), 300);
  for (const n of idx.slice(0, 3)) assert.ok(existsSync(join(dir, n)), `${n} rebuilt`);
  const r = await b.fetch("t", 0, 123, { maxBytes: 1 });
  assert.equal(r.records[0].offset, 123);
  await b.close();
});

test("ENOSPC: producers get StorageFullError, acknowledged data stays, reads continue, writes resume", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  const b = await openBroker({ dataDir: tmp.dir, fs, retentionCheckIntervalMs: 0 });
  await b.createTopic("t");
  await fill(b, "t", 4);
  fs.failAlways("write", "ENOSPC", ".log");
  await assert.rejects(b.publish("t", "x", { partition: 0 }), (e: unknown) => e instanceof StorageFullError && e.retriable === true);
  const many = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => b.publish("t", `y${i}`, { partition: 0 })));
  assert.ok(many.every((r) => r.status === "rejected" && r.reason instanceof StorageFullError));
  const r = await b.fetch("t", 0, 0, { maxBytes: 1 << 20 });
  assert.equal(r.records.length, 20);
  fs.clearFaults();
  // A torn write (partial bytes on disk) followed by an error is rolled back too.
  fs.failNext("write", "ENOSPC", { pathIncludes: ".log", tornBytes: 30 });
  await assert.rejects(b.publish("t", "torn", { partition: 0 }), StorageFullError);
  const ok = await b.publish("t", "after", { partition: 0 });
  assert.equal(ok.offset, 20, "no gap, no reused acknowledged offset");
  await b.close();
  const b2 = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const all = await b2.fetch("t", 0, 0, { maxBytes: 1 << 20 });
  assert.equal(all.records.length, 21);
  assert.equal(all.records[20].value, "after");
  await b2.close();
});

test("EIO on fdatasync: the append fails, the partition is read-only until it has reopened itself from disk; nothing acknowledged is lost", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  const logger = captureLogger();
  const b = await openBroker({ dataDir: tmp.dir, fs, retentionCheckIntervalMs: 0, logger });
  await b.createTopic("t");
  await fill(b, "t", 2);
  fs.failNext("datasync", "EIO", { pathIncludes: ".log" });
  // Retriable: the same call succeeds once the partition is recovered.
  await assert.rejects(b.publish("t", "x", { partition: 0 }), (e: unknown) => e instanceof StorageError && e.retriable);
  assert.ok(logger.lines.some((l) => l.level === "error"), "the fault is logged at error level");
  assert.equal((await b.fetch("t", 0, 0, { maxBytes: 1 << 20 })).records.length, 10, "reads continue");
  // The partition reopens by itself (recovery re-verifies the files); appends resume at 10.
  const r = await waitUntil(() => b.publish("t", "y", { partition: 0 }).catch((e: unknown) => (e instanceof StorageError ? null : Promise.reject(e))), "recovery");
  assert.equal(r.offset, 10);
  assert.ok(logger.lines.some((l) => l.msg === "partition recovered from disk after an I/O error"));
  await b.close();
  const b2 = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  assert.equal((await b2.publish("t", "z", { partition: 0 })).offset, 11);
  await b2.close();
});

test("power loss drops only un-synced bytes: every acknowledged record survives, torn remains are cut", async () => {
  for (const torn of [0, 1, 57, 300]) {
    using tmp = tempDir();
    const fs = new FaultyFileSystem();
    const b = await openBroker({ dataDir: tmp.dir, fs, retentionCheckIntervalMs: 0 });
    await b.createTopic("t", { segmentBytes: 16 * 1024 });
    const acked: number[] = [];
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < 200; i++) pending.push(b.publish("t", `v${i}`, { partition: 0 }).then((r) => acked.push(r.offset)));
    await Promise.all(pending.slice(0, 150));
    // Stop syncing (the "power" goes before the rest becomes durable), then cut.
    fs.failAlways("datasync", "EIO");
    await Promise.allSettled(pending);
    await fs.powerLoss(torn);
    fs.clearFaults();
    const b2 = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    const { offsets, errors } = await readAll(b2, "t");
    assert.equal(errors.length, 0, "no torn record served");
    for (const o of acked) assert.ok(offsets.includes(o), `acknowledged offset ${o} survives (torn=${torn})`);
    const r = await b2.fetch("t", 0, 0, { maxBytes: 1 << 20 });
    for (const rec of r.records) assert.equal(rec.value, `v${rec.offset}`);
    await b2.close();
    await b.close().catch(() => {});
  }
});

test("corruption inside acknowledged data of the active segment is kept and reported, not truncated", async () => {
  using tmp = tempDir();
  const fs1 = new FaultyFileSystem();
  const b1 = await openBroker({ dataDir: tmp.dir, fs: fs1, retentionCheckIntervalMs: 0 });
  await b1.createTopic("t");
  await fill(b1, "t", 10);
  await fs1.crash("abandoned"); // killed: no clean shutdown
  const dir = partDir(tmp.dir, "t");
  const file = join(dir, logFiles(dir).at(-1)!);
  const pos = batchPositions(file);
  const bytes = readFileSync(file);
  bytes[pos[3].pos + 60] ^= 0x01;
  writeFileSync(file, bytes);
  const logger = captureLogger();
  const b2 = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0, logger });
  assert.equal((await b2.describeTopic("t")).partitions[0].highWatermark, 50, "nothing after the damage was dropped");
  const { offsets, errors } = await readAll(b2, "t");
  assert.equal(errors.length, 1);
  assert.equal(errors[0].offset, 15);
  assert.equal(offsets.length, 45);
  assert.ok(logger.lines.some((l) => l.level === "error"));
  await b2.close();
  await b1.close().catch(() => {});
});
