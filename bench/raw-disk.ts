/**
 * The raw limit of this disk for the engine's write pattern: sequential appends of the same bytes
 * to one file, one write() plus one fdatasync() per batch, nothing else (no framing, no CRC, no
 * index, no event loop hops between write and sync). The engine's append throughput with
 * `durability: "always"` is reported as a fraction of this figure, measured in the same run on
 * the same filesystem, so a slow disk or a busy machine moves both numbers together.
 *
 * Synchronous fs calls on purpose: this is the ceiling, so it must not pay for the thread pool.
 */
import { closeSync, fdatasyncSync, mkdirSync, openSync, readSync, rmSync, writeSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { percentile, type BenchRow } from "./report.js";

export type RawDiskOptions = {
  /** Directory on the filesystem under test (the broker's data dir's filesystem). */
  dir: string;
  /** Bytes per record as written (pass the engine's on-disk record size to compare like for like). */
  recordBytes: number;
  recordsPerBatch: number;
  /** Upper bound on batches; the run also stops at `maxDurationMs`. */
  batches: number;
  /** Time bound (default 5000 ms). */
  maxDurationMs?: number;
};

export type RawDiskResult = {
  recordsPerSec: number;
  mbPerSec: number;
  /** Latency of one batch (write + fdatasync), milliseconds. */
  p50Ms: number;
  p99Ms: number;
  batches: number;
  records: number;
  bytes: number;
  elapsedMs: number;
};

/** Largest single write allowed, so a mistaken argument cannot allocate gigabytes. */
const MAX_BATCH_BYTES = 256 * 1024 * 1024;

export async function rawDiskAppend(options: RawDiskOptions): Promise<RawDiskResult> {
  const { dir, recordBytes, recordsPerBatch, batches } = options;
  const maxDurationMs = options.maxDurationMs ?? 5000;
  if (!(Number.isInteger(recordBytes) && recordBytes > 0)) throw new RangeError(`recordBytes must be a positive integer, got ${recordBytes}`);
  if (!(Number.isInteger(recordsPerBatch) && recordsPerBatch > 0)) throw new RangeError(`recordsPerBatch must be a positive integer, got ${recordsPerBatch}`);
  if (!(Number.isInteger(batches) && batches > 0)) throw new RangeError(`batches must be a positive integer, got ${batches}`);
  const batchBytes = recordBytes * recordsPerBatch;
  if (batchBytes > MAX_BATCH_BYTES) throw new RangeError(`batch of ${batchBytes} bytes exceeds ${MAX_BATCH_BYTES}`);

  mkdirSync(dir, { recursive: true });
  const path = join(dir, `raw-disk-${process.pid}-${Date.now()}.bin`);
  // Random content so no layer below can compress or deduplicate it; the same buffer every batch.
  const buf = randomBytes(batchBytes);
  const lat = new Float64Array(batches);
  let done = 0;
  const fd = openSync(path, "w");
  const start = performance.now();
  let position = 0;
  try {
    while (done < batches) {
      const t0 = performance.now();
      let off = 0;
      while (off < batchBytes) off += writeSync(fd, buf, off, batchBytes - off, position + off);
      fdatasyncSync(fd);
      position += batchBytes;
      const t1 = performance.now();
      lat[done++] = t1 - t0;
      if (t1 - start >= maxDurationMs) break;
      // Yield now and then so timers (e.g. a progress printer) are not starved for seconds.
      if ((done & 63) === 0) await new Promise<void>((r) => setImmediate(r));
    }
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
  const elapsedMs = performance.now() - start;
  const sorted = lat.subarray(0, done).sort();
  const records = done * recordsPerBatch;
  const bytes = done * batchBytes;
  return {
    recordsPerSec: records / (elapsedMs / 1000),
    mbPerSec: bytes / (1024 * 1024) / (elapsedMs / 1000),
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    batches: done,
    records,
    bytes,
    elapsedMs,
  };
}

/** rawDiskAppend as table rows (records/s, MB/s, p50/p99 per batch). */
export async function rawDiskRows(options: RawDiskOptions): Promise<BenchRow[]> {
  const label = `raw append ${options.recordBytes} B x ${options.recordsPerBatch}/batch`;
  const durability = "write + fdatasync per batch";
  try {
    const r = await rawDiskAppend(options);
    return [
      { name: label, system: "raw disk", durability, value: r.recordsPerSec, unit: "rec/s" },
      { name: `${label} MB/s`, system: "raw disk", durability, value: r.mbPerSec, unit: "MB/s" },
      { name: `${label} p50`, system: "raw disk", durability, value: r.p50Ms, unit: "ms" },
      { name: `${label} p99`, system: "raw disk", durability, value: r.p99Ms, unit: "ms", note: `${r.batches} batches` },
    ];
  } catch (err) {
    return [{ name: label, system: "raw disk", durability, value: Number.NaN, unit: "rec/s", note: `unavailable: ${(err as Error).message}` }];
  }
}

/**
 * The disk's own latency floor for the end-to-end figure: records arrive at a fixed rate
 * (open loop, arrival i at start + i/rate, so a slow fdatasync delays every record that
 * arrives during it, as it does for a broker) and are made durable by group commit: each step
 * writes every record that has arrived and fdatasyncs once. Latency = durable time - arrival
 * time. No broker can acknowledge (or show a consumer) a record after fsync sooner than this on
 * the same disk; sluice's p99 is reported beside it. Busy-waits, synchronous calls only.
 *
 * `preallocate` first writes and syncs zeros over the region, so the appends' fdatasync has no
 * file-size change to journal (what a preallocating log does).
 */
export function rawDiskPacedLatency(opts: { dir: string; recordBytes: number; ratePerSec: number; durationMs: number; preallocate?: boolean }): { p50Ms: number; p99Ms: number; count: number } {
  const { dir, recordBytes, ratePerSec, durationMs } = opts;
  const total = Math.floor((ratePerSec * durationMs) / 1000);
  if (!(total > 0) || recordBytes <= 0 || recordBytes * total > MAX_BATCH_BYTES) throw new RangeError("rawDiskPacedLatency: bad arguments");
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `raw-paced-${process.pid}-${Date.now()}.bin`);
  const fd = openSync(path, "w");
  const lat = new Float64Array(total);
  try {
    if (opts.preallocate) {
      const zeros = Buffer.alloc(1024 * 1024);
      for (let pos = 0; pos < recordBytes * total; pos += zeros.length) writeSync(fd, zeros, 0, zeros.length, pos);
      fdatasyncSync(fd);
    }
    const buf = randomBytes(recordBytes * 64);
    const start = performance.now();
    const gap = 1000 / ratePerSec;
    let next = 0; // first record not yet durable
    let position = 0;
    while (next < total) {
      const now = performance.now();
      const arrived = Math.min(total, Math.floor((now - start) / gap) + 1);
      if (arrived <= next) continue; // nothing new yet: spin (the floor must not pay for timers)
      let n = arrived - next;
      while (n > 0) {
        const k = Math.min(n, 64);
        writeSync(fd, buf, 0, k * recordBytes, position);
        position += k * recordBytes;
        n -= k;
      }
      fdatasyncSync(fd);
      const done = performance.now();
      for (let i = next; i < arrived; i++) lat[i] = done - (start + i * gap);
      next = arrived;
    }
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
  const sorted = lat.sort();
  return { p50Ms: percentile(sorted, 50), p99Ms: percentile(sorted, 99), count: total };
}

/**
 * The disk's sequential bandwidth for the cleaner's I/O pattern: `bytes` written in 1 MiB
 * writes with one fdatasync at the end (how the cleaner writes a segment), then read back in
 * 1 MiB reads. The read comes from the page cache when the file fits in it, as the cleaner's
 * reads of recently written segments do; both figures are reported as measured.
 */
export function rawDiskSequential(dir: string, bytes: number): { writeMbPerSec: number; readMbPerSec: number } {
  if (!(Number.isInteger(bytes) && bytes > 0)) throw new RangeError(`bytes must be a positive integer, got ${bytes}`);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `raw-seq-${process.pid}-${Date.now()}.bin`);
  const chunk = randomBytes(1024 * 1024);
  const fd = openSync(path, "w+");
  try {
    const w0 = performance.now();
    for (let pos = 0; pos < bytes; pos += chunk.length) writeSync(fd, chunk, 0, Math.min(chunk.length, bytes - pos), pos);
    fdatasyncSync(fd);
    const writeMs = performance.now() - w0;
    const r0 = performance.now();
    for (let pos = 0; pos < bytes; pos += chunk.length) readSync(fd, chunk, 0, Math.min(chunk.length, bytes - pos), pos);
    const readMs = performance.now() - r0;
    return { writeMbPerSec: bytes / 1e6 / (writeMs / 1000), readMbPerSec: bytes / 1e6 / (readMs / 1000) };
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
}
