// SPDX-License-Identifier: Apache-2.0
/**
 * docs/runbooks.md is a set of procedures whose commands must work: every `sluice …` line of
 * its shell blocks runs here, in the order written, with the real binary against a spawned
 * server (SLUICE_URL) holding the names the runbooks use: topic `orders` with group `billing`,
 * queue `emails` with a dead-lettered job in `emails.dlq`. Each must exit 0 without a stack trace.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const CLI = `${root}dist/src/cli/main.js`;

/** `sluice …` lines of the ```sh blocks, in order. */
function runbookCommands(): string[][] {
  const doc = readFileSync(`${root}docs/runbooks.md`, "utf8");
  const out: string[][] = [];
  for (const block of doc.matchAll(/```sh\n([\s\S]*?)```/g)) {
    for (const line of block[1].split("\n").map((l) => l.trim())) if (line.startsWith("sluice ")) out.push(line.split(/\s+/).slice(1));
  }
  return out;
}

test("every command of docs/runbooks.md runs against a live server", { timeout: 180_000 }, async () => {
  const commands = runbookCommands();
  assert.ok(commands.length >= 15, `runbooks have ${commands.length} commands`);
  using tmp = tempDir();
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"]);
  try {
    await using b = await connect({ url: server.url });
    await b.createTopic("orders", { partitions: 3, retentionMs: 7 * 86_400_000 });
    await b.publishBatch("orders", Array.from({ length: 30 }, (_, i) => ({ key: `order-${i}`, value: { n: i } })));
    const sub = b.subscribe("orders", { group: "billing", start: "earliest" });
    let seen = 0;
    for await (const msg of sub) {
      await msg.commit();
      if (++seen === 10) break;
    }
    const emails = b.queue<{ to: string }>("emails", { maxAttempts: 2 });
    await emails.enqueue({ to: "nobody" });
    await emails.enqueue({ to: "ada@example.com" });
    const ac = new AbortController();
    for await (const job of emails.work({ signal: ac.signal })) {
      await job.nack({ requeue: false, reason: "invalid address" });
      ac.abort();
    }
    for (const args of commands) {
      const r = spawnSync(process.execPath, [CLI, ...args], { env: { ...process.env, SLUICE_URL: server.url }, encoding: "utf8", timeout: 30_000 });
      const shown = `sluice ${args.join(" ")}`;
      assert.equal(r.status, 0, `${shown} exited ${r.status}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
      assert.ok(!/^\s+at /m.test(r.stderr), `${shown} printed a stack trace`);
      assert.ok(r.stdout.length > 0, `${shown} printed nothing`);
    }
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
