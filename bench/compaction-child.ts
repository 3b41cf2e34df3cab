// SPDX-License-Identifier: Apache-2.0
/**
 * Compaction of a topic of N distinct keys, one phase per process so that each phase's RSS is
 * its own (bench/compaction.ts and test/compaction-rss.test.ts run it):
 *
 *   node compaction-child.js write   <dataDir> <keys>
 *   node compaction-child.js compact <dataDir> <keys> [cleanerIoBytesPerSec|Infinity]
 *   node compaction-child.js verify  <dataDir> <keys>
 *
 * `write` creates a compacted topic (one partition, 16 MiB segments) and writes N keyed records
 * of 32 B (generation 0), then an update of every 10th key (generation 1) and a tombstone of
 * every 100th key (i % 100 == 5). `compact` opens the data dir as a broker does after a restart
 * (the whole log dirty) and runs one compaction (DiskEngine.compact: as many passes as the
 * default 64 MiB key map needs, 21.3 B per key, so 10 M keys take 4). `verify` scans the log and
 * checks that the latest record of every key is the one written last, that offsets only
 * increase, and that only the records of the active segment repeat a key.
 * Prints `STAGE name rss` lines and one `RESULT {json}` line; exits 1 if the scan disagrees.
 */
import { openBroker } from "../src/broker/broker.js";
import { NodeFileSystem } from "../src/log/io.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";

const [mode, dir, keysArg, ioArg] = process.argv.slice(2);
const N = Number(keysArg);
if ((mode !== "write" && mode !== "compact" && mode !== "verify") || !dir || !(Number.isInteger(N) && N > 0)) {
  throw new Error("usage: compaction-child write|compact|verify <dataDir> <keys> [cleanerIoBytesPerSec]");
}
const ioRate = ioArg === undefined || ioArg === "Infinity" ? Infinity : Number(ioArg);
const VALUE_BYTES = 32;
const SEGMENT_BYTES = 16 * 1024 * 1024;
const BATCH = 1000;
const IN_FLIGHT = 8;
const TOPIC = "table";

const keyOf = (i: number): string => `k${String(i).padStart(9, "0")}`;
const isTombstoned = (i: number): boolean => i % 100 === 5;
const isUpdated = (i: number): boolean => i % 10 === 0;
/** What the scan must find last for key i: 1 = generation 0, 2 = generation 1, 3 = tombstone. */
const finalState = (i: number): number => (isTombstoned(i) ? 3 : isUpdated(i) ? 2 : 1);

const rssSamples: number[] = [];
const sampler = setInterval(() => rssSamples.push(process.memoryUsage().rss), 50);
const peakRss = (): number => Math.max(process.memoryUsage().rss, ...rssSamples);
const stage = (name: string): void => void process.stdout.write(`STAGE ${name} ${process.memoryUsage().rss}\n`);

const engine = new DiskEngine({ dataDir: dir, fs: new NodeFileSystem(), cleanerIntervalMs: 0, cleanerIoBytesPerSec: ioRate });
const broker = await openBroker({ engine, retentionCheckIntervalMs: 0 });

function valueOf(i: number, gen: number): Buffer {
  const v = Buffer.alloc(VALUE_BYTES, 0x61);
  v.writeUInt32BE(i, 0);
  v.writeUInt32BE(gen, 4);
  return v;
}

/** Publishes the records `make` returns for i in [0, n) (null: none), IN_FLIGHT batches at a time. */
async function writeAll(n: number, make: (i: number) => { key: string; value: Buffer | null } | null): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < n) {
      const batch: { key: string; value: Buffer | null; partition: number }[] = [];
      while (next < n && batch.length < BATCH) {
        const r = make(next++);
        if (r) batch.push({ ...r, partition: 0 });
      }
      if (batch.length > 0) await broker.publishBatch(TOPIC, batch);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
}

async function write(): Promise<Record<string, unknown>> {
  await broker.createTopic(TOPIC, { partitions: 1, cleanupPolicy: "compact", minCompactionLagMs: 0, segmentBytes: SEGMENT_BYTES });
  const t0 = performance.now();
  await writeAll(N, (i) => ({ key: keyOf(i), value: valueOf(i, 0) }));
  await writeAll(N, (i) => (isTombstoned(i) ? { key: keyOf(i), value: null } : isUpdated(i) ? { key: keyOf(i), value: valueOf(i, 1) } : null));
  const p = (await broker.describeTopic(TOPIC)).partitions[0];
  stage("written");
  return { written: p.highWatermark, bytes: p.sizeBytes, segments: p.segments, writeMs: Math.round(performance.now() - t0) };
}

/** Full scan: the latest record of every key, offsets strictly increasing; an error message or null. */
async function scan(logStart: number, hwm: number): Promise<{ records: number; repeats: number; ms: number; error: string | null }> {
  const state = new Uint8Array(N);
  let records = 0;
  let repeats = 0;
  let last = -1;
  let error: string | null = null;
  const t0 = performance.now();
  for (let off = logStart; off < hwm && !error; ) {
    const r = await broker.fetch(TOPIC, 0, off, { maxBytes: 1024 * 1024 }); // subscribe()'s default fetch size
    for (const m of r.records) {
      if (m.offset <= last) error = `offset ${m.offset} after ${last}`;
      last = m.offset;
      const i = Number(String(m.key).slice(1));
      if (state[i] !== 0) repeats++;
      const v = m.value as Buffer | null;
      if (v !== null && v.readUInt32BE(0) !== i) error = `key ${i} holds the value of key ${v.readUInt32BE(0)}`;
      state[i] = v === null ? 3 : v.readUInt32BE(4) === 1 ? 2 : 1;
      records++;
    }
    off = r.nextOffset;
  }
  for (let i = 0; i < N && !error; i++) if (state[i] !== finalState(i)) error = `key ${i}: latest is state ${state[i]}, want ${finalState(i)}`;
  return { records, repeats, ms: Math.round(performance.now() - t0), error };
}

async function compact(): Promise<Record<string, unknown>> {
  const before = (await broker.describeTopic(TOPIC)).partitions[0];
  stage("opened");
  const t0 = performance.now();
  await engine.compact();
  const compactMs = performance.now() - t0;
  stage("compacted");
  const after = (await broker.describeTopic(TOPIC)).partitions[0];
  return {
    inputBytes: before.sizeBytes,
    outputBytes: after.sizeBytes,
    bytesReclaimed: after.bytesReclaimed ?? 0,
    passes: after.cleanerPasses,
    dirtyRatioAfter: after.cleanerDirtyRatio,
    segmentsBefore: before.segments,
    segmentsAfter: after.segments,
    compactMs: Math.round(compactMs),
  };
}

async function verify(): Promise<Record<string, unknown>> {
  const p = (await broker.describeTopic(TOPIC)).partitions[0];
  const s = await scan(p.logStartOffset, p.highWatermark);
  stage("scanned");
  return { records: p.highWatermark, recordsLeft: s.records, repeats: s.repeats, scanMs: s.ms, error: s.error };
}

const result: Record<string, unknown> = { mode, keys: N, ...(mode === "write" ? await write() : mode === "compact" ? await compact() : await verify()) };
await broker.close();
clearInterval(sampler);
process.stdout.write(`RESULT ${JSON.stringify({ ...result, peakRss: peakRss(), maxRss: process.resourceUsage().maxRSS * 1024 })}\n`);
process.exitCode = result.error ? 1 : 0;
