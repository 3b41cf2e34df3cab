// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer test kit finds planted defects: a handler that commits before its write is
 * durable loses work; one whose external effect is not idempotent repeats it. The fixed
 * handler (payload validation, inbox-style dedupe and per-entity versions in the same
 * transaction, an idempotency key on the effect, commit after) passes every crash point, the
 * replays and a rebalance during in-flight work, on the kit's default record set (duplicates,
 * conflicting duplicates, a version gap, malformed payloads, several keys, a hot one).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { kitRecordSet, verifyConsumer, type KitEvent, type KitHandler } from "../src/testing/consumer-kit.js";
import type { Message } from "../src/types.js";

const records = kitRecordSet();

function parse(v: unknown): KitEvent | null {
  if (typeof v !== "object" || v === null || v instanceof Uint8Array) return null;
  const e = v as Partial<KitEvent>;
  if (typeof e.id !== "string" || typeof e.entity !== "string" || !Number.isInteger(e.version) || typeof e.amount !== "number") return null;
  return e as KitEvent;
}

/**
 * The projection: balance and version per entity, gaps and conflicts recorded, malformed records
 * parked by position. Returns the event when it was applied (now or on an earlier delivery).
 */
function apply(msg: Message, tx: Map<string, unknown>): KitEvent | null {
  const ev = parse(msg.value);
  if (ev === null) {
    tx.set(`malformed:${msg.partition}:${msg.offset}`, true);
    return null;
  }
  const seen = tx.get(`seen:${ev.id}`);
  if (seen !== undefined) return seen === "applied" ? ev : null;
  const last = (tx.get(`version:${ev.entity}`) as number | undefined) ?? 0;
  if (ev.version <= last) {
    if (tx.get(`amount:${ev.entity}:${ev.version}`) !== ev.amount) tx.set(`conflict:${ev.entity}:${ev.version}`, ev.id);
    tx.set(`seen:${ev.id}`, "conflict");
    return null;
  }
  if (ev.version > last + 1) tx.set(`gap:${ev.entity}:${last + 1}`, ev.version);
  tx.set(`version:${ev.entity}`, ev.version);
  tx.set(`amount:${ev.entity}:${ev.version}`, ev.amount);
  tx.set(`balance:${ev.entity}`, ((tx.get(`balance:${ev.entity}`) as number | undefined) ?? 0) + ev.amount);
  tx.set(`seen:${ev.id}`, "applied");
  return ev;
}

const commitsFirst: KitHandler = async (msg, w) => {
  await msg.commit(); // DEFECT: acknowledged before the write below is durable
  const ev = await w.store.transaction((tx) => apply(msg, tx));
  if (ev) await w.effects.send(`receipt:${ev.id}`, { idempotencyKey: ev.id });
};

const nonIdempotentEffect: KitHandler = async (msg, w) => {
  const ev = await w.store.transaction((tx) => apply(msg, tx));
  if (ev) await w.effects.send(`receipt:${ev.id}`); // DEFECT: no idempotency key: a redelivery sends it again
  await msg.commit();
};

const fixed: KitHandler = async (msg, w) => {
  const ev = await w.store.transaction((tx) => apply(msg, tx));
  if (ev) await w.effects.send(`receipt:${ev.id}`, { idempotencyKey: ev.id });
  await msg.commit();
};

test("the default record set holds duplicates, conflicts, a gap, malformed payloads and a hot key", () => {
  const values = records.map((r) => r.value);
  const events = values.map(parse).filter((e): e is KitEvent => e !== null);
  const ids = events.map((e) => e.id);
  assert.ok(ids.length > new Set(ids).size, "exact duplicates");
  const versions = events.map((e) => `${e.entity}:${e.version}`);
  assert.ok(versions.length - new Set(versions).size > ids.length - new Set(ids).size, "conflicting duplicates");
  assert.ok(values.length - events.length >= 3, "malformed payloads");
  const perKey = new Map<string, number[]>();
  for (const e of events) perKey.set(e.entity, [...(perKey.get(e.entity) ?? []), e.version]);
  assert.ok(perKey.size >= 5, "several keys");
  assert.ok([...perKey.values()].some((v) => v.some((x, i) => i > 0 && x > v[i - 1] + 1)), "a version gap");
  const hot = perKey.get("acct-hot")!.length;
  assert.ok(hot > (2 * events.length) / perKey.size, `a hot key (${hot} of ${events.length})`);
  assert.deepEqual(kitRecordSet(), records, "deterministic");
});

test("the kit finds lost work in a handler that commits before its write", async () => {
  const r = await verifyConsumer({ handler: commitsFirst, crashesPerPoint: 2 });
  assert.equal(r.ok, false);
  assert.ok(r.lostWork.some((n) => n.startsWith("crash at after-commit")), `lost work found: ${JSON.stringify(r.lostWork)}`);
});

test("the kit finds a repeated non-idempotent effect, after a crash, on replay and on a rebalance", async () => {
  const r = await verifyConsumer({ handler: nonIdempotentEffect, crashesPerPoint: 2 });
  assert.equal(r.ok, false);
  assert.ok(r.repeatedEffects.some((n) => n.startsWith("crash at")), `repeated: ${JSON.stringify(r.repeatedEffects)}`);
  assert.ok(r.repeatedEffects.includes("replay from the start"), "the replay repeats every effect");
  assert.ok(r.repeatedEffects.includes("replay from the middle"), "so does a replay from the middle");
  assert.ok(r.repeatedEffects.includes("rebalance during in-flight work"), "the new owner repeats the in-flight message's effect");
});

test("the fixed handler passes every crash point, the replays and the rebalance; partitions really moved", async () => {
  const r = await verifyConsumer({ handler: fixed, crashesPerPoint: 2 });
  assert.deepEqual({ lostWork: r.lostWork, repeatedEffects: r.repeatedEffects }, { lostWork: [], repeatedEffects: [] });
  assert.ok(r.runs.length >= 10, `${r.runs.length} runs`);
  const names = r.runs.map((x) => x.name);
  for (const n of ["replay from the start", "replay from the middle", "rebalance during in-flight work"]) assert.ok(names.includes(n), n);
  const rb = r.runs.find((x) => x.rebalance)!.rebalance!;
  assert.ok(rb.movedOnJoin.length > 0, `partitions moved when the second member joined: ${JSON.stringify(rb)}`);
  assert.equal(rb.inFlightOnJoin?.moved, true, "the in-flight message's partition moved on join");
  assert.ok(rb.movedOnAbort.length > 0, "partitions moved when the first member's subscription was aborted");
  assert.equal(rb.inFlightOnAbort?.moved, true, "the in-flight message's partition moved on abort");
  assert.ok(rb.refusedCommits >= 2, `the held handlers' commits were refused (${rb.refusedCommits})`);
});

test("a caller's own record set and the rebalance run can be turned off", async () => {
  const own = records.slice(0, 30);
  const r = await verifyConsumer({ handler: fixed, records: own, crashesPerPoint: 1, rebalance: false });
  assert.ok(r.ok, JSON.stringify(r));
  assert.ok(!r.runs.some((x) => x.rebalance), "no rebalance run");
});
