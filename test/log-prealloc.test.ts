// SPDX-License-Identifier: Apache-2.0
/**
 * Preallocation of the active segment (LOG-8): appends overwrite zero-filled, synced space so
 * their fdatasync journals no size change. The file is longer than the log while a segment is
 * active; these tests pin down what that means for recovery, sealing, close, power loss and
 * failures of the zero fill itself.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CorruptRecordError, StorageError, StorageFullError } from "../src/errors.js";
import { NodeFileSystem, type FileHandle, type FileSystem, type OpenMode } from "../src/log/io.js";
import type { Logger } from "../src/observability/telemetry.js";
import { PartitionLog, type LogConfig, type PreallocateMode } from "../src/log/partition-log.js";
import { encodeBatch, stampBatch, type PreparedRecord } from "../src/log/record-batch.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";

type Line = { level: string; obj: Record<string, unknown>; msg?: string };
function captureLogger(): Logger & { lines: Line[] } {
  const lines: Line[] = [];
  const mk = (level: string) => (obj: unknown, msg?: string) => void lines.push({ level, obj: obj as Record<string, unknown>, msg });
  return { lines, debug: mk("debug"), info: mk("info"), warn: mk("warn"), error: mk("error") };
}

function config(over: Partial<LogConfig> = {}): LogConfig {
  return { segmentBytes: 1 << 20, segmentMs: 7 * 86_400_000, maxMessageBytes: 1 << 20, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1, ...over };
}

function openLog(dir: string, o: { fs?: FileSystem; logger?: Logger; preallocate?: PreallocateMode; config?: Partial<LogConfig> } = {}): Promise<PartitionLog> {
  return PartitionLog.open({ fs: o.fs ?? new NodeFileSystem(), dir, topic: "t", partition: 0, config: config(o.config), logger: o.logger, preallocate: o.preallocate ?? "always" });
}

const value = (i: number): Buffer => Buffer.from(`v${i}-${"x".repeat(200)}`);
const rec = (i: number): PreparedRecord => ({ key: null, value: value(i), valueKind: 0, timestamp: Date.now(), headers: null });

/** Appends records from..from+n-1 as single-record batches, `concurrency` at a time. */
async function appendRange(log: PartitionLog, from: number, n: number, concurrency = 1): Promise<number[]> {
  const offsets: number[] = new Array(n);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        offsets[i] = (await log.append([rec(from + i)])).baseOffset;
      }
    }),
  );
  return offsets;
}

async function readValues(log: PartitionLog): Promise<Map<number, string>> {
  const out = new Map<number, string>();
  let off = log.logStartOffset;
  while (off < log.highWatermark) {
    const r = await log.read(off, 1 << 20);
    for (const x of r.records) out.set(x.offset, x.value!.toString());
    assert.ok(r.nextOffset > off, "read progress");
    off = r.nextOffset;
  }
  return out;
}

const logFiles = (dir: string) => readdirSync(dir).filter((n) => n.endsWith(".log")).sort().map((n) => join(dir, n));
const activeFile = (dir: string) => logFiles(dir).at(-1)!;
const logicalSize = (log: PartitionLog) => log.describeSegments().at(-1)!.size;

/** Waits until the active segment's file is at least `bytes` longer than its last batch. */
async function preallocated(log: PartitionLog, dir: string, bytes = 4096): Promise<void> {
  await waitUntil(() => statSync(activeFile(dir)).size >= logicalSize(log) + bytes, "zero fill ahead of the log");
}

test("appends go into zero-filled space ahead of the log; reads, sizes and a clean close see only the log", async () => {
  using tmp = tempDir();
  const logger = captureLogger();
  let log = await openLog(tmp.dir, { logger });
  await appendRange(log, 0, 50);
  await preallocated(log, tmp.dir, 64 * 1024);
  const file = activeFile(tmp.dir);
  const size = logicalSize(log);
  assert.equal(log.sizeBytes, size, "sizes count batches, not preallocated zeros");
  const bytes = readFileSync(file);
  assert.ok(bytes.length > size);
  assert.ok(bytes.subarray(size).every((b) => b === 0), "past the last batch there are only zeros");
  assert.ok(logger.lines.some((l) => l.msg === "preallocating segment space"));
  // Appends after the fill overwrite zeros in place.
  await appendRange(log, 50, 50, 4);
  assert.ok(statSync(file).size > logicalSize(log));
  const vals = await readValues(log);
  assert.equal(vals.size, 100);
  for (const [o, v] of vals) assert.equal(v, value(o).toString());
  await log.close();
  assert.equal(statSync(file).size, logicalSize(log), "a clean close cuts the zeros: the file is the log");
  log = await openLog(tmp.dir, { preallocate: "off" });
  assert.equal(log.highWatermark, 100);
  assert.equal((await log.append([rec(100)])).baseOffset, 100);
  await log.close();
});

test("recovery after a crash: a preallocated zero tail is the end of the log, dropped quietly", async () => {
  using tmp = tempDir();
  const log = await openLog(tmp.dir);
  await appendRange(log, 0, 40, 4);
  await preallocated(log, tmp.dir, 64 * 1024);
  const size = logicalSize(log);
  const fileSize = statSync(activeFile(tmp.dir)).size;
  // Abandon `log` (no close, no clean marker) and recover from the files as they are.
  const logger = captureLogger();
  const log2 = await openLog(tmp.dir, { logger, preallocate: "off" });
  assert.equal(log2.highWatermark, 40);
  assert.equal(logicalSize(log2), size);
  assert.equal(statSync(activeFile(tmp.dir)).size, size, "the file is cut back to the last batch");
  assert.ok(!logger.lines.some((l) => l.level === "warn" || l.level === "error"), "zeros are not damage");
  const info = logger.lines.find((l) => l.msg === "dropping preallocated zero tail of active segment");
  assert.ok(info);
  assert.equal(info.obj.position, size);
  assert.equal(info.obj.bytesDropped, fileSize - size);
  const vals = await readValues(log2);
  assert.deepEqual([...vals.keys()].sort((a, b) => a - b), Array.from({ length: 40 }, (_, i) => i));
  assert.equal((await log2.append([rec(40)])).baseOffset, 40, "offsets continue");
  await log2.close();
});

test("recovery: a torn batch followed by zeros is truncated and logged with its torn bytes", async () => {
  using tmp = tempDir();
  const log = await openLog(tmp.dir);
  await appendRange(log, 0, 30);
  await preallocated(log, tmp.dir, 64 * 1024);
  const size = logicalSize(log);
  const file = activeFile(tmp.dir);
  // The crash tore the next batch (offset 30): only its first half reached the disk.
  const next = encodeBatch([rec(30), rec(31)]);
  stampBatch(next, 30);
  const torn = Math.floor(next.length / 2);
  const bytes = readFileSync(file);
  next.copy(bytes, size, 0, torn);
  writeFileSync(file, bytes);
  const fileSize = bytes.length;
  const logger = captureLogger();
  const log2 = await openLog(tmp.dir, { logger, preallocate: "off" });
  assert.equal(log2.highWatermark, 30);
  const warn = logger.lines.find((l) => l.level === "warn" && l.msg === "truncating torn tail of active segment");
  assert.ok(warn, "the torn batch is logged");
  assert.equal(warn.obj.position, size);
  assert.equal(warn.obj.bytesDropped, fileSize - size);
  assert.ok((warn.obj.tornBytes as number) <= torn && (warn.obj.tornBytes as number) > torn - 8, "tornBytes counts the torn remains, not the zeros");
  assert.equal(statSync(file).size, size);
  assert.equal((await readValues(log2)).size, 30);
  assert.equal((await log2.append([rec(30)])).baseOffset, 30, "the torn offsets are reassigned: never acknowledged");
  await log2.close();
});

test("recovery: zeros inside the log followed by intact batches are kept and reported, not cut", async () => {
  using tmp = tempDir();
  const log = await openLog(tmp.dir);
  await appendRange(log, 0, 30);
  await preallocated(log, tmp.dir, 64 * 1024);
  const file = activeFile(tmp.dir);
  // Zero batch 10 (a lost block inside acknowledged data): recovery cannot tell it from the
  // zeros of an unwritten page, so it keeps everything after it and reports the range.
  const bytes = readFileSync(file);
  let pos = 0;
  for (let i = 0; i < 10; i++) pos += bytes.readUInt32BE(pos);
  bytes.fill(0, pos, pos + bytes.readUInt32BE(pos));
  writeFileSync(file, bytes);
  const logger = captureLogger();
  const log2 = await openLog(tmp.dir, { logger, preallocate: "off" });
  assert.equal(log2.highWatermark, 30, "nothing after the hole was dropped");
  assert.ok(logger.lines.some((l) => l.level === "error"));
  await assert.rejects(log2.read(10, 1 << 20), (e: unknown) => e instanceof CorruptRecordError && e.nextOffset === 11);
  assert.equal((await log2.read(11, 100)).records[0].offset, 11);
  await log2.close();
});

test("sealed segments are truncated to their last batch before the next one exists (LOG-4)", async () => {
  using tmp = tempDir();
  const logger = captureLogger();
  const segmentBytes = 64 * 1024;
  const log = await openLog(tmp.dir, { logger, config: { segmentBytes } });
  await appendRange(log, 0, 1500, 8);
  const segs = log.describeSegments();
  assert.ok(segs.length >= 4, `${segs.length} segments`);
  const fills = logger.lines.filter((l) => l.msg === "preallocating segment space").map((l) => l.obj as { file: string; end: number });
  for (const s of segs.slice(0, -1)) {
    assert.equal(statSync(s.file).size, s.size, `${s.file}: file size is the logical size`);
    // The time index's seal entry records the same size.
    const ti = readFileSync(s.file.replace(/\.log$/, ".timeindex"));
    assert.equal(ti.readUInt32BE(ti.length - 4), s.size);
  }
  assert.ok(
    segs.slice(0, -1).some((s) => fills.some((f) => f.file === s.file && f.end > s.size)),
    "some sealed segment had zeros past its last batch, which the roll cut",
  );
  // Unclean reopen: sealed sizes come from the file sizes and need no scan.
  const log2 = await openLog(tmp.dir, { preallocate: "off" });
  assert.deepEqual(
    log2.describeSegments().slice(0, -1).map((s) => [s.baseOffset, s.endOffset, s.size]),
    segs.slice(0, -1).map((s) => [s.baseOffset, s.endOffset, s.size]),
  );
  const vals = await readValues(log2);
  assert.equal(vals.size, 1500);
  for (const [o, v] of vals) assert.ok(v.startsWith("v"), `offset ${o}`);
  await log2.close();
});

/**
 * Delegates to a FaultyFileSystem; `stall` makes every later fdatasync hang, and every later
 * O_DSYNC write reach the page cache but never return (power about to go).
 */
class StallingFs implements FileSystem {
  stall = false;
  constructor(readonly inner: FaultyFileSystem) {}
  async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await this.inner.open(path, mode);
    return {
      path: h.path,
      write: (b, p) => h.write(b, p),
      read: (b, o, l, p) => h.read(b, o, l, p),
      writeDurable: (b, p) => (this.stall ? h.write(b, p).then(() => new Promise<void>(() => {})) : h.writeDurable(b, p)),
      readSync: (b, o, l, p) => h.readSync(b, o, l, p),
      datasync: () => (this.stall ? new Promise<void>(() => {}) : h.datasync()),
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
  readFile = (p: string) => this.inner.readFile(p);
  mkdir = (p: string) => this.inner.mkdir(p);
  readdir = (p: string) => this.inner.readdir(p);
  rename = (a: string, b: string) => this.inner.rename(a, b);
  unlink = (p: string) => this.inner.unlink(p);
  rm = (p: string) => this.inner.rm(p);
  fsyncDir = (p: string) => this.inner.fsyncDir(p);
  stat = (p: string) => this.inner.stat(p);
  lock = (d: string) => this.inner.lock(d);
}

test("power loss with preallocation: un-synced appends inside the zeroed space are lost, acknowledged ones survive", async () => {
  for (const torn of [0, 1, 57, 300, 5000]) {
    using tmp = tempDir();
    const faulty = new FaultyFileSystem();
    const fs = new StallingFs(faulty);
    const log = await openLog(tmp.dir, { fs, config: { segmentBytes: 256 * 1024 } });
    const acked = new Map<number, number>();
    const ack = (i: number) => (r: { baseOffset: number }) => void acked.set(r.baseOffset, i);
    for (let i = 0; i < 200; i++) await log.append([rec(i)]).then(ack(i));
    await preallocated(log, tmp.dir, 16 * 1024);
    await waitUntil(() => faulty.synced.get(activeFile(tmp.dir))! > logicalSize(log) + 16 * 1024, "zero fill synced");
    // Appends written in place while their fdatasync never returns; then the power goes.
    fs.stall = true;
    for (let k = 0; k < 50; k++) void log.append([rec(200 + k)]).then(ack(200 + k));
    const file = activeFile(tmp.dir);
    await waitUntil(() => (faulty.undo.get(file) ?? []).reduce((n, u) => n + u.old.length, 0) >= 40 * 250, "appends written over the zeros");
    assert.equal(acked.size, 200, "nothing after the stall is acknowledged");
    await faulty.powerLoss(torn);
    const log2 = await openLog(tmp.dir, { preallocate: "off" });
    const vals = await readValues(log2);
    for (const [o, i] of acked) assert.equal(vals.get(o), value(i).toString(), `acknowledged offset ${o} survives (torn=${torn})`);
    // Un-acknowledged batches may survive whole in a torn prefix; what is served is intact.
    const maybe = new Set(Array.from({ length: 250 }, (_, i) => value(i).toString()));
    for (const [o, v] of vals) assert.ok(maybe.has(v), `offset ${o} holds an appended value`);
    assert.ok(log2.highWatermark < 250, "the un-synced appends are gone (at most a torn prefix survives)");
    assert.equal(statSync(file).size, logicalSize(log2), "no zeros or torn remains past the log");
    await log2.close();
  }
});

/** Appends 8 KiB records until one is written with an O_DSYNC write (inside durable zeros). */
async function untilDurableWrites(log: PartitionLog, fs: FaultyFileSystem): Promise<number> {
  let durable = 0;
  fs.onOp = (op) => void (op.kind === "writeDurable" && op.path.endsWith(".log") && durable++);
  let n = 0;
  await waitUntil(async () => (await log.append([{ ...rec(n), value: Buffer.alloc(8192, 0x66) }]), n++, durable > 0), "an append inside durable zeros", 10_000);
  return n;
}

test("inside durable zeros: a durable write that finds the disk full is rolled back and appends resume; a failed sync faults the partition", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  const log = await openLog(tmp.dir, { fs });
  const n = await untilDurableWrites(log, fs);
  // A zero fill may run in the background on the same file: the write fault is armed when the
  // append's durable write begins, so it is the append's write that takes it.
  const onNextDurableWrite = (arm: () => void) => {
    fs.onOp = (op) => {
      if (op.kind !== "writeDurable" || !op.path.endsWith(".log")) return;
      fs.onOp = null;
      arm();
    };
  };
  onNextDurableWrite(() => fs.failNext("write", "ENOSPC", { pathIncludes: ".log", tornBytes: 40 }));
  await assert.rejects(log.append([rec(1000)]), StorageFullError);
  assert.equal((await log.append([rec(1001)])).baseOffset, n, "no gap, no reused acknowledged offset");
  // Two: a background fill's fdatasync (same file, tolerated when it fails) may take the first.
  fs.failNext("datasync", "EIO", { pathIncludes: ".log", times: 2 });
  await assert.rejects(log.append([rec(1002)]), (e: unknown) => e instanceof StorageError && e.retriable);
  await assert.rejects(log.append([rec(1003)]), StorageError, "read-only until reopened");
  fs.clearFaults();
  assert.equal((await log.read(n, 1 << 20)).records[0].value!.toString(), value(1001).toString(), "reads continue");
  await log.close();
  const log2 = await openLog(tmp.dir, { preallocate: "off" });
  assert.equal(log2.highWatermark, n + 1);
  assert.equal((await log2.read(n, 1 << 20)).records[0].value!.toString(), value(1001).toString());
  await log2.close();
});

/** Node's FileSystem with hooks to fail the zero fill (recognised by its all-zero buffers / "rw" handle). */
class HookedFs extends NodeFileSystem {
  failZeroWrites: string | null = null;
  failFillSync: string | null = null;
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await super.open(path, mode);
    const fs = this;
    return {
      path: h.path,
      async write(buffers, position) {
        if (fs.failZeroWrites && buffers.every((b) => b.every((x) => x === 0))) throw Object.assign(new Error(`${fs.failZeroWrites}: injected`), { code: fs.failZeroWrites });
        return h.write(buffers, position);
      },
      read: (b, o, l, p) => h.read(b, o, l, p),
      writeDurable: (b, p) => h.writeDurable(b, p),
      readSync: (b, o, l, p) => h.readSync(b, o, l, p),
      async datasync() {
        // The log's own handle is opened "create"; the zero fill opens one of its own, "rw".
        if (fs.failFillSync && mode === "rw" && path.endsWith(".log")) throw Object.assign(new Error(`${fs.failFillSync}: injected`), { code: fs.failFillSync });
        return h.datasync();
      },
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
}

test("a zero fill that cannot be written (ENOSPC) is not an error: appends extend the file as before", async () => {
  using tmp = tempDir();
  const fs = new HookedFs();
  fs.failZeroWrites = "ENOSPC";
  const logger = captureLogger();
  const log = await openLog(tmp.dir, { fs, logger });
  await appendRange(log, 0, 100, 4);
  await waitUntil(() => logger.lines.some((l) => l.msg === "could not preallocate segment space; appends extend the file"), "warning");
  await appendRange(log, 100, 100, 4);
  assert.equal(log.highWatermark, 200);
  assert.equal((await readValues(log)).size, 200);
  await log.close();
  assert.equal(statSync(activeFile(tmp.dir)).size, logicalSize(log));
});

test("a failed fdatasync of a zero fill makes the partition read-only until it is reopened; nothing acknowledged is lost", async () => {
  using tmp = tempDir();
  const fs = new HookedFs();
  fs.failFillSync = "EIO";
  const logger = captureLogger();
  const log = await openLog(tmp.dir, { fs, logger });
  await log.append([rec(0)]);
  await waitUntil(() => logger.lines.some((l) => l.level === "error"), "fill sync failure");
  // Retriable: the owner (the disk engine) reopens a faulted partition by itself.
  await assert.rejects(log.append([rec(1)]), (e: unknown) => e instanceof StorageError && e.retriable);
  assert.equal((await log.read(0, 1 << 20)).records.length, 1, "reads continue");
  await log.close();
  const log2 = await openLog(tmp.dir, { preallocate: "off" });
  assert.equal(log2.highWatermark, 1);
  assert.equal((await log2.append([rec(1)])).baseOffset, 1);
  await log2.close();
});

test("auto mode leaves slow and idle partitions alone: no zeros for a trickle of appends", async () => {
  using tmp = tempDir();
  const logger = captureLogger();
  const log = await openLog(tmp.dir, { logger, preallocate: "auto" });
  for (let i = 0; i < 20; i++) await log.append([rec(i)]);
  assert.ok(!logger.lines.some((l) => l.msg === "preallocating segment space"));
  assert.equal(statSync(activeFile(tmp.dir)).size, logicalSize(log));
  await log.close();
});
