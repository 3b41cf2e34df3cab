// SPDX-License-Identifier: Apache-2.0
/**
 * The worked system examples/learning-platform runs to its end and its own checks pass: once on
 * an embedded broker, once against a spawned `sluice serve`. PostgreSQL: $SLUICE_PG_URL or the
 * local server (the example works in a schema of its own and drops it).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { tempDir } from "../src/testing/helpers.js";

const MAIN = fileURLToPath(new URL("../examples/learning-platform/main.js", import.meta.url));
const CLI = fileURLToPath(new URL("../src/cli/main.js", import.meta.url));

function runExample(env: NodeJS.ProcessEnv, timeoutMs = 40_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const base = { ...process.env };
    delete base.SLUICE_URL; // only the server test sets it
    const child = spawn(process.execPath, [MAIN], { env: { ...base, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`example did not finish within ${timeoutMs} ms; stdout:\n${stdout}\nstderr:\n${stderr}`));
    }, timeoutMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

function assertOutcome(r: { code: number | null; stdout: string; stderr: string }): void {
  const context = `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
  assert.equal(r.code, 0, `example exited ${r.code}\n${context}`);
  assert.match(r.stdout, /\d+ checks passed, 0 failed/, context);
  assert.doesNotMatch(r.stdout, /FAIL/, context);
  for (const line of [
    /killed with SIGKILL/,
    /ok {3}a second member joined/,
    /ok {3}no completion lost or counted twice by analytics after the crash: 36 of 36/,
    /ok {3}the poison fact landed in the dead-letter topic/,
    /redriveTopic moved 1 dead letter back/,
    /ok {3}after the fix the redriven fact was indexed/,
    /ok {3}rebuilt search projection's checksum equals the live one/,
    /ok {3}outbox: every committed completion published once/,
    /ok {3}corrupt thumbnail dead-lettered after bounded retries/,
    /--- at the end ---/,
    /analytics @ course-completed +0 +0 +-/,
    /certificate-generation +0 +- +36 /,
  ]) {
    assert.match(r.stdout, line, context);
  }
}

test("learning platform example: embedded broker", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-lp-");
  assertOutcome(await runExample({ SLUICE_DATA: tmp.dir }));
});

test("learning platform example: against a spawned sluice serve", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-lp-srv-");
  const server = spawn(process.execPath, [CLI, "serve", "--data", join(tmp.dir, "server"), "--port", "0", "--http-port", "off", "--log-level", "error"], { stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise<void>((resolve) => server.once("exit", () => resolve()));
  try {
    // The server prints {"event":"listening","url":...} once it accepts connections.
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("server did not start within 15 s")), 15_000);
      createInterface({ input: server.stdout! }).on("line", (line) => {
        try {
          const e = JSON.parse(line) as { event?: string; url?: string };
          if (e.event === "listening" && e.url) {
            clearTimeout(timer);
            resolve(e.url);
          }
        } catch {
          /* not JSON */
        }
      });
      void exited.then(() => reject(new Error("server exited before listening")));
    });
    assertOutcome(await runExample({ SLUICE_DATA: join(tmp.dir, "work"), SLUICE_URL: url }));
  } finally {
    server.kill("SIGTERM");
    await exited;
  }
});
