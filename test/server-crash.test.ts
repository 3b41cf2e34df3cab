// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance (issue 4, item 3): the server process is SIGKILLed at least 20 times while a
 * client publishes with the idempotent producer. Publishes in flight during each crash are
 * retried by the client on the restarted server. At the end every acknowledged record is
 * stored exactly where its receipt said, and no record is stored twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "../src/client/index.js";
import type { Broker } from "../src/types.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const KILLS = Number(process.env.SLUICE_SERVER_KILLS ?? 20);

async function waitUntil(cond: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test(`server SIGKILL x${KILLS} during idempotent publishing: no acked record lost, none duplicated`, { timeout: 150_000 }, async (t) => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-crash-"));
  const args = (port: number): string[] => ["--data", dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const client = await connect({
    url: server.url,
    reconnectMinDelayMs: 10,
    reconnectMaxDelayMs: 100,
    requestTimeoutMs: 60_000,
  });
  try {
    await client.createTopic("crash", { partitions: 3 });
    const acked = new Map<number, { partition: number; offset: number }>();
    const failed = new Set<number>();
    let nextId = 0;
    let stop = false;
    let duplicatesReported = 0;
    // Producers: 4 concurrent loops, each keeping a small window of publishes in flight.
    const producer = async (): Promise<void> => {
      while (!stop) {
        const ids = Array.from({ length: 16 }, () => nextId++);
        await Promise.all(
          ids.map((id) =>
            (client as Broker)
              .publish("crash", { id }, { key: `k${id % 7}` })
              .then((r) => {
                acked.set(id, { partition: r.partition, offset: r.offset });
                if (r.duplicate) duplicatesReported++;
              })
              .catch(() => failed.add(id)),
          ),
        );
      }
    };
    const loops = [producer(), producer(), producer(), producer()];
    for (let k = 0; k < KILLS; k++) {
      const before = acked.size;
      // Kill at a moment when publishes are flowing (not a fixed delay): after some new acks.
      await waitUntil(() => acked.size >= before + 20 + Math.floor(Math.random() * 200), `progress before kill ${k}`);
      server.proc.kill("SIGKILL");
      await server.exited;
      server = await spawnServer(args(port));
    }
    const beforeStop = acked.size;
    await waitUntil(() => acked.size >= beforeStop + 50, "progress after the last restart");
    stop = true;
    await Promise.all(loops);

    // Verify: read the whole topic back.
    const seen = new Map<number, { partition: number; offset: number }>();
    const dups: number[] = [];
    for (let p = 0; p < 3; p++) {
      let off = 0;
      for (;;) {
        const r = await client.fetch("crash", p, off, { maxBytes: 1 << 20 });
        for (const rec of r.records) {
          const id = (rec.value as { id: number }).id;
          if (seen.has(id)) dups.push(id);
          seen.set(id, { partition: p, offset: rec.offset });
        }
        if (r.records.length === 0 || r.nextOffset >= r.highWatermark) break;
        off = r.nextOffset;
      }
    }
    let lost = 0;
    for (const [id, where] of acked) {
      const got = seen.get(id);
      if (!got || got.partition !== where.partition || got.offset !== where.offset) lost++;
    }
    assert.equal(lost, 0, `acknowledged records lost or misplaced (of ${acked.size})`);
    assert.deepEqual(dups, [], "no record stored twice");
    assert.ok(acked.size > KILLS * 20, `enough traffic: ${acked.size} acked`);
    // Every publish eventually succeeded: in-flight ones were retried across the crashes.
    assert.equal(failed.size, 0, `publishes that failed instead of being retried: ${failed.size}`);
    t.diagnostic(`acked ${acked.size}, retried batches answered as duplicates: ${duplicatesReported}, client reconnects: ${client.transport.reconnects}`);
  } finally {
    await client.close();
    server.proc.kill("SIGKILL");
    await server.exited;
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a subscription survives a server restart: it rejoins and resumes from the last commit", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-resub-"));
  const args = (port: number): string[] => ["--data", dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const client = await connect({ url: server.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 100 });
  try {
    await client.createTopic("resub", { partitions: 2 });
    await client.publishBatch("resub", Array.from({ length: 10 }, (_, i) => ({ value: i, partition: i % 2 })));
    const sub = client.subscribe<number>("resub", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    const seen: number[] = [];
    while (seen.length < 10) {
      const r = await it.next();
      seen.push(r.value!.value);
      await r.value!.commit();
    }
    server.proc.kill("SIGKILL");
    await server.exited;
    server = await spawnServer(args(port));
    // Publishing waits for the reconnection; the member rejoins and receives only new records.
    await client.publishBatch("resub", Array.from({ length: 10 }, (_, i) => ({ value: 100 + i, partition: i % 2 })));
    const after: number[] = [];
    while (after.length < 10) after.push((await it.next()).value!.value);
    assert.deepEqual(after.sort((a, b) => a - b), Array.from({ length: 10 }, (_, i) => 100 + i));
    await sub.close();
  } finally {
    await client.close();
    server.proc.kill("SIGKILL");
    await server.exited;
    rmSync(dir, { recursive: true, force: true });
  }
});
