// SPDX-License-Identifier: Apache-2.0
/**
 * The compiled `sluice` binary against a spawned server: `dlq list|show|redrive|purge` (showing
 * an entry counts no attempt; redrive needs --yes without a terminal) and `explain` naming a
 * poison job behind a blocked key and the partition and offset a group is stuck on.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import type { Job } from "../src/queues/types.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the binary without blocking this process (its clients keep heartbeating meanwhile). */
function cli(args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } }, (err, stdout, stderr) => {
      const status = err === null ? 0 : typeof (err as { code?: unknown }).code === "number" ? ((err as { code: number }).code) : null;
      assert.ok(!stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${stderr}`);
      resolve({ status, stdout, stderr });
    });
  });
}

async function ok(args: string[]): Promise<string> {
  const r = await cli(args);
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

async function nextOf<T>(it: AsyncIterator<Job<T>>): Promise<Job<T>> {
  const r = await it.next();
  assert.ok(!r.done, "a job arrived");
  return r.value;
}

test("every dlq and explain command answers --help with exit 0", async () => {
  for (const args of [["dlq"], ["dlq", "list"], ["dlq", "show"], ["dlq", "redrive"], ["dlq", "purge"], ["explain"], ["explain", "queue"], ["explain", "group"], ["explain", "topic"]]) {
    const r = await cli([...args, "--help"]);
    assert.equal(r.status, 0, `${args.join(" ")} --help: ${r.stderr}`);
    assert.match(r.stdout, /^Usage: sluice /, args.join(" "));
  }
  assert.equal((await cli(["dlq", "lsit"])).status, 2);
});

test("sluice dlq and explain against a running server", { timeout: 90_000 }, async () => {
  using tmp = tempDir("sluice-cli-dlq-");
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"]);
  const u = ["--url", server.url];
  const c = await connect({ url: server.url });
  try {
    // Two jobs fail once each with maxAttempts 1: both are dead-lettered.
    const mail = c.queue<{ to: string }>("mail", { maxAttempts: 1 });
    const ids = (await mail.enqueueBatch([{ data: { to: "a@x" } }, { data: { to: "b@x" } }])).map((r) => r.id);
    const w = mail.work({ prefetch: 2 });
    const it = w[Symbol.asyncIterator]();
    for (let i = 0; i < 2; i++) await (await nextOf(it)).nack({ error: new RangeError("smtp 550"), reason: "smtp 550" });
    await w.close();
    await waitUntil(async () => (await c.queue("mail.dlq").stats()).waiting === 2, "both jobs dead-lettered");

    const list = JSON.parse(await ok(["dlq", "list", "mail", "--json", ...u])) as { dlq: string; jobs: { id: string; deadLetter: { sourceId: string } }[]; next: string | null };
    assert.equal(list.dlq, "mail.dlq");
    assert.deepEqual(list.jobs.map((j) => j.deadLetter.sourceId), ids);
    assert.match(await ok(["dlq", "list", "mail", ...u]), /^ID\s+SOURCE-ID\s+ERROR-CLASS\s+ERROR\s+ATTEMPTS\s+DEAD-LETTERED\n.*RangeError\s+smtp 550/);
    const page = JSON.parse(await ok(["dlq", "list", "mail", "--limit", "1", "--json", ...u])) as { jobs: unknown[]; next: string };
    assert.equal(page.jobs.length, 1);
    assert.equal(page.next, list.jobs[0].id);

    // Showing an entry (twice) changes nothing: no attempt is counted on the entry.
    const entry = list.jobs[0].id;
    for (let i = 0; i < 2; i++) {
      const shown = JSON.parse(await ok(["dlq", "show", "mail", entry, "--json", ...u])) as { job: { attempts: number; data: unknown; deadLetter: { attempts: number; history: unknown[]; errorClass: string } } };
      assert.equal(shown.job.attempts, 0, "browsing leased nothing");
      assert.deepEqual(shown.job.data, { to: "a@x" });
      assert.equal(shown.job.deadLetter.errorClass, "RangeError");
      assert.equal(shown.job.deadLetter.history.length, 1);
    }
    assert.match(await ok(["dlq", "show", "mail", entry, ...u]), /attempt history:[\s\S]*RangeError[\s\S]*payload:\n\{\n {2}"to": "a@x"\n\}/);
    assert.equal((await cli(["dlq", "show", "mail", "999999", ...u])).status, 1);
    assert.equal((await cli(["dlq", "list", "nosuch", ...u])).status, 1);

    // Redrive needs --yes without a terminal; with it, the entry goes back and is delivered as attempt 1.
    assert.equal((await cli(["dlq", "redrive", "mail", "--id", entry, ...u])).status, 2);
    assert.match(await ok(["dlq", "redrive", "mail", "--id", entry, "--yes", ...u]), /redrove 1 job from mail\.dlq/);
    const w2 = mail.work({ prefetch: 1 });
    const back = await nextOf(w2[Symbol.asyncIterator]());
    assert.deepEqual([back.data, back.attempt, back.redriveCount], [{ to: "a@x" }, 1, 1]);
    await back.ack();
    await w2.close();
    assert.equal(JSON.parse(await ok(["dlq", "list", "mail", "--json", ...u])).jobs.length, 1);
    assert.equal((await cli(["dlq", "purge", "mail", ...u])).status, 2);
    assert.match(await ok(["dlq", "purge", "mail", "--yes", ...u]), /purged 1 entry from mail\.dlq/);

    // A poison job: key k1's head always fails (kept in backoff), the next job of k1 waits behind it.
    const orders = c.queue<string>("orders");
    const poison = await orders.enqueue("bad", { key: "k1" });
    await orders.enqueue("fine", { key: "k1" });
    const w3 = orders.work({ prefetch: 1 });
    const head = await nextOf(w3[Symbol.asyncIterator]());
    assert.equal(head.id, poison.id);
    await head.nack({ delayMs: 600_000, error: new TypeError("cannot parse"), reason: "cannot parse" });
    await w3.close();
    await waitUntil(async () => (await orders.stats()).blockedKeys.length === 1, "key k1 blocked");
    const explained = await ok(["explain", "queue", "orders", ...u]);
    assert.match(explained, new RegExp(`^warn\\s+blocked keys: key k1 blocked for .* behind poison job ${poison.id} \\(1 attempt, last error: cannot parse\\)$`, "m"));
    assert.match(explained, /^ok\s+exists: queue orders/m);
    const asJson = JSON.parse(await ok(["explain", "queue", "orders", "--json", ...u])) as { findings: { step: string; data?: { poisonJob?: string } }[] };
    assert.equal(asJson.findings.find((f) => f.step === "blocked keys")?.data?.poisonJob, poison.id);
    assert.equal((await cli(["explain", "queue", "nosuch", ...u])).status, 1);

    // A group stuck on a record: partition 0 is never committed past offset 2, partition 1 is.
    await c.createTopic("events", { partitions: 2 });
    for (let i = 0; i < 5; i++) {
      await c.publish("events", i, { partition: 0 });
      await c.publish("events", i, { partition: 1 });
    }
    const sub = c.subscribe<number>("events", { group: "g1", start: "earliest" });
    const consume = (async () => {
      for await (const m of sub) if (m.partition === 1 || m.offset < 2) await m.commit();
    })();
    await waitUntil(async () => {
      const lag = await c.groupLag("g1", "events");
      return lag.partitions[0].committedOffset === 2 && lag.partitions[1].committedOffset === 5;
    }, "partition 1 consumed, partition 0 committed up to offset 2");
    const stuck = await ok(["explain", "group", "g1", ...u]);
    assert.match(stuck, /^warn\s+stuck: partition 0 of events did not move in 1\.0 s with 3 records behind: committed position 2; the record at offset 2 is the likely poison record/m);
    assert.doesNotMatch(stuck, /stuck: partition 1/);
    assert.match(stuck, /^ok\s+members: 1 member on events/m);
    assert.match(await ok(["explain", "topic", "events", ...u]), /^ok\s+skew: hottest partition of events is 0 with 50% of its 10 records/m);
    assert.match(stuck, /^ok\s+resets: no offset reset of g1 on events remembered/m);
    await sub.close();
    await consume.catch(() => {});
    // After a reset (the member gone), explain names it with each partition's move.
    await ok(["groups", "reset", "g1", "events", "--to-earliest", "--execute", ...u]);
    assert.match(await ok(["explain", "group", "g1", "--sample-ms", "0", ...u]), /^warn\s+resets: 1 reset of g1 on events remembered, newest first: \S+ \(p0 2→0, p1 5→0\)/m);
    assert.match(await ok(["groups", "describe", "g1", ...u]), /^last reset \S+: p0 2→0, p1 5→0 \(1 remembered/m);
  } finally {
    await c.close();
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
