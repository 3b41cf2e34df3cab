// SPDX-License-Identifier: Apache-2.0
/**
 * Archiving is crash safe (ARC-1): a crash at every I/O operation of archiving one segment and
 * deleting it (FaultyFileSystem's crash model: the file system freezes at operation k, then a
 * power loss drops or tears whatever was not durable) loses nothing. After reopening, every
 * record written is readable, locally or from the archive; a segment missing locally has a
 * verified archive copy; and archiving again after the crash completes and keeps it so.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FsArchiveStore } from "../src/log/archive/fs-archive-store.js";
import { objectKey, partitionPrefix } from "../src/log/archive/manifest.js";
import { PartitionArchive } from "../src/log/archive/partition-archive.js";
import { verifyObject } from "../src/log/archive/segment-archiver.js";
import { restoreRange } from "../src/log/archive/restore.js";
import type { FileSystem } from "../src/log/io.js";
import { PartitionLog, type LogConfig } from "../src/log/partition-log.js";
import type { PreparedRecord } from "../src/log/record-batch.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";

const CONFIG: LogConfig = { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 };
const BATCHES = 10;
const TOPIC = "t";
const TOPIC_ID = "00000000-0000-4000-8000-000000000001";

function batch(i: number): PreparedRecord[] {
  return [0, 1, 2].map((j) => ({ key: Buffer.from(`k${j}`), value: Buffer.from(`value ${i}.${j} `.repeat(8)), valueKind: 0 as const, timestamp: 1_000_000 + i, headers: null }));
}

function openLog(fs: FileSystem, root: string): Promise<PartitionLog> {
  const store = new FsArchiveStore(fs, join(root, "archive"));
  const target = { topic: TOPIC, topicId: TOPIC_ID, partition: 0, prefix: partitionPrefix(TOPIC, TOPIC_ID, 0) };
  return PartitionLog.open({
    fs,
    dir: join(root, "data", "p0"),
    topic: TOPIC,
    partition: 0,
    config: CONFIG,
    preallocate: "off",
    archive: (logStart) => PartitionArchive.open({ fs, store, target, logger: silent, retentionMs: () => -1 }, logStart),
  });
}

const silent = { info() {}, warn() {}, error() {}, debug() {}, trace() {}, fatal() {}, child: () => silent } as never;

/** Every record, offset by offset, as "<offset>:<value>" (reads go to the archive below the online start). */
async function readAll(log: PartitionLog): Promise<string[]> {
  const out: string[] = [];
  let off = log.logStartOffset;
  while (off < log.highWatermark) {
    const r = await log.read(off, 4096);
    for (const rec of r.records) out.push(`${rec.offset}:${rec.value!.toString()}`);
    if (r.nextOffset <= off) throw new Error(`no progress at ${off}`);
    off = r.nextOffset;
  }
  return out;
}

async function withTimeout(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p.catch(() => {}), new Promise((r) => (timer = setTimeout(r, ms)))]);
  clearTimeout(timer);
}

interface Run {
  ops: number;
  problems: string[];
}

async function runAt(k: number, seed: number, expected: string[] | null): Promise<Run & { written: string[] }> {
  const root = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-arccp-"));
  mkdirSync(join(root, "data"));
  const problems: string[] = [];
  try {
    const fs = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch") } });
    const log = await openLog(fs, root);
    for (let i = 0; i < BATCHES; i++) await log.append(batch(i));
    const written = await readAll(log);
    const segs = log.describeSegments();
    if (segs.length < 3) problems.push(`only ${segs.length} segments rolled`);
    const base = fs.opCount;
    fs.crashAtOp(base + k);
    // Archive and delete the first segment: every I/O operation from here is a crash point.
    await Promise.race([log.advanceLogStart(segs[0].endOffset).catch(() => {}), fs.whenCrashed()]);
    const ops = fs.opCount - base;
    if (!fs.isCrashed) fs.crash("power lost after archiving");
    await withTimeout(log.close(), 2000);
    await fs.powerLoss({ seed: seed * 7919 + k, mode: "mixed" });
    fs.dispose();

    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2") } });
    try {
      const log2 = await openLog(fs2, root);
      try {
        const want = expected ?? written;
        const got = await readAll(log2);
        if (log2.logStartOffset !== 0) problems.push(`log start ${log2.logStartOffset}, expected 0`);
        if (JSON.stringify(got) !== JSON.stringify(want)) problems.push(`records differ after recovery: ${got.length} of ${want.length}`);
        const local = log2.describeSegments();
        if (local[0].baseOffset > 0) {
          // Gone locally: its archive copy must be there and verify (ARC-1).
          const m = log2.archive!.list()[0];
          if (m === undefined || m.baseOffset !== 0 || m.endOffset !== local[0].baseOffset) problems.push(`segment 0 deleted locally without a manifest: ${JSON.stringify(m)}`);
          else await verifyObject(new FsArchiveStore(fs2, join(root, "archive")), objectKey(partitionPrefix(TOPIC, TOPIC_ID, 0), 0, "log"), m).catch((e: Error) => problems.push(`archived copy does not verify: ${e.message}`));
        }
        // Archiving again after the crash completes (idempotent) and loses nothing.
        await log2.advanceLogStart(segs[1].endOffset);
        const again = await readAll(log2);
        if (JSON.stringify(again) !== JSON.stringify(want)) problems.push(`records differ after archiving again: ${again.length} of ${want.length}`);
        if (log2.describeSegments()[0].baseOffset !== segs[1].endOffset) problems.push("second archive run did not delete the archived segments");
      } finally {
        await log2.close();
      }
    } catch (e) {
      problems.push(`recovery failed: ${(e as Error).stack}`);
    } finally {
      fs2.dispose();
    }
    return { ops, problems, written };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

test("archiving a segment survives a crash and power loss at every I/O operation (ARC-1)", { timeout: 600_000 }, async (t) => {
  const seed = Number(process.env.SLUICE_SEED ?? 1);
  const dry = await runAt(Number.MAX_SAFE_INTEGER, seed, null);
  assert.deepEqual(dry.problems, [], "the workload without a crash");
  assert.equal(dry.written.length, BATCHES * 3);
  assert.ok(dry.ops > 10, `archiving and deleting a segment takes ${dry.ops} I/O operations`);
  const failures: string[] = [];
  for (let k = 0; k <= dry.ops; k++) {
    const r = await runAt(k, seed, dry.written);
    for (const p of r.problems) failures.push(`k=${k}: ${p}`);
  }
  t.diagnostic(`${dry.ops + 1} crash points, ${failures.length} problems`);
  assert.deepEqual(failures.slice(0, 20), []);
});

/** Restores the archived range at crash point k: the partition is as before or fully restored, never between (ARC-5). */
async function restoreAt(k: number, seed: number): Promise<Run & { written: string[] }> {
  const root = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-arcrs-"));
  mkdirSync(join(root, "data"));
  const problems: string[] = [];
  try {
    const fs = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch") } });
    const log = await openLog(fs, root);
    for (let i = 0; i < BATCHES; i++) await log.append(batch(i));
    const written = await readAll(log);
    const segs = log.describeSegments();
    await log.advanceLogStart(segs[2].endOffset);
    const archivedStart = log.onlineLogStartOffset;
    await log.close();
    const base = fs.opCount;
    fs.crashAtOp(base + k);
    const store = new FsArchiveStore(fs, join(root, "archive"));
    await Promise.race([restoreRange(fs, store, partitionPrefix(TOPIC, TOPIC_ID, 0), join(root, "data", "p0"), 0).catch(() => {}), fs.whenCrashed()]);
    const ops = fs.opCount - base;
    if (!fs.isCrashed) fs.crash("power lost after the restore");
    await fs.powerLoss({ seed: seed * 7919 + k, mode: "mixed" });
    fs.dispose();
    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2") } });
    try {
      const log2 = await openLog(fs2, root);
      try {
        const online = log2.onlineLogStartOffset;
        if (online !== 0 && online !== archivedStart) problems.push(`online log start ${online}: neither before (${archivedStart}) nor after (0) the restore`);
        const got = await readAll(log2);
        if (JSON.stringify(got) !== JSON.stringify(written)) problems.push(`records differ after recovery: ${got.length} of ${written.length}`);
        if (online === 0 && log2.describeSegments()[0].baseOffset !== 0) problems.push("log start 0 without the restored segment");
        if (k === Number.MAX_SAFE_INTEGER && online !== 0) problems.push(`a completed restore left the online log start at ${online}`);
      } finally {
        await log2.close();
      }
    } catch (e) {
      problems.push(`recovery failed: ${(e as Error).stack}`);
    } finally {
      fs2.dispose();
    }
    return { ops, problems, written };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

test("restoring archived segments survives a crash and power loss at every I/O operation: all or nothing (ARC-5)", { timeout: 600_000 }, async (t) => {
  const seed = Number(process.env.SLUICE_SEED ?? 1);
  const dry = await restoreAt(Number.MAX_SAFE_INTEGER, seed);
  assert.deepEqual(dry.problems, [], "the restore without a crash");
  assert.ok(dry.ops > 10, `restoring takes ${dry.ops} I/O operations`);
  const failures: string[] = [];
  for (let k = 0; k <= dry.ops; k++) {
    const r = await restoreAt(k, seed);
    for (const p of r.problems) failures.push(`k=${k}: ${p}`);
  }
  t.diagnostic(`${dry.ops + 1} crash points, ${failures.length} problems`);
  assert.deepEqual(failures.slice(0, 20), []);
});
