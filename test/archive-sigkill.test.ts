// SPDX-License-Identifier: Apache-2.0
/**
 * SIGKILL during segment archiving (ARC-1, ARC-2, ARC-4, LOG-6): a child process writes to a
 * topic with an `archive`, 4 KiB segments and size retention of two segments, four batches in
 * flight, while it runs retention passes back to back (each archives the segments it is about
 * to delete, verified, before the new log start is written); this test SIGKILLs it at a random
 * moment after a pass started, again and again (SLUICE_ARCHIVE_KILLS, default 25; and until at
 * least 20 kills landed inside a pass). After every kill, before recovery: every offset below
 * the durable log start has a manifest (nothing was deleted locally without a verified copy).
 * After recovery: a replay from offset 0 through the broker (the archive serves what is below
 * the online log start) returns every acknowledged record exactly once, byte-identical, at its
 * acknowledged offset, offsets contiguous. At the end `sluice archive verify` reports the
 * archive sound, whatever partial objects the kills left.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/broker/broker.js";
import { dataBase, manifestBase, parseManifest } from "../src/log/archive/manifest.js";
import { PARTITION_META_FILE } from "../src/log/log-loader.js";
import { tempDir } from "../src/testing/helpers.js";
import { valueFor } from "./fixtures/crash-common.js";
import { killRound, type Ack } from "./fixtures/kill-rounds.js";

const KILLS = Number(process.env.SLUICE_ARCHIVE_KILLS ?? 25);
/** Kills that must land while a retention pass was running (more rounds run until they did). */
const MID_PASS = Math.min(20, KILLS);
const TOPIC = "events";
const PARTITIONS = 2;
const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

/** Every file under `dir`, as paths relative to it. */
function walk(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const p = rel === "" ? e.name : join(rel, e.name);
    if (e.isDirectory()) out.push(...walk(dir, p));
    else out.push(p);
  }
  return out;
}

interface ArchiveFiles {
  /** Per partition, the manifests' [base, end) ranges, ascending. */
  ranges: Map<number, [number, number][]>;
  /** Temp files of interrupted puts, and data objects without a manifest. */
  partial: number;
}

function archiveFiles(archiveDir: string): ArchiveFiles {
  const ranges = new Map<number, [number, number][]>();
  const files = existsSync(archiveDir) ? walk(archiveDir) : [];
  const manifests = new Set<string>();
  let partial = 0;
  for (const f of files) {
    if (manifestBase(f) === null) continue;
    const m = parseManifest(readFileSync(join(archiveDir, f)));
    assert.ok(m !== null, `manifest ${f} is whole (puts are atomic)`);
    manifests.add(f.replace(/\.manifest\.json$/, ""));
    const list = ranges.get(m.partition) ?? [];
    list.push([m.baseOffset, m.endOffset]);
    ranges.set(m.partition, list);
  }
  for (const f of files) {
    if (/(^|\/)\.[^/]*\.tmp$/.test(f)) partial++;
    else if (dataBase(f) !== null && !manifests.has(f.replace(/\.(log|index|timeindex)$/, ""))) partial++;
  }
  for (const list of ranges.values()) list.sort((a, b) => a[0] - b[0]);
  return { ranges, partial };
}

/** ARC-1 on disk: the offsets below each partition's durable log start are all archived. */
function checkArchivedBelowLogStart(dataDir: string, a: ArchiveFiles, where: string): number {
  let archived = 0;
  for (let p = 0; p < PARTITIONS; p++) {
    const meta = join(dataDir, "topics", TOPIC, String(p), PARTITION_META_FILE);
    const logStart = existsSync(meta) ? (JSON.parse(readFileSync(meta, "utf8")) as { logStartOffset: number }).logStartOffset : 0;
    let covered = 0;
    for (const [base, end] of a.ranges.get(p) ?? []) {
      if (base > covered) break;
      covered = Math.max(covered, end);
      archived++;
    }
    assert.ok(covered >= logStart, `${where}: partition ${p}: offsets [0, ${logStart}) deleted locally, but only [0, ${covered}) archived`);
  }
  return archived;
}

/** Replays every partition from offset 0 through a fresh broker; returns the records read. */
async function replay(dataDir: string, acked: Map<number, Ack>, where: string): Promise<number> {
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  const seen = new Set<number>();
  try {
    for (const p of (await b.describeTopic(TOPIC)).partitions) {
      assert.equal(p.logStartOffset, 0, `${where}: partition ${p.partition} starts at 0 (the archive's start)`);
      let expected = 0;
      while (expected < p.highWatermark) {
        const r = await b.fetch(TOPIC, p.partition, expected, { maxBytes: 256 * 1024 });
        assert.ok(r.records.length > 0, `${where}: fetch at ${p.partition}/${expected} returns records`);
        for (const rec of r.records) {
          assert.equal(rec.offset, expected, `${where}: offsets contiguous in partition ${p.partition}`);
          expected++;
          const seq = Number(Buffer.from(rec.headers.seq as Uint8Array).toString());
          assert.ok(!seen.has(seq), `${where}: seq ${seq} served once`);
          seen.add(seq);
          assert.ok(Buffer.from(rec.value as Uint8Array).equals(valueFor(seq)), `${where}: value of seq ${seq} byte-identical`);
          const a = acked.get(seq);
          if (a !== undefined) assert.deepEqual([p.partition, rec.offset], [a.partition, a.offset], `${where}: seq ${seq} at its acknowledged offset`);
        }
        assert.equal(r.nextOffset, expected);
      }
    }
  } finally {
    await b.close();
  }
  for (const seq of acked.keys()) assert.ok(seen.has(seq), `${where}: acknowledged seq ${seq} replayed`);
  return seen.size;
}

test(`SIGKILL during archiving x${KILLS} (>= ${MID_PASS} mid-pass): every acknowledged record replays once from the archive and the log`, { timeout: Math.max(180_000, KILLS * 15_000) }, async (t) => {
  using tmp = tempDir("sluice-archive-kill-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  {
    const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
    await b.createTopic(TOPIC, { partitions: PARTITIONS, segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    await b.close();
  }
  const acked = new Map<number, Ack>();
  let kills = 0;
  let midPass = 0;
  let partialKills = 0;
  let passes = 0;
  let records = 0;
  let archived = 0;
  const started = Date.now();
  while (kills < KILLS || midPass < MID_PASS) {
    assert.ok(kills < 3 * KILLS, `only ${midPass} of ${kills} kills landed inside a retention pass`);
    const r = await killRound({ mode: "archive", dataDir, topic: TOPIC, startSeq: kills * 1_000_000, keys: 64, minAcks: 50 + Math.floor(Math.random() * 350) });
    kills++;
    if (r.midPass) midPass++;
    passes += r.passesCompleted;
    for (const a of r.acks) acked.set(a.seq, a);
    // Before recovery: what the kill left, and ARC-1 (no local deletion without an archived copy).
    const files = archiveFiles(archiveDir);
    if (files.partial > 0) partialKills++;
    archived = checkArchivedBelowLogStart(dataDir, files, `after kill ${kills}`);
    records = await replay(dataDir, acked, `after kill ${kills}`);
  }
  const v = spawnSync(process.execPath, [CLI, "archive", "verify", "--dir", archiveDir, "--json"], { encoding: "utf8", timeout: 60_000 });
  assert.equal(v.status, 0, `sluice archive verify: ${v.stdout}${v.stderr}`);
  const report = JSON.parse(v.stdout) as { ok: boolean; segments: number; problems: unknown[] };
  assert.deepEqual([report.ok, report.problems], [true, []]);
  assert.ok(report.segments >= archived && archived > 0, `${report.segments} archived segments verified`);
  t.diagnostic(
    `archive SIGKILL: ${kills} kills, ${midPass} mid-pass, ${partialKills} left partial archive objects; ${acked.size} acked records, ${records} replayed; ` +
      `${passes} retention passes completed; ${report.segments} segments archived and verified; ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
});
