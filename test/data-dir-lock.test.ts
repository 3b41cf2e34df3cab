// SPDX-License-Identifier: Apache-2.0
/**
 * One process per data directory (FS-3): a second openBroker (same process or another), a
 * second `sluice serve` and a state-changing CLI command on a locked directory fail with
 * DataDirLockedError (DATA_DIR_LOCKED, naming the holder) and change no file; a holder killed
 * with SIGKILL never blocks the next start; read-only commands create nothing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker, DataDirLockedError } from "../src/index.js";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(dirname(fileURLToPath(import.meta.url)), "..", "src", "cli", "main.js");

/** Every file under `dir` with its size, mtime and content hash: "changes no file" is equality. */
function treeState(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string): void => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      const st = statSync(p);
      if (st.isDirectory()) {
        out.set(p, "dir");
        walk(p);
      } else out.set(p, `${st.size} ${st.mtimeMs} ${createHash("sha1").update(readFileSync(p)).digest("hex")}`);
    }
  };
  walk(dir);
  return out;
}

function cli(...args: string[]): { status: number | null; stderr: string; stdout: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 60_000 });
  return { status: r.status, stderr: r.stderr, stdout: r.stdout };
}

test("a second openBroker in this process fails with DataDirLockedError naming the holder, and changes nothing", async () => {
  using tmp = tempDir("sluice-lock-");
  const a = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  try {
    await a.createTopic("t");
    await a.publish("t", "x", { partition: 0 });
    const before = treeState(tmp.dir);
    const err = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 }).then(
      () => assert.fail("a second open succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof DataDirLockedError, String(err));
    assert.equal(err.code, "DATA_DIR_LOCKED");
    assert.equal(err.retriable, false);
    assert.equal(err.pid, process.pid);
    assert.match(err.message, new RegExp(`pid ${process.pid}`));
    assert.deepEqual(treeState(tmp.dir), before, "no file changed");
  } finally {
    await a.close();
  }
  // Released on close: the next open succeeds.
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  assert.equal((await b.fetch("t", 0, 0)).records[0].value, "x");
  await b.close();
});

test("beside a running sluice serve: a second server, an embedded broker and a state-changing CLI command fail with DATA_DIR_LOCKED and change nothing; after SIGKILL of the server the next open succeeds", { timeout: 120_000 }, async () => {
  using tmp = tempDir("sluice-lock-srv-");
  const args = ["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"];
  const server = await spawnServer(args);
  try {
    const before = treeState(tmp.dir);
    // A second server on the same directory refuses to start.
    const second = await spawnServer(args).then(
      (s) => {
        s.proc.kill("SIGKILL");
        return null;
      },
      (e: unknown) => String((e as Error).message),
    );
    assert.ok(second !== null, "the second server must not start");
    assert.match(second!, /DATA_DIR_LOCKED/);
    assert.match(second!, new RegExp(`pid ${server.proc.pid}`));
    // An embedded broker in another process (this one) refuses too.
    await assert.rejects(openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 }), (e: unknown) => e instanceof DataDirLockedError && e.pid === server.proc.pid);
    // A CLI command that would change state refuses, with the code on its one-line error.
    const create = cli("topics", "create", "sneaky", "--data", tmp.dir);
    assert.equal(create.status, 1);
    assert.match(create.stderr, /\[DATA_DIR_LOCKED\]/);
    // A read-only command needs the directory too: it says so instead of opening it.
    const list = cli("topics", "list", "--data", tmp.dir);
    assert.equal(list.status, 1);
    assert.match(list.stderr, /\[DATA_DIR_LOCKED\]/);
    assert.deepEqual(treeState(tmp.dir), before, "no file changed by any of the refused openers");
  } finally {
    server.proc.kill("SIGKILL");
    await server.exited;
  }
  // The holder died without releasing anything: the lock went with it.
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("after");
  await b.close();
  const create = cli("topics", "create", "later", "--data", tmp.dir);
  assert.equal(create.status, 0, create.stderr);
});

test("a read-only CLI command on a missing data directory is an error and creates nothing", () => {
  using tmp = tempDir("sluice-lock-missing-");
  const missing = join(tmp.dir, "nope");
  for (const args of [["topics", "list"], ["topics", "describe", "x"], ["group", "lag", "g", "t"], ["doctor"]]) {
    const r = cli(...args, "--data", missing);
    assert.equal(r.status, 1, `${args.join(" ")}: ${r.stdout}`);
    assert.match(r.stderr, /does not exist/);
    assert.equal(existsSync(missing), false, `${args.join(" ")} created the directory`);
  }
});
