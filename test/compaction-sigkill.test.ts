// SPDX-License-Identifier: Apache-2.0
/**
 * SIGKILL during key compaction (CMP-2..CMP-5): a child process writes keyed records and
 * tombstones to a compacted topic with 4 KiB segments (they roll constantly), four batches in
 * flight, while it runs compaction passes back to back; this test SIGKILLs it at a random
 * moment after a pass started, again and again (SLUICE_COMPACT_KILLS, default 25; and until at
 * least 20 kills landed inside a pass). After every kill the log opens (recovery finishes or
 * discards interrupted swaps, CMP-3) and leaves no `.cleaned`/`.swap` file, and a full scan
 * from the log start shows: offsets strictly increasing, no record served twice, every batch's
 * offsets consistent (a gap only before a compacted batch, CMP-2), every acknowledged record
 * still there at its acknowledged offset unless a later record of its key is, and for every
 * key the latest acknowledged write (a tombstone too: deleteRetentionMs is long) or a later
 * one readable (CMP-4, CMP-5). At the end the background cleaner resumes: a pass completes
 * and the dirty ratio drops. A second, shorter run has tombstones expire at
 * once (deleteRetentionMs 0): there a key may vanish, but only after a tombstone was sent for
 * it, and never reads back an older value than its latest acknowledged write (CMP-5).
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { NodeFileSystem } from "../src/log/io.js";
import { BATCH_ATTR_COMPACTED, BATCH_ATTR_SPARSE, decodeRecords, readHeader } from "../src/log/record-batch.js";
import { MIN_CLEANABLE_DIRTY_RATIO } from "../src/log/cleaner.js";
import { CLEANED_SUFFIX, SWAP_SUFFIX } from "../src/log/segment-swap.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";
import { valueFor } from "./fixtures/crash-common.js";
import { killRound, type Ack } from "./fixtures/kill-rounds.js";

const KILLS = Number(process.env.SLUICE_COMPACT_KILLS ?? 25);
/** Kills that must land while a compaction pass was running (more rounds run until they did). */
const MID_PASS = Math.min(20, KILLS);
const TOPIC = "table";
const PARTITIONS = 2;
const KEYS = 24;

interface Model {
  /** Every acknowledged record, by sequence number. */
  bySeq: Map<number, Ack>;
  /** Per key, the acknowledged record at the highest offset. */
  latest: Map<string, Ack>;
  /** Keys a tombstone was sent for, acknowledged or not. */
  tombstoneKeys: Set<string>;
  /** Tombstones expire at once (deleteRetentionMs 0): a key may vanish after one (CMP-5). */
  expiring: boolean;
}

function note(m: Model, a: Ack): void {
  m.bySeq.set(a.seq, a);
  const l = m.latest.get(a.key);
  if (l === undefined || l.offset < a.offset) m.latest.set(a.key, a);
}

function leftovers(dataDir: string): string[] {
  const out: string[] = [];
  for (let p = 0; p < PARTITIONS; p++) {
    const dir = join(dataDir, "topics", TOPIC, String(p));
    for (const n of readdirSync(dir)) if (n.endsWith(CLEANED_SUFFIX) || n.endsWith(SWAP_SUFFIX)) out.push(join(String(p), n));
  }
  return out;
}

/** Base offsets of a partition's segments (from the file names: compaction keeps them, CMP-2). */
function segmentBases(dataDir: string, p: number): Set<number> {
  const names = readdirSync(join(dataDir, "topics", TOPIC, String(p)));
  return new Set(names.filter((n) => /^\d{20}\.log$/.test(n)).map((n) => Number(n.slice(0, 20))));
}

/**
 * The stored batches of a partition, walked raw: offsets consistent within each batch, and a
 * gap only before a batch the cleaner wrote or at a segment's base (CMP-2: a segment the
 * cleaner emptied keeps its range, so the next segment's first batch follows a gap). Returns
 * the offsets.
 */
async function batchOffsets(engine: DiskEngine, dataDir: string, p: number, from: number, hwm: number, where: string): Promise<number[]> {
  const bases = segmentBases(dataDir, p);
  const offsets: number[] = [];
  let prevEnd = from;
  for (let off = from; off < hwm; ) {
    const r = await engine.encoded.readRaw(TOPIC, p, off, 64 * 1024);
    assert.ok(r.nextOffset > off, `${where}: raw read at ${p}/${off} makes progress`);
    for (let pos = 0; pos < r.data.length; ) {
      const h = readHeader(r.data, pos);
      assert.ok(h.count > 0 && h.baseOffset >= prevEnd, `${where}: batch at ${p}/${h.baseOffset} starts at or after ${prevEnd}`);
      if (h.baseOffset > prevEnd && !bases.has(h.baseOffset)) assert.ok((h.attributes & BATCH_ATTR_COMPACTED) !== 0, `${where}: only a compacted batch follows a gap (${p}/${prevEnd}..${h.baseOffset})`);
      const recs = decodeRecords(r.data, pos, h);
      if ((h.attributes & BATCH_ATTR_SPARSE) === 0) {
        assert.deepEqual(recs.map((x) => x.offset), Array.from({ length: h.count }, (_, i) => h.baseOffset + i), `${where}: offsets within the batch at ${p}/${h.baseOffset}`);
      } else {
        // A sparse batch (compaction): some of its span's offsets, increasing, inside the span.
        const o = recs.map((x) => x.offset);
        assert.ok(o.length > 0 && o.every((x, i) => x >= h.baseOffset && x < h.baseOffset + h.count && (i === 0 || x > o[i - 1])), `${where}: offsets within the sparse batch at ${p}/${h.baseOffset}`);
      }
      offsets.push(...recs.map((x) => x.offset));
      prevEnd = h.baseOffset + h.count;
      pos += h.length;
    }
    off = r.nextOffset;
  }
  return offsets;
}

/** Full scan of every partition against the model; returns the number of records read. */
async function checkTable(b: Broker, engine: DiskEngine, dataDir: string, m: Model, where: string, raw: boolean): Promise<number> {
  const d = await b.describeTopic(TOPIC);
  const inLog = new Map<string, { offset: number; seq: number; tombstone: boolean }>();
  const seen = new Set<number>();
  let records = 0;
  for (const p of d.partitions) {
    assert.equal(p.logStartOffset, 0, `${where}: a compact-only topic keeps its log start`);
    const served: number[] = [];
    let prev = -1;
    for (let off = 0; off < p.highWatermark; ) {
      const r = await b.fetch(TOPIC, p.partition, off, { maxBytes: 64 * 1024 });
      assert.ok(r.nextOffset > off, `${where}: fetch at ${p.partition}/${off} makes progress`);
      for (const rec of r.records) {
        assert.ok(rec.offset > prev, `${where}: offset ${p.partition}/${rec.offset} after ${prev}: none served twice`);
        prev = rec.offset;
        served.push(rec.offset);
        const seq = Number(Buffer.from(rec.headers.seq as Uint8Array).toString());
        const key = Buffer.from(rec.key!).toString();
        assert.ok(!seen.has(seq), `${where}: seq ${seq} stored once`);
        seen.add(seq);
        const tombstone = rec.value === null;
        if (!tombstone) assert.ok(Buffer.from(rec.value as Uint8Array).equals(valueFor(seq)), `${where}: value of seq ${seq} byte-identical`);
        const a = m.bySeq.get(seq);
        if (a !== undefined) assert.deepEqual([p.partition, rec.offset, key, tombstone], [a.partition, a.offset, a.key, a.tombstone], `${where}: seq ${seq} where it was acknowledged`);
        inLog.set(key, { offset: rec.offset, seq, tombstone });
        records++;
      }
      off = r.nextOffset;
    }
    if (raw) assert.deepEqual(await batchOffsets(engine, dataDir, p.partition, 0, p.highWatermark, where), served, `${where}: fetch serves exactly the stored offsets of ${p.partition}`);
  }
  for (const [key, a] of m.latest) {
    const l = inLog.get(key);
    if (l === undefined && m.expiring && m.tombstoneKeys.has(key)) continue; // its tombstone expired: every older record went first (CMP-5)
    assert.ok(l !== undefined, `${where}: key ${key} (latest acknowledged: seq ${a.seq}${a.tombstone ? ", a tombstone" : ""}) is readable`);
    assert.ok(l.offset >= a.offset, `${where}: key ${key} reads its latest acknowledged write or a later one (${l.offset} >= ${a.offset})`);
    if (l.offset === a.offset) assert.equal(l.tombstone, a.tombstone, `${where}: key ${key} tombstone kept`);
  }
  return records;
}

async function open(dataDir: string, cleanerIntervalMs: number): Promise<{ b: Broker; engine: DiskEngine }> {
  const engine = new DiskEngine({ dataDir, fs: new NodeFileSystem(), cleanerIntervalMs });
  return { b: await openBroker({ engine, retentionCheckIntervalMs: 0 }), engine };
}

interface Scenario {
  kills: number;
  midPass: number;
  deleteRetentionMs: number;
}

async function killDuringCompaction(t: TestContext, o: Scenario): Promise<void> {
  using tmp = tempDir("sluice-compact-kill-");
  {
    const { b } = await open(tmp.dir, 0);
    await b.createTopic(TOPIC, { partitions: PARTITIONS, segmentBytes: 4096, cleanupPolicy: "compact", minCompactionLagMs: 0, deleteRetentionMs: o.deleteRetentionMs });
    await b.close();
  }
  const m: Model = { bySeq: new Map(), latest: new Map(), tombstoneKeys: new Set(), expiring: o.deleteRetentionMs === 0 };
  let kills = 0;
  let midPass = 0;
  let swapLeftovers = 0;
  let passes = 0;
  let rewritten = 0;
  let records = 0;
  const started = Date.now();
  while (kills < o.kills || midPass < o.midPass) {
    assert.ok(kills < 3 * o.kills, `only ${midPass} of ${kills} kills landed inside a compaction pass`);
    const r = await killRound({ mode: "compact", dataDir: tmp.dir, topic: TOPIC, startSeq: kills * 1_000_000, keys: KEYS, minAcks: 50 + Math.floor(Math.random() * 350) });
    kills++;
    if (r.midPass) midPass++;
    passes += r.passesCompleted;
    rewritten += r.work;
    for (const a of r.acks) note(m, a);
    for (const k of r.tombstoneKeys) m.tombstoneKeys.add(k);
    // What the kill left for recovery: a swap interrupted before or after its commit point.
    if (leftovers(tmp.dir).length > 0) swapLeftovers++;
    const { b, engine } = await open(tmp.dir, 0);
    try {
      assert.deepEqual(leftovers(tmp.dir), [], `after kill ${kills}: recovery removed or finished every swap (CMP-3)`);
      // The raw batch walk every few rounds and at the end (it doubles the scan's cost).
      records = await checkTable(b, engine, tmp.dir, m, `after kill ${kills}`, kills % 4 === 0);
    } finally {
      await b.close();
    }
  }

  // The background cleaner resumes on the recovered log: a pass completes and the dirty ratio
  // drops. It need not reclaim bytes: a kill after a pass's last swap but before its checkpoint
  // (CMP-6) leaves a log already compact that the checkpoint still calls dirty.
  const { b, engine } = await open(tmp.dir, 20);
  let reclaimed = 0;
  let mode = "";
  try {
    const before = (await b.describeTopic(TOPIC)).partitions.map((p) => p.cleanerDirtyRatio!);
    // A partition whose last pass finished (and checkpointed, CMP-6) before the last kill with
    // nothing written since is clean after the restart; the others have dirty bytes to resume on.
    const dirty = before.flatMap((x, i) => (x > 0 ? [i] : []));
    // The background cleaner only picks partitions at least MIN_CLEANABLE_DIRTY_RATIO dirty. If
    // the last kill left none that dirty, a pass is asked for explicitly on the recovered log.
    const cleanable = dirty.filter((i) => before[i] >= MIN_CLEANABLE_DIRTY_RATIO);
    if (cleanable.length === 0 && dirty.length > 0) await engine.compact();
    const expected = cleanable.length > 0 ? cleanable : dirty;
    mode = cleanable.length > 0 ? "background" : dirty.length > 0 ? "requested" : "no";
    let last: unknown = null;
    const after = await waitUntil(
      async () => {
        const ps = (await b.describeTopic(TOPIC)).partitions;
        last = ps.map((p) => ({ dirty: p.cleanerDirtyRatio, passes: p.cleanerPasses, lastCleanedAt: p.lastCleanedAt, bytesReclaimed: p.bytesReclaimed }));
        return expected.every((i) => ps[i].lastCleanedAt != null) ? ps : null;
      },
      () => `a ${mode} compaction pass on partitions ${expected} after the last kill (dirty ratios ${before}; last seen ${JSON.stringify(last)})`,
      30_000,
    );
    for (const i of expected) assert.ok(after[i].cleanerDirtyRatio! < before[i], `partition ${i}: dirty ratio dropped (${before[i]} -> ${after[i].cleanerDirtyRatio})`);
    reclaimed = after.reduce((s, p) => s + p.bytesReclaimed!, 0);
    records = await checkTable(b, engine, tmp.dir, m, "after the cleaner resumed", true);
  } finally {
    await b.close();
  }
  assert.deepEqual(leftovers(tmp.dir), []);
  t.diagnostic(
    `compaction SIGKILL (deleteRetentionMs ${o.deleteRetentionMs}): ${kills} kills, ${midPass} mid-pass, ${swapLeftovers} left a .cleaned/.swap file; ${m.bySeq.size} acked records, ${m.latest.size} keys, ${records} records after compaction; ` +
      `${passes} passes completed (${rewritten} segment rewrites); ${reclaimed} bytes reclaimed after the last restart (${mode} pass); ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
}

test(`SIGKILL during compaction x${KILLS} (>= ${MID_PASS} mid-pass): no latest value lost, nothing served twice, log readable, cleaner resumes`, { timeout: Math.max(180_000, KILLS * 15_000) }, (t) =>
  // Tombstones outlive the test: every key's latest acknowledged write, a tombstone too, stays.
  killDuringCompaction(t, { kills: KILLS, midPass: MID_PASS, deleteRetentionMs: 365 * 86_400_000 }),
);

const EXPIRING_KILLS = Math.max(8, Math.floor(KILLS / 3));
test(`SIGKILL during compaction with expiring tombstones x${EXPIRING_KILLS}: a key vanishes only after a tombstone, never back to an older value`, { timeout: Math.max(120_000, EXPIRING_KILLS * 15_000) }, (t) =>
  killDuringCompaction(t, { kills: EXPIRING_KILLS, midPass: Math.ceil(EXPIRING_KILLS * 0.75), deleteRetentionMs: 0 }),
);
