// SPDX-License-Identifier: Apache-2.0
/**
 * Durable-log figures beside the disk's own (docs/benchmarks.md, "storage" rows):
 *
 *  - key compaction throughput: MB/s of input of one compaction of a topic of N distinct keys
 *    (10 million; quick: 1 million), unthrottled and with the default I/O budget's figure
 *    stated, beside the disk's sequential write and read bandwidth measured in the same run;
 *    and the RSS of the process that compacts (a broker opened on the data dir, as after a
 *    restart), sampled from /proc. Write, compact and verify run in three child processes
 *    (compaction-child.ts) so each RSS is its own; the verify step fails the row if any key's
 *    latest value is wrong.
 *  - replay throughput from the segment archive against the online log: the same records in
 *    two topics, one with most of its segments archived and deleted locally, read from offset 0
 *    with fetch(4 MiB), alternating, the median of three each.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/index.js";
import { rawDiskSequential } from "./raw-disk.js";
import { measureRss, type BenchRow } from "./report.js";

export interface StorageBenchOptions {
  tmpDir: string;
  quick?: boolean;
  only?: Set<string> | null;
}

const DUR = "fdatasync per segment rewritten (cleaner)";
const CHILD = fileURLToPath(new URL("./compaction-child.js", import.meta.url));

function parseResult(stdout: string): Record<string, number | string | null> {
  const m = /^RESULT (.*)$/m.exec(stdout);
  if (!m) throw new Error(`no RESULT line in: ${stdout.slice(-500)}`);
  return JSON.parse(m[1]) as Record<string, number | string | null>;
}

async function compactionRows(tmp: string, keys: number): Promise<BenchRow[]> {
  const dir = join(tmp, "compaction");
  rmSync(dir, { recursive: true, force: true });
  const shape = `${keys.toLocaleString("en-US")} distinct keys (10-byte keys, 32 B values), then 10% updated and 1% deleted; 1 partition, 16 MiB segments; one compaction with the default 64 MiB key map, after a restart`;
  try {
    const w = spawnSync(process.execPath, [CHILD, "write", dir, String(keys)], { encoding: "utf8", maxBuffer: 1 << 20 });
    if (w.status !== 0) throw new Error(`write child failed: ${w.stderr.slice(-500)}`);
    const rss = await measureRss(CHILD, ["compact", dir, String(keys), "Infinity"], { timeoutMs: 1_200_000 });
    if (rss.exitCode !== 0) throw new Error(`compact child failed: ${rss.stderr.slice(-500)}`);
    const c = parseResult(rss.stdout);
    const v = spawnSync(process.execPath, [CHILD, "verify", dir, String(keys)], { encoding: "utf8", maxBuffer: 1 << 20 });
    const verified = v.status === 0 ? parseResult(v.stdout) : null;
    const check = verified ? `verified: every key's latest value, ${Number(verified.repeats).toLocaleString("en-US")} repeats (active segment)` : `VERIFY FAILED: ${/RESULT .*"error":"([^"]*)"/.exec(v.stdout)?.[1] ?? v.stderr.slice(-300)}`;
    const seq = rawDiskSequential(join(tmp, "raw-seq"), Math.min(Number(c.inputBytes), 1024 * 1024 * 1024));
    const mbps = Number(c.inputBytes) / 1e6 / (Number(c.compactMs) / 1000);
    const common = { table: "storage", shape };
    return [
      {
        ...common,
        name: "compaction input MB/s (unthrottled)",
        system: "sluice-embedded",
        durability: DUR,
        value: verified ? mbps : Number.NaN,
        unit: "MB/s",
        note: `${(Number(c.inputBytes) / 1e6).toFixed(0)} MB in ${(Number(c.compactMs) / 1000).toFixed(1)} s, ${c.passes} passes, ${(Number(c.bytesReclaimed) / 1e6).toFixed(1)} MB reclaimed; ${(mbps / seq.writeMbPerSec).toFixed(2)}x the disk's sequential write, ${(mbps / seq.readMbPerSec).toFixed(3)}x its read; default budget 33.6 MB/s read+written; ${check}`,
      },
      { ...common, name: "compaction input MB/s / disk sequential write MB/s", system: "sluice-embedded", durability: DUR, value: verified ? mbps / seq.writeMbPerSec : Number.NaN, unit: "x" },
      { ...common, name: "disk sequential write MB/s (1 MiB writes, one fdatasync)", system: "raw disk", durability: "one fdatasync at the end", value: seq.writeMbPerSec, unit: "MB/s" },
      { ...common, name: "disk sequential read MB/s (1 MiB reads, page cache)", system: "raw disk", durability: "n/a", value: seq.readMbPerSec, unit: "MB/s" },
      {
        ...common,
        name: `RSS compacting ${keys.toLocaleString("en-US")} distinct keys`,
        system: "sluice-embedded",
        durability: DUR,
        value: +(rss.peakRssBytes / 2 ** 20).toFixed(1),
        unit: "MB",
        note: `peak of the compacting process from /proc; goal < 300 MB: ${rss.peakRssBytes < 300 * 2 ** 20 ? "met" : "MISSED"}`,
      },
    ];
  } catch (err) {
    return [{ table: "storage", shape, name: "compaction input MB/s (unthrottled)", system: "sluice-embedded", durability: DUR, value: Number.NaN, unit: "MB/s", note: `unavailable: ${(err as Error).message}` }];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Reads a topic's partition 0 from offset 0 to its end; bytes of values and seconds. */
async function replay(b: Awaited<ReturnType<typeof openBroker>>, topic: string): Promise<{ records: number; secs: number }> {
  const p = (await b.describeTopic(topic)).partitions[0];
  let records = 0;
  const t0 = performance.now();
  for (let off = 0; off < p.highWatermark; ) {
    const r = await b.fetch(topic, 0, off, { maxBytes: 4 * 1024 * 1024 });
    records += r.records.length;
    off = r.nextOffset;
  }
  return { records, secs: (performance.now() - t0) / 1000 };
}

async function archiveRows(tmp: string, records: number): Promise<BenchRow[]> {
  const dir = join(tmp, "archive-bench");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const recordBytes = 200;
  const shape = `${records.toLocaleString("en-US")} records of ${recordBytes} B, 1 partition, 8 MiB segments; fetch(4 MiB) from offset 0 to the end; median of 3 alternating runs`;
  const b = await openBroker({ dataDir: join(dir, "data"), retentionCheckIntervalMs: 0 });
  try {
    const segmentBytes = 8 * 1024 * 1024;
    await b.createTopic("online", { partitions: 1, segmentBytes });
    await b.createTopic("archived", { partitions: 1, segmentBytes, retentionBytes: segmentBytes, archive: { dir: join(dir, "archive") } });
    const value = Buffer.alloc(recordBytes, 0x61);
    const batch = Array.from({ length: 1000 }, () => ({ value, partition: 0 }));
    for (let n = 0; n < records; n += batch.length) await Promise.all([b.publishBatch("online", batch), b.publishBatch("archived", batch)]);
    await b.enforceRetention();
    const a = (await b.describeTopic("archived")).partitions[0];
    const runs: Record<string, number[]> = { online: [], archived: [] };
    for (let i = 0; i < 3; i++) {
      for (const t of ["online", "archived"]) {
        const r = await replay(b, t);
        if (r.records !== records) throw new Error(`${t}: replay read ${r.records} of ${records} records`);
        runs[t].push((r.records * recordBytes) / 1e6 / r.secs);
      }
    }
    const med = (xs: number[]): number => [...xs].sort((x, y) => x - y)[1];
    const name = "replay from offset 0 MB/s (values)";
    const note = `${a.archivedSegments ?? "?"} segments (${((a.archivedBytes ?? 0) / 1e6).toFixed(0)} MB) read from the archive, the rest online; each archived segment verified (CRC-32C and SHA-256) when first read`;
    return [
      { table: "storage", shape, name, system: "sluice online segments", durability: "fdatasync before ack", value: med(runs.online), unit: "MB/s", min: Math.min(...runs.online), max: Math.max(...runs.online), reps: 3 },
      { table: "storage", shape, name, system: "sluice archive (filesystem)", durability: "copied and verified before local delete", value: med(runs.archived), unit: "MB/s", min: Math.min(...runs.archived), max: Math.max(...runs.archived), reps: 3, note },
      { table: "storage", shape, name: "replay from the archive / from online segments", system: "sluice archive (filesystem)", durability: "n/a", value: med(runs.archived) / med(runs.online), unit: "x" },
    ];
  } catch (err) {
    return [{ table: "storage", shape, name: "replay from offset 0 MB/s (values)", system: "sluice archive (filesystem)", durability: "n/a", value: Number.NaN, unit: "MB/s", note: `unavailable: ${(err as Error).message}` }];
  } finally {
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function runStorageBench(opts: StorageBenchOptions): Promise<BenchRow[]> {
  mkdirSync(opts.tmpDir, { recursive: true });
  const rows: BenchRow[] = [];
  if (!opts.only || opts.only.has("compaction")) rows.push(...(await compactionRows(opts.tmpDir, opts.quick ? 1_000_000 : 10_000_000)));
  if (!opts.only || opts.only.has("archive-replay")) rows.push(...(await archiveRows(opts.tmpDir, opts.quick ? 200_000 : 1_000_000)));
  for (const r of rows) console.log(`  ${r.name} [${r.system}]: ${Number.isNaN(r.value) ? r.note : `${r.unit === "x" ? r.value.toPrecision(3) : r.value.toFixed(1)} ${r.unit}`}`);
  return rows;
}
