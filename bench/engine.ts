// SPDX-License-Identifier: Apache-2.0
/**
 * Storage engine figures (issue 2, item 7): append throughput and latency with
 * durability "always" for 100 B and 1 KiB records at several batch sizes, sequential read
 * throughput, the raw limit of this disk (plain write + fdatasync per batch of the same bytes)
 * measured in interleaved repetitions with sluice's (bench/harness.ts), and RSS while retaining
 * 10 million records (run once: it takes about a minute).
 */
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/index.js";
import { rawDiskAppend } from "./raw-disk.js";
import { measureRss, summarizeLatencies, type BenchRow } from "./report.js";
import { Meter, runGroups, type BenchCase, type BenchGroup, type Limits, type RunGroupOptions } from "./harness.js";
import { pumpWindow } from "./peers/common.js";

export interface EngineBenchOptions {
  tmpDir: string;
  quick?: boolean;
  run: RunGroupOptions;
  only?: Set<string> | null;
  /** Records retained for the RSS figure (default 10 million; quick: 1 million). */
  rssRecords?: number;
}

const DUR = "fdatasync before ack (group commit)";

async function appendRun(dir: string, recordBytes: number, batch: number, inFlight: number, limits: Limits) {
  rmSync(dir, { recursive: true, force: true });
  const b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("bench", { partitions: 1 });
    const value = Buffer.alloc(recordBytes, 0x61);
    const records = Array.from({ length: batch }, () => ({ value }));
    const lat: number[] = [];
    const m = new Meter(limits);
    await pumpWindow(inFlight, () => {
      if (m.done) return null;
      const s = performance.now();
      return b.publishBatch("bench", records).then(() => {
        if (m.running) lat.push(performance.now() - s);
        m.add(batch);
      });
    });
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
    const s = summarizeLatencies(lat);
    const secs = m.elapsedMs / 1000;
    return { recsPerSec: m.count / secs, mbPerSec: (m.count * recordBytes) / secs / 1e6, p50: s.p50Ms, p99: s.p99Ms, readRecsPerSec: read / readSecs, readMbPerSec: (read * recordBytes) / readSecs / 1e6, describe: m.describe() };
  } finally {
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

function sluiceCase(dir: string, size: number, batch: number, inFlight: number): BenchCase {
  return {
    system: "sluice-embedded",
    durability: DUR,
    shape: `publishBatch x${batch}, ${inFlight} in flight (${(batch * inFlight).toLocaleString("en-US")} records), ${size} B, 1 partition`,
    run: async (limits) => {
      const r = await appendRun(dir, size, batch, inFlight, limits);
      return {
        values: { rate: r.recsPerSec, mbps: r.mbPerSec, p50: r.p50, p99: r.p99 },
        note: `${r.describe}; then sequential read ${Math.round(r.readRecsPerSec).toLocaleString("en-US")} rec/s (${r.readMbPerSec.toFixed(1)} MB/s)`,
      };
    },
  };
}

/**
 * The disk's limit for the same records in flight as sluice's case: `inFlight` batches of
 * `batch` records are what group commit can cover with one fdatasync, so the raw figure writes
 * them with one write + one fdatasync, one group at a time, synchronous calls.
 */
function rawCase(dir: string, size: number, batch: number, inFlight: number): BenchCase {
  const group = batch * inFlight;
  return {
    system: "raw disk",
    durability: "write + fdatasync per group of records",
    shape: `one write + fdatasync per ${group.toLocaleString("en-US")} x ${size} B (the records sluice has in flight), one at a time, synchronous calls: the ceiling`,
    run: async (limits) => {
      mkdirSync(dir, { recursive: true });
      try {
        const x = await rawDiskAppend({ dir, recordBytes: size, recordsPerBatch: group, batches: Math.ceil(limits.maxMessages / group), maxDurationMs: limits.maxMs });
        return { values: { rate: x.recordsPerSec, mbps: x.bytes / 1e6 / (x.elapsedMs / 1000) }, note: `n=${x.records.toLocaleString("en-US")} in ${(x.elapsedMs / 1000).toFixed(2)} s; fdatasync p50 ${x.p50Ms.toFixed(2)} ms, p99 ${x.p99Ms.toFixed(2)} ms` };
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

export async function runEngineBench(opts: EngineBenchOptions): Promise<BenchRow[]> {
  const dir = join(opts.tmpDir, "engine");
  mkdirSync(opts.tmpDir, { recursive: true });
  const configs: [number, number, number][] = [
    [100, 1, 64],
    [100, 10, 16],
    [100, 100, 8],
    [100, 1000, 8],
    [1024, 1, 64],
    [1024, 100, 8],
    [1024, 1000, 16],
  ];
  const groups: BenchGroup[] = configs.map(([size, batch, inFlight]) => {
    const label = `append ${size} B x ${batch}/batch`;
    const cases = [sluiceCase(dir, size, batch, inFlight)];
    // The raw limit for the same bytes and the same records in flight, interleaved with sluice's runs.
    if (batch >= 100) cases.push(rawCase(join(dir, "raw"), size, batch, inFlight));
    const goal = size === 100 && batch === 1000 ? "; goal >= 1,000,000 rec/s" : "";
    return {
      id: `engine-${size}x${batch}`,
      table: "engine",
      metrics: [
        { key: "rate", name: `${label}: records/s${goal}`, unit: "rec/s" },
        { key: "mbps", name: `${label}: MB/s`, unit: "MB/s" },
        { key: "p50", name: `${label}: batch latency p50`, unit: "ms" },
        { key: "p99", name: `${label}: batch latency p99`, unit: "ms" },
      ],
      cases,
      ratios: batch >= 100 ? [{ sluice: "sluice-embedded", peer: "raw disk", key: "mbps", goal: { atLeast: 0.6 } }] : [],
    };
  });
  const rows = await runGroups(groups, { ...opts.run, only: opts.only });
  if (opts.only && !opts.only.has("engine-rss")) return rows;
  // RSS while retaining many records (child process, sampled from /proc and self-reported).
  const records = opts.rssRecords ?? (opts.quick ? 1_000_000 : 10_000_000);
  const child = fileURLToPath(new URL("./rss-child.js", import.meta.url));
  const rssDir = join(opts.tmpDir, "rss");
  rmSync(rssDir, { recursive: true, force: true });
  const rss = await measureRss(child, [rssDir, String(records)], { timeoutMs: 600_000 });
  rmSync(rssDir, { recursive: true, force: true });
  const stages = [...rss.stdout.matchAll(/^STAGE (\S+) (\d+)$/gm)].map((m) => `${m[1]}=${(Number(m[2]) / 2 ** 20).toFixed(0)}MB`);
  rows.push({
    table: "info",
    shape: "publishBatch x1000, 8 in flight, 4 partitions, then every record read back with fetch(1 MiB); one run",
    name: `RSS retaining ${records.toLocaleString("en-US")} records (100 B)`,
    system: "sluice-embedded",
    durability: DUR,
    value: +(rss.peakRssBytes / 2 ** 20).toFixed(1),
    unit: "MB",
    note: `peak over the run; stages ${stages.join(" ")}; goal < 200 MB: ${rss.peakRssBytes < 200 * 2 ** 20 ? "met" : "MISSED"}`,
  });
  return rows;
}
