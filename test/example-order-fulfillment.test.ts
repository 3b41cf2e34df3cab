// SPDX-License-Identifier: Apache-2.0
/**
 * The order-fulfillment reference system (examples/order-fulfillment/) runs end to end against
 * an embedded broker and against a spawned `sluice serve`, with PostgreSQL from the local
 * server and SQLite in a temp dir. The system checks its own outcome (exit 1 on any failed
 * check); here each run must pass every check, and a second embedded run on the same data dir
 * must too (it starts over).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const MAIN = fileURLToPath(new URL("../examples/order-fulfillment/main.js", import.meta.url));
const CHECKS = 17;

function runSystem(env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [MAIN], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => p.kill("SIGKILL"), 90_000);
    p.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

function assertPassed(r: { code: number | null; stdout: string; stderr: string }): void {
  assert.equal(r.code, 0, `exit ${r.code}\n${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /order fulfillment: all checks passed/);
  assert.equal(r.stdout.match(/^ {2}ok {2}/gm)?.length, CHECKS, r.stdout);
  assert.match(r.stdout, /reconciliation sent the \d+ e-mails never sent/);
  assert.match(r.stdout, /rebuilt checksum [0-9a-f]{12} equals the live one/);
}

test("order fulfillment runs end to end on an embedded broker (twice on one data dir)", { timeout: 200_000 }, async () => {
  using tmp = tempDir();
  assertPassed(await runSystem({ SLUICE_DATA: tmp.dir }));
  assertPassed(await runSystem({ SLUICE_DATA: tmp.dir }));
});

test("order fulfillment runs end to end against a spawned server", { timeout: 120_000 }, async () => {
  using tmp = tempDir();
  using apps = tempDir();
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"]);
  try {
    const r = await runSystem({ SLUICE_DATA: apps.dir, SLUICE_URL: server.url });
    assertPassed(r);
    assert.match(r.stdout, new RegExp(`order fulfillment on ${server.url.replace(/[/.:]/g, "\\$&")}`));
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
