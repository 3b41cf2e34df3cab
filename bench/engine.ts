// SPDX-License-Identifier: Apache-2.0
/**
 * Storage engine figures (issue 2, item 7): append throughput and latency with
 * durability "always" for 100 B and 1 KiB records at several batch sizes, sequential read
 * throughput, the raw limit of this disk (plain write + fdatasync per batch of the same bytes)
 * measured in the same run, and RSS while retaining 10 million records.
 */
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/index.js";
import { rawDiskAppend } from "./raw-disk.js";
import { measureRss, summarizeLatencies, type BenchRow } from "./report.js";

export interface EngineBenchOptions {
  tmpDir: string;
  quick?: boolean;
  /** Records retained for the RSS figure (default 10 million; quick: 1 million). */
  rssRecords?: number;
}

const DUR = "fdatasync before ack (group commit)";

async function appendRun(dir: string, recordBytes: number, batch: number, inFlight: number, durationMs: number) {
  rmSync(dir, { recursive: true, force: true });
  const b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("bench", { partitions: 1 });
  const value = Buffer.alloc(recordBytes, 0x61);
  const records = Array.from({ length: batch }, () => ({ value }));
  // Warm up (JIT, first segment file) without timing.
  for (let i = 0; i < 20; i++) await b.publishBatch("bench", records);
  const lat: number[] = [];
  let n = 0;
  const t0 = performance.now();
  const end = t0 + durationMs;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < end) {
        const s = performance.now();
        await b.publishBatch("bench", records);
        lat.push(performance.now() - s);
        n += batch;
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  // Sequential read of everything just written.
  const r0 = performance.now();
  let read = 0;
  let off = 0;
  const hwm = (await b.describeTopic("bench")).partitions[0].highWatermark;
  while (off < hwm) {
    const r = await b.fetch("bench", 0, off, { maxBytes: 4 * 1024 * 1024 });
    read += r.records.length;
    off = r.nextOffset;
  }
  const readSecs = (performance.now() - r0) / 1000;
  await b.close();
  rmSync(dir, { recursive: true, force: true });
  const s = summarizeLatencies(lat);
  return { recsPerSec: n / secs, mbPerSec: (n * recordBytes) / secs / 1e6, p50: s.p50Ms, p99: s.p99Ms, readRecsPerSec: read / readSecs, readMbPerSec: (read * recordBytes) / readSecs / 1e6 };
}

export async function runEngineBench(opts: EngineBenchOptions): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  const dir = join(opts.tmpDir, "engine");
  mkdirSync(opts.tmpDir, { recursive: true });
  const durationMs = opts.quick ? 1000 : 3000;
  const configs: [number, number, number][] = [
    [100, 1, 64],
    [100, 10, 16],
    [100, 100, 8],
    [100, 1000, 8],
    [1024, 1, 64],
    [1024, 100, 8],
    [1024, 1000, 16],
  ];
  for (const [size, batch, inFlight] of configs) {
    // This shared disk's speed swings by 2x within seconds, so where sluice is compared with the
    // raw limit both are measured in interleaved rounds (sluice, raw, sluice, raw) and the best
    // round of each is kept: the same treatment for both sides.
    const rounds = batch >= 100 && !opts.quick ? 2 : 1;
    let r = await appendRun(dir, size, batch, inFlight, durationMs);
    let raw: Awaited<ReturnType<typeof rawDiskAppend>> | null = null;
    for (let round = 0; round < rounds; round++) {
      if (round > 0) {
        const again = await appendRun(dir, size, batch, inFlight, durationMs);
        if (again.recsPerSec > r.recsPerSec) r = again;
      }
      if (batch >= 100) {
        mkdirSync(dir, { recursive: true });
        const x = await rawDiskAppend({ dir, recordBytes: size, recordsPerBatch: batch, batches: 1_000_000, maxDurationMs: durationMs });
        rmSync(dir, { recursive: true, force: true });
        if (raw === null || x.mbPerSec > raw.mbPerSec) raw = x;
      }
    }
    const label = `append ${size} B x ${batch}/batch, ${inFlight} in flight`;
    rows.push({ name: `${label}: records/s`, system: "sluice", durability: DUR, value: Math.round(r.recsPerSec), unit: "rec/s" });
    rows.push({ name: `${label}: MB/s`, system: "sluice", durability: DUR, value: +r.mbPerSec.toFixed(1), unit: "MB/s" });
    rows.push({ name: `${label}: batch latency p50`, system: "sluice", durability: DUR, value: +r.p50.toFixed(3), unit: "ms" });
    rows.push({ name: `${label}: batch latency p99`, system: "sluice", durability: DUR, value: +r.p99.toFixed(3), unit: "ms" });
    if (raw !== null) {
      rows.push({ name: `sequential read ${size} B (after ${label})`, system: "sluice", durability: "-", value: Math.round(r.readRecsPerSec), unit: "rec/s", note: `${r.readMbPerSec.toFixed(1)} MB/s` });
      // The raw limit for the same bytes: one write + fdatasync per batch, in this run.
      rows.push({ name: `${label}: MB/s`, system: "raw disk", durability: "write + fdatasync per batch", value: +raw.mbPerSec.toFixed(1), unit: "MB/s", note: `${Math.round(raw.recordsPerSec)} rec/s; best of ${rounds} round(s)` });
      rows.push({
        name: `append ${size} B x ${batch}: sluice / raw disk limit`,
        system: "ratio",
        durability: DUR,
        value: +(r.mbPerSec / raw.mbPerSec).toFixed(3),
        unit: "x",
        note: `goal >= 0.6: ${r.mbPerSec / raw.mbPerSec >= 0.6 ? "met" : "MISSED"}${size === 100 && batch === 1000 ? `; goal >= 1,000,000 rec/s: ${r.recsPerSec >= 1e6 ? "met" : "MISSED"}` : ""}`,
      });
    }
  }
  // RSS while retaining many records (child process, sampled from /proc and self-reported).
  const records = opts.rssRecords ?? (opts.quick ? 1_000_000 : 10_000_000);
  const child = fileURLToPath(new URL("./rss-child.js", import.meta.url));
  const rssDir = join(opts.tmpDir, "rss");
  rmSync(rssDir, { recursive: true, force: true });
  const rss = await measureRss(child, [rssDir, String(records)], { timeoutMs: 600_000 });
  rmSync(rssDir, { recursive: true, force: true });
  const stages = [...rss.stdout.matchAll(/^STAGE (\S+) (\d+)$/gm)].map((m) => `${m[1]}=${(Number(m[2]) / 2 ** 20).toFixed(0)}MB`);
  rows.push({
    name: `RSS retaining ${records.toLocaleString("en-US")} records (100 B)`,
    system: "sluice",
    durability: DUR,
    value: +(rss.peakRssBytes / 2 ** 20).toFixed(1),
    unit: "MB",
    note: `peak over the run; stages ${stages.join(" ")}; goal < 200 MB: ${rss.peakRssBytes < 200 * 2 ** 20 ? "met" : "MISSED"}`,
  });
  return rows;
}
