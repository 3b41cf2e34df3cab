// SPDX-License-Identifier: Apache-2.0
/**
 * Unit tests of the idempotent producer's per-partition window (src/client/partition-window.ts,
 * driven through the Producer of src/client/producer.ts) against a scripted transport: the cap
 * of PRODUCER_BATCHES_KEPT numbered batches per partition, sequence order, what is re-sent with
 * its number, what is renumbered, what reaches the caller; then a seeded model check against a
 * fake broker that implements the broker's sequence rules and injects failures.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Producer, type ProducerOptions } from "../src/client/producer.js";
import { stubs } from "../src/client/rpc.js";
import {
  BrokerClosedError,
  ConnectionClosedError,
  OutOfOrderSequenceError,
  ProducerFencedError,
  StorageError,
  TimeoutError,
  ValidationError,
} from "../src/errors.js";
import { PRODUCER_BATCHES_KEPT } from "../src/log/producer-state.js";
import { decodeRecords, verifyBatch, type BatchHeader } from "../src/log/record-batch.js";
import { Op, type Frame } from "../src/wire/index.js";
import type { PublishReceipt } from "../src/types.js";
import { prng } from "../src/testing/helpers.js";

const KEPT = PRODUCER_BATCHES_KEPT;

interface Req {
  partition: number;
  body: Buffer;
  h: BatchHeader;
  values: string[];
  resolve(f: Frame): void;
  reject(e: unknown): void;
}

function frame(meta: Record<string, unknown>): Frame {
  return { op: 0, flags: 0, correlationId: 0, meta, body: Buffer.alloc(0) };
}

/** Stands in for the Transport: records PUBLISH_ENCODED requests and lets the test answer them. */
class ScriptedTransport {
  isClosed = false;
  inits = 0;
  /** Unanswered publish requests, in the order they were sent. */
  pending: Req[] = [];
  /** Every publish request ever sent. */
  sent: Req[] = [];
  onPublish: ((r: Req) => void) | null = null;

  /** The op-table stubs, through the scripted `request`. */
  readonly rpc = stubs((op, meta, body) => this.request(op, meta as { partition: number }, body));

  request(op: number, meta: { partition: number }, body: Buffer | null): Promise<Frame> {
    if (this.isClosed) return Promise.reject(new BrokerClosedError("client is closed"));
    if (op === Op.InitProducer) {
      this.inits++;
      return Promise.resolve(frame({ producerId: 100 + this.inits, producerEpoch: 0 }));
    }
    assert.equal(op, Op.PublishEncoded);
    return new Promise<Frame>((resolve, reject) => {
      const h = verifyBatch(body!, 0, body!.length);
      const values = decodeRecords(body!, 0, h).map((r) => r.value!.toString());
      const r: Req = {
        partition: meta.partition,
        body: body!,
        h,
        values,
        resolve: (f) => {
          this.pending.splice(this.pending.indexOf(r), 1);
          resolve(f);
        },
        reject: (e) => {
          this.pending.splice(this.pending.indexOf(r), 1);
          reject(e);
        },
      };
      this.pending.push(r);
      this.sent.push(r);
      this.onPublish?.(r);
    });
  }

  inFlight(partition: number): Req[] {
    return this.pending.filter((r) => r.partition === partition);
  }
}

function producer(t: ScriptedTransport, o: Partial<ProducerOptions> = {}, partitions = 2): Producer {
  return new Producer(
    t,
    {
      lingerMs: 0,
      maxBatchRecords: 2,
      maxBatchBytes: 1 << 20,
      idempotent: true,
      maxBufferedRecords: 100_000,
      deliveryTimeoutMs: 120_000,
      requestTimeoutMs: 30_000,
      ...o,
    },
    async () => ({ partitions: Array.from({ length: partitions }), config: { maxMessageBytes: 1 << 20 } }),
  );
}

async function until(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** Lets every pending callback run (the producer reacts to answers on microtasks and immediates). */
const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

/** One call = one batch (maxBatchRecords 2). */
function call(p: Producer, partition: number, i: number): Promise<PublishReceipt[]> {
  return p.send("t", [
    { value: Buffer.from(`${i}a`), partition },
    { value: Buffer.from(`${i}b`), partition },
  ]);
}

function ack(r: Req, baseOffset: number, duplicate = false): void {
  r.resolve(frame({ baseOffset, count: r.h.count, duplicate, synced: true }));
}

test("window: at most PRODUCER_BATCHES_KEPT batches of a partition in flight, numbered in order when sent; partitions are independent", async () => {
  const t = new ScriptedTransport();
  const p = producer(t);
  const calls = [...Array.from({ length: 12 }, (_, i) => call(p, 0, i)), ...Array.from({ length: 3 }, (_, i) => call(p, 1, 100 + i))];
  await until(() => t.sent.length === KEPT + 3, "the first window");
  await settle();
  assert.equal(t.inFlight(0).length, KEPT, "partition 0 stops at the cap");
  assert.equal(t.inFlight(1).length, 3, "partition 1 is not held back by partition 0");
  assert.deepEqual(
    t.inFlight(0).map((r) => r.h.baseSequence),
    [0, 2, 4, 6, 8],
  );
  // Each answer frees one slot; the next batch gets the next sequence.
  let offset = 0;
  const seen: number[] = [];
  while (t.inFlight(0).length > 0) {
    const r = t.inFlight(0)[0];
    seen.push(r.h.baseSequence);
    ack(r, offset);
    offset += 2;
    await settle();
    assert.ok(t.inFlight(0).length <= KEPT);
  }
  assert.deepEqual(seen, Array.from({ length: 12 }, (_, i) => 2 * i), "every sequence once, in order");
  assert.deepEqual(
    t.sent.filter((r) => r.partition === 0).map((r) => r.values[0]),
    Array.from({ length: 12 }, (_, i) => `${i}a`),
    "publish order kept",
  );
  for (const r of t.inFlight(1)) ack(r, 0);
  const receipts = await Promise.all(calls);
  assert.deepEqual(
    receipts.slice(0, 12).map((rs) => rs[0].offset),
    Array.from({ length: 12 }, (_, i) => 2 * i),
  );
  assert.equal(t.inits, 1);
});

test("window: a batch refused for good fails its callers only; the batches behind it are renumbered from its sequence once none is in flight", async () => {
  const t = new ScriptedTransport();
  const p = producer(t);
  const calls = Array.from({ length: 8 }, (_, i) => call(p, 0, i));
  const outcome = calls.map((c) => c.then((rs) => rs, (e: unknown) => e as Error));
  await until(() => t.pending.length === KEPT, "the first window");
  const [b0, b1, b2, b3, b4] = t.pending;
  ack(b0, 0);
  b1.reject(new ValidationError("refused"));
  b2.reject(new OutOfOrderSequenceError("gap"));
  b3.reject(new OutOfOrderSequenceError("gap"));
  await settle();
  // b0's answer freed a slot before b1's answer arrived: call 5 went out behind b4.
  assert.equal(t.sent.length, KEPT + 1);
  const b5 = t.sent[KEPT];
  assert.deepEqual([b5.values[0], b5.h.baseSequence], ["5a", 10]);
  b4.reject(new OutOfOrderSequenceError("gap"));
  await settle();
  // b5 is still in flight: nothing is re-sent or numbered yet.
  assert.equal(t.sent.length, KEPT + 1);
  b5.reject(new OutOfOrderSequenceError("gap"));
  await until(() => t.pending.length === KEPT, "the window after recovery");
  const epoch = b0.h.producerEpoch;
  assert.deepEqual(
    t.pending.map((r) => [r.values[0], r.h.baseSequence, r.h.producerId, r.h.producerEpoch]),
    [
      ["2a", 2, b0.h.producerId, epoch],
      ["3a", 4, b0.h.producerId, epoch],
      ["4a", 6, b0.h.producerId, epoch],
      ["5a", 8, b0.h.producerId, epoch],
      ["6a", 10, b0.h.producerId, epoch],
    ],
    "renumbered from the refused batch's sequence, same id and epoch, order kept",
  );
  let off = 2;
  while (t.pending.length > 0) {
    ack(t.pending[0], off);
    off += 2;
    await settle();
  }
  const results = await Promise.all(outcome);
  assert.ok(results[1] instanceof ValidationError, "the refused batch's caller gets the server's error");
  for (const [i, r] of results.entries()) if (i !== 1) assert.ok(Array.isArray(r), `call ${i} resolves`);
  assert.deepEqual(
    results.filter((r): r is PublishReceipt[] => Array.isArray(r)).map((rs) => rs[0].offset),
    [0, 2, 4, 6, 8, 10, 12],
  );
  assert.equal(t.inits, 1, "no new producer id or epoch");
});

test("window: a retriable failure re-sends the same batches with the same numbers and bytes, after a backoff; the callers never see it", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, {}, 1);
  const calls = Array.from({ length: 6 }, (_, i) => call(p, 0, i));
  await until(() => t.pending.length === KEPT, "the first window");
  const first = [...t.pending];
  ack(first[0], 0);
  first[1].reject(new StorageError("faulted"));
  first[2].reject(new OutOfOrderSequenceError("gap"));
  first[3].reject(new ConnectionClosedError("lost"));
  first[4].reject(new OutOfOrderSequenceError("gap"));
  await settle();
  // The slot freed by the first answer went to call 5 (sequence 10), refused for the gap too.
  const b5 = t.sent[KEPT];
  assert.deepEqual([b5.values[0], b5.h.baseSequence], ["5a", 10]);
  b5.reject(new OutOfOrderSequenceError("gap"));
  await until(() => t.pending.length === KEPT, "the re-sent window");
  const expected = [...first.slice(1), b5];
  for (let k = 0; k < KEPT; k++) {
    assert.equal(t.pending[k].body, expected[k].body, `${expected[k].values[0]} re-sent as the same bytes (same sequence and epoch)`);
  }
  let off = 2;
  while (t.pending.length > 0) {
    ack(t.pending[0], off);
    off += 2;
    await settle();
  }
  const receipts = await Promise.all(calls);
  assert.deepEqual(
    receipts.map((rs) => rs[0].offset),
    [0, 2, 4, 6, 8, 10],
  );
});

test("window: OUT_OF_ORDER_SEQUENCE for the oldest batch with no earlier failure (lost producer state): its callers fail, the rest go again under a fresh producer id", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, {}, 2);
  const other = call(p, 1, 50);
  const calls = Array.from({ length: 7 }, (_, i) => call(p, 0, i));
  const outcome = calls.map((c) => c.then((rs) => rs, (e: unknown) => e as Error));
  await until(() => t.pending.length === KEPT + 1, "the first windows");
  const oldId = t.pending[0].h.producerId;
  const p0 = t.inFlight(0);
  const p1 = t.inFlight(1)[0];
  const warned = new Promise<Error>((resolve) => process.once("warning", resolve));
  p0[0].reject(new OutOfOrderSequenceError("expected sequence 40"));
  for (const r of p0.slice(1)) r.reject(new OutOfOrderSequenceError("gap"));
  await settle();
  // Partition 1 still has a batch in flight under the old id: no new id yet, nothing numbered.
  assert.equal(t.inits, 1);
  assert.equal(t.pending.length, 1);
  ack(p1, 0);
  await until(() => t.inFlight(0).length === KEPT, "the window under the new id");
  assert.equal(t.inits, 2);
  assert.match((await warned).message, /lost its sequence state/);
  assert.deepEqual(
    t.inFlight(0).map((r) => [r.values[0], r.h.baseSequence]),
    [
      ["1a", 0],
      ["2a", 2],
      ["3a", 4],
      ["4a", 6],
      ["5a", 8],
    ],
  );
  assert.ok(t.inFlight(0).every((r) => r.h.producerId !== oldId));
  let off = 0;
  while (t.pending.length > 0) {
    ack(t.pending[0], off);
    off += 2;
    await settle();
  }
  const results = await Promise.all(outcome);
  assert.ok(results[0] instanceof OutOfOrderSequenceError, "the refused batch was not stored: its caller is told");
  assert.ok(results.slice(1).every((r) => Array.isArray(r)));
  await other;
});

test("window: PRODUCER_FENCED reaches the callers (another instance took the id)", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, {}, 1);
  const c = call(p, 0, 0);
  await until(() => t.pending.length === 1, "the batch");
  t.pending[0].reject(new ProducerFencedError("fenced by epoch 1"));
  await assert.rejects(c, ProducerFencedError);
});

test("window: deliveryTimeoutMs bounds the retries; then the publish fails with the last error and the producer continues under a fresh id", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, { deliveryTimeoutMs: 300 }, 1);
  // Every attempt of batch 0 fails retriably (e.g. the server keeps losing the connection).
  t.onPublish = (r) => {
    if (r.values[0] === "0a") queueMicrotask(() => r.reject(new ConnectionClosedError("lost")));
  };
  const started = Date.now();
  const c0 = call(p, 0, 0);
  await assert.rejects(c0, ConnectionClosedError);
  assert.ok(Date.now() - started >= 300, "retried until the delivery deadline");
  assert.ok(t.sent.length >= 2, `retried (${t.sent.length} attempts)`);
  assert.ok(t.sent.every((r) => r.h.baseSequence === 0 && r.h.producerId === t.sent[0].h.producerId), "always the same number");
  const c1 = call(p, 0, 1);
  await until(() => t.pending.length === 1, "the next batch");
  assert.equal(t.inits, 2, "a fresh producer id: the broker's expected sequence is unknown");
  assert.equal(t.pending[0].h.baseSequence, 0);
  ack(t.pending[0], 0);
  await c1;
});

test("window: a request deadline (TIMEOUT) is retried with the same number and recognised as a duplicate", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, {}, 1);
  const c = call(p, 0, 0);
  await until(() => t.pending.length === 1, "the batch");
  const first = t.pending[0];
  first.reject(new TimeoutError("request timed out"));
  await until(() => t.pending.length === 1, "the retry");
  assert.equal(t.pending[0].body, first.body);
  ack(t.pending[0], 7, true);
  const [r] = await c;
  assert.equal(r.offset, 7);
  assert.equal(r.duplicate, true);
});

test("window: once the client is closed, in-flight and waiting batches fail with BROKER_CLOSED and nothing is re-sent", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, {}, 1);
  const calls = Array.from({ length: 7 }, (_, i) => call(p, 0, i).then(() => null, (e: unknown) => e));
  await until(() => t.pending.length === KEPT, "the first window");
  t.isClosed = true;
  for (const r of [...t.pending]) r.reject(new BrokerClosedError("client is closed"));
  const results = await Promise.all(calls);
  assert.ok(results.every((e) => e instanceof BrokerClosedError));
  assert.equal(t.sent.length, KEPT);
  await assert.rejects(call(p, 0, 9), BrokerClosedError);
});

test("window: idempotent: false sends every batch at once and never re-sends", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, { idempotent: false }, 1);
  const calls = Array.from({ length: 8 }, (_, i) => call(p, 0, i).then(() => null, (e: unknown) => e));
  await until(() => t.pending.length === 8, "all batches");
  assert.equal(t.inits, 0);
  assert.ok(t.pending.every((r) => r.h.producerId === -1));
  for (const r of [...t.pending]) r.reject(new ConnectionClosedError("lost"));
  const results = await Promise.all(calls);
  assert.ok(results.every((e) => e instanceof ConnectionClosedError));
  assert.equal(t.sent.length, 8);
});

test("window: deliveryTimeoutMs is validated", () => {
  assert.throws(() => producer(new ScriptedTransport(), { deliveryTimeoutMs: 0 }), ValidationError);
  assert.throws(() => producer(new ScriptedTransport(), { deliveryTimeoutMs: Number.NaN }), ValidationError);
});

// ───────────────────────────── model check ─────────────────────────────

/** mulberry32: a small seeded generator, so a failing seed can be replayed. */
const rng = prng;

/**
 * The broker's sequence rules for one producer (src/log/partition-log.ts checkProducer):
 * per partition the last KEPT batches are remembered; a retry of one of them is answered with
 * its original offsets; anything else must continue at lastSeq + 1 (a new id starts anywhere,
 * as the broker accepts any sequence from a producer it has no state for).
 */
class ModelBroker {
  logs = new Map<number, string[]>();
  state = new Map<string, { lastSeq: number; batches: { seq: number; count: number; offset: number }[] }>();
  stats = { gap: 0, retriable: 0, storedButLost: 0, refused: 0, duplicate: 0 };

  constructor(private readonly random: () => number) {}

  /** Answers requests strictly in arrival order, each with a random fate. */
  process(r: Req): void {
    const x = this.random();
    if (r.values.some((v) => v.startsWith("BAD"))) {
      // Refused for good before the sequence check (like VALIDATION): deterministic per batch.
      this.stats.refused++;
      return r.reject(new ValidationError("bad record"));
    }
    if (x < 0.06) {
      this.stats.retriable++;
      return r.reject(new StorageError("faulted"));
    }
    const key = `${r.h.producerId}/${r.partition}`;
    let st = this.state.get(key);
    if (!st) this.state.set(key, (st = { lastSeq: r.h.baseSequence - 1, batches: [] }));
    const dup = st.batches.find((b) => b.seq === r.h.baseSequence);
    if (dup) {
      assert.equal(dup.count, r.h.count, "a retry carries the original record count");
      this.stats.duplicate++;
      return r.resolve(frame({ baseOffset: dup.offset, count: dup.count, duplicate: true, synced: true }));
    }
    if (r.h.baseSequence !== st.lastSeq + 1) {
      this.stats.gap++;
      return r.reject(new OutOfOrderSequenceError(`expected ${st.lastSeq + 1}, got ${r.h.baseSequence}`));
    }
    let log = this.logs.get(r.partition);
    if (!log) this.logs.set(r.partition, (log = []));
    const offset = log.length;
    log.push(...r.values);
    st.lastSeq = r.h.baseSequence + r.h.count - 1;
    st.batches.push({ seq: r.h.baseSequence, count: r.h.count, offset });
    if (st.batches.length > KEPT) st.batches.shift();
    if (x < 0.12) {
      // Stored, but the answer is lost (timeout or connection failure seen by the client).
      this.stats.storedButLost++;
      return r.reject(x < 0.09 ? new TimeoutError("request timed out") : new ConnectionClosedError("lost"));
    }
    r.resolve(frame({ baseOffset: offset, count: r.h.count, duplicate: false, synced: true }));
  }
}

for (const seed of [1, 2, 3]) {
  test(`window: model check (seed ${seed}): random retriable failures, lost answers and refused batches across 3 partitions`, { timeout: 60_000 }, async () => {
    const random = rng(seed);
    const t = new ScriptedTransport();
    const broker = new ModelBroker(random);
    let maxInFlight = 0;
    // The broker answers in arrival order, one request per turn of the event loop.
    let stop = false;
    const server = (async () => {
      while (!stop) {
        await new Promise((r) => setImmediate(r));
        for (const part of [0, 1, 2]) maxInFlight = Math.max(maxInFlight, t.inFlight(part).length);
        const r = t.pending[0];
        if (r) broker.process(r);
      }
    })();
    const p = producer(t, { maxBatchRecords: 3 }, 3);
    const outcomes: Promise<{ i: number; values: string[]; receipts?: PublishReceipt[]; err?: { code: string } }>[] = [];
    for (let i = 0; i < 150; i++) {
      const n = 1 + Math.floor(random() * 3);
      const partition = Math.floor(random() * 3);
      const bad = random() < 0.03;
      const values = Array.from({ length: n }, (_, j) => `${bad ? "BAD" : ""}${i}.${j}`);
      outcomes.push(
        p.send("t", values.map((v) => ({ value: Buffer.from(v), partition }))).then(
          (receipts) => ({ i, values, receipts }),
          (err: { code: string }) => ({ i, values, err }),
        ),
      );
      // Publishes arrive over time, in bursts.
      if (random() < 0.2) await new Promise((r) => setImmediate(r));
    }
    const results = await Promise.all(outcomes);
    stop = true;
    await server;
    assert.ok(maxInFlight <= KEPT, `in flight per partition: ${maxInFlight}`);
    const stored = new Map<string, [number, number]>();
    for (const [partition, log] of broker.logs) {
      for (const [offset, v] of log.entries()) {
        assert.ok(!stored.has(v), `${v} stored twice`);
        stored.set(v, [partition, offset]);
      }
    }
    for (const r of results) {
      if (r.err) {
        assert.equal(r.err.code, "VALIDATION", `publish ${r.i} failed with ${r.err.code}`);
        for (const v of r.values) assert.ok(!stored.has(v), `${v} failed but is stored`);
      } else {
        for (const [k, rec] of r.receipts!.entries()) {
          assert.deepEqual(stored.get(r.values[k]), [rec.partition, rec.offset], `${r.values[k]} is where its receipt says`);
        }
      }
    }
    const ok = results.filter((r) => !r.err).reduce((n, r) => n + r.values.length, 0);
    assert.equal(stored.size, ok, "everything stored was acknowledged");
    assert.ok(broker.stats.gap > 0 && broker.stats.storedButLost > 0 && broker.stats.duplicate > 0, JSON.stringify(broker.stats));
  });
}
