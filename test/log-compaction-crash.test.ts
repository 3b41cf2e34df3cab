// SPDX-License-Identifier: Apache-2.0
/**
 * Crash safety of compaction's segment swap (CMP-3, src/log/segment-swap.ts): every I/O
 * operation of one compaction run is a crash point. At each, the file system freezes, power
 * is lost (un-synced state dropped, kept or torn, seeded), and the partition is reopened:
 * every acknowledged record's key must read back with its latest value, no offset is served
 * twice, the whole log reads without damage, no swap leftovers remain, and compaction then
 * completes on the reopened log.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { NodeFileSystem, type FileSystem } from "../src/log/io.js";
import { PartitionLog, type LogConfig } from "../src/log/partition-log.js";
import type { StoredRecord } from "../src/log/record-batch.js";
import { FaultyFileSystem, type PowerLossMode } from "../src/testing/faulty-fs.js";
import { tempDir } from "../src/testing/helpers.js";

const T0 = 1_000_000;
const RECORDS = 96;
const config: LogConfig = { segmentBytes: 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 1024, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1, cleanupPolicy: "compact", minCompactionLagMs: 0, deleteRetentionMs: 1e12 };

/** Record i: key k(i % 5), a tombstone every 7th. */
function rec(i: number): { key: string; value: string | null } {
  return { key: `k${i % 5}`, value: i % 7 === 6 ? null : `value-${i}-${"y".repeat(20)}` };
}

async function writeWorkload(fs: FileSystem, dir: string): Promise<PartitionLog> {
  const log = await PartitionLog.open({ fs, dir, topic: "t", partition: 0, config, preallocate: "off" });
  for (let i = 0; i < RECORDS; i += 2) {
    const recs = [i, i + 1].map((j) => {
      const r = rec(j);
      return { key: Buffer.from(r.key), value: r.value === null ? null : Buffer.from(r.value), valueKind: 1 as const, timestamp: T0 + j, headers: null };
    });
    await log.append(recs);
  }
  return log;
}

async function readAll(log: PartitionLog): Promise<StoredRecord[]> {
  const out: StoredRecord[] = [];
  let off = log.logStartOffset;
  while (off < log.highWatermark) {
    const r = await log.read(off, 512);
    out.push(...r.records);
    assert.ok(r.nextOffset > off);
    off = r.nextOffset;
  }
  return out;
}

async function checkLog(log: PartitionLog, where: string): Promise<void> {
  assert.equal(log.highWatermark, RECORDS, `${where}: every acknowledged record is there`);
  const all = await readAll(log);
  let prev = -1;
  for (const r of all) {
    assert.ok(r.offset > prev, `${where}: offset ${r.offset} served once, in order`);
    prev = r.offset;
    const m = rec(r.offset);
    assert.equal(r.key!.toString(), m.key, `${where}: key at ${r.offset}`);
    assert.equal(r.value === null ? null : r.value.toString(), m.value, `${where}: value at ${r.offset}`);
  }
  const offsets = new Set(all.map((r) => r.offset));
  for (let k = 0; k < 5; k++) {
    let latest = -1;
    for (let i = 0; i < RECORDS; i++) if (i % 5 === k) latest = i;
    assert.ok(offsets.has(latest), `${where}: the latest record of k${k} (offset ${latest}) is readable`);
  }
}

/** The bytes of every sealed segment file of a partition directory, by name. */
function sealedFiles(dir: string): Map<string, Buffer> {
  const logs = readdirSync(dir).filter((n) => /^\d{20}\.log$/.test(n)).sort();
  return new Map(logs.slice(0, -1).map((n) => [n, readFileSync(join(dir, n))]));
}

function leftovers(dir: string): string[] {
  return readdirSync(dir).filter((n) => n.endsWith(".cleaned") || n.endsWith(".swap"));
}

test("compaction swap: a crash at every I/O operation of a compaction run leaves each segment wholly old or new (CMP-3)", async () => {
  using tmp = tempDir("sluice-compact-crash-");
  // The run without a crash: how many operations compaction makes.
  const countDir = join(tmp.dir, "count");
  mkdirSync(countDir);
  const fs0 = new FaultyFileSystem({ crashModel: { scratchDir: join(tmp.dir, "scratch-count") } });
  const log0 = await writeWorkload(fs0, countDir);
  const before = fs0.opCount;
  const oldFiles = sealedFiles(countDir);
  const res = await log0.compact(T0 + RECORDS);
  const newFiles = sealedFiles(countDir);
  const ops = fs0.opCount - before;
  assert.ok(res.segmentsRewritten >= 3, `compaction rewrote ${res.segmentsRewritten} segments`);
  await checkLog(log0, "no crash");
  await log0.close();
  fs0.dispose();
  const modes: PowerLossMode[] = ["drop", "keep", "mixed"];
  let crashed = 0;
  for (let k = 0; k <= ops; k++) {
    const mode = modes[k % modes.length];
    const dir = join(tmp.dir, `k${k}`);
    mkdirSync(dir);
    const fs = new FaultyFileSystem({ crashModel: { scratchDir: join(tmp.dir, `scratch-${k}`) } });
    const log = await writeWorkload(fs, dir);
    assert.equal(fs.opCount, before, "the workload is deterministic");
    fs.crashAtOp(before + k);
    await log.compact(T0 + RECORDS).catch(() => {
      crashed++;
    });
    await fs.powerLoss({ mode, seed: k });
    fs.dispose();
    const where = `crash at operation ${k} of ${ops} (${mode})`;
    const reopened = await PartitionLog.open({ fs: new NodeFileSystem(), dir, topic: "t", partition: 0, config, preallocate: "off" });
    try {
      assert.deepEqual(leftovers(dir), [], `${where}: recovery finished or discarded the swap`);
      const files = sealedFiles(dir);
      assert.deepEqual([...files.keys()], [...oldFiles.keys()], `${where}: the same segments`);
      for (const [n, bytes] of files) {
        assert.ok(bytes.equals(oldFiles.get(n)!) || bytes.equals(newFiles.get(n)!), `${where}: ${n} is wholly the old or wholly the compacted segment`);
      }
      await checkLog(reopened, where);
      await reopened.compact(T0 + RECORDS);
      await checkLog(reopened, `${where}, compacted again`);
    } finally {
      await reopened.close();
    }
  }
  // A crash while the last segment's indexes are written does not fail the run: indexes are
  // rebuildable hints (IDX-1), written after the swap and not synced.
  assert.ok(crashed > ops / 2, `compaction failed at the crash points (${crashed} of ${ops})`);
});
