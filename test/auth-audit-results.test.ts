// SPDX-License-Identifier: Apache-2.0
// Every authentication result goes to the audit log (AUD-4, docs/security.md "Audit log"):
// successes and failures over the binary protocol and HTTP, with principal, source, operation,
// resource and result; a flood of failures from one address costs one record per window; no
// secret is recorded; a login whose record cannot be written is refused; `sluice audit verify`
// passes, and catches an edited and a deleted record.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { AuthenticationError, StorageError } from "../src/errors.js";
import { auditLogPath } from "../src/security/audit/audit-log.js";
import { AuthAudit, type AuthAttempt } from "../src/security/audit/auth-results.js";
import type { AuditTarget } from "../src/security/audit/auditor.js";
import { silentLogger } from "../src/observability/telemetry.js";
import type { AuditRecord } from "../src/security/audit/record.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { startServer } from "../src/server/index.js";
import { tempDir } from "../src/testing/helpers.js";
import { wrapHost } from "./fixtures/host-wrapper.js";
import { grantAdmin } from "./fixtures/acl.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const PASSWORD = "audit-results-pw";
const FLOOD = 40;

function cli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Byte offsets of each frame (u32 length | u32 CRC | payload) of the audit file. */
function frames(buf: Buffer): { start: number; end: number }[] {
  const out: { start: number; end: number }[] = [];
  for (let pos = 0; pos + 8 <= buf.length; ) {
    const end = pos + 8 + buf.readUInt32BE(pos);
    out.push({ start: pos, end });
    pos = end;
  }
  return out;
}

test("logins that succeed and fail over the protocol and HTTP are audited, failures aggregated per source", async () => {
  using dir = tempDir("sluice-auth-audit-results-");
  const data = join(dir.dir, "data");
  const store = await CredentialStore.open(data);
  await store.addUser("alice", PASSWORD, 4096);
  const { token } = await store.createToken("ci-bot");
  await grantAdmin(data, "alice", "ci-bot");
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, auth: { failureLimit: { burst: 1000 } } });
  const base = `http://127.0.0.1:${srv.httpPort}`;
  const basic = (user: string, pw: string): string => "Basic " + Buffer.from(`${user}:${pw}`).toString("base64");
  let floodMs = 0;
  try {
    const a = await connect({ url: srv.url, auth: { username: "alice", password: PASSWORD } });
    await a.close();
    const t = await connect({ url: srv.url, auth: { token } });
    await t.close();
    await assert.rejects(connect({ url: srv.url, auth: { username: "alice", password: "wrong-password" } }), AuthenticationError);
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: `Bearer ${token}` } })).status, 200);
    for (let i = 0; i < 3; i++) assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: basic("alice", PASSWORD) } })).status, 200);
    // A flood of failures from one address.
    const started = performance.now();
    for (let i = 0; i < FLOOD; i++) assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: i % 2 ? "Bearer slt_nope" : basic("mallory", "guess") } })).status, 401);
    floodMs = performance.now() - started;
  } finally {
    await srv.close(); // writes the counts still being aggregated
    await broker.close();
  }

  const listed = cli(["audit", "list", "--data", data, "--json"]);
  assert.equal(listed.status, 0, listed.stderr);
  const logins = (JSON.parse(listed.stdout) as { records: AuditRecord[] }).records.filter((r) => r.op === "auth.login");
  for (const r of logins) {
    assert.equal(r.resourceType, "server");
    assert.ok(r.time > 0 && r.time <= Date.now());
    assert.match(r.source, /^127\.0\.0\.1(:\d+)?$/);
  }
  const find = (resource: string, principal: string, result: string): AuditRecord[] => logins.filter((r) => r.resource === resource && r.principal === principal && r.result === result);

  const scram = find("protocol", "alice", "ok");
  assert.equal(scram.length, 1);
  assert.match(scram[0].source, /^127\.0\.0\.1:\d+$/);
  assert.equal(scram[0].details.mechanism, "SCRAM-SHA-256");
  assert.equal(find("protocol", "ci-bot", "ok")[0]?.details.mechanism, "BEARER");
  const wrong = find("protocol", "alice", "AUTHENTICATION_FAILED");
  assert.equal(wrong.length, 1);
  assert.equal(wrong[0].details.reason, "wrong password or unknown user");
  assert.equal(find("http", "ci-bot", "ok")[0]?.details.mechanism, "BEARER");
  // Repeated HTTP successes: the first at once, the repeats as one record with their count.
  const basicOk = find("http", "alice", "ok");
  assert.deepEqual(basicOk.map((r) => r.details.count), [1, 2]);

  const failed = logins.filter((r) => r.resource === "http" && r.result === "AUTHENTICATION_FAILED");
  const total = failed.reduce((n, r) => n + Number(r.details.count), 0);
  assert.equal(total, FLOOD, "every failure is counted");
  // One record at once, then one per second (1 s window) while failures go on, and one at close.
  assert.ok(failed.length <= 2 + Math.ceil(floodMs / 1000), `${failed.length} records for ${FLOOD} failures in ${floodMs.toFixed(0)} ms`);
  assert.ok(failed.some((r) => r.principal === "various" && /^127\.0\.0\.1$/.test(r.source)), "aggregates name the address");

  // No password, token or part of one is recorded.
  const file = auditLogPath(data);
  const bytes = readFileSync(file);
  for (const secret of [PASSWORD, "wrong-password", "guess", token, token.slice(4), "slt_nope"]) assert.ok(!bytes.includes(secret), `the audit log holds no ${secret}`);

  const ok = cli(["audit", "verify", "--data", data]);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^OK: \d+ records/);

  // One byte of a record in the middle changed: `modified` at that record.
  const fr = frames(bytes);
  assert.ok(fr.length >= 6);
  const edited = Buffer.from(bytes);
  const victim = fr[2];
  const at = edited.indexOf("auth.login", victim.start);
  assert.ok(at > victim.start && at < victim.end);
  edited[at] ^= 0x01;
  writeFileSync(file, edited);
  const modified = cli(["audit", "verify", "--data", data]);
  assert.equal(modified.status, 1);
  assert.match(modified.stdout + modified.stderr, /FAILED at seq 3 \(modified\)/);
  assert.match(modified.stderr, /AUDIT_CORRUPT/);

  // One record removed: `missing`.
  writeFileSync(file, Buffer.concat([bytes.subarray(0, victim.start), bytes.subarray(victim.end)]));
  const missing = cli(["audit", "verify", "--data", data]);
  assert.equal(missing.status, 1);
  assert.match(missing.stdout + missing.stderr, /FAILED at seq 3 \(missing\): seq 3 is missing/);
});

test("aggregation: one record per window and source, bounded windows, counts written on flush", async () => {
  const written: { principal: string; source: string; target: AuditTarget; failed: boolean }[] = [];
  const audit = new AuthAudit(async (actor, target, error) => void written.push({ ...actor, target, failed: error !== undefined }), silentLogger, {
    failureWindowMs: 3_600_000, // the windows end at flush() here
    maxWindows: 2,
  });
  const from = (source: string, principal = "mallory"): AuthAttempt => ({ via: "protocol", source, remote: `${source}:1234`, principal, mechanism: "SCRAM-SHA-256" });
  for (let i = 0; i < 5; i++) audit.failed(from("10.0.0.1", i === 4 ? "eve" : "mallory"), "wrong password or unknown user");
  audit.failed(from("10.0.0.2"), "no credentials");
  // The windows are full: further addresses share one overflow window.
  for (const src of ["10.0.0.3", "10.0.0.4", "10.0.0.5"]) audit.failed(from(src), "no credentials");
  await audit.succeeded(from("10.0.0.9", "alice"));
  await audit.flush();
  const rows = written.map((w) => [w.source, w.principal, w.target.details?.count, w.failed]);
  assert.deepEqual(rows, [
    ["10.0.0.1:1234", "mallory", 1, true],
    ["10.0.0.2:1234", "mallory", 1, true],
    ["10.0.0.3:1234", "mallory", 1, true],
    ["10.0.0.9:1234", "alice", 1, false], // protocol successes: each recorded, never aggregated
    ["10.0.0.1", "various", 4, true],
    ["various", "mallory", 2, true],
  ]);
  assert.equal(written[4].target.details?.principals, "mallory; eve");
  assert.equal(written[5].target.details?.sources, "10.0.0.4; 10.0.0.5");
  for (const w of written) assert.deepEqual([w.target.op, w.target.resourceType, w.target.resource], ["auth.login", "server", "protocol"]);
});

test("a login whose audit record cannot be written is not let in (retriable STORAGE_ERROR)", async () => {
  using dir = tempDir("sluice-auth-audit-fail-");
  const store = await CredentialStore.open(dir.dir);
  const { token } = await store.createToken("ci-bot");
  const broker = await openBroker({ dataDir: dir.dir, retentionCheckIntervalMs: 0 });
  const host = wrapHost(broker, { recordAudit: () => Promise.reject(new Error("audit disk gone")) });
  const srv = await startServer({ broker: host, port: 0, httpPort: 0, dataDir: dir.dir });
  try {
    const e = await connect({ url: srv.url, auth: { token }, connectTimeoutMs: 3000 }).then(
      (c) => c.close().then(() => null),
      (err: unknown) => err,
    );
    assert.ok(e instanceof StorageError, String(e));
    assert.equal(e.retriable, true);
    const res = await fetch(`http://127.0.0.1:${srv.httpPort}/v1/topics`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, 503);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "STORAGE_ERROR");
  } finally {
    await srv.close();
    await broker.close();
  }
});
