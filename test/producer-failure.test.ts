// SPDX-License-Identifier: Apache-2.0
/**
 * Failures in the middle of a stream of pipelined idempotent batches to one partition, made by
 * the *server* (a real broker behind a wrapper that refuses chosen batches, so the client's own
 * checks cannot catch them):
 * - a batch refused for good fails only its own callers; the batches behind it (refused by the
 *   broker for the sequence gap) are renumbered and stored; offsets stay contiguous;
 * - a batch refused with a retriable error, or stored but answered with one, is re-sent with
 *   its number: nothing surfaces, nothing is stored twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { StorageError, ValidationError } from "../src/errors.js";
import { startServer } from "../src/server/index.js";
import type { BrokerHost, EncodedAppend } from "../src/broker/host.js";
import { wrapHost } from "./fixtures/host-wrapper.js";
import type { PublishReceipt } from "../src/types.js";

type Refuse = (batch: Buffer, store: () => Promise<unknown>) => Promise<"pass" | Error>;

interface Wrapped {
  broker: BrokerHost;
  /** Errors the real broker answered, by code (e.g. OUT_OF_ORDER_SEQUENCE for the gap). */
  innerErrors: Map<string, number>;
}

/** The real broker, except that `refuse` may fail a PUBLISH_ENCODED batch (before or after storing it). */
function wrap(inner: EmbeddedBroker, refuse: Refuse): Wrapped {
  const innerErrors = new Map<string, number>();
  const publishEncoded = async (topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<EncodedAppend> => {
    const store = (): Promise<EncodedAppend> =>
      inner.publishEncoded(topic, partition, batch, signal).catch((e: unknown) => {
        const code = (e as { code: string }).code;
        innerErrors.set(code, (innerErrors.get(code) ?? 0) + 1);
        throw e;
      });
    const verdict = await refuse(batch, store);
    if (verdict !== "pass") throw verdict;
    return store();
  };
  const broker = wrapHost(inner, { publishEncoded });
  return { broker, innerErrors };
}

async function withWrappedServer(refuse: Refuse, fn: (url: string, w: Wrapped) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-prod-fail-"));
  const inner = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const w = wrap(inner, refuse);
  const srv = await startServer({ broker: w.broker, port: 0, httpPort: null });
  try {
    await fn(srv.url, w);
  } finally {
    await srv.close({ graceMs: 100 });
    await inner.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const CALLS = 40;
const PER_CALL = 4;
const valuesOf = (i: number, mark: string): string[] => Array.from({ length: PER_CALL }, (_, j) => `${mark}call ${i} record ${j}`);

/** Publishes CALLS pipelined calls (one batch each) to partition 0; returns their outcomes. */
async function stream(url: string, mark: (i: number) => string): Promise<{ values: string[][]; outcomes: PromiseSettledResult<PublishReceipt[]>[]; all: string[]; offsets: number[] }> {
  const client = await connect({ url, maxBatchRecords: PER_CALL });
  try {
    await client.createTopic("s", { partitions: 1 });
    const values = Array.from({ length: CALLS }, (_, i) => valuesOf(i, mark(i)));
    const outcomes = await Promise.allSettled(values.map((vs) => client.publishBatch("s", vs.map((value) => ({ value })))));
    const f = await client.fetch("s", 0, 0, { maxBytes: 1 << 20 });
    return { values, outcomes, all: f.records.map((r) => r.value as string), offsets: f.records.map((r) => r.offset) };
  } finally {
    await client.close();
  }
}

test("producer: a batch the server refuses for good fails only its callers; the pipelined batches behind it are renumbered and stored once, contiguously", { timeout: 60_000 }, async () => {
  // Refused: the very first batch (the broker has no state for the producer yet), two
  // adjacent ones, and the last one.
  const poisoned = new Set([0, 13, 14, 31, 39]);
  const refuse: Refuse = async (batch) => (batch.includes("POISON") ? new ValidationError("refused by the test server") : "pass");
  await withWrappedServer(refuse, async (url, w) => {
    const { values, outcomes, all, offsets } = await stream(url, (i) => (poisoned.has(i) ? "POISON " : ""));
    const surfaced = outcomes.flatMap((o, i) => (o.status === "rejected" ? [[i, (o.reason as { code: string }).code]] : []));
    assert.deepEqual(
      surfaced,
      [...poisoned].map((i) => [i, "VALIDATION"]),
      "only the refused batches' callers see an error, and it is the server's",
    );
    const expected = values.filter((_, i) => !poisoned.has(i));
    // Receipts: contiguous offsets in publish order.
    const got = outcomes.filter((o) => o.status === "fulfilled").map((o) => (o as PromiseFulfilledResult<PublishReceipt[]>).value);
    assert.deepEqual(
      got.flat().map((r) => r.offset),
      Array.from({ length: expected.length * PER_CALL }, (_, k) => k),
    );
    // The log: exactly the accepted records, once each, in publish order, at contiguous offsets.
    assert.deepEqual(all, expected.flat());
    assert.deepEqual(offsets, Array.from({ length: all.length }, (_, k) => k));
    // The batches behind a refused one really were in flight and refused for the gap.
    assert.ok((w.innerErrors.get("OUT_OF_ORDER_SEQUENCE") ?? 0) >= 1, `gap refusals at the broker: ${JSON.stringify([...w.innerErrors])}`);
  });
});

test("producer: a batch refused with STORAGE_ERROR, or stored but answered with it, is re-sent with its number: nothing surfaces, nothing is stored twice", { timeout: 60_000 }, async () => {
  const flakyTries = new Map<string, number>();
  const refuse: Refuse = async (batch, store) => {
    const text = batch.toString("latin1");
    const m = /(FLAKY|STORED) call (\d+)/.exec(text);
    if (!m) return "pass";
    const n = (flakyTries.get(m[2]) ?? 0) + 1;
    flakyTries.set(m[2], n);
    if (n > 2) return "pass";
    // FLAKY: refused twice before anything is stored. STORED: stored first, then the answer is
    // an error (the client cannot know the batch is stored).
    if (m[1] === "STORED") await store();
    return new StorageError("injected by the test server");
  };
  await withWrappedServer(refuse, async (url, w) => {
    const marks = new Map([
      [3, "FLAKY "],
      [17, "STORED "],
      [18, "FLAKY "],
      [30, "STORED "],
    ]);
    const { values, outcomes, all, offsets } = await stream(url, (i) => marks.get(i) ?? "");
    const surfaced = outcomes.flatMap((o, i) => (o.status === "rejected" ? [`${i}: ${(o.reason as Error).message}`] : []));
    assert.deepEqual(surfaced, []);
    const receipts = outcomes.map((o) => (o as PromiseFulfilledResult<PublishReceipt[]>).value);
    assert.deepEqual(
      receipts.flat().map((r) => r.offset),
      Array.from({ length: CALLS * PER_CALL }, (_, k) => k),
      "contiguous offsets in publish order",
    );
    assert.deepEqual(all, values.flat(), "each record stored once, in publish order");
    assert.deepEqual(offsets, Array.from({ length: all.length }, (_, k) => k));
    // The batches stored before their error answer were recognised on retry.
    const tries = JSON.stringify([...flakyTries]);
    assert.equal(receipts[17][0].duplicate, true, `call 17 answered as a duplicate (attempts ${tries})`);
    assert.equal(receipts[30][0].duplicate, true, `call 30 answered as a duplicate (attempts ${tries})`);
    assert.equal(flakyTries.get("3"), 3, `call 3 refused twice, then stored (attempts ${tries})`);
    assert.ok((w.innerErrors.get("OUT_OF_ORDER_SEQUENCE") ?? 0) >= 1, `gap refusals at the broker: ${JSON.stringify([...w.innerErrors])}`);
  });
});

test("producer: a re-send still unanswered at the delivery deadline fails the publish with the error that made it retry, not with TIMEOUT", { timeout: 60_000 }, async () => {
  let tries = 0;
  const refuse: Refuse = async (batch) => {
    if (!batch.toString("latin1").includes("HELD")) return "pass";
    tries++;
    // The first attempt is refused retriably; the re-sends hang past the delivery deadline.
    if (tries === 1) return new StorageError("injected by the test server");
    await new Promise((r) => setTimeout(r, 3_000));
    return new StorageError("injected by the test server, late");
  };
  await withWrappedServer(refuse, async (url) => {
    const client = await connect({ url, deliveryTimeoutMs: 800 });
    try {
      await client.createTopic("s", { partitions: 1 });
      const err = await client.publish("s", "HELD").then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
      assert.ok(tries >= 2, `re-sent after the first refusal (attempts: ${tries})`);
      assert.equal(err?.code, "STORAGE_ERROR", `failed with ${err?.code}: ${err?.message}`);
      // The partition goes on: a later publish is stored.
      assert.equal((await client.publish("s", "after")).offset >= 0, true);
    } finally {
      await client.close();
    }
  });
});
