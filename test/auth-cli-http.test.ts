// SPDX-License-Identifier: Apache-2.0
/**
 * Authentication through `sluice` and the HTTP port: `sluice users` / `sluice tokens` fill the
 * credential store, `sluice serve` then requires logins (CLI `--user/--password-file`,
 * `--token-file`, SLUICE_TOKEN; HTTP Bearer and Basic, 401 with WWW-Authenticate otherwise,
 * probes open), the loopback rule stops `serve --host 0.0.0.0` without credentials, and
 * neither the data directory nor the server's log holds a password or token afterwards.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const CLEAN_ENV = { SLUICE_URL: "", SLUICE_DATA: "", SLUICE_TLS_CA: "", SLUICE_USER: "", SLUICE_PASSWORD: "", SLUICE_TOKEN: "" };

function cli(args: string[], env: NodeJS.ProcessEnv = {}): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, ...CLEAN_ENV, ...env } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function filesUnder(dir: string, out: string[] = []): string[] {
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) filesUnder(p, out);
    else out.push(p);
  }
  return out;
}

test("users and tokens from the CLI: logins over the protocol and HTTP, and no secret on disk or in logs", async () => {
  using dir = tempDir("sluice-auth-cli-");
  const data = join(dir.dir, "data");
  const password = "pw-" + "q7Zr2mXk9vLp";
  const pwFile = join(dir.dir, "pw");
  writeFileSync(pwFile, password + "\n");
  assert.equal(cli(["users", "add", "alice", "--data", data, "--password-file", pwFile, "--iterations", "4096"]).status, 0);
  const created = cli(["tokens", "create", "ci-bot", "--data", data, "--ttl-ms", "3600000", "--json"]);
  assert.equal(created.status, 0, created.stderr);
  const { token, id } = JSON.parse(created.stdout) as { token: string; id: string };
  const tokenFile = join(dir.dir, "token");
  writeFileSync(tokenFile, token + "\n");
  for (const who of ["alice", "ci-bot"]) assert.equal(cli(["acl", "add", "--allow", who, "--op", "admin", "--cluster", "--data", data]).status, 0);
  assert.match(cli(["users", "list", "--data", data]).stdout, /alice/);
  assert.match(cli(["tokens", "list", "--data", data]).stdout, new RegExp(`${id}\\s+ci-bot`));

  const srv = await spawnServer(["--data", data, "--port", "0", "--http-port", "0", "--log-level", "debug"]);
  try {
    const denied = cli(["topics", "list", "--url", srv.url]);
    assert.equal(denied.status, 1);
    assert.match(denied.stderr, /^error \[AUTHENTICATION_FAILED\]: authentication failed/);
    assert.equal(cli(["topics", "list", "--url", srv.url, "--user", "alice", "--password-file", pwFile]).status, 0);
    assert.equal(cli(["topics", "list", "--url", srv.url, "--token-file", tokenFile]).status, 0);
    assert.equal(cli(["topics", "list", "--url", srv.url], { SLUICE_TOKEN: token }).status, 0);
    assert.equal(cli(["topics", "list", "--url", srv.url], { SLUICE_USER: "alice", SLUICE_PASSWORD: password }).status, 0);
    assert.equal(cli(["topics", "list", "--url", srv.url, "--user", "alice", "--password-file", tokenFile]).status, 1);

    const base = `http://127.0.0.1:${srv.httpPort}`;
    const open = await fetch(`${base}/v1/topics`);
    assert.equal(open.status, 401);
    assert.match(open.headers.get("www-authenticate") ?? "", /Basic realm="sluice".*Bearer realm="sluice"/);
    assert.equal(((await open.json()) as { error: { code: string } }).error.code, "AUTHENTICATION_FAILED");
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: `Bearer ${token}` } })).status, 200);
    const basic = (user: string, pw: string): string => "Basic " + Buffer.from(`${user}:${pw}`).toString("base64");
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: basic("alice", password) } })).status, 200);
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: basic("alice", "wrong") } })).status, 401);
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: "Bearer slt_nope" } })).status, 401);
    assert.equal((await fetch(`${base}/nothing-here`)).status, 401, "no route is revealed without credentials");
    assert.equal((await fetch(`${base}/healthz`)).status, 200);

    // A revoked token stops working at the next login, without a restart.
    assert.equal(cli(["tokens", "revoke", id, "--data", data]).status, 0);
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: `Bearer ${token}` } })).status, 401);
    assert.equal(cli(["topics", "list", "--url", srv.url, "--token-file", tokenFile]).status, 1);
    // Likewise a removed user, even one whose Basic login succeeded (and was cached) above.
    assert.equal(cli(["users", "remove", "alice", "--data", data]).status, 0);
    assert.equal((await fetch(`${base}/v1/topics`, { headers: { authorization: basic("alice", password) } })).status, 401);
  } finally {
    srv.proc.kill("SIGTERM");
    await srv.exited;
  }
  const logs = srv.stdout.join("\n");
  assert.match(logs, /"principal":"alice"/, "logins are logged with their principal");
  for (const secret of [password, token, token.slice(4)]) {
    assert.ok(!logs.includes(secret), "the server's log holds no secret");
    for (const f of filesUnder(data)) assert.ok(!readFileSync(f).includes(secret), `${f} holds no secret`);
  }
});

test("sluice serve refuses a non-loopback host without users or tokens, naming the flag", () => {
  using dir = tempDir("sluice-auth-cli-");
  const r = cli(["serve", "--data", join(dir.dir, "data"), "--host", "0.0.0.0", "--port", "0", "--http-port", "off"]);
  assert.notEqual(r.status, 0);
  const lines = r.stderr.trim().split("\n");
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], /refusing to listen on 0\.0\.0\.0 without authentication.*--insecure-no-auth/);
});
