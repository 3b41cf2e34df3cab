// SPDX-License-Identifier: Apache-2.0
/**
 * The idempotent producer never surfaces an error for a stored batch and never stores one
 * twice when the answers to stored batches are lost: a proxy between client and server drops
 * the server's answers to stored PUBLISH_ENCODED batches of one partition, then cuts the
 * connection. On reconnect every batch resolves with its original offsets. The client keeps at
 * most PRODUCER_BATCHES_KEPT batches of a partition in flight (the broker's memory per producer
 * and partition), so every retried batch is one the broker still recognises.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { PRODUCER_BATCHES_KEPT } from "../src/log/producer-state.js";
import { startServer } from "../src/server/index.js";
import type { PublishReceipt } from "../src/types.js";
import { FaultProxy } from "./fixtures/fault-proxy.js";

const RECORDS_PER_BATCH = 3;

async function lostAnswers(n: number): Promise<void> {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-lost-acks-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const proxy = await FaultProxy.start({ port: srv.port });
  // maxBatchRecords = records per call: every publishBatch call below is exactly one batch.
  const client = await connect({ url: proxy.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50, maxBatchRecords: RECORDS_PER_BATCH });
  try {
    await client.createTopic("t", { partitions: 1 });
    // Only PRODUCER_BATCHES_KEPT can be in flight without an answer; the rest wait and go later.
    const dropped = Math.min(n, PRODUCER_BATCHES_KEPT);
    let requestsWhenCut = -1;
    proxy.dropPublishAnswers(dropped);
    proxy.onDrop = (k) => {
      if (k === dropped) {
        requestsWhenCut = proxy.publishRequests;
        proxy.cut();
      }
    };
    const values = Array.from({ length: n }, (_, i) => Array.from({ length: RECORDS_PER_BATCH }, (_, j) => `batch ${i} record ${j}`));
    const outcomes = await Promise.allSettled(values.map((vs) => client.publishBatch("t", vs.map((value) => ({ value })))));
    const errors = outcomes.flatMap((o, i) => (o.status === "rejected" ? [`batch ${i}: ${(o.reason as Error).message}`] : []));
    assert.deepEqual(errors, [], "no publish fails");
    const receipts = outcomes.map((o) => (o as PromiseFulfilledResult<PublishReceipt[]>).value);

    assert.equal(proxy.dropped, dropped, "answers to stored batches were dropped");
    assert.equal(requestsWhenCut, dropped, `the client had ${requestsWhenCut} batches of the partition in flight without answers`);
    assert.ok(proxy.maxPerPartition <= PRODUCER_BATCHES_KEPT, `at most ${PRODUCER_BATCHES_KEPT} in flight per partition, saw ${proxy.maxPerPartition}`);
    assert.ok(client.transport.reconnects >= 1, "the client reconnected");
    // Original offsets, in publish order; the retried (stored) batches are recognised as such.
    for (let i = 0; i < n; i++) {
      assert.deepEqual(
        receipts[i].map((r) => r.offset),
        Array.from({ length: RECORDS_PER_BATCH }, (_, j) => i * RECORDS_PER_BATCH + j),
        `offsets of batch ${i}`,
      );
      for (const r of receipts[i]) assert.equal(r.duplicate, i < dropped, `batch ${i} duplicate flag`);
    }
    // The log holds every record once, each at the offset its receipt names.
    const r = await client.fetch("t", 0, 0, { maxBytes: 1 << 20 });
    assert.equal(r.highWatermark, n * RECORDS_PER_BATCH, "nothing stored twice");
    assert.deepEqual(
      r.records.map((m) => [m.offset, m.value]),
      values.flat().map((v, k) => [k, v]),
    );
  } finally {
    await client.close();
    await proxy.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

for (const n of [1, PRODUCER_BATCHES_KEPT, 8, 20]) {
  test(`producer: answers to ${n} stored batches lost, connection cut: every batch resolves with its original offsets, stored once`, { timeout: 60_000 }, () =>
    lostAnswers(n),
  );
}

test("producer: the cap holds per partition; other partitions fill their own windows", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-window-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const proxy = await FaultProxy.start({ port: srv.port });
  const client = await connect({ url: proxy.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50, maxBatchRecords: 2 });
  try {
    await client.createTopic("w", { partitions: 3 });
    // Hold every answer: the client fills each partition's window and stops there.
    const held = 3 * PRODUCER_BATCHES_KEPT;
    proxy.dropPublishAnswers(held);
    let requestsWhenCut = -1;
    proxy.onDrop = (k) => {
      if (k === held) {
        requestsWhenCut = proxy.publishRequests;
        proxy.cut();
      }
    };
    const calls = Array.from({ length: 60 }, (_, i) =>
      client.publishBatch("w", [
        { value: `${i}a`, partition: i % 3 },
        { value: `${i}b`, partition: i % 3 },
      ]),
    );
    const receipts = await Promise.all(calls);
    assert.equal(requestsWhenCut, held);
    assert.equal(proxy.maxPerPartition, PRODUCER_BATCHES_KEPT);
    assert.equal(proxy.maxTotal, held);
    for (let p = 0; p < 3; p++) {
      const mine = receipts.filter((_, i) => i % 3 === p).flat();
      assert.deepEqual(
        mine.map((r) => r.offset),
        Array.from({ length: 40 }, (_, k) => k),
        `partition ${p}: contiguous, in publish order`,
      );
      const f = await client.fetch("w", p, 0, { maxBytes: 1 << 20 });
      assert.equal(f.highWatermark, 40);
    }
  } finally {
    await client.close();
    await proxy.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
