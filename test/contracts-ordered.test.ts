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
import { processOrdered } from "../src/contracts/ordered.js";
import { openBroker } from "../src/broker/broker.js";
import type { Message } from "../src/types.js";
import { waitUntil } from "../src/testing/helpers.js";

/** A small deterministic PRNG (mulberry32), so a failing seed can be replayed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

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
