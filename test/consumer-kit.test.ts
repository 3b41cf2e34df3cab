// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer test kit finds planted defects: a handler that commits before its write is
 * durable loses work; one whose external effect is not idempotent repeats it. The fixed
 * handler (inbox-style dedupe in the same transaction, an idempotency key on the effect,
 * commit after) passes, including a replay from the start.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { verifyConsumer, type KitHandler } from "../src/testing/consumer-kit.js";
import type { PublishRecord } from "../src/types.js";

const records: PublishRecord[] = [];
for (let i = 0; i < 60; i++) records.push({ key: `order-${i % 7}`, value: { id: `m-${i}`, order: `order-${i % 7}`, amount: i } });
// Duplicates, as a producer retry publishes them.
for (let i = 0; i < 60; i += 9) records.push(records[i]);

type V = { id: string; order: string; amount: number };

const commitsFirst: KitHandler = async (msg, w) => {
  const v = msg.value as V;
  await msg.commit(); // DEFECT: acknowledged before the write below is durable
  await w.store.transaction((tx) => {
    if (tx.has(`seen:${v.id}`)) return;
    tx.set(`seen:${v.id}`, true);
    tx.set(v.order, ((tx.get(v.order) as number) ?? 0) + v.amount);
  });
  await w.effects.send(`receipt:${v.id}`, { idempotencyKey: v.id });
};

const nonIdempotentEffect: KitHandler = async (msg, w) => {
  const v = msg.value as V;
  await w.store.transaction((tx) => {
    if (tx.has(`seen:${v.id}`)) return;
    tx.set(`seen:${v.id}`, true);
    tx.set(v.order, ((tx.get(v.order) as number) ?? 0) + v.amount);
  });
  await w.effects.send(`receipt:${v.id}`); // DEFECT: no idempotency key: a redelivery sends it again
  await msg.commit();
};

const fixed: KitHandler = async (msg, w) => {
  const v = msg.value as V;
  await w.store.transaction((tx) => {
    if (tx.has(`seen:${v.id}`)) return;
    tx.set(`seen:${v.id}`, true);
    tx.set(v.order, ((tx.get(v.order) as number) ?? 0) + v.amount);
  });
  await w.effects.send(`receipt:${v.id}`, { idempotencyKey: v.id });
  await msg.commit();
};

test("the kit finds lost work in a handler that commits before its write", async () => {
  const r = await verifyConsumer({ handler: commitsFirst, records, crashesPerPoint: 2 });
  assert.equal(r.ok, false);
  assert.ok(r.lostWork.some((n) => n.startsWith("crash at after-commit")), `lost work found: ${JSON.stringify(r.lostWork)}`);
});

test("the kit finds a repeated non-idempotent effect", async () => {
  const r = await verifyConsumer({ handler: nonIdempotentEffect, records, crashesPerPoint: 2 });
  assert.equal(r.ok, false);
  assert.ok(r.repeatedEffects.length > 0, "a repeated effect found");
  assert.ok(r.repeatedEffects.includes("replay from the start"), "the replay repeats every effect");
});

test("the fixed handler passes every crash point and the replay", async () => {
  const r = await verifyConsumer({ handler: fixed, records, crashesPerPoint: 2 });
  assert.deepEqual({ lostWork: r.lostWork, repeatedEffects: r.repeatedEffects }, { lostWork: [], repeatedEffects: [] });
  assert.ok(r.runs.length >= 7, `${r.runs.length} runs`);
});
