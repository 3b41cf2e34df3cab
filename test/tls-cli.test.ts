// SPDX-License-Identifier: Apache-2.0
/**
 * TLS through the command line: `sluice serve --tls-cert --tls-key` serves `sluice+tls://`,
 * CLI commands reach it with `--url sluice+tls://… --tls-ca FILE` (and fail with
 * TLS_HANDSHAKE without the CA), SIGHUP reloads the certificate, and bad TLS files stop the
 * start with one `error [TLS_CONFIG]` line.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { connect as tlsConnect } from "node:tls";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { resolveServeConfig } from "../src/cli/serve.js";
import { ValidationError } from "../src/errors.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";
import { fingerprintOf, makeCa, makeLeaf } from "./fixtures/tls-certs.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

function cli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "", SLUICE_TLS_CA: "" } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function peerFingerprint(port: number, caFile: string): Promise<string> {
  return withTimeout(
    new Promise<string>((resolve, reject) => {
      const s = tlsConnect({ host: "127.0.0.1", port, ca: readFileSync(caFile) }, () => {
        resolve(s.getPeerCertificate().fingerprint256);
        s.destroy();
      });
      s.on("error", reject);
    }),
    5000,
    "a TLS handshake",
  );
}

test("serve flags: --tls-cert and --tls-key go together; --tls-ca needs them", () => {
  const c = resolveServeConfig(["--data", "d", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"], {});
  assert.deepEqual([c.tlsCert, c.tlsKey, c.tlsCa], ["c.pem", "k.pem", "ca.pem"]);
  assert.equal(resolveServeConfig(["--data", "d"], { SLUICE_TLS_CERT: "c.pem", SLUICE_TLS_KEY: "k.pem" }).tlsCert, "c.pem");
  assert.throws(() => resolveServeConfig(["--data", "d", "--tls-cert", "c.pem"], {}), (e: unknown) => e instanceof ValidationError && /both --tls-cert and --tls-key/.test(e.message));
  assert.throws(() => resolveServeConfig(["--data", "d", "--tls-ca", "ca.pem"], {}), (e: unknown) => e instanceof ValidationError && /--tls-ca needs --tls-cert/.test(e.message));
});

test("sluice serve over TLS: CLI commands with --tls-ca, SIGHUP reloads, bad files stop the start", { timeout: 90_000 }, async () => {
  using tmp = tempDir("sluice-tls-cli-");
  const ca = makeCa(tmp.dir, "ca");
  const cert = makeLeaf(tmp.dir, ca, { name: "server", cn: "localhost", serial: 1 });
  const data = join(tmp.dir, "data");

  const bad = cli(["serve", "--data", data, "--port", "0", "--http-port", "off", "--tls-cert", join(tmp.dir, "missing.crt"), "--tls-key", cert.key]);
  assert.equal(bad.status, 1, bad.stderr);
  assert.match(bad.stderr, /^error \[TLS_CONFIG\]: cannot read the TLS certificate file/);

  const server = await spawnServer(["--data", data, "--port", "0", "--http-port", "0", "--log-level", "info", "--tls-cert", cert.cert, "--tls-key", cert.key]);
  try {
    assert.match(server.url, /^sluice\+tls:\/\/127\.0\.0\.1:\d+$/);
    const u = ["--url", server.url, "--tls-ca", ca.cert];
    const created = cli(["topics", "create", "tls-orders", ...u]);
    assert.equal(created.status, 0, created.stderr);
    const listed = cli(["topics", "list", "--json", ...u]);
    assert.equal(listed.status, 0, listed.stderr);
    assert.match(listed.stdout, /tls-orders/);
    const untrusted = cli(["topics", "list", "--url", server.url]);
    assert.equal(untrusted.status, 1);
    assert.match(untrusted.stderr, /^error \[TLS_HANDSHAKE\]: .*not trusted/);

    const next = makeLeaf(tmp.dir, ca, { name: "server-2", cn: "renewed.localhost", serial: 2 });
    copyFileSync(next.key, cert.key);
    copyFileSync(next.cert, cert.cert);
    server.proc.kill("SIGHUP");
    const want = fingerprintOf(next.cert);
    await waitUntil(async () => (await peerFingerprint(server.port, ca.cert)) === want, "the certificate reloaded on SIGHUP", 10_000, 50);
    assert.equal(await peerFingerprint(server.httpPort!, ca.cert), want, "the HTTPS port too");
    assert.ok(server.stdout.some((l) => l.includes("TLS certificate reloaded")));
  } finally {
    server.proc.kill("SIGTERM");
    assert.equal(await server.exited, 0);
  }
});
