// SPDX-License-Identifier: Apache-2.0
// Secrets scan (ENC-1, ENC-3; AUTH-2): a real `sluice serve` with users, a token and an
// encryption key file carries traffic on an encrypted topic and queue (binary protocol with a
// password and with a token, HTTP with the token); then no file of the data dir and no line the
// server logged holds the password, the token, the key (base64, hex or raw) or the payload.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const PAYLOAD = "payload-c0ffee-secret-4711";

function files(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    out.push(...(e.isDirectory() ? files(p) : [p]));
  }
  return out;
}

function cli(args: string[]): string {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

test("no password, token, encryption key or encrypted payload in the data dir or the server's log", { timeout: 90_000 }, async () => {
  using tmp = tempDir("sluice-secrets-");
  const data = join(tmp.dir, "data");
  const key = randomBytes(32);
  const keyFile = join(tmp.dir, "keys.json");
  writeFileSync(keyFile, JSON.stringify({ active: "k1", keys: { k1: key.toString("base64") } }), { mode: 0o600 });
  const password = `pw-${randomBytes(12).toString("hex")}`;
  const pwFile = join(tmp.dir, "alice.pw");
  writeFileSync(pwFile, password, { mode: 0o600 });
  cli(["users", "add", "alice", "--data", data, "--password-file", pwFile]);
  const token = (JSON.parse(cli(["tokens", "create", "ci-bot", "--data", data, "--json"])) as { token: string }).token;
  cli(["acl", "add", "--allow", "alice", "--op", "admin", "--cluster", "--data", data]);
  cli(["acl", "add", "--allow", "ci-bot", "--op", "admin", "--cluster", "--data", data]);
  assert.ok(token.length > 16);

  const server = await spawnServer(["--data", data, "--port", "0", "--http-port", "0", "--log-level", "debug", "--encryption-key-file", keyFile]);
  let stderr = "";
  server.proc.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
  try {
    const a = await connect({ url: server.url, auth: { username: "alice", password } });
    try {
      await a.createTopic("orders", { encrypted: true, partitions: 2 });
      const p = await a.initProducer();
      await a.publishBatch("orders", [{ value: { note: PAYLOAD }, key: "cust-1", partition: 0 }], { ...p, baseSequence: 0 });
      for (let i = 0; i < 10; i++) await a.publish("orders", `${PAYLOAD}-${i}`, { key: `cust-${i}`, headers: { h: PAYLOAD } });
      const sub = a.subscribe("orders", { group: "billing", start: "earliest" });
      let n = 0;
      await withTimeout(
        (async () => {
          for await (const m of sub) {
            assert.match(JSON.stringify(m.value), new RegExp(PAYLOAD));
            await m.commit();
            if (++n === 11) break;
          }
        })(),
        20_000,
        "subscription",
      );
      const q = a.queue<{ s: string }>("emails", { encrypted: true, resultRetentionMs: 60_000, maxAttempts: 1 });
      await q.enqueue({ s: PAYLOAD });
      await q.enqueue({ s: `${PAYLOAD}-dlq` });
      const w = q.work({ visibilityTimeoutMs: 5000 });
      const it = w[Symbol.asyncIterator]();
      const j1 = (await it.next()).value!;
      await j1.progress({ at: PAYLOAD });
      await j1.ack({ sent: PAYLOAD });
      const j2 = (await it.next()).value!;
      await j2.nack({ requeue: false, reason: `failed on ${PAYLOAD}` });
      await w.close();
      await waitUntil(async () => (await a.queue("emails.dlq").stats()).waiting === 1, "dead-lettered");
    } finally {
      await a.close();
    }
    const t = await connect({ url: server.url, auth: { token } });
    try {
      await t.publish("orders", `${PAYLOAD}-token`);
      assert.equal((await t.queue("emails").getJob("0"))?.state ?? "completed", "completed");
    } finally {
      await t.close();
    }
    const res = await fetch(`http://127.0.0.1:${server.httpPort}/v1/topics/orders/records`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ records: [{ value: `${PAYLOAD}-http`, partition: 1 }] }),
    });
    assert.equal(res.status, 200, await res.text());
    const back = await fetch(`http://127.0.0.1:${server.httpPort}/v1/topics/orders/partitions/1/records?offset=0`, { headers: { authorization: `Bearer ${token}` } });
    assert.match(await back.text(), new RegExp(`${PAYLOAD}-http`));
  } finally {
    server.proc.kill("SIGTERM");
    assert.equal(await server.exited, 0, stderr);
  }

  const secrets: [string, Buffer][] = [
    ["password", Buffer.from(password)],
    ["token", Buffer.from(token)],
    ["key (base64)", Buffer.from(key.toString("base64"))],
    ["key (hex)", Buffer.from(key.toString("hex"))],
    ["key (raw)", key],
    ["payload", Buffer.from(PAYLOAD)],
    ["record key", Buffer.from("cust-1")],
  ];
  const scanned = files(data);
  assert.ok(scanned.some((f) => f.endsWith(".log") && f.includes("orders")), "the topic's segments were scanned");
  assert.ok(scanned.some((f) => f.endsWith("snapshot.bin")), "a queue snapshot was scanned");
  for (const f of scanned) {
    const bytes = readFileSync(f);
    for (const [what, s] of secrets) assert.ok(!bytes.includes(s), `${what} found in ${f}`);
  }
  const log = server.stdout.join("\n") + "\n" + stderr;
  assert.ok(log.includes('"event":"listening"'), "the log was captured");
  assert.ok(log.includes("encryption at rest: keyring loaded"), "the keyring's source is logged");
  assert.ok(!log.includes("can be read by other users"), "a 0600 key file draws no warning");
  for (const [what, s] of secrets) {
    if (what === "key (raw)" || what === "record key") continue; // binary; keys of records may name things, see docs/security.md
    const line = log.split("\n").find((l) => l.includes(s.toString("utf8")));
    assert.equal(line, undefined, `${what} found in the server log`);
  }
});
