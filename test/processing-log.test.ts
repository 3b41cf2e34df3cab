// SPDX-License-Identifier: Apache-2.0
/**
 * The server's structured processing lines (src/server/processing-log.ts): a spawned
 * `sluice serve --log-level debug` logs each settlement and commit as one JSON line with the
 * destination, group or consumer, partition, attempt, result and the envelope's schema
 * version, and never the payload.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import { envelope } from "../src/contracts/envelope.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const SECRET = "card-4242-4242";

test("processing lines: ack, nack, dead letter and commit as JSON with their fields, never the payload", { timeout: 60_000 }, async () => {
  using tmp = tempDir();
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "debug"]);
  try {
    await using b = await connect({ url: server.url });
    const q = b.queue<{ card: string }>("payments", { maxAttempts: 5 });
    await q.enqueue({ card: SECRET }, { headers: envelope({ type: "CapturePayment", schemaVersion: 3, messageId: "m-1", kind: "command" }) });
    await q.enqueue({ card: SECRET });
    await q.enqueue({ card: SECRET });
    const ac = new AbortController();
    let n = 0;
    for await (const job of q.work({ signal: ac.signal })) {
      n++;
      if (n === 1) await job.ack();
      else if (n === 2) await job.nack({ delayMs: 0, reason: "gateway timeout" });
      else if (n === 3) await job.nack({ requeue: false, reason: "card declined" });
      if (n === 3) ac.abort();
    }
    await b.createTopic("orders", { partitions: 1 });
    await b.publish("orders", { card: SECRET });
    const sub = b.subscribe("orders", { group: "billing", start: "earliest" });
    for await (const msg of sub) {
      await msg.commit();
      break;
    }
    const lines = (): Record<string, unknown>[] => server.stdout.filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, unknown>).filter((j) => j.system === "sluice");
    await waitUntil(() => lines().some((l) => l.kind === "stream"), "the commit line");
    const jobs = lines().filter((l) => l.kind === "queue");
    const ack = jobs.find((l) => l.result === "ack");
    assert.ok(ack, JSON.stringify(jobs));
    assert.equal(ack.level, "debug");
    assert.equal(ack.destination, "payments");
    assert.equal(ack.attempt, 1);
    assert.equal(ack.type, "CapturePayment");
    assert.equal(ack.schemaVersion, 3);
    assert.equal(ack.messageId, "m-1");
    const nack = jobs.find((l) => l.result === "nack");
    assert.equal(nack?.level, "info");
    assert.equal(nack?.reason, "gateway timeout");
    const dead = jobs.find((l) => l.result === "dead-letter");
    assert.equal(dead?.level, "warn");
    assert.equal(dead?.reason, "card declined");
    const commit = lines().find((l) => l.kind === "stream");
    assert.deepEqual({ ...commit, time: undefined, pid: undefined, hostname: undefined }, { ...commit, time: undefined, pid: undefined, hostname: undefined, destination: "orders", group: "billing", partition: 0, offset: 1, result: "commit" });
    assert.ok(!server.stdout.some((l) => l.includes(SECRET)), "no payload in the log");
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
