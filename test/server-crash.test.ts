// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance: the server process is SIGKILLed SLUICE_SERVER_KILLS times (default 50) at random
 * moments while many concurrent callers publish with the idempotent producer to a topic whose
 * segments roll every 16 KiB, with at least 16 batches in flight (8 partitions x up to 5). A
 * loopback proxy (test/fixtures/fault-proxy.ts) between client and server counts the batches
 * in flight as the client sees them. Publishes in flight during each crash are retried by the
 * client on the restarted server. At the end every acknowledged record is stored exactly where
 * its receipt said, no record is stored twice, every partition's offsets are contiguous, no
 * caller saw OUT_OF_ORDER_SEQUENCE or PRODUCER_FENCED, and no publish that failed is stored.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "../src/client/index.js";
import { PRODUCER_BATCHES_KEPT } from "../src/log/producer-state.js";
import type { Broker } from "../src/types.js";
import { FaultProxy } from "./fixtures/fault-proxy.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";
import { waitUntil as waitUntilShared } from "../src/testing/helpers.js";

const KILLS = Number(process.env.SLUICE_SERVER_KILLS ?? 50);
const PARTITIONS = 8;
const PUBLISHERS = 12;
/** Publishes each publisher keeps outstanding (a new one starts as soon as one settles). */
const OUTSTANDING = 24;

const waitUntil = (cond: () => boolean, what: string, timeoutMs = 30_000): Promise<unknown> => waitUntilShared(cond, what, timeoutMs, 2);

test(`server SIGKILL x${KILLS} during idempotent publishing (16 KiB segments, >= 16 batches in flight): no acked record lost, none duplicated, no sequence error surfaced`, { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-crash-"));
  const args = (port: number): string[] => ["--data", dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const proxy = await FaultProxy.start({ port });
  const client = await connect({
    url: proxy.url,
    reconnectMinDelayMs: 10,
    reconnectMaxDelayMs: 100,
    requestTimeoutMs: 60_000,
    // Small batches: many of them, so that windows fill and segments roll often.
    maxBatchRecords: 8,
  });
  const started = Date.now();
  try {
    await client.createTopic("crash", { partitions: PARTITIONS, segmentBytes: 16384 });
    const acked = new Map<number, { partition: number; offset: number }>();
    const failed = new Map<number, string>();
    let nextId = 0;
    let stop = false;
    let duplicatesReported = 0;
    const publishOne = (): Promise<void> => {
      const id = nextId++;
      // Keys spread records over the partitions; every 5th record names its partition.
      const opts = id % 5 === 0 ? { partition: id % PARTITIONS } : { key: `k${id % 37}` };
      return (client as Broker)
        .publish("crash", { id, pad: "x".repeat(50 + (id % 150)) }, opts)
        .then((r) => {
          acked.set(id, { partition: r.partition, offset: r.offset });
          if (r.duplicate) duplicatesReported++;
        })
        .catch((e: unknown) => {
          failed.set(id, (e as { code?: string }).code ?? String(e));
        });
    };
    // Each publisher keeps OUTSTANDING publishes going: a new one as soon as one settles.
    const publisher = async (): Promise<void> => {
      const lane = async (): Promise<void> => {
        while (!stop) await publishOne();
      };
      await Promise.all(Array.from({ length: OUTSTANDING }, lane));
    };
    const loops = Array.from({ length: PUBLISHERS }, publisher);
    let inFlightAtKills = 0;
    for (let k = 0; k < KILLS; k++) {
      const before = acked.size;
      // Random points, not fixed delays: after a random number of new acks, at a moment when a
      // random number of batches is in flight.
      const progress = 20 + Math.floor(Math.random() * 300);
      const inFlight = 1 + Math.floor(Math.random() * 20);
      await waitUntil(() => acked.size >= before + progress && proxy.inFlight >= inFlight, `progress before kill ${k}`);
      inFlightAtKills += proxy.inFlight;
      server.proc.kill("SIGKILL");
      await server.exited;
      server = await spawnServer(args(port));
    }
    const beforeStop = acked.size;
    await waitUntil(() => acked.size >= beforeStop + 200, "progress after the last restart");
    stop = true;
    await Promise.all(loops);

    // Read every partition back.
    const seen = new Map<number, { partition: number; offset: number }>();
    const dups: number[] = [];
    const gaps: string[] = [];
    for (let p = 0; p < PARTITIONS; p++) {
      let off = 0;
      let expect = 0;
      for (;;) {
        const r = await client.fetch("crash", p, off, { maxBytes: 1 << 20 });
        for (const rec of r.records) {
          if (rec.offset !== expect) gaps.push(`partition ${p}: offset ${rec.offset} where ${expect} was expected`);
          expect = rec.offset + 1;
          const id = (rec.value as { id: number }).id;
          if (seen.has(id)) dups.push(id);
          seen.set(id, { partition: p, offset: rec.offset });
        }
        if (r.records.length === 0 || r.nextOffset >= r.highWatermark) {
          if (expect !== r.highWatermark) gaps.push(`partition ${p}: read up to ${expect}, high watermark ${r.highWatermark}`);
          break;
        }
        off = r.nextOffset;
      }
    }
    let lost = 0;
    for (const [id, where] of acked) {
      const got = seen.get(id);
      if (!got || got.partition !== where.partition || got.offset !== where.offset) lost++;
    }
    const codes = new Map<string, number>();
    for (const c of failed.values()) codes.set(c, (codes.get(c) ?? 0) + 1);
    const failedButStored = [...failed.keys()].filter((id) => seen.has(id));
    const segments = Array.from({ length: PARTITIONS }, (_, p) =>
      readdirSync(join(dir, "topics", "crash", String(p))).filter((f) => /^\d{20}\.log$/.test(f)).length,
    );
    t.diagnostic(
      `${KILLS} kills in ${((Date.now() - started) / 1000).toFixed(1)} s; acked ${acked.size}, failed ${failed.size} ${JSON.stringify([...codes])}; ` +
        `answered as duplicates: ${duplicatesReported}; client reconnects: ${client.transport.reconnects}; ` +
        `batches in flight: max ${proxy.maxTotal}, max per partition ${proxy.maxPerPartition}, mean at a kill ${(inFlightAtKills / Math.max(1, KILLS)).toFixed(1)}; ` +
        `segments per partition: ${segments.join(",")}`,
    );
    assert.equal(lost, 0, `acknowledged records lost or misplaced (of ${acked.size})`);
    assert.deepEqual(dups, [], "no record stored twice");
    assert.deepEqual(gaps, [], "offsets contiguous per partition");
    assert.equal((codes.get("OUT_OF_ORDER_SEQUENCE") ?? 0) + (codes.get("PRODUCER_FENCED") ?? 0), 0, "no sequence error reaches a caller");
    assert.deepEqual(failedButStored, [], "a publish that failed is not stored");
    // In flight publishes were retried across the crashes: none failed (120 s delivery timeout).
    assert.equal(failed.size, 0, `publishes that failed instead of being retried: ${JSON.stringify([...codes])}`);
    assert.ok(acked.size > KILLS * 20, `enough traffic: ${acked.size} acked`);
    assert.ok(proxy.maxTotal >= 16, `at least 16 batches in flight at some point (saw ${proxy.maxTotal})`);
    assert.ok(proxy.maxPerPartition <= PRODUCER_BATCHES_KEPT, `at most ${PRODUCER_BATCHES_KEPT} per partition (saw ${proxy.maxPerPartition})`);
    assert.ok(Math.min(...segments) >= 2, `every partition rolled its segment: ${segments.join(",")} .log files per partition`);
  } finally {
    await client.close();
    await proxy.close();
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
