// SPDX-License-Identifier: Apache-2.0
/**
 * processOrdered (ORD-1): a property test with random keys, completion orders and failures.
 * Whatever the interleaving, a commit never passes an unfinished record, one key's records run
 * one at a time in offset order, and every record is handled; then the same against a real
 * embedded subscription.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { orderedProcessor, processOrdered } from "../src/contracts/ordered.js";
import { MissingPredecessorError, redriveTopic } from "../src/contracts/poison.js";
import { openBroker } from "../src/broker/broker.js";
import type { Message } from "../src/types.js";
import { prng, waitUntil } from "../src/testing/helpers.js";

const rng = prng;

interface World {
  msgs: Message<number>[];
  commits: { partition: number; offset: number; finished: Set<string> }[];
  finished: Set<string>;
}

function world(seed: number, partitions: number, perPartition: number, keys: number): World {
  const r = rng(seed);
  const ac = new AbortController();
  const w: World = { msgs: [], commits: [], finished: new Set() };
  const next = new Array(partitions).fill(0);
  for (let i = 0; i < partitions * perPartition; i++) {
    const partition = Math.floor(r() * partitions);
    // Offsets with gaps (as after compaction): the prefix is by delivery order, not arithmetic.
    const offset = next[partition];
    next[partition] += 1 + (r() < 0.1 ? 3 : 0);
    const key = r() < 0.05 ? null : Buffer.from(`k${Math.floor(r() * keys)}`);
    const m: Message<number> = {
      topic: "t",
      partition,
      offset,
      timestamp: 0,
      key,
      value: i,
      headers: {},
      signal: ac.signal,
      replay: false,
      commit: async () => void w.commits.push({ partition, offset, finished: new Set(w.finished) }),
    };
    w.msgs.push(m);
  }
  return w;
}

async function* source<T>(msgs: Message<T>[]): AsyncGenerator<Message<T>> {
  for (const m of msgs) {
    yield m;
    if (m.offset % 7 === 0) await new Promise((r) => setImmediate(r));
  }
}

const id = (m: Message<unknown>) => `${m.partition}:${m.offset}`;

test("property: commits cover only finished prefixes; per-key order; every record handled", async () => {
  const seeds = Number(process.env.SLUICE_ORDERED_SEEDS ?? 60);
  for (let seed = 1; seed <= seeds; seed++) {
    const r = rng(seed * 7919);
    const w = world(seed, 1 + (seed % 4), 60, 1 + (seed % 9));
    const running = new Set<string>();
    const lastStarted = new Map<string, number>();
    const attempts = new Map<string, number>();
    await processOrdered(
      source(w.msgs),
      async (m) => {
        const key = m.key === null ? `null:${id(m)}` : `${m.partition}/${Buffer.from(m.key).toString()}`;
        assert.ok(!running.has(key), `seed ${seed}: two records of key ${key} at once`);
        const prev = lastStarted.get(key);
        assert.ok(prev === undefined || prev <= m.offset, `seed ${seed}: key ${key} ran ${m.offset} after ${prev}`);
        lastStarted.set(key, m.offset);
        running.add(key);
        const n = (attempts.get(id(m)) ?? 0) + 1;
        attempts.set(id(m), n);
        try {
          // Random completion order: a random number of turns, sometimes a timer.
          const turns = Math.floor(r() * 5);
          for (let i = 0; i < turns; i++) await new Promise((res) => setImmediate(res));
          if (r() < 0.05) await new Promise((res) => setTimeout(res, 1));
          if (n < 3 && r() < 0.15) throw new Error(`transient failure of ${id(m)}`);
          w.finished.add(id(m));
        } finally {
          running.delete(key);
        }
      },
      { concurrency: 1 + (seed % 8), maxInFlight: 8 + (seed % 50), maxAttempts: 5, minDelayMs: 0, maxDelayMs: 2 },
    );
    for (const c of w.commits) {
      for (const m of w.msgs) {
        if (m.partition === c.partition && m.offset <= c.offset) assert.ok(c.finished.has(id(m)), `seed ${seed}: commit ${c.partition}@${c.offset} passed unfinished ${id(m)}`);
      }
    }
    assert.equal(w.finished.size, w.msgs.length, `seed ${seed}: every record handled`);
    const parts = new Set(w.msgs.map((m) => m.partition));
    for (const p of parts) {
      const last = Math.max(...w.msgs.filter((m) => m.partition === p).map((m) => m.offset));
      const committed = Math.max(...w.commits.filter((c) => c.partition === p).map((c) => c.offset));
      assert.equal(committed, last, `seed ${seed}: partition ${p} committed through its last record`);
    }
  }
});

test("a record that keeps failing stops processing; nothing is committed past it; other keys' earlier records are", async () => {
  const w = world(42, 1, 200, 10);
  const poison = w.msgs[50];
  await assert.rejects(
    processOrdered(
      source(w.msgs),
      async (m) => {
        if (m === poison) throw new Error("poison");
        await new Promise((res) => setImmediate(res));
        w.finished.add(id(m));
      },
      { concurrency: 8, maxInFlight: 64, maxAttempts: 3, minDelayMs: 0, maxDelayMs: 1 },
    ),
    /poison/,
  );
  const committed = Math.max(-1, ...w.commits.map((c) => c.offset));
  assert.ok(committed < poison.offset, `committed ${committed} must stay below the poison record ${poison.offset}`);
  assert.equal(committed, w.msgs[49].offset, "everything before the poison record is committed");
  // Bounded: the window stopped taking records once maxInFlight were behind the poison one.
  const taken = w.msgs.filter((m) => w.finished.has(id(m))).length;
  assert.ok(taken <= 50 + 64, `took ${taken} records while one was stuck (maxInFlight 64)`);
});

test("onExhausted 'skip' counts the record as finished (e.g. after a dead-letter publish)", async () => {
  const w = world(7, 2, 50, 5);
  const poison = w.msgs[10];
  const skipped: Message<number>[] = [];
  await processOrdered(
    source(w.msgs),
    async (m) => {
      if (m === poison) throw new Error("poison");
      w.finished.add(id(m));
    },
    { maxAttempts: 2, minDelayMs: 0, maxDelayMs: 1, onExhausted: (_e, m) => (skipped.push(m), "skip") },
  );
  assert.deepEqual(skipped, [poison]);
  const last = w.msgs.filter((m) => m.partition === poison.partition).at(-1)!;
  assert.ok(w.commits.some((c) => c.partition === poison.partition && c.offset === last.offset), "the partition committed past the skipped record");
});

test("against an embedded subscription: 4 partitions, 40 keys, concurrency 16; the group's offsets end at the log end", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-ordered-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    await broker.createTopic("orders", { partitions: 4 });
    const n = 2000;
    await broker.publishBatch(
      "orders",
      Array.from({ length: n }, (_, i) => ({ key: `order-${i % 40}`, value: { order: i % 40, seq: Math.floor(i / 40) } })),
    );
    const seen = new Map<number, number>();
    let handled = 0;
    const ac = new AbortController();
    const sub = broker.subscribe<{ order: number; seq: number }>("orders", { group: "projector", start: "earliest", signal: ac.signal });
    const done = processOrdered(
      sub,
      async (m) => {
        const prev = seen.get(m.value.order) ?? -1;
        assert.equal(m.value.seq, prev + 1, `order ${m.value.order} in sequence`);
        seen.set(m.value.order, m.value.seq);
        if (m.value.seq % 3 === 0) await new Promise((r) => setImmediate(r));
        handled++;
      },
      { concurrency: 16, signal: ac.signal },
    );
    await waitUntil(async () => {
      const lag = await broker.groupLag("projector", "orders");
      return handled === n && lag.totalRecords === 0;
    }, "every record handled and committed", 30_000);
    ac.abort();
    await done;
    await sub.close();
  } finally {
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("poison policy: permanent failures go to the dead-letter topic (redacted, with why); defects and missing predecessors hold only their key until resumed or skipped; redrive with its loop guard", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-poison-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    await broker.createTopic("orders", { partitions: 1 });
    await broker.createTopic("orders.dlq", { partitions: 1 });
    const value = (i: number, kind: string) => ({ key: `k${i % 4}`, value: { i, kind }, headers: { authorization: "Bearer secret", "x-trace": `t${i}` } });
    await broker.publishBatch("orders", Array.from({ length: 40 }, (_, i) => value(i, i === 5 ? "bad-json" : i === 10 ? "flaky" : i === 15 ? "orphan" : "ok")));
    let flakyFixed = false;
    const handled: number[] = [];
    const ac = new AbortController();
    const sub = broker.subscribe<{ i: number; kind: string }>("orders", { group: "projector", start: "earliest", signal: ac.signal });
    const proc = orderedProcessor(
      sub,
      async (m) => {
        if (m.value.kind === "bad-json") throw new SyntaxError("Unexpected token in JSON");
        if (m.value.kind === "flaky" && !flakyFixed) throw new Error("connection reset by the projection database");
        if (m.value.kind === "orphan") throw new MissingPredecessorError("customer not created yet");
        handled.push(m.value.i);
      },
      { concurrency: 4, maxAttempts: 3, minDelayMs: 0, maxDelayMs: 2, signal: ac.signal, poison: { deadLetter: { broker, topic: "orders.dlq", codeVersion: "v1.2.3" } } },
    );
    await waitUntil(() => proc.paused().length === 2, "two keys held");
    const held = proc.paused().sort((a, b) => a.offset - b.offset);
    assert.deepEqual(held.map((h) => [h.key, h.offset, h.reason]), [["k2", 10, "defect"], ["k3", 15, "missing-predecessor"]]);
    // Keys k0 and k1 went on past the dead-lettered record 5 (key k1); k2 and k3 stop at their held record.
    await waitUntil(() => handled.filter((i) => i % 4 < 2).length === 19, "other keys go on");
    assert.ok(!handled.some((i) => (i % 4 === 2 && i > 10) || (i % 4 === 3 && i > 15)), "a held key's later records wait");
    await waitUntil(async () => (await broker.groupLag("projector", "orders")).partitions[0].committedOffset === 10, "committed up to the held record 10");
    const dlq = await broker.fetch("orders.dlq", 0, 0);
    assert.equal((await broker.groupLag("projector", "orders")).partitions[0].committedOffset, 10, "and never past it");
    assert.equal(dlq.records.length, 1);
    const h = Object.fromEntries(Object.entries(dlq.records[0].headers).map(([k, v]) => [k, Buffer.from(v).toString()]));
    assert.equal(h["sluice-dlq-source-topic"], "orders");
    assert.equal(h["sluice-dlq-source-offset"], "5");
    assert.equal(h["sluice-dlq-error-class"], "SyntaxError");
    assert.equal(h["sluice-dlq-failure-class"], "permanent");
    assert.equal(h["sluice-dlq-code-version"], "v1.2.3");
    assert.equal(h.authorization, undefined, "secrets redacted");
    assert.equal(h["sluice-dlq-redacted"], "authorization");
    assert.equal(h["x-trace"], "t5");
    assert.deepEqual(dlq.records[0].value, { i: 5, kind: "bad-json" });
    flakyFixed = true;
    assert.equal(proc.resume("k2"), true);
    assert.equal(proc.skip("k3"), true);
    await waitUntil(async () => (await broker.groupLag("projector", "orders")).totalRecords === 0, "everything committed after resume and skip");
    assert.ok(handled.includes(10) && !handled.includes(15) && handled.includes(39));
    // Redrive: back to the source; it dead-letters again; after maxRedrives it is a repeat.
    for (let round = 1; round <= 3; round++) {
      const r = await redriveTopic(broker, "orders.dlq", { maxRedrives: 2 });
      if (round <= 2) assert.deepEqual(r, { redriven: 1, repeats: 0, filtered: 0 }, `round ${round}`);
      else assert.deepEqual(r, { redriven: 0, repeats: 1, filtered: 0 }, "the loop guard stops a record that keeps failing");
      if (round <= 2) await waitUntil(async () => (await broker.describeTopic("orders.dlq")).partitions[0].highWatermark === round + 1, "dead-lettered again");
    }
    const last = await broker.fetch("orders.dlq", 0, 2);
    assert.equal(Buffer.from(last.records[0].headers["sluice-redrive-count"]).toString(), "2");
    ac.abort();
    await proc.done;
    await sub.close();
  } finally {
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
