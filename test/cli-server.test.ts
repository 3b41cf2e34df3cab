// SPDX-License-Identifier: Apache-2.0
/**
 * The compiled `sluice` binary against a real spawned server (`--url`): topics, pub from stdin
 * and tail --max --json reading them back, groups describe (unknown group: NOT_FOUND, exit 1),
 * reset dry run vs --execute, --to-datetime, queues stats and purge, and the one-line hint when
 * `--data` names the directory the server holds.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

function cli(args: string[], opts: { input?: string; env?: NodeJS.ProcessEnv } = {}): Run {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, input: opts.input ?? "", env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "", ...opts.env } });
  assert.ok(!r.stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${r.stderr}`);
  if (r.status !== 0) assert.equal(r.stderr.trimEnd().split("\n").length, 1, `one error line for ${args.join(" ")}: ${r.stderr}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function ok(args: string[], opts: { input?: string; env?: NodeJS.ProcessEnv } = {}): string {
  const r = cli(args, opts);
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

function committed(url: string, group: string, topic: string): (number | null)[] {
  const out = JSON.parse(ok(["groups", "describe", group, "--topic", topic, "--json", "--url", url])) as { partitions: { committedOffset: number | null }[] }[];
  return out[0].partitions.map((p) => p.committedOffset);
}

test("sluice CLI against a running server (--url)", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-cli-server-");
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"]);
  const u = ["--url", server.url];
  try {
    // topics
    assert.match(ok(["topics", "create", "orders", "--partitions", "2", ...u]), /created topic orders \(2 partitions/);
    assert.match(ok(["topics", "create", "events", ...u]), /created topic events \(1 partition,/);
    const list = JSON.parse(ok(["topics", "list", "--json", ...u])) as { name: string; partitions: number }[];
    assert.deepEqual(list.map((t) => [t.name, t.partitions]).sort(), [["events", 1], ["orders", 2]]);
    assert.match(ok(["topics", "list", ...u]), /^TOPIC\s+PARTITIONS\s+RECORDS\s+SIZE\n/);
    const exists = cli(["topics", "create", "orders", ...u]);
    assert.equal(exists.status, 1);
    assert.match(exists.stderr, /^error \[TOPIC_EXISTS\]: /);

    // pub from stdin, then tail --max --json reads them back (SLUICE_URL as the target)
    const lines = ['{"id":1}', "plain text", "42", '"quoted"'];
    const pubOut = ok(["pub", "events", "--json"], { input: lines.join("\n") + "\n\n", env: { SLUICE_URL: server.url } });
    assert.equal(pubOut.trim().split("\n").length, 4, "one receipt per non-blank line");
    const tailed = ok(["tail", "events", "--from", "earliest", "--max", "4", "--json", ...u])
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { offset: number; value: unknown; timestamp: number });
    assert.deepEqual(tailed.map((r) => r.value), [{ id: 1 }, "plain text", 42, "quoted"]);
    assert.deepEqual(tailed.map((r) => r.offset), [0, 1, 2, 3]);

    // tail --group follows until SIGINT, then leaves cleanly with what it printed committed
    const follower = spawn(process.execPath, [CLI, "tail", "events", "--group", "auditor", "--from", "earliest", "--json", ...u], { stdio: ["ignore", "pipe", "pipe"] });
    let followed = "";
    let followErr = "";
    follower.stdout.on("data", (b: Buffer) => (followed += b.toString()));
    follower.stderr.on("data", (b: Buffer) => (followErr += b.toString()));
    const followerExit = new Promise<number | null>((resolve) => follower.once("exit", (code) => resolve(code)));
    await waitUntil(() => followed.trim().split("\n").length >= 4, "tail --group printed the 4 records", 20_000);
    follower.kill("SIGINT");
    assert.equal(await followerExit, 0, followErr);
    assert.equal(followErr, "");
    assert.deepEqual(committed(server.url, "auditor", "events"), [4], "what it printed is committed");

    // groups: consume 2 as a member (committed), an unknown group is NOT_FOUND
    ok(["tail", "events", "--group", "billing", "--from", "earliest", "--max", "2", ...u]);
    assert.deepEqual(committed(server.url, "billing", "events"), [2]);
    const groups = JSON.parse(ok(["groups", "list", "--json", ...u])) as { group: string; lagRecords: number }[];
    assert.deepEqual(groups.map((g) => [g.group, g.lagRecords]), [["auditor", 0], ["billing", 2]]);
    const described = ok(["groups", "describe", "billing", ...u]);
    assert.match(described, /LAG-S +HEADROOM-S +OWNER/);
    assert.match(described, /generation \d+ .*headroom /, "generation and the smallest headroom in the heading");
    assert.match(described, /members: none/, "the tail member left");
    const unknown = cli(["groups", "describe", "nobody", ...u]);
    assert.equal(unknown.status, 1);
    assert.match(unknown.stderr, /^error \[NOT_FOUND\]: group "nobody" does not exist/);

    // reset: dry run changes nothing, --execute does; --to-datetime finds the first record at/after
    const plan = JSON.parse(ok(["groups", "reset", "billing", "events", "--to-earliest", "--json", ...u])) as { dryRun: boolean; partitions: { previous: number; next: number }[] };
    assert.equal(plan.dryRun, true);
    assert.deepEqual(plan.partitions.map((p) => [p.previous, p.next]), [[2, 0]]);
    assert.match(ok(["groups", "reset", "billing", "events", "--to-earliest", ...u]), /dry run[\s\S]*add --execute/);
    assert.deepEqual(committed(server.url, "billing", "events"), [2], "a dry run changes nothing");
    assert.match(ok(["groups", "reset", "billing", "events", "--to-earliest", "--execute", ...u]), /reset applied/);
    assert.deepEqual(committed(server.url, "billing", "events"), [0]);
    ok(["pub", "events", "later-1", "later-2", ...u]); // a later process: later timestamps
    const later = JSON.parse(ok(["tail", "events", "--from", "4", "--max", "1", "--json", ...u])) as { timestamp: number };
    assert.ok(later.timestamp > tailed[3].timestamp);
    ok(["groups", "reset", "billing", "events", "--to-datetime", new Date(later.timestamp).toISOString(), "--execute", ...u]);
    assert.deepEqual(committed(server.url, "billing", "events"), [4], "first record at or after the time");
    ok(["groups", "reset", "billing", "events", "--shift-by", "-3", "--execute", ...u]);
    assert.deepEqual(committed(server.url, "billing", "events"), [1]);
    const outOfRange = cli(["groups", "reset", "billing", "events", "--to-offset", "99", ...u]);
    assert.equal(outOfRange.status, 1, "an offset past the end is refused, not clamped");
    assert.match(outOfRange.stderr, /^error \[VALIDATION\]: partition 0: offset 99 is outside/);

    // per-partition reset on a 2-partition topic
    ok(["pub", "orders", "a", "b", "c", "--partition", "1", ...u]);
    ok(["groups", "reset", "ship", "orders", "--to-latest", "--execute", ...u]);
    assert.deepEqual(committed(server.url, "ship", "orders"), [0, 3]);
    ok(["groups", "reset", "ship", "orders", "--to-offset", "1", "--partition", "1", "--execute", ...u]);
    assert.deepEqual(committed(server.url, "ship", "orders"), [0, 1], "partition 0 kept its offset");
    const noPart = cli(["groups", "reset", "ship", "orders", "--to-latest", "--partition", "5", ...u]);
    assert.equal(noPart.status, 1);
    assert.match(noPart.stderr, /^error \[PARTITION_NOT_FOUND\]/);

    // queues
    const c = await connect({ url: server.url });
    try {
      await c.queue("jobs").enqueueBatch([{ data: 1 }, { data: 2 }, { data: 3 }]);
    } finally {
      await c.close();
    }
    const qs = JSON.parse(ok(["queues", "list", "--json", ...u])) as { name: string; waiting: number }[];
    assert.deepEqual(qs.filter((q) => q.name === "jobs").map((q) => q.waiting), [3]);
    assert.equal((JSON.parse(ok(["queues", "stats", "jobs", "--json", ...u])) as { depth: number }).depth, 3);
    const missingQ = cli(["queues", "stats", "nope", ...u]);
    assert.equal(missingQ.status, 1);
    assert.match(missingQ.stderr, /^error \[QUEUE_NOT_FOUND\]/);
    assert.ok(!(JSON.parse(ok(["queues", "list", "--json", ...u])) as { name: string }[]).some((q) => q.name === "nope"), "stats created no queue");
    assert.equal(cli(["queues", "purge", "jobs", ...u]).status, 2, "purge without --yes");
    assert.equal((JSON.parse(ok(["queues", "stats", "jobs", "--json", ...u])) as { depth: number }).depth, 3, "nothing purged");
    assert.match(ok(["queues", "purge", "jobs", "--yes", ...u]), /purged 3 jobs from queue jobs/);

    // --data on the directory the server holds: a one-line hint, and nothing changed
    const locked = cli(["topics", "list", "--data", tmp.dir]);
    assert.equal(locked.status, 1);
    assert.match(locked.stderr, /^error \[DATA_DIR_LOCKED\]: a server holds .*; use --url/);

    // topics delete needs --yes without a terminal
    assert.equal(cli(["topics", "delete", "orders", ...u]).status, 2);
    assert.match(ok(["topics", "delete", "orders", "--yes", ...u]), /deleted topic orders/);
    assert.equal(cli(["topics", "describe", "orders", ...u]).status, 1);
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});

test("a server that is not there: one line with the code, exit 1", () => {
  const r = cli(["topics", "list", "--url", "sluice://127.0.0.1:1"]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^error \[[A-Z_]+\]: .*127\.0\.0\.1:1/);
});
