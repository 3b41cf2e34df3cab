// SPDX-License-Identifier: Apache-2.0
/**
 * Every administrative operation of the broker facade is in the audit log with who asked, what,
 * and the result, durable before the result is returned (AUD-1): embedded (principal and
 * source "embedded") and through the server (principal "anonymous", the peer's address as
 * source, over the binary protocol and HTTP). Failures are recorded with their error code;
 * reads and dry runs are not recorded. `sluice audit list|verify` read it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { PermanentError } from "../src/errors.js";
import { NodeFileSystem } from "../src/log/io.js";
import { auditLogPath } from "../src/security/audit/audit-log.js";
import { listAuditRecords } from "../src/security/audit/reader.js";
import type { AuditRecord } from "../src/security/audit/record.js";
import { verifyAuditLog } from "../src/security/audit/verify.js";
import { startServer } from "../src/server/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { waitUntil } from "../src/testing/helpers.js";

const fs = new NodeFileSystem();
const CLI = join(dirname(fileURLToPath(import.meta.url)), "..", "src", "cli", "main.js");

function tmp(): { dir: string; [Symbol.dispose](): void } {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-audit-broker-"));
  return { dir, [Symbol.dispose]: () => rmSync(dir, { recursive: true, force: true }) };
}

const brief = (r: AuditRecord): string => `${r.op} ${r.resourceType}:${r.resource} ${r.result}`;

test("embedded: every administrative operation, failed or not, is recorded as embedded; reads and dry runs are not", async () => {
  using t = tmp();
  const b = await openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("orders", { partitions: 2 });
    await assert.rejects(b.createTopic("orders"), { code: "TOPIC_EXISTS" });
    await b.alterTopic("orders", { retentionMs: 60_000 });
    await b.listTopics();
    await b.describeTopic("orders");
    await b.resetGroup("billing", "orders", "earliest", { dryRun: true });
    await b.resetGroup("billing", "orders", "latest");
    await assert.rejects(b.resetGroup("billing", "nope", "latest"), { code: "TOPIC_NOT_FOUND" });
    const q = b.queue<string>("jobs", { maxAttempts: 3 });
    await q.enqueue("a");
    await q.enqueue("b");
    const keep = await q.enqueue("c");
    assert.equal(await q.remove(keep.id), true);
    // Dead-letter two jobs, then remove one from the dead-letter queue and redrive the other.
    const ac = new AbortController();
    const running = q.process(
      async () => {
        throw new PermanentError("bad input");
      },
      { signal: ac.signal },
    );
    const dlq = b.queue<string>("jobs.dlq");
    await waitUntil(async () => (await dlq.stats()).waiting === 2, "two jobs dead-lettered");
    ac.abort();
    await running;
    const page = await dlq.browse({ limit: 10 });
    assert.equal(await dlq.remove(page.jobs[0].id), true);
    assert.deepEqual(await dlq.redrive(), { moved: 1, skippedRepeats: 0 });
    assert.equal(await q.purge(), 1);
    await q.stats();
    await b.deleteQueue("jobs");
    await assert.rejects(b.deleteQueue("jobs"), { code: "QUEUE_NOT_FOUND" });
    await b.deleteTopic("orders");
    await assert.rejects(b.deleteTopic("orders"), { code: "TOPIC_NOT_FOUND" });
    // Durable before the result (AUD-1): every record is in the file now, before close.
    const records = await listAuditRecords(fs, t.dir, { limit: 1000 });
    assert.deepEqual(records.map(brief), [
      "topic.create topic:orders ok",
      "topic.create topic:orders TOPIC_EXISTS",
      "topic.alter topic:orders ok",
      "group.reset group:billing ok",
      "group.reset group:billing TOPIC_NOT_FOUND",
      "queue.create queue:jobs ok",
      "queue.create queue:jobs.dlq ok",
      "queue.remove queue:jobs ok",
      "queue.remove queue:jobs.dlq ok",
      "queue.redrive queue:jobs.dlq ok",
      "queue.purge queue:jobs ok",
      "queue.delete queue:jobs ok",
      "queue.delete queue:jobs QUEUE_NOT_FOUND",
      "topic.delete topic:orders ok",
      "topic.delete topic:orders TOPIC_NOT_FOUND",
    ]);
    for (const r of records) assert.deepEqual([r.principal, r.source], ["embedded", "embedded"]);
    assert.deepEqual(
      records.map((r) => r.seq),
      records.map((_, i) => i + 1),
    );
    assert.deepEqual(records[0].details, { config: '{"partitions":2}' });
    assert.deepEqual(records[2].details, { changes: '{"retentionMs":60000}' });
    assert.deepEqual(records[3].details, { topic: "orders", to: '"latest"', partitions: 2 });
    assert.deepEqual(records[5].details, { config: '{"maxAttempts":3}' });
    assert.deepEqual(records[6].details, { implicit: true });
    assert.deepEqual(records[7].details, { id: keep.id, removed: true });
    assert.deepEqual(records[9].details, { moved: 1, skippedRepeats: 0 });
    assert.deepEqual(records[10].details, { purged: 1 });
  } finally {
    await b.close();
  }
  // Reopened: the chain goes on.
  const again = await openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0 });
  await again.createTopic("later");
  await again.close();
  const all = await listAuditRecords(fs, t.dir, { limit: 1000 });
  assert.equal(all.at(-1)!.seq, 16);
  assert.equal(all.at(-1)!.prev, all.at(-2)!.hash);
});

test("audit: false keeps no audit log", async () => {
  using t = tmp();
  const b = await openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0, audit: false });
  await b.createTopic("x");
  await b.close();
  assert.deepEqual(await listAuditRecords(fs, t.dir), []);
});

function httpJson(port: number, method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method, path, headers: { "content-type": "application/json" } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        resolve({ status: res.statusCode ?? 0, json: text === "" ? null : JSON.parse(text) });
      });
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

const http = async (port: number, method: string, path: string, body?: unknown): Promise<number> => (await httpJson(port, method, path, body)).status;

test("server: operations over the protocol and HTTP are recorded as anonymous from the peer's address", async () => {
  using t = tmp();
  const broker = await openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0 });
  const client = await connect({ url: srv.url });
  try {
    await client.createTopic("events", { partitions: 1 });
    await assert.rejects(client.createTopic("events"), { code: "TOPIC_EXISTS" });
    await client.alterTopic("events", { retentionMs: 120_000 });
    await client.resetGroup("g", "events", "earliest");
    const q = client.queue<string>("work", { maxAttempts: 2 });
    const { id } = await q.enqueue("x");
    await q.enqueue("y");
    assert.equal(await q.remove(id), true);
    assert.equal(await q.purge(), 1);
    assert.deepEqual(await client.queue("work.dlq").redrive(), { moved: 0, skippedRepeats: 0 });
    await client.deleteQueue("work");
    await client.deleteTopic("events");
    assert.equal(await http(srv.httpPort!, "POST", "/v1/topics", { name: "web" }), 201);
    assert.equal(await http(srv.httpPort!, "POST", "/v1/queues/webq/purge"), 404);
    assert.equal(await http(srv.httpPort!, "DELETE", "/v1/topics/web"), 200);
    const records = await listAuditRecords(fs, t.dir, { limit: 1000 });
    assert.deepEqual(records.map(brief), [
      "topic.create topic:events ok",
      "topic.create topic:events TOPIC_EXISTS",
      "topic.alter topic:events ok",
      "group.reset group:g ok",
      "queue.create queue:work ok",
      "queue.create queue:work.dlq ok",
      "queue.remove queue:work ok",
      "queue.purge queue:work ok",
      "queue.redrive queue:work.dlq ok",
      "queue.delete queue:work ok",
      "topic.delete topic:events ok",
      "topic.create topic:web ok",
      "queue.purge queue:webq QUEUE_NOT_FOUND",
      "topic.delete topic:web ok",
    ]);
    for (const r of records) {
      assert.equal(r.principal, "anonymous", brief(r));
      assert.match(r.source, /^(::ffff:)?127\.0\.0\.1:\d+$/, brief(r));
    }
    // GET /v1/audit: the same records; not itself audited.
    const viaHttp = await httpJson(srv.httpPort!, "GET", "/v1/audit?limit=2");
    assert.equal(viaHttp.status, 200);
    assert.deepEqual(viaHttp.json.records, records.slice(-2));
    const since = await httpJson(srv.httpPort!, "GET", `/v1/audit?since=${records[0].time}&limit=1`);
    assert.deepEqual(since.json.records, [records[0]]);
    assert.equal((await httpJson(srv.httpPort!, "GET", "/v1/audit?limit=0")).status, 400);
    assert.equal((await listAuditRecords(fs, t.dir, { limit: 1000 })).length, records.length);
    const protocolPeer = records[0].source;
    assert.ok(records.slice(0, 11).every((r) => r.source === protocolPeer), "one connection, one source");
    assert.notEqual(records[11].source, protocolPeer, "HTTP requests come from another socket");
  } finally {
    await client.close();
    await srv.close({ graceMs: 200 });
    await broker.close();
  }
});

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof err.code === "number" ? err.code : 1, stdout, stderr });
    });
  });
}

test("sluice audit list and verify: a table, JSON, and exit status 1 naming the first broken record", async () => {
  using t = tmp();
  const b = await openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0 });
  for (const n of ["a", "b", "c", "d"]) await b.createTopic(n);
  await b.close();
  const table = await cli(["audit", "list", "--data", t.dir]);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /^SEQ +TIME +PRINCIPAL +SOURCE +OPERATION +RESOURCE +RESULT +DETAILS/);
  assert.match(table.stdout, /\n4 +\S+ +embedded +embedded +topic\.create +topic d +ok/);
  const json = await cli(["audit", "list", "--data", t.dir, "--limit", "2", "--json"]);
  assert.deepEqual(
    (JSON.parse(json.stdout).records as AuditRecord[]).map((r) => r.resource),
    ["c", "d"],
  );
  const ok = await cli(["audit", "verify", "--data", t.dir]);
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, /^OK: 4 records, last seq 4, last hash [0-9a-f]{64}/);
  // Drop record 2: verify fails at seq 2.
  const path = auditLogPath(t.dir);
  const buf = readFileSync(path);
  const first = 8 + buf.readUInt32BE(0);
  const second = first + 8 + buf.readUInt32BE(first);
  writeFileSync(path, Buffer.concat([buf.subarray(0, first), buf.subarray(second)]));
  const bad = await cli(["audit", "verify", "--data", t.dir]);
  assert.equal(bad.code, 1);
  assert.match(bad.stdout, /FAILED at seq 2 \(missing\)/);
  assert.match(bad.stderr, /error \[AUDIT_CORRUPT\]: audit log broken at seq 2 \(missing\)/);
  const usage = await cli(["audit", "list", "--url", "sluice://127.0.0.1:1"]);
  assert.equal(usage.code, 2);
});

/** Crash at I/O operation k of a few admin operations: each acknowledged one must have its record. */
async function adminCrashAt(k: number, seed: number): Promise<{ ops: number; problems: string[] }> {
  const root = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-audit-bcp-"));
  const dataDir = join(root, "data");
  const problems: string[] = [];
  try {
    const ffs = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch") } });
    const b = await openBroker({ dataDir, fs: ffs, retentionCheckIntervalMs: 0, runSchedules: false });
    const base = ffs.opCount;
    ffs.crashAtOp(base + k);
    const acked: string[] = [];
    const step = async (what: string, p: Promise<unknown>, fails = false): Promise<void> => {
      try {
        await p;
        if (fails) throw new Error(`${what} should fail`);
        acked.push(`${what} ok`);
      } catch (e) {
        if (fails && (e as { code?: string }).code === "TOPIC_NOT_FOUND") acked.push(`${what} TOPIC_NOT_FOUND`);
        else throw e;
      }
    };
    const work = (async () => {
      await step("topic.create topic:a", b.createTopic("a", { partitions: 1 }));
      await step("topic.alter topic:nope", b.alterTopic("nope", { retentionMs: 1000 }), true);
      await step("topic.alter topic:a", b.alterTopic("a", { retentionMs: 60_000 }));
      await step("queue.delete queue:q", (async () => (await b.queue("q", {}).stats(), b.deleteQueue("q")))());
      await step("topic.delete topic:a", b.deleteTopic("a"));
    })().catch(() => {});
    await Promise.race([work, ffs.whenCrashed()]);
    const ops = ffs.opCount - base;
    if (!ffs.isCrashed) ffs.crash("power lost after the operations");
    await Promise.race([b.close().catch(() => {}), new Promise((r) => setTimeout(r, 2000).unref())]);
    await ffs.powerLoss({ seed: seed * 7919 + k, mode: "mixed" });
    ffs.dispose();
    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2") } });
    try {
      const b2 = await openBroker({ dataDir, fs: fs2, retentionCheckIntervalMs: 0, runSchedules: false });
      await b2.close();
      const v = await verifyAuditLog(fs2, dataDir);
      if (!v.ok) problems.push(`verify after recovery: ${JSON.stringify(v)}`);
      const got = (await listAuditRecords(fs2, dataDir, { limit: 100 })).map(brief);
      for (const a of acked) if (!got.includes(a)) problems.push(`acknowledged "${a}" has no audit record (${JSON.stringify(got)})`);
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

test("a crash and power loss at any I/O operation of audited operations: every acknowledged one has its record (AUD-1)", { timeout: 600_000 }, async (t) => {
  const dry = await adminCrashAt(Number.MAX_SAFE_INTEGER, 1);
  assert.deepEqual(dry.problems, []);
  const failures: string[] = [];
  for (let k = 0; k <= dry.ops; k++) for (const p of (await adminCrashAt(k, 1)).problems) failures.push(`k=${k}: ${p}`);
  t.diagnostic(`${dry.ops + 1} crash points, ${failures.length} problems`);
  assert.deepEqual(failures.slice(0, 10), []);
});
