// SPDX-License-Identifier: Apache-2.0
/**
 * The network client's single-record publish path (src/client/producer.ts `publishOne` and a
 * one-record `send`): a lone publish to a partition with nothing in flight is sent before the
 * event loop turns (no linger), publishes made while a partition's window is full gather into
 * the next batch, a call that waits for the
 * producer id or topic metadata is never overtaken by a later one, and an oversized or invalid
 * record fails alone while its batch-mates are sent.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Producer } from "../src/client/producer.js";
import { stubs } from "../src/client/rpc.js";
import { RecordTooLargeError, ValidationError } from "../src/errors.js";
import { PRODUCER_BATCHES_KEPT } from "../src/log/producer-state.js";
import { decodeRecords, verifyBatch, type BatchHeader } from "../src/log/record-batch.js";
import { Op, type Frame } from "../src/wire/index.js";
import type { PublishReceipt } from "../src/types.js";

interface Req {
  partition: number;
  h: BatchHeader;
  values: string[];
  resolve(f: Frame): void;
}

function frame(meta: Record<string, unknown>): Frame {
  return { op: 0, flags: 0, correlationId: 0, meta, body: Buffer.alloc(0) };
}

/** Records PUBLISH_ENCODED requests; the test answers them. InitProducer answers at once. */
class ScriptedTransport {
  isClosed = false;
  pending: Req[] = [];
  sent: Req[] = [];
  readonly rpc = stubs((op, meta, body) => this.request(op, meta as { partition: number }, body));

  request(op: number, meta: { partition: number }, body: Buffer | null): Promise<Frame> {
    if (op === Op.InitProducer) return Promise.resolve(frame({ producerId: 7, producerEpoch: 0 }));
    assert.equal(op, Op.PublishEncoded);
    return new Promise<Frame>((resolve) => {
      const h = verifyBatch(body!, 0, body!.length);
      const values = decodeRecords(body!, 0, h).map((r) => r.value!.toString());
      const r: Req = {
        partition: meta.partition,
        h,
        values,
        resolve: (f) => {
          this.pending.splice(this.pending.indexOf(r), 1);
          resolve(f);
        },
      };
      this.pending.push(r);
      this.sent.push(r);
    });
  }
}

let nextOffset = 0;
function ack(r: Req): void {
  r.resolve(frame({ baseOffset: nextOffset, count: r.h.count, duplicate: false, synced: true }));
  nextOffset += r.h.count;
}

function producer(t: ScriptedTransport, describeDelayMs = 0): Producer {
  return new Producer(
    t,
    { lingerMs: 0, maxBatchRecords: 5000, maxBatchBytes: 1 << 20, idempotent: true, maxBufferedRecords: 100_000, deliveryTimeoutMs: 120_000, requestTimeoutMs: 30_000 },
    async () => {
      if (describeDelayMs > 0) await new Promise((r) => setTimeout(r, describeDelayMs));
      return { partitions: [0, 1], config: { maxMessageBytes: 1024 } };
    },
  );
}

test("publishOne: a lone publish is sent within the same turn; publishes made while the window is full go out together", async () => {
  const t = new ScriptedTransport();
  const p = producer(t);
  const first = p.publishOne("t", Buffer.from("first"), { partition: 0 });
  await new Promise((r) => setImmediate(r));
  ack(t.pending[0]);
  assert.equal((await first).partition, 0);
  // Metadata and id known: the next one is sent before the event loop turns.
  let turned = false;
  setImmediate(() => (turned = true));
  const lone = p.publishOne("t", Buffer.from("lone"), { partition: 0 });
  for (let i = 0; i < 10 && t.pending.length === 0; i++) await Promise.resolve();
  assert.equal(turned, false);
  assert.deepEqual(t.pending.map((r) => r.values), [["lone"]]);
  // Fill the window with single publishes in separate turns (with a batch in flight, records
  // gather until the end of the turn), then publish 100 more.
  const more: Promise<PublishReceipt>[] = [lone];
  for (let i = 1; i < PRODUCER_BATCHES_KEPT; i++) {
    more.push(p.publishOne("t", Buffer.from(`w${i}`), { partition: 0 }));
    await new Promise((r) => setImmediate(r));
  }
  assert.equal(t.pending.length, PRODUCER_BATCHES_KEPT);
  for (let i = 0; i < 100; i++) more.push(p.publishOne("t", Buffer.from(`g${i}`), { partition: 0 }));
  await new Promise((r) => setImmediate(r));
  assert.equal(t.pending.length, PRODUCER_BATCHES_KEPT, "the window stays at its cap");
  ack(t.pending[0]);
  await new Promise((r) => setImmediate(r));
  const last = t.sent[t.sent.length - 1];
  assert.equal(last.values.length, 100, "the hundred gathered into one batch");
  assert.deepEqual(last.values.slice(0, 2), ["g0", "g1"]);
  while (t.pending.length > 0) ack(t.pending[0]);
  const rs = await Promise.all(more);
  for (let i = 1; i < rs.length; i++) assert.equal(rs[i].offset, rs[i - 1].offset + 1);
});

test("publishOne: calls made while the first waits for metadata keep their order; an invalid record fails alone", async () => {
  const t = new ScriptedTransport();
  const p = producer(t, 20);
  const calls: Promise<PromiseSettledResult<PublishReceipt | PublishReceipt[]>>[] = [];
  const track = (x: Promise<PublishReceipt | PublishReceipt[]>): void => {
    calls.push(Promise.allSettled([x]).then(([r]) => r));
  };
  for (let i = 0; i < 50; i++) {
    if (i === 10) track(p.publishOne("t", Buffer.alloc(2000), { key: "k" }));
    else if (i === 20) track(p.publishOne("t", "bad", { key: "k", timestamp: -1 }));
    else if (i % 7 === 0) track(p.send("t", [{ key: "k", value: `v${i}` }, { key: "k", value: `v${i}+` }]));
    else track(p.publishOne("t", `v${i}`, { key: "k" }));
    if (i === 25) await new Promise((r) => setTimeout(r, 40)); // metadata arrived meanwhile
  }
  const settled = Promise.all(calls);
  for (let i = 0; i < 200 && (t.pending.length > 0 || t.sent.length === 0); i++) {
    while (t.pending.length > 0) ack(t.pending[0]);
    await new Promise((r) => setImmediate(r));
  }
  const out = await settled;
  assert.ok(out[10].status === "rejected" && out[10].reason instanceof RecordTooLargeError);
  assert.ok(out[20].status === "rejected" && out[20].reason instanceof ValidationError);
  const sentValues = t.sent.flatMap((r) => r.values);
  const want: string[] = [];
  for (let i = 0; i < 50; i++) {
    if (i === 10 || i === 20) continue;
    want.push(`v${i}`);
    if (i % 7 === 0) want.push(`v${i}+`);
  }
  assert.deepEqual(sentValues, want, "sent in call order, the refused records absent");
});
