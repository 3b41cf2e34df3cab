// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, per-message commits (COMMIT-1): `msg.commit()` not awaited, as the
 * README's loop does; commits across a rebalance; the `maxPendingCommits` option. Registered by
 * `defineConformanceSuite` (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { NotAssignedError, ValidationError } from "../errors.js";
import type { Broker, Message } from "../types.js";
import { take, uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function commitTests(t: DefineTest): void {
  t("msg.commit() not awaited: every promise resolves once durable, none rejects unhandled; closing writes what is pending", unawaitedCommits);
  t("commits not awaited across a rebalance: the next owner never starts past the last commit + 1 nor before the last durable one", commitsAcrossRebalance);
  t("maxPendingCommits is validated", maxPendingValidated);
}

/** Collects unhandled rejections while `fn` runs (there must be none). */
async function noUnhandled(fn: () => Promise<void>): Promise<void> {
  const seen: unknown[] = [];
  const on = (e: unknown): void => void seen.push(e);
  process.on("unhandledRejection", on);
  try {
    await fn();
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off("unhandledRejection", on);
  }
  assert.deepEqual(seen, [], "no unhandled rejection");
}

async function unawaitedCommits(b: Broker): Promise<void> {
  const name = uniq("commits");
  const group = uniq("g");
  await b.createTopic(name, { partitions: 3 });
  await b.publishBatch(name, Array.from({ length: 3000 }, (_, i) => ({ value: i, key: `k${i % 30}` })));
  await noUnhandled(async () => {
    const sub = b.subscribe<number>(name, { group, start: "earliest" });
    const promises: Promise<void>[] = [];
    const last = new Map<number, number>();
    let n = 0;
    for await (const m of sub) {
      promises.push(m.commit()); // not awaited here
      last.set(m.partition, m.offset);
      if (++n === 2000) break; // leaving the loop closes the subscription
    }
    await Promise.all(promises); // all resolved: each was covered by a durable write
    const lag = await b.groupLag(group, name);
    for (const p of lag.partitions) assert.equal(p.committedOffset, last.has(p.partition) ? last.get(p.partition)! + 1 : null, `partition ${p.partition}`);
    assert.equal(lag.totalRecords, 1000);
  });
}

async function commitsAcrossRebalance(b: Broker): Promise<void> {
  const name = uniq("commits-rb");
  const group = uniq("g");
  await b.createTopic(name, { partitions: 2 });
  await b.publishBatch(name, Array.from({ length: 400 }, (_, i) => ({ value: i, key: `k${i % 8}` })));
  await noUnhandled(async () => {
    const a = b.subscribe<number>(name, { group, start: "earliest" });
    const got = await take(a, 150);
    const durable = new Map<number, number>(); // partition -> highest offset whose commit resolved
    const marked = new Map<number, number>();
    const results: Promise<unknown>[] = [];
    for (const m of got) {
      marked.set(m.partition, Math.max(marked.get(m.partition) ?? -1, m.offset));
      results.push(
        m.commit().then(
          () => durable.set(m.partition, Math.max(durable.get(m.partition) ?? -1, m.offset)),
          (e: unknown) => assert.ok(e instanceof NotAssignedError, `a refused commit is NotAssignedError, got ${String(e)}`),
        ),
      );
    }
    const bsub = b.subscribe<number>(name, { group, start: "earliest" });
    const first = new Map<number, number>();
    const consumed = (async () => {
      for await (const m of bsub) if (!first.has(m.partition)) first.set(m.partition, m.offset);
    })();
    // The second member gets one of the partitions, with records left in it.
    await waitUntil(() => first.size > 0, "the second member receives a message", 15_000);
    await Promise.all(results);
    for (const [p, o] of first) {
      if (!marked.has(p)) continue;
      assert.ok(o <= marked.get(p)! + 1, `partition ${p}: the next owner starts at ${o}, past the last commit ${marked.get(p)} + 1`);
      if (durable.has(p)) assert.ok(o >= durable.get(p)! + 1, `partition ${p}: the next owner starts at ${o}, before the durable commit ${durable.get(p)}`);
    }
    await Promise.all([a.close(), bsub.close()]);
    await consumed;
  });
}

async function maxPendingValidated(b: Broker): Promise<void> {
  const name = uniq("commits-opt");
  await b.createTopic(name);
  for (const bad of [0, -1, 1.5, 2_000_000]) {
    assert.throws(() => b.subscribe(name, { group: uniq("g"), maxPendingCommits: bad }), (e: unknown) => e instanceof ValidationError, `maxPendingCommits ${bad}`);
  }
  const ok = b.subscribe<Message>(name, { group: uniq("g"), maxPendingCommits: 1 });
  await ok.close();
}
