// SPDX-License-Identifier: Apache-2.0
/**
 * Segment archive (tiered storage, src/log/archive/): retention archives sealed segments
 * (verified, with a manifest) before deleting them (ARC-1); reads below the online log start
 * are served from the archive, byte-identical (ARC-2); a damaged archived segment raises
 * ArchiveCorruptError and is never served (ARC-3); archive retention (ARC-4).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { ArchiveCorruptError, OffsetOutOfRangeError, StorageError, ValidationError } from "../src/errors.js";
import type { DiskEngine } from "../src/store/disk/disk-engine.js";
import { resolveTopicConfig } from "../src/store/topic-config.js";
import { FsArchiveStore } from "../src/log/archive/fs-archive-store.js";
import { NodeFileSystem } from "../src/log/io.js";
import { tempDir } from "../src/testing/helpers.js";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
function cli(...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

const VALUE = Buffer.alloc(200, 0x61);

async function fill(b: EmbeddedBroker, topic: string, batches: number, ts0 = 1_000_000): Promise<void> {
  for (let i = 0; i < batches; i++) {
    await b.publishBatch(topic, Array.from({ length: 4 }, (_, j) => ({ value: Buffer.concat([VALUE, Buffer.from(`#${i * 4 + j}`)]), key: `k${j}`, partition: 0, timestamp: ts0 + i })));
  }
}

function engine(b: EmbeddedBroker): DiskEngine {
  return b.engine as DiskEngine;
}

/** Every stored batch of partition 0 from `from`, as raw bytes (server push path). */
async function rawFrom(b: EmbeddedBroker, topic: string, from: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  const hwm = engine(b).log(topic, 0).highWatermark;
  let off = from;
  while (off < hwm) {
    const r = await engine(b).encoded!.readRaw(topic, 0, off, 64 * 1024);
    parts.push(Buffer.from(r.data));
    assert.ok(r.nextOffset > off, `progress at ${off}`);
    off = r.nextOffset;
  }
  return Buffer.concat(parts);
}

async function fetchAll(b: EmbeddedBroker, topic: string, from: number): Promise<{ offset: number; value: unknown; key: unknown; timestamp: number }[]> {
  const out: { offset: number; value: unknown; key: unknown; timestamp: number }[] = [];
  const hwm = engine(b).log(topic, 0).highWatermark;
  let off = from;
  while (off < hwm) {
    const r = await b.fetch(topic, 0, off, { maxBytes: 3000 });
    for (const m of r.records) out.push({ offset: m.offset, value: m.value, key: m.key, timestamp: m.timestamp });
    assert.ok(r.nextOffset > off);
    off = r.nextOffset;
  }
  return out;
}

function localLogs(dataDir: string, topic: string): string[] {
  return readdirSync(join(dataDir, "topics", topic, "0")).filter((n) => n.endsWith(".log")).sort();
}

test("archive config is validated: absolute dir, archiveRetentionMs needs an archive; topics without it are unchanged", () => {
  assert.deepEqual(resolveTopicConfig({}).archive, null);
  assert.equal(resolveTopicConfig({}).archiveRetentionMs, -1);
  assert.deepEqual(resolveTopicConfig({ archive: { dir: "/mnt/a" }, archiveRetentionMs: 5 }).archive, { dir: "/mnt/a" });
  assert.throws(() => resolveTopicConfig({ archive: { dir: "rel/dir" } }), ValidationError);
  assert.throws(() => resolveTopicConfig({ archive: { dir: "/a", bucket: "x" } as never }), ValidationError);
  assert.throws(() => resolveTopicConfig({ archive: "/a" as never }), ValidationError);
  assert.throws(() => resolveTopicConfig({ archiveRetentionMs: 1000 }), ValidationError);
  assert.throws(() => resolveTopicConfig({ archive: { dir: "/a" }, archiveRetentionMs: -2 }), ValidationError);
});

test("round trip: retention archives segments before deleting them; replay from 0 is byte-identical, across a restart", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 3 * 4096, archive: { dir: archiveDir } });
    await fill(b, "t", 100);
    const rawBefore = await rawFrom(b, "t", 0);
    const recsBefore = await fetchAll(b, "t", 0);
    assert.equal(recsBefore.length, 400);
    const segsBefore = localLogs(dataDir, "t").length;
    const t0 = await b.fetch("t", 0, 0);

    await b.enforceRetention(Date.now());
    const log = engine(b).log("t", 0);
    assert.ok(log.onlineLogStartOffset > 0, "retention moved the online log start");
    assert.ok(localLogs(dataDir, "t").length < segsBefore, "local segments were deleted");
    assert.equal(log.logStartOffset, 0, "the archive keeps offset 0 readable");
    assert.equal((await b.describeTopic("t")).partitions[0].logStartOffset, 0);
    const manifests = log.archive!.list();
    assert.equal(manifests[0].baseOffset, 0);
    assert.equal(manifests[manifests.length - 1].endOffset, log.onlineLogStartOffset, "archived range ends where the online log starts");
    for (let i = 1; i < manifests.length; i++) assert.equal(manifests[i].baseOffset, manifests[i - 1].endOffset, "contiguous");
    assert.equal(manifests.reduce((s, m) => s + m.recordCount, 0), log.onlineLogStartOffset);

    const check = async (bk: EmbeddedBroker): Promise<void> => {
      assert.ok((await rawFrom(bk, "t", 0)).equals(rawBefore), "raw replay from 0 is byte-identical");
      assert.deepEqual(await fetchAll(bk, "t", 0), recsBefore, "records from 0 are identical");
      const f = await bk.fetch("t", 0, 0);
      assert.deepEqual(f.records.map((r) => r.offset), t0.records.map((r) => r.offset));
      // Mid-segment start in the archive, and offset by time through the manifests.
      const mid = await bk.fetch("t", 0, 37, { maxBytes: 1 });
      assert.equal(mid.records[0].offset, 37);
      assert.equal(await bk.offsetForTimestamp("t", 0, 1_000_000 + 10), 40);
      assert.equal(await bk.offsetForTimestamp("t", 0, 1_000_000 + 99), 396);
    };
    await check(b);
    await b.close();
    b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
    await check(b);
    // Nothing archived twice on the next retention run (idempotent), nothing lost.
    await fill(b, "t", 20);
    await b.enforceRetention(Date.now());
    assert.equal((await fetchAll(b, "t", 0)).length, 480);
  } finally {
    await b.close();
  }
});

test("a damaged archived segment raises ArchiveCorruptError and is never served; other segments still are", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    await fill(b, "t", 60);
    await b.enforceRetention(Date.now());
    const log = engine(b).log("t", 0);
    const [m0, m1] = log.archive!.list();
    assert.ok(m1 !== undefined, "two segments archived");
    const topicId = (await b.describeTopic("t")).topicId;
    const file = join(archiveDir, "t", topicId, "0", `${String(m1.baseOffset).padStart(20, "0")}.log`);
    // Read once: the segment is verified against its manifest and remembered as verified.
    assert.equal((await b.fetch("t", 0, m1.baseOffset)).records[0].offset, m1.baseOffset);
    const bytes = readFileSync(file);
    // Flip one bit in a record value after that: the batch's own CRC catches it on the next read.
    bytes[bytes.length - 10] ^= 0x01;
    writeFileSync(file, bytes);
    await assert.rejects(b.fetch("t", 0, m1.endOffset - 1), (e: unknown) => e instanceof ArchiveCorruptError && /fails its check/.test(e.message));
    // And then the whole-segment check again (SHA-256 against the manifest) for every read of it.
    for (const read of [() => b.fetch("t", 0, m1.baseOffset), () => engine(b).encoded!.readRaw("t", 0, m1.baseOffset + 1, 1 << 20), () => b.fetch("t", 0, m1.endOffset - 1)]) {
      await assert.rejects(read(), (e: unknown) => e instanceof ArchiveCorruptError && e.code === "ARCHIVE_CORRUPT" && e.key.endsWith(".log"));
    }
    // The intact archived segment and the online log still serve.
    assert.equal((await b.fetch("t", 0, m0.baseOffset)).records[0].offset, m0.baseOffset);
    assert.equal((await b.fetch("t", 0, m1.endOffset)).records[0].offset, m1.endOffset);
    // A truncated copy is refused as well.
    writeFileSync(file, bytes.subarray(0, 100));
    await assert.rejects(b.fetch("t", 0, m1.baseOffset), ArchiveCorruptError);
  } finally {
    await b.close();
  }
});

test("archiveRetentionMs removes the oldest archived segments (manifest first); reads below the new start are out of range", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir }, archiveRetentionMs: 1000 });
    await fill(b, "t", 30, 1_000_000); // old
    await fill(b, "t", 30, 5_000_000); // newer
    const now = 5_000_000 + 500;
    await b.enforceRetention(now);
    const log = engine(b).log("t", 0);
    const start = log.logStartOffset;
    assert.ok(start > 0 && start <= 120, `archive start ${start} moved past the old records`);
    assert.ok(log.archive!.list().every((m) => m.maxTimestamp >= now - 1000));
    await assert.rejects(b.fetch("t", 0, 0), (e: unknown) => e instanceof OffsetOutOfRangeError && e.logStartOffset === start);
    assert.equal((await b.fetch("t", 0, start)).records[0].offset, start);
    const topicId = (await b.describeTopic("t")).topicId;
    const left = readdirSync(join(archiveDir, "t", topicId, "0"));
    assert.ok(left.every((n) => Number(n.slice(0, 20)) >= start), `no objects below ${start}: ${left.join(",")}`);
  } finally {
    await b.close();
  }
});

test("sluice archive list and verify: manifests per partition; verify recomputes checksums and names a damaged object", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  let topicId = "";
  let manifests: { baseOffset: number; endOffset: number }[] = [];
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    await fill(b, "t", 60);
    await b.enforceRetention(Date.now());
    topicId = (await b.describeTopic("t")).topicId;
    manifests = engine(b).log("t", 0).archive!.list().map((m) => ({ baseOffset: m.baseOffset, endOffset: m.endOffset }));
  } finally {
    await b.close();
  }
  const l = cli("archive", "list", "--dir", archiveDir, "--json");
  assert.equal(l.status, 0, l.stderr);
  const listed = JSON.parse(l.stdout) as { segments: { topic: string; partition: number; baseOffset: number; endOffset: number; sha256: string }[] };
  assert.deepEqual(listed.segments.map((m) => ({ baseOffset: m.baseOffset, endOffset: m.endOffset })), manifests);
  assert.ok(listed.segments.every((m) => m.topic === "t" && m.partition === 0 && /^[0-9a-f]{64}$/.test(m.sha256)));
  const table = cli("archive", "list", "--dir", archiveDir, "--topic", "t");
  assert.equal(table.status, 0, table.stderr);
  assert.match(table.stdout, /^TOPIC\s+PARTITION\s+BASE/);
  assert.equal(cli("archive", "list", "--dir", archiveDir, "--topic", "other", "--json").stdout.includes('"segments": []'), true);

  const ok = cli("archive", "verify", "--dir", archiveDir);
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(ok.stdout.split("\n").filter((x) => x.startsWith("ok t/0")).length, manifests.length);

  const file = join(archiveDir, "t", topicId, "0", `${String(manifests[0].baseOffset).padStart(20, "0")}.log`);
  const bytes = readFileSync(file);
  bytes[60] ^= 0x80;
  writeFileSync(file, bytes);
  const bad = cli("archive", "verify", "--dir", archiveDir, "--json");
  assert.equal(bad.status, 1);
  const report = JSON.parse(bad.stdout) as { ok: boolean; problems: { key: string; problem: string }[] };
  assert.equal(report.ok, false);
  assert.equal(report.problems.length, 1);
  assert.ok(report.problems[0].key.endsWith(`${String(manifests[0].baseOffset).padStart(20, "0")}.log`));
  assert.match(bad.stderr, /^error \[ARCHIVE_CORRUPT\]: /);
  assert.equal(bad.stderr.trim().split("\n").length, 1, "one-line error");

  const usage = cli("archive", "restore", "--dir", archiveDir);
  assert.equal(usage.status, 2);
  assert.equal(cli("archive", "list").status, 2, "--dir is required");
  assert.equal(cli("archive", "--help").status, 0);
});

test("subscriptions replay from archived offsets: a group committed below the online start resumes there, earliest starts at offset 0", async () => {
  using tmp = tempDir("sluice-archive-");
  const b = await openBroker({ dataDir: join(tmp.dir, "data"), retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: join(tmp.dir, "archive") } });
    await fill(b, "t", 40);
    await engine(b).commitOffsets("g-committed", "t", new Map([[0, 2]]));
    await b.enforceRetention(Date.now());
    assert.ok(engine(b).log("t", 0).onlineLogStartOffset > 50, "the committed position is archived");
    const want = (await fetchAll(b, "t", 0)).map((r) => r.offset);
    for (const [group, from] of [["g-committed", 2], ["g-new", 0]] as const) {
      const sub = b.subscribe("t", { group, start: "earliest", offsetReset: "error" });
      const it = sub[Symbol.asyncIterator]();
      const got: number[] = [];
      while (got.length < want.length - from) {
        const r = await it.next();
        assert.ok(!r.done);
        got.push(r.value.offset);
      }
      await sub.close();
      assert.deepEqual(got, want.slice(from), `${group} replays every record from ${from}`);
    }
  } finally {
    await b.close();
  }
});

test("an archive that cannot be written stops retention for that partition only: nothing is deleted, nothing lost; other topics' retention runs", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const notADir = join(tmp.dir, "archive-file");
  writeFileSync(notADir, "not a directory");
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("a", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: notADir } });
    await b.createTopic("z", { segmentBytes: 4096, retentionBytes: 2 * 4096 });
    await fill(b, "a", 40);
    for (let i = 0; i < 120; i++) await b.publishBatch("z", [{ value: VALUE, partition: 0 }]);
    const before = localLogs(dataDir, "a");
    await assert.rejects(b.enforceRetention(Date.now()));
    assert.deepEqual(localLogs(dataDir, "a"), before, "no local segment deleted without its archive copy");
    assert.equal(engine(b).log("a", 0).logStartOffset, 0);
    assert.equal((await fetchAll(b, "a", 0)).length, 160);
    assert.ok(engine(b).log("z", 0).logStartOffset > 0, "the other topic's retention ran");
  } finally {
    await b.close();
  }
});

test("sluice archive restore brings an archived range back online (offline, under the data dir lock); replay is then local and identical", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  let want: Awaited<ReturnType<typeof fetchAll>> = [];
  let manifests: { baseOffset: number; endOffset: number }[] = [];
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    await fill(b, "t", 60);
    want = await fetchAll(b, "t", 0);
    await b.enforceRetention(Date.now());
    manifests = engine(b).log("t", 0).archive!.list().map((m) => ({ baseOffset: m.baseOffset, endOffset: m.endOffset }));
    assert.ok(manifests.length >= 3);
    const locked = cli("archive", "restore", "--data", dataDir, "--topic", "t", "--partition", "0", "--from", "0");
    assert.equal(locked.status, 1);
    assert.match(locked.stderr, /^error \[DATA_DIR_LOCKED\]/);
  } finally {
    await b.close();
  }
  const from = manifests[1].baseOffset + 1;
  const r = cli("archive", "restore", "--data", dataDir, "--topic", "t", "--partition", "0", "--from", String(from), "--json");
  assert.equal(r.status, 0, r.stderr);
  const report = JSON.parse(r.stdout) as { logStart: number; previousLogStart: number; segments: number };
  assert.equal(report.logStart, manifests[1].baseOffset);
  assert.equal(report.previousLogStart, manifests[manifests.length - 1].endOffset);
  assert.equal(report.segments, manifests.length - 1);
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    const log = engine(b).log("t", 0);
    assert.equal(log.onlineLogStartOffset, manifests[1].baseOffset, "the range is online again");
    assert.equal(log.describeSegments()[0].baseOffset, manifests[1].baseOffset);
    assert.equal(log.logStartOffset, 0, "the first segment is still readable from the archive");
    assert.deepEqual(await fetchAll(b, "t", 0), want);
    // Retention deletes the restored segments again without archiving them twice.
    await b.enforceRetention(Date.now());
    assert.equal(log.archive!.list().length, manifests.length);
    assert.deepEqual(await fetchAll(b, "t", 0), want);
  } finally {
    await b.close();
  }
  const bad = cli("archive", "restore", "--data", dataDir, "--topic", "nope", "--partition", "0", "--from", "0");
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /^error \[TOPIC_NOT_FOUND\]/);
});

test("FsArchiveStore: put replaces atomically, ranged get, size, sorted list by prefix without temporaries, delete of a missing key, keys checked", async () => {
  using tmp = tempDir("sluice-archive-store-");
  const store = new FsArchiveStore(new NodeFileSystem(), join(tmp.dir, "root"));
  assert.equal(await store.get("a/b"), null);
  assert.equal(await store.size("a/b"), null);
  assert.deepEqual(await store.list(""), []);
  await store.put("a/b", Buffer.from("hello world"));
  await store.put("a/c/d", (async function* () {
    yield Buffer.from("chunk1-");
    yield Buffer.from("chunk2");
  })());
  await store.put("z", Buffer.from("x"));
  await store.put("a/b", Buffer.from("HELLO WORLD!"));
  assert.equal((await store.get("a/b"))!.toString(), "HELLO WORLD!");
  assert.equal((await store.get("a/b", { start: 6, end: 11 }))!.toString(), "WORLD");
  assert.equal((await store.get("a/b", { start: 6, end: 1000 }))!.toString(), "WORLD!");
  assert.equal((await store.get("a/c/d"))!.toString(), "chunk1-chunk2");
  assert.equal(await store.size("a/c/d"), 13);
  writeFileSync(join(tmp.dir, "root", "a", ".deadbeef.tmp"), "an interrupted put");
  assert.deepEqual(await store.list(""), ["a/b", "a/c/d", "z"]);
  assert.deepEqual(await store.list("a/"), ["a/b", "a/c/d"]);
  assert.deepEqual(await store.list("a/c/"), ["a/c/d"]);
  await store.put("a/e", Buffer.from("e"));
  assert.deepEqual(readdirSync(join(tmp.dir, "root", "a")).filter((n) => n.endsWith(".tmp")), [], "the next put into the directory removes temporaries");
  await store.delete("a/b");
  await store.delete("a/b");
  assert.equal(await store.get("a/b"), null);
  for (const bad of ["", "../x", "a/../b", "a//b", ".hidden", "a/.tmp", "/abs"]) await assert.rejects(store.put(bad, Buffer.from("x")), ValidationError, bad);
});

test("an archive unreadable when the broker opens does not stop it: archived reads fail with StorageError until it is back, then work", async () => {
  using tmp = tempDir("sluice-archive-");
  const dataDir = join(tmp.dir, "data");
  const archiveDir = join(tmp.dir, "archive");
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  let want: Awaited<ReturnType<typeof fetchAll>> = [];
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    await fill(b, "t", 40);
    want = await fetchAll(b, "t", 0);
    await b.enforceRetention(Date.now());
  } finally {
    await b.close();
  }
  renameSync(archiveDir, `${archiveDir}.away`);
  writeFileSync(archiveDir, "not a directory (an unmounted archive)");
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    const online = engine(b).log("t", 0).onlineLogStartOffset;
    assert.ok(online > 0);
    await assert.rejects(b.fetch("t", 0, 0), (e: unknown) => e instanceof StorageError && !(e instanceof ArchiveCorruptError) && e.message.includes(archiveDir));
    assert.equal((await b.fetch("t", 0, online)).records[0].offset, online, "the online log is unaffected");
    rmSync(archiveDir);
    renameSync(`${archiveDir}.away`, archiveDir);
    assert.deepEqual(await fetchAll(b, "t", 0), want, "the archive is read again on its next use");
  } finally {
    await b.close();
  }
});
