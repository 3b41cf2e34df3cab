// SPDX-License-Identifier: Apache-2.0
/**
 * The Broker contract as executable tests. `defineConformanceSuite(name, factory)` registers
 * node:test tests that any `Broker` implementation must pass: the embedded `openBroker()`,
 * `connect()` to a `sluice serve` process, and future engines (e.g. PostgreSQL).
 *
 * Rules for the tests here: they only use the public `Broker` interface and error classes;
 * every test uses its own topic and group names (a factory may hand out the same broker
 * repeatedly); waits are conditions with deadlines, never sleeps.
 *
 * @example
 * defineConformanceSuite("embedded", async () => {
 *   const dir = mkdtempSync(join(tmpdir(), "c-"));
 *   const broker = await openBroker({ dataDir: dir });
 *   return { broker, cleanup: async () => { await broker.close(); rmSync(dir, { recursive: true }); } };
 * });
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  AbortedError,
  BrokerError,
  GroupActiveError,
  InvalidNameError,
  NotAssignedError,
  OffsetOutOfRangeError,
  ProducerFencedError,
  RecordTooLargeError,
  TopicExistsError,
  TopicNotFoundError,
  ValidationError,
} from "../errors.js";
import { partitionForKey } from "../streams/murmur2.js";
import type { Broker, Message, Subscription } from "../types.js";
import type { Job } from "../queues/types.js";
import { LeaseExpiredError, PermanentError } from "../errors.js";
import { waitUntil } from "./helpers.js";

export interface ConformanceTarget {
  broker: Broker;
  cleanup(): Promise<void>;
}

let seq = 0;
function uniq(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${++seq}`;
}


/** Reads `n` messages from a subscription (with a deadline), leaving it open. */
async function take<T>(sub: Subscription<T>, n: number, timeoutMs = 10_000): Promise<Message<T>[]> {
  const out: Message<T>[] = [];
  const it = sub[Symbol.asyncIterator]();
  const deadline = Date.now() + timeoutMs;
  while (out.length < n) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`timed out: got ${out.length} of ${n} messages`);
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), left))),
    ]);
    clearTimeout(timer);
    if (r === "timeout") throw new Error(`timed out: got ${out.length} of ${n} messages`);
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

/** Reads everything from all partitions of a topic via fetch. */
async function readAll(b: Broker, topic: string): Promise<Map<number, unknown[]>> {
  const d = await b.describeTopic(topic);
  const out = new Map<number, unknown[]>();
  for (const p of d.partitions) {
    const vals: unknown[] = [];
    let off = p.logStartOffset;
    for (;;) {
      const r = await b.fetch(topic, p.partition, off);
      for (const rec of r.records) vals.push(rec.value);
      if (r.records.length === 0 || r.nextOffset >= r.highWatermark) break;
      off = r.nextOffset;
    }
    out.set(p.partition, vals);
  }
  return out;
}

export function defineConformanceSuite(name: string, factory: () => Promise<ConformanceTarget>): void {
  const t = (title: string, fn: (b: Broker) => Promise<void>, timeoutMs = 30_000): void => {
    test(`[${name}] ${title}`, { timeout: timeoutMs }, async () => {
      const target = await factory();
      try {
        await fn(target.broker);
      } finally {
        await target.cleanup();
      }
    });
  };

  // ------------------------------------------------------------------------------ topics
  t("createTopic / describeTopic / listTopics / deleteTopic", async (b) => {
    const name = uniq("topics");
    const d = await b.createTopic(name, { partitions: 3, maxMessageBytes: 4096 });
    assert.equal(d.name, name);
    assert.equal(d.partitions.length, 3);
    assert.equal(d.config.partitions, 3);
    assert.equal(d.config.maxMessageBytes, 4096);
    assert.equal(d.config.durability, "always", "durability defaults to always");
    assert.ok(typeof d.topicId === "string" && d.topicId.length > 0);
    for (const p of d.partitions) {
      assert.equal(p.logStartOffset, 0);
      assert.equal(p.highWatermark, 0);
    }
    assert.deepEqual((await b.describeTopic(name)).topicId, d.topicId);
    assert.ok((await b.listTopics()).includes(name));
    await assert.rejects(b.createTopic(name), TopicExistsError);
    await b.deleteTopic(name);
    assert.ok(!(await b.listTopics()).includes(name));
    await assert.rejects(b.describeTopic(name), TopicNotFoundError);
    await assert.rejects(b.deleteTopic(name), TopicNotFoundError);
  });

  t("topic names are checked against the allow-list", async (b) => {
    for (const bad of ["", ".", "..", "a/b", "../x", "a b", "x".repeat(250), "tab\t"]) {
      await assert.rejects(b.createTopic(bad), (e: unknown) => e instanceof InvalidNameError || e instanceof ValidationError, `name ${JSON.stringify(bad)}`);
    }
    const ok = uniq("Ok.name_with-chars");
    await b.createTopic(ok);
    await b.deleteTopic(ok);
  });

  t("deleting then re-creating a topic never resurrects old data", async (b) => {
    const name = uniq("recreate");
    const d1 = await b.createTopic(name);
    await b.publish(name, "old");
    await b.deleteTopic(name);
    const d2 = await b.createTopic(name);
    assert.notEqual(d2.topicId, d1.topicId);
    const r = await b.fetch(name, 0, 0);
    assert.equal(r.records.length, 0);
    assert.equal(r.highWatermark, 0);
    await b.publish(name, "new");
    assert.deepEqual((await readAll(b, name)).get(0), ["new"]);
  });

  t("operations on a missing topic fail with TopicNotFoundError", async (b) => {
    const name = uniq("missing");
    await assert.rejects(b.publish(name, "x"), TopicNotFoundError);
    await assert.rejects(b.fetch(name, 0, 0), TopicNotFoundError);
    await assert.rejects(b.groupLag("g", name), TopicNotFoundError);
  });

  // ------------------------------------------------------------------------------ produce/fetch
  t("values keep their kind: bytes, string, JSON, null; keys, headers and timestamps round-trip", async (b) => {
    const name = uniq("kinds");
    await b.createTopic(name);
    const ts = 1_700_000_000_123;
    const inputs: unknown[] = [Buffer.from([0, 1, 2, 255]), "héllo ✓", { a: [1, "two", null], b: { c: true } }, 42, true, null, ""];
    for (const v of inputs) await b.publish(name, v as never, { key: "k", headers: { h1: "v1", h2: Buffer.from([7, 8]) }, timestamp: ts });
    const r = await b.fetch(name, 0, 0);
    assert.equal(r.records.length, inputs.length);
    r.records.forEach((rec, i) => {
      const want = inputs[i];
      if (want instanceof Uint8Array) {
        assert.ok(rec.value instanceof Uint8Array, "bytes come back as Uint8Array");
        assert.deepEqual(Buffer.from(rec.value as Uint8Array), Buffer.from(want));
      } else assert.deepEqual(rec.value, want);
      assert.equal(rec.topic, name);
      assert.equal(rec.partition, 0);
      assert.equal(rec.offset, i);
      assert.equal(rec.timestamp, ts);
      assert.deepEqual(Buffer.from(rec.key!), Buffer.from("k"));
      assert.deepEqual(Buffer.from(rec.headers.h1), Buffer.from("v1"));
      assert.deepEqual(Buffer.from(rec.headers.h2), Buffer.from([7, 8]));
    });
  });

  t("a key picks the partition with Kafka's murmur2; receipts carry partition and offset", async (b) => {
    const name = uniq("keys");
    await b.createTopic(name, { partitions: 6 });
    const next = new Map<number, number>();
    for (let i = 0; i < 60; i++) {
      const key = `customer-${i % 12}`;
      const r = await b.publish(name, i, { key });
      assert.equal(r.partition, partitionForKey(Buffer.from(key), 6));
      assert.equal(r.offset, next.get(r.partition) ?? 0, "offsets are contiguous per partition");
      assert.equal(r.topic, name);
      assert.equal(r.duplicate, false);
      assert.equal(r.synced, true, "durability always acknowledges after fsync");
      next.set(r.partition, r.offset + 1);
    }
  });

  t("publishBatch returns one receipt per record in order; explicit partitions are honoured", async (b) => {
    const name = uniq("batch");
    await b.createTopic(name, { partitions: 3 });
    const recs = Array.from({ length: 30 }, (_, i) => ({ value: `v${i}`, partition: i % 3 }));
    const receipts = await b.publishBatch(name, recs);
    assert.equal(receipts.length, 30);
    receipts.forEach((r, i) => {
      assert.equal(r.partition, i % 3);
      assert.equal(r.offset, Math.floor(i / 3));
    });
    const all = await readAll(b, name);
    assert.deepEqual(all.get(1), Array.from({ length: 10 }, (_, k) => `v${k * 3 + 1}`));
    await assert.rejects(b.publishBatch(name, []), ValidationError);
    await assert.rejects(b.publish(name, "x", { partition: 3 }), (e: unknown) => e instanceof BrokerError && !e.retriable);
    // Keyless records spread over partitions (not all on one).
    const spread = new Set<number>();
    for (let i = 0; i < 12; i++) spread.add((await b.publish(name, i)).partition);
    assert.ok(spread.size > 1, "keyless publishes are spread over partitions");
  });

  t("a record over maxMessageBytes fails with RecordTooLargeError and nothing of it is stored", async (b) => {
    const name = uniq("large");
    await b.createTopic(name, { maxMessageBytes: 1024 });
    await b.publish(name, "small");
    await assert.rejects(b.publish(name, "x".repeat(5000)), (e: unknown) => e instanceof RecordTooLargeError && e.maxBytes === 1024);
    await assert.rejects(b.publishBatch(name, [{ value: "ok" }, { value: Buffer.alloc(4096) }]), RecordTooLargeError);
    const d = await b.describeTopic(name);
    assert.equal(d.partitions[0].highWatermark, 1);
    await b.publish(name, "after");
    assert.deepEqual((await readAll(b, name)).get(0), ["small", "after"]);
  });

  t("idempotent producing: a retried batch returns the original offsets with duplicate=true", async (b) => {
    const name = uniq("idem");
    await b.createTopic(name, { partitions: 2 });
    const { producerId, producerEpoch } = await b.initProducer();
    const batch = [
      { value: "a", partition: 1 },
      { value: "b", partition: 1 },
    ];
    const first = await b.publishBatch(name, batch, { producerId, producerEpoch, baseSequence: 0 });
    const retry = await b.publishBatch(name, batch, { producerId, producerEpoch, baseSequence: 0 });
    assert.deepEqual(
      retry.map((r) => [r.partition, r.offset, r.duplicate]),
      first.map((r) => [r.partition, r.offset, true]),
    );
    const next = await b.publishBatch(name, [{ value: "c", partition: 1 }], { producerId, producerEpoch, baseSequence: 2 });
    assert.equal(next[0].offset, 2);
    assert.equal(next[0].duplicate, false);
    assert.deepEqual((await readAll(b, name)).get(1), ["a", "b", "c"]);
    // Re-initialising the same id bumps the epoch and fences the older instance.
    const bumped = await b.initProducer(producerId);
    assert.equal(bumped.producerId, producerId);
    assert.ok(bumped.producerEpoch > producerEpoch);
    await assert.rejects(
      b.publishBatch(name, [{ value: "zombie", partition: 1 }], { producerId, producerEpoch, baseSequence: 3 }),
      ProducerFencedError,
    );
    assert.deepEqual((await readAll(b, name)).get(1), ["a", "b", "c"]);
  });

  t("fetch honours maxBytes (at least one record), nextOffset and offsets out of range", async (b) => {
    const name = uniq("fetch");
    await b.createTopic(name);
    await b.publishBatch(name, Array.from({ length: 50 }, (_, i) => ({ value: "x".repeat(100) + i })));
    const small = await b.fetch(name, 0, 0, { maxBytes: 1 });
    assert.ok(small.records.length >= 1);
    assert.equal(small.nextOffset, small.records.at(-1)!.offset + 1);
    assert.equal(small.highWatermark, 50);
    assert.equal(small.logStartOffset, 0);
    const mid = await b.fetch(name, 0, 20);
    assert.equal(mid.records[0].offset, 20);
    const atEnd = await b.fetch(name, 0, 50);
    assert.equal(atEnd.records.length, 0);
    await assert.rejects(b.fetch(name, 0, 51), OffsetOutOfRangeError);
    await assert.rejects(b.fetch(name, 7, 0), (e: unknown) => e instanceof BrokerError && !e.retriable);
  });

  t("fetch long-polls: a waiting fetch returns as soon as a record arrives", async (b) => {
    const name = uniq("longpoll");
    await b.createTopic(name);
    const started = Date.now();
    const waiting = b.fetch(name, 0, 0, { maxWaitMs: 10_000 });
    // Whether the fetch is already waiting or arrives after the publish, it must return the record.
    await b.publish(name, "wake");
    const r = await waiting;
    assert.equal(r.records[0].value, "wake");
    assert.ok(Date.now() - started < 9_000, "returned on data, not on timeout");
    const empty = await b.fetch(name, 0, 1, { maxWaitMs: 50 });
    assert.equal(empty.records.length, 0);
    // Aborting a long poll ends it promptly (empty result or an abort error, never a hang).
    const ac = new AbortController();
    const t0 = Date.now();
    const aborted = b.fetch(name, 0, 1, { maxWaitMs: 10_000, signal: ac.signal });
    ac.abort();
    const settled = await aborted.then((x) => x.records.length, () => 0);
    assert.equal(settled, 0);
    assert.ok(Date.now() - t0 < 5_000, "abort ends the long poll");
  });

  t("offsetForTimestamp finds the first record at or after a time", async (b) => {
    const name = uniq("ts");
    await b.createTopic(name);
    await b.publishBatch(name, [10, 20, 30, 40].map((s) => ({ value: s, timestamp: 1_000_000 + s })));
    assert.equal(await b.offsetForTimestamp(name, 0, 1_000_000), 0);
    assert.equal(await b.offsetForTimestamp(name, 0, 1_000_025), 2);
    assert.equal(await b.offsetForTimestamp(name, 0, 1_000_040), 3);
    assert.equal(await b.offsetForTimestamp(name, 0, 9_000_000), 4, "past the end: the high watermark");
  });

  // ------------------------------------------------------------------------------ groups
  t("subscribe from earliest delivers every record in per-partition order; commit() resumes exactly there", async (b) => {
    const name = uniq("sub");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 3 });
    await b.publishBatch(name, Array.from({ length: 90 }, (_, i) => ({ value: i, key: `k${i % 9}` })));
    const sub = b.subscribe<number>(name, { group, start: "earliest" });
    const msgs = await take(sub, 90);
    const last = new Map<number, number>();
    for (const m of msgs) {
      assert.ok((last.get(m.partition) ?? -1) < m.offset, "per-partition order");
      last.set(m.partition, m.offset);
      assert.equal(m.topic, name);
      assert.ok(m.signal instanceof AbortSignal);
    }
    assert.deepEqual(msgs.map((m) => m.value).sort((x, y) => x - y), Array.from({ length: 90 }, (_, i) => i));
    // Commit through the 5th message of each partition.
    const byP = new Map<number, Message<number>[]>();
    for (const m of msgs) byP.set(m.partition, [...(byP.get(m.partition) ?? []), m]);
    for (const list of byP.values()) await list[4].commit();
    assert.deepEqual(sub.assignment(), [0, 1, 2]);
    await sub.close();
    const lag = await b.groupLag(group, name);
    assert.equal(lag.totalRecords, 90 - 5 * byP.size);
    for (const p of lag.partitions) {
      if (!byP.has(p.partition)) continue;
      assert.equal(p.committedOffset, byP.get(p.partition)![4].offset + 1, "stored offset = processed + 1");
      assert.ok(p.lagMs >= 0);
    }
    const again = b.subscribe<number>(name, { group, start: "earliest" });
    const rest = await take(again, 90 - 5 * byP.size);
    for (const m of rest) assert.ok(m.offset >= 5, "resumes after the committed message");
    await again.close();
  });

  t("start latest skips the backlog; groups are independent", async (b) => {
    const name = uniq("latest");
    await b.createTopic(name);
    await b.publishBatch(name, [{ value: "old1" }, { value: "old2" }]);
    const g1 = uniq("g1");
    const g2 = uniq("g2");
    const latest = b.subscribe(name, { group: g1, start: "latest" });
    const earliest = b.subscribe(name, { group: g2, start: "earliest" });
    const e = await take(earliest, 2);
    assert.deepEqual(e.map((m) => m.value), ["old1", "old2"]);
    // The member resolves "latest" at some point after joining (iteration may trigger the
    // join); keep publishing fresh records until it receives one. It must never see the backlog.
    const pending = take(latest, 1);
    let i = 0;
    let got: Message<unknown>[] | null = null;
    void pending.then((x) => (got = x));
    await waitUntil(async () => {
      if (got) return true;
      await b.publish(name, `new${i++}`);
      await new Promise((r) => setTimeout(r, 20));
      return got !== null;
    }, "latest member receives a new record");
    const l = got! as Message<unknown>[];
    assert.match(String(l[0].value), /^new/);
    await e[1].commit();
    assert.equal((await b.groupLag(g2, name)).totalRecords, i, "only the new records are unprocessed by g2");
    await latest.close();
    await earliest.close();
  });

  t("batches(): commit() stores the highest offset per partition", async (b) => {
    const name = uniq("batches");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 2 });
    await b.publishBatch(name, Array.from({ length: 40 }, (_, i) => ({ value: i, partition: i % 2 })));
    const sub = b.subscribe<number>(name, { group, start: "earliest" });
    let seen = 0;
    for await (const batch of sub.batches({ maxMessages: 15, maxWaitMs: 20 })) {
      assert.ok(batch.messages.length >= 1 && batch.messages.length <= 15);
      seen += batch.messages.length;
      await batch.commit();
      if (seen >= 40) break;
    }
    assert.equal(seen, 40);
    await sub.close();
    const lag = await b.groupLag(group, name);
    assert.equal(lag.totalRecords, 0);
    assert.deepEqual(lag.partitions.map((p) => p.committedOffset), [20, 20]);
  });

  t("two members split the partitions; a revoked partition aborts msg.signal and its commit fails", async (b) => {
    const name = uniq("rebalance");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 4 });
    await b.publishBatch(name, Array.from({ length: 40 }, (_, i) => ({ value: i, partition: i % 4 })));
    const a = b.subscribe<number>(name, { group, start: "earliest" });
    const first = await take(a, 40);
    await waitUntil(() => a.assignment().length === 4, "a owns all partitions");
    const b2 = b.subscribe<number>(name, { group, start: "earliest" });
    const pendingB = take(b2, 1);
    await waitUntil(() => a.assignment().length === 2 && b2.assignment().length === 2, "partitions split 2/2", 15_000);
    await pendingB;
    const union = [...a.assignment(), ...b2.assignment()].sort();
    assert.deepEqual(union, [0, 1, 2, 3], "disjoint and complete");
    const moved = first.find((m) => !a.assignment().includes(m.partition))!;
    assert.ok(moved, "some partition moved");
    await waitUntil(() => moved.signal.aborted, "signal of a revoked partition aborts");
    await assert.rejects(moved.commit(), NotAssignedError);
    await b2.close();
    await waitUntil(() => a.assignment().length === 4, "the survivor gets everything back", 15_000);
    // The partition came back, but that message belongs to an earlier ownership period.
    await assert.rejects(moved.commit(), NotAssignedError);
    await a.close();
  });

  t("members beyond the partition count stay idle", async (b) => {
    const name = uniq("idle");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 2 });
    const subs = [0, 1, 2].map(() => b.subscribe(name, { group, start: "earliest" }));
    // Iteration triggers the join in some implementations; start one next() per member.
    const its = subs.map((s) => s[Symbol.asyncIterator]());
    const nexts = its.map((it) => it.next());
    await waitUntil(() => subs.reduce((n, s) => n + s.assignment().length, 0) === 2 && subs.filter((s) => s.assignment().length === 0).length === 1, "2 busy + 1 idle", 15_000);
    await Promise.all(subs.map((s) => s.close()));
    await Promise.allSettled(nexts);
  });

  t("aborting the subscription signal ends the loop cleanly", async (b) => {
    const name = uniq("abort");
    await b.createTopic(name);
    await b.publish(name, 1);
    const ac = new AbortController();
    const sub = b.subscribe(name, { group: uniq("g"), start: "earliest", signal: ac.signal });
    let n = 0;
    for await (const m of sub) {
      n++;
      void m;
      ac.abort();
    }
    assert.equal(n, 1);
  });

  t("resetGroup: dry run reports without changing; a reset moves the group; active groups are refused", async (b) => {
    const name = uniq("reset");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 2 });
    await b.publishBatch(name, Array.from({ length: 20 }, (_, i) => ({ value: i, partition: i % 2 })));
    const dry = await b.resetGroup(group, name, { offset: 4 }, { dryRun: true });
    assert.equal(dry.dryRun, true);
    assert.deepEqual(dry.partitions.map((p) => [p.partition, p.previous, p.next]), [
      [0, null, 4],
      [1, null, 4],
    ]);
    assert.equal((await b.groupLag(group, name)).partitions[0].committedOffset, null, "dry run changed nothing");
    await b.resetGroup(group, name, "latest");
    assert.equal((await b.groupLag(group, name)).totalRecords, 0);
    const shifted = await b.resetGroup(group, name, { shiftBy: -3 });
    assert.deepEqual(shifted.partitions.map((p) => p.next), [7, 7]);
    assert.equal((await b.groupLag(group, name)).totalRecords, 6);
    const sub = b.subscribe(name, { group, start: "earliest" });
    const got = await take(sub, 1);
    assert.ok(got[0].offset >= 7);
    await assert.rejects(b.resetGroup(group, name, "earliest"), GroupActiveError);
    await sub.close();
    await b.resetGroup(group, name, "earliest");
    assert.equal((await b.groupLag(group, name)).totalRecords, 20);
  });

  // ------------------------------------------------------------------------------ queues
  const nextJob = async <T>(it: AsyncIterator<Job<T>>, timeoutMs = 10_000): Promise<Job<T>> => {
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs))),
    ]);
    clearTimeout(timer);
    if (r === "timeout" || r.done) throw new Error("no job delivered in time");
    return r.value;
  };

  t("queues: enqueue, work, ack; nack redelivers with a higher attempt; stats", async (b) => {
    const q = b.queue<{ n: number }>(uniq("q"), { visibilityTimeoutMs: 10_000 });
    const r1 = await q.enqueue({ n: 1 }, { headers: { h: "v" } });
    assert.equal(r1.duplicate, false);
    await q.enqueueBatch([{ data: { n: 2 } }]);
    const w = q.work({ prefetch: 2 });
    const it = w[Symbol.asyncIterator]();
    const a = await nextJob(it);
    const c = await nextJob(it);
    const byN = new Map([a, c].map((j) => [j.data.n, j]));
    assert.deepEqual([...byN.keys()].sort(), [1, 2]);
    assert.equal(byN.get(1)!.attempt, 1);
    assert.deepEqual(Buffer.from(byN.get(1)!.headers.h), Buffer.from("v"));
    await byN.get(1)!.ack();
    await byN.get(2)!.nack({ delayMs: 0 });
    const again = await nextJob(it);
    assert.equal(again.data.n, 2);
    assert.equal(again.attempt, 2);
    await again.extend(5_000);
    await again.ack();
    const st = await q.stats();
    assert.equal(st.inFlight, 0);
    assert.equal(st.depth, 0);
    await w.close();
  });

  t("queues: a stale receipt after lease expiry fails with LeaseExpiredError; job.signal aborts", async (b) => {
    const q = b.queue<string>(uniq("lease"), { visibilityTimeoutMs: 300 });
    await q.enqueue("x");
    const w1 = q.work({ prefetch: 1 });
    const j1 = await nextJob(w1[Symbol.asyncIterator]());
    await waitUntil(() => j1.signal.aborted, "lease loss aborts job.signal", 10_000);
    await assert.rejects(j1.ack(), LeaseExpiredError);
    // w1 has room again and could receive the job itself; close it so w2 gets the redelivery.
    await w1.close();
    const w2 = q.work({ prefetch: 1 });
    const j2 = await nextJob(w2[Symbol.asyncIterator]());
    assert.equal(j2.id, j1.id);
    assert.ok(j2.attempt >= 2);
    await assert.rejects(j1.ack(), LeaseExpiredError);
    await j2.ack();
    await w2.close();
  });

  t("queues: dedupe window returns the original id; purge empties the queue", async (b) => {
    const q = b.queue<string>(uniq("dedupe"), { dedupeWindowMs: 60_000 });
    const a = await q.enqueue("a", { dedupeId: "d1" });
    const again = await q.enqueue("a", { dedupeId: "d1" });
    assert.equal(again.id, a.id);
    assert.equal(again.duplicate, true);
    await q.enqueue("b");
    assert.equal((await q.stats()).waiting, 2);
    assert.equal(await q.purge(), 2);
    assert.equal((await q.stats()).depth, 0);
  });

  t("queues: process() acks on return; PermanentError dead-letters with metadata", async (b) => {
    const name = uniq("proc");
    const q = b.queue<number>(name, { maxAttempts: 3 });
    await q.enqueueBatch([1, 2, 3, 4].map((n) => ({ data: n })));
    const ac = new AbortController();
    const done: number[] = [];
    await q.process(
      async (job) => {
        if (job.data === 3) throw new PermanentError("bad job");
        done.push(job.data);
        if (done.length === 3) ac.abort();
      },
      { concurrency: 2, signal: ac.signal },
    );
    assert.deepEqual(done.sort(), [1, 2, 4]);
    const dlq = b.queue<number>(`${name}.dlq`);
    await waitUntil(async () => (await dlq.stats()).waiting === 1, "job in the DLQ");
    const w = dlq.work();
    const dead = await nextJob(w[Symbol.asyncIterator]());
    assert.equal(dead.data, 3);
    assert.equal(dead.deadLetter?.sourceQueue, name);
    assert.equal(dead.deadLetter?.errorClass, "PermanentError");
    await dead.ack();
    await w.close();
  });

  // Shutdown semantics of process() (docs/queues.md, PROC-1), the same embedded and remote.
  t("queues: process() shutdown: running jobs' signals abort; a handler that returns acks, one that throws is released (not failed); unstarted jobs keep their attempts", async (b) => {
    const name = uniq("shutdown");
    // maxAttempts 1: a failure recorded for the interrupted job would dead-letter it.
    const q = b.queue<string>(name, { maxAttempts: 1, visibilityTimeoutMs: 60_000 });
    await q.enqueueBatch(["finishes", "interrupted", "unstarted"].map((data) => ({ data })));
    const ac = new AbortController();
    const reasons = new Map<string, unknown>();
    const order: string[] = [];
    let letFinish!: () => void;
    const finishGate = new Promise<void>((r) => (letFinish = r));
    const done = q.process(
      async (job) => {
        await new Promise<void>((r) => job.signal.addEventListener("abort", () => r(), { once: true }));
        reasons.set(job.data, job.signal.reason);
        if (job.data === "interrupted") {
          order.push("interrupted threw");
          throw new Error("interrupted by the shutdown");
        }
        await finishGate;
        order.push("finishes returned");
      },
      { concurrency: 2, signal: ac.signal },
    );
    void done.then(() => order.push("process resolved"));
    await waitUntil(async () => (await q.stats()).inFlight === 2, "two handlers running");
    ac.abort(new Error("shutting down"));
    await waitUntil(() => reasons.size === 2, "both signals aborted");
    for (const [data, reason] of reasons) assert.ok(reason instanceof AbortedError, `${data}: signal aborted with AbortedError`);
    letFinish();
    await done;
    assert.deepEqual(order, ["interrupted threw", "finishes returned", "process resolved"], "process() resolves after its handlers finished");
    const s = await q.stats();
    assert.equal(s.inFlight, 0, "nothing left leased");
    assert.equal(s.deadLettered, 0, "the interrupted job was not failed");
    assert.equal(s.completed, 1, "the handler that returned was acked");
    assert.equal(s.depth, 2);
    const w = q.work({ prefetch: 2 });
    const it = w[Symbol.asyncIterator]();
    const attempts = new Map<string, number>();
    for (let i = 0; i < 2; i++) {
      const j = await nextJob(it);
      attempts.set(j.data, j.attempt);
      await j.ack();
    }
    await w.close();
    assert.deepEqual(Object.fromEntries(attempts), { interrupted: 2, unstarted: 1 }, "released with its delivery counted; never delivered: first attempt");
  });
}
