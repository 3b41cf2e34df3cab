// SPDX-License-Identifier: Apache-2.0
/**
 * The audit log file (src/security/audit/): appends are durable and chained (AUD-1, AUD-2),
 * concurrent appends share one fdatasync, a reopen continues the chain, a torn tail is cut on
 * open (AUD-3), and verify names the first broken sequence number of a modified (CRC fixed up),
 * deleted, or swapped record; a crash at any I/O operation of an append keeps every
 * acknowledged record.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { appendFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { crc32c } from "../src/log/crc32c.js";
import { NodeFileSystem, type FileHandle, type OpenMode } from "../src/log/io.js";
import { AuditLog, auditLogPath } from "../src/security/audit/audit-log.js";
import { listAuditRecords } from "../src/security/audit/reader.js";
import type { AuditEntry, AuditRecord } from "../src/security/audit/record.js";
import { verifyAuditLog } from "../src/security/audit/verify.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";

const fs = new NodeFileSystem();

function tmp(): { dir: string; [Symbol.dispose](): void } {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-audit-"));
  return { dir, [Symbol.dispose]: () => rmSync(dir, { recursive: true, force: true }) };
}

const entry = (i: number): AuditEntry => ({ principal: "embedded", source: "embedded", op: "topic.create", resourceType: "topic", resource: `topic-${i}`, result: "ok", details: { partitions: i } });

async function writeRecords(dir: string, n: number): Promise<AuditRecord[]> {
  const log = await AuditLog.open({ dataDir: dir, fs });
  const out: AuditRecord[] = [];
  for (let i = 1; i <= n; i++) out.push(await log.append(entry(i)));
  await log.close();
  return out;
}

/** The frames of the file as byte ranges (the test's own reading of the format). */
function frames(buf: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let p = 0; p < buf.length; ) {
    const end = p + 8 + buf.readUInt32BE(p);
    out.push(buf.subarray(p, end));
    p = end;
  }
  return out;
}

/** A file system counting fdatasyncs of the audit file. */
class CountingFs extends NodeFileSystem {
  syncs = 0;
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const fh = await super.open(path, mode);
    const datasync = fh.datasync.bind(fh);
    fh.datasync = () => {
      this.syncs++;
      return datasync();
    };
    return fh;
  }
}

test("appends are chained, concurrent ones share an fdatasync, and a reopen continues the chain", async () => {
  using t = tmp();
  const counting = new CountingFs();
  const log = await AuditLog.open({ dataDir: t.dir, fs: counting, now: () => 1_000 });
  const first = await log.append(entry(1));
  assert.equal(first.seq, 1);
  assert.equal(first.prev, "0".repeat(64));
  assert.equal(first.time, 1_000);
  const before = counting.syncs;
  const many = await Promise.all([2, 3, 4, 5].map((i) => log.append(entry(i))));
  assert.deepEqual(
    many.map((r) => r.seq),
    [2, 3, 4, 5],
  );
  assert.ok(counting.syncs - before <= 2, `4 concurrent appends took ${counting.syncs - before} fdatasyncs`);
  for (let i = 1; i < many.length; i++) assert.equal(many[i].prev, many[i - 1].hash);
  assert.equal(many[0].prev, first.hash);
  await log.close();
  await assert.rejects(log.append(entry(9)), { code: "STORAGE_ERROR" });

  const again = await AuditLog.open({ dataDir: t.dir, fs });
  assert.deepEqual(again.last, { seq: 5, hash: many[3].hash });
  const sixth = await again.append(entry(6));
  assert.equal(sixth.seq, 6);
  assert.equal(sixth.prev, many[3].hash);
  await again.close();

  const listed = await listAuditRecords(fs, t.dir, { limit: 3 });
  assert.deepEqual(
    listed.map((r) => [r.seq, r.resource, r.details.partitions]),
    [
      [4, "topic-4", 4],
      [5, "topic-5", 5],
      [6, "topic-6", 6],
    ],
  );
  const v = await verifyAuditLog(fs, t.dir);
  assert.deepEqual(v, { ok: true, count: 6, lastSeq: 6, lastHash: sixth.hash, tornTail: false });
});

test("list --since pages from a time; strings are bounded", async () => {
  using t = tmp();
  let now = 100;
  const log = await AuditLog.open({ dataDir: t.dir, fs, now: () => now });
  for (let i = 1; i <= 5; i++) {
    now = i * 100;
    await log.append(i === 5 ? { ...entry(i), resource: "x".repeat(5000) } : entry(i));
  }
  await log.close();
  const since = await listAuditRecords(fs, t.dir, { since: 300, limit: 2 });
  assert.deepEqual(
    since.map((r) => r.seq),
    [3, 4],
  );
  const last = await listAuditRecords(fs, t.dir, { since: 500 });
  assert.ok(last[0].resource.length < 300, "a long name is cut");
});

test("a record whose fields would exceed the frame limit keeps its fields and drops its details", async () => {
  using t = tmp();
  const log = await AuditLog.open({ dataDir: t.dir, fs });
  const huge = "\u0001".repeat(10_000); // 6 bytes each as JSON
  const details = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`${i}${huge}`, huge]));
  const r = await log.append({ ...entry(1), principal: huge, source: huge, resource: huge, details });
  assert.deepEqual(r.details, { detailsTruncated: true });
  await log.close();
  const v = await verifyAuditLog(fs, t.dir);
  assert.ok(v.ok && v.count === 1, JSON.stringify(v));
});

test("verify: a modified record (CRC recomputed), a deleted one and two swapped ones are each found at their sequence number", async () => {
  using t = tmp();
  const recs = await writeRecords(t.dir, 6);
  const path = auditLogPath(t.dir);
  const original = readFileSync(path);
  const parts = frames(original);
  assert.equal(parts.length, 6);

  // Modified: one letter of record 3's resource name, with its CRC fixed up so it looks clean.
  const edited = Buffer.from(parts[2]);
  const at = edited.indexOf("topic-3");
  edited[at + 6] = "9".charCodeAt(0);
  edited.writeUInt32BE(crc32c(edited.subarray(8)), 4);
  writeFileSync(path, Buffer.concat([...parts.slice(0, 2), edited, ...parts.slice(3)]));
  let v = await verifyAuditLog(fs, t.dir);
  assert.equal(v.ok, false);
  assert.ok(!v.ok && v.seq === 3 && v.reason === "modified", JSON.stringify(v));

  // Deleted: record 3 removed.
  writeFileSync(path, Buffer.concat([...parts.slice(0, 2), ...parts.slice(3)]));
  v = await verifyAuditLog(fs, t.dir);
  assert.ok(!v.ok && v.seq === 3 && v.reason === "missing", JSON.stringify(v));

  // Swapped: records 3 and 4 exchanged.
  writeFileSync(path, Buffer.concat([parts[0], parts[1], parts[3], parts[2], parts[4], parts[5]]));
  v = await verifyAuditLog(fs, t.dir);
  assert.ok(!v.ok && v.seq === 3 && v.reason === "reordered", JSON.stringify(v));

  // Damaged without a CRC fix-up, in the middle: reported, and kept by a reopen (not a torn tail).
  const flipped = Buffer.from(original);
  flipped[parts[0].length + parts[1].length + parts[2].length + 20] ^= 0x01;
  writeFileSync(path, flipped);
  v = await verifyAuditLog(fs, t.dir);
  assert.ok(!v.ok && v.seq === 4 && v.reason === "modified", JSON.stringify(v));
  const log = await AuditLog.open({ dataDir: t.dir, fs });
  assert.equal(statSync(path).size, original.length, "mid-file damage is not truncated");
  assert.equal(log.last.seq, 6, "appends go on after the last readable record");
  await log.close();

  // A record rewritten with a recomputed hash and CRC: the next record's prev no longer matches.
  writeFileSync(path, original);
  const { sealRecord } = await import("../src/security/audit/record.js");
  const forged = sealRecord({ ...recs[2], resource: "forged" }, 3, recs[2].time, recs[2].prev).frame;
  writeFileSync(path, Buffer.concat([...parts.slice(0, 2), forged, ...parts.slice(3)]));
  v = await verifyAuditLog(fs, t.dir);
  assert.ok(!v.ok && v.seq === 4 && v.reason === "chain", JSON.stringify(v));

  writeFileSync(path, original);
  assert.equal((await verifyAuditLog(fs, t.dir)).ok, true);
});

test("a torn tail (a partial last record, or a zero fill) is truncated on open and verify passes", async () => {
  using t = tmp();
  await writeRecords(t.dir, 3);
  const path = auditLogPath(t.dir);
  const good = statSync(path).size;
  const whole = readFileSync(path);
  const last = frames(whole)[2];
  for (const tail of [last.subarray(0, 5), last.subarray(0, last.length - 3), Buffer.alloc(300)]) {
    appendFileSync(path, tail);
    const before = await verifyAuditLog(fs, t.dir);
    assert.ok(before.ok && before.count === 3 && before.tornTail, `a torn tail is no failure: ${JSON.stringify(before)}`);
    const log = await AuditLog.open({ dataDir: t.dir, fs });
    assert.equal(statSync(path).size, good, "the torn tail was cut");
    await log.close();
    const after = await verifyAuditLog(fs, t.dir);
    assert.ok(after.ok && after.count === 3 && !after.tornTail, JSON.stringify(after));
  }
  // A last record whose CRC fails (its bytes half written over an older attempt) is torn too.
  const bad = Buffer.from(last);
  bad[bad.length - 1] ^= 0xff;
  appendFileSync(path, bad);
  const log = await AuditLog.open({ dataDir: t.dir, fs });
  assert.equal(statSync(path).size, good);
  assert.equal((await log.append(entry(4))).seq, 4);
  await log.close();
  assert.ok((await verifyAuditLog(fs, t.dir)).ok);
});

test("no audit log yet: verify passes with zero records, list is empty", async () => {
  using t = tmp();
  assert.deepEqual(await verifyAuditLog(fs, t.dir), { ok: true, count: 0, lastSeq: 0, lastHash: "0".repeat(64), tornTail: false });
  assert.deepEqual(await listAuditRecords(fs, t.dir), []);
});

/** Crash at I/O operation k of a few appends; every acknowledged record must be there after a power loss. */
async function crashAt(k: number, seed: number): Promise<{ ops: number; problems: string[] }> {
  const root = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-audit-cp-"));
  mkdirSync(join(root, "data"));
  const problems: string[] = [];
  try {
    const ffs = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch") } });
    const base = ffs.opCount;
    ffs.crashAtOp(base + k);
    const acked: AuditRecord[] = [];
    const work = (async () => {
      const log = await AuditLog.open({ dataDir: join(root, "data"), fs: ffs });
      acked.push(await log.append(entry(1)));
      for (const r of await Promise.all([2, 3, 4].map((i) => log.append(entry(i))))) acked.push(r);
      acked.push(await log.append(entry(5)));
    })().catch(() => {});
    await Promise.race([work, ffs.whenCrashed()]);
    const ops = ffs.opCount - base;
    if (!ffs.isCrashed) ffs.crash("power lost after the appends");
    await ffs.powerLoss({ seed: seed * 7919 + k, mode: "mixed" });
    ffs.dispose();
    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2") } });
    try {
      const log = await AuditLog.open({ dataDir: join(root, "data"), fs: fs2 });
      const next = await log.append(entry(99));
      await log.close();
      const v = await verifyAuditLog(fs2, join(root, "data"));
      if (!v.ok) problems.push(`verify after recovery: ${JSON.stringify(v)}`);
      const got = await listAuditRecords(fs2, join(root, "data"), { limit: 100 });
      for (const a of acked) if (got[a.seq - 1]?.hash !== a.hash) problems.push(`acknowledged seq ${a.seq} lost`);
      if (next.seq !== got.length) problems.push(`the append after recovery got seq ${next.seq} of ${got.length}`);
    } catch (e) {
      problems.push(`recovery failed: ${(e as Error).stack}`);
    } finally {
      fs2.dispose();
    }
    return { ops, problems };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

test("a crash and power loss at any I/O operation of opening and appending keeps every acknowledged record (AUD-1, AUD-3)", { timeout: 300_000 }, async (t) => {
  const dry = await crashAt(Number.MAX_SAFE_INTEGER, 1);
  assert.deepEqual(dry.problems, []);
  assert.ok(dry.ops >= 8, `${dry.ops} I/O operations`);
  const failures: string[] = [];
  for (const seed of [1, 2]) {
    for (let k = 0; k <= dry.ops; k++) for (const p of (await crashAt(k, seed)).problems) failures.push(`seed ${seed} k=${k}: ${p}`);
  }
  t.diagnostic(`${2 * (dry.ops + 1)} crash points, ${failures.length} problems`);
  assert.deepEqual(failures.slice(0, 20), []);
});
