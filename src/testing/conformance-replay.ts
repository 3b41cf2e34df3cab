// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, replays after a reset (`msg.replay`, META-4): a reset that moves a
 * group back marks the records below its previous position as replays, for every member and
 * across a restart; commits and resets that reach the mark end it; a dry run marks nothing.
 * Registered by `defineConformanceSuite` (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import type { Broker, Message } from "../types.js";
import { take, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";

export function replayTests(t: DefineTest): void {
  t("a reset back marks the records below the previous position as replays (msg.replay), across a restart; new records are not", replayAfterReset);
  t("a commit or a reset that reaches the mark ends it; a reset forward below it keeps it; a dry run marks nothing", replayMarkEnds);
  t("a member that takes a partition over in a rebalance sees its replay mark", replayAcrossRebalance);
}

const values = (from: number, n: number): { value: number; partition: number }[] => Array.from({ length: n }, (_, i) => ({ value: from + i, partition: 0 }));

/** Reads `n` messages with a new member of `group`, commits the last one (awaited), leaves. */
async function consume(b: Broker, topic: string, group: string, n: number): Promise<Message<number>[]> {
  const sub = b.subscribe<number>(topic, { group, start: "earliest" });
  try {
    const got = await take(sub, n);
    if (got.length > 0) await got[got.length - 1].commit();
    return got;
  } finally {
    await sub.close();
  }
}

const summary = (msgs: Message<number>[]): [number, boolean][] => msgs.map((m) => [m.offset, m.replay]);
const expect = (from: number, to: number, replayBelow: number): [number, boolean][] => Array.from({ length: to - from }, (_, i) => [from + i, from + i < replayBelow]);

async function replayAfterReset(first: Broker, kit: ConformanceKit): Promise<void> {
  let b = first;
  const topic = uniq("replay");
  const group = uniq("g");
  await b.createTopic(topic);
  await b.publishBatch(topic, values(0, 10));
  assert.deepEqual(summary(await consume(b, topic, group, 10)), expect(0, 10, 0), "a first delivery is no replay");
  await b.resetGroup(group, topic, { partitions: { 0: 3 } });
  // The mark is stored with the group's offsets: it survives a restart.
  if (kit.reopen) b = await kit.reopen();
  await b.publishBatch(topic, values(10, 10));
  const got = await consume(b, topic, group, 17);
  assert.deepEqual(summary(got), expect(3, 20, 10), "3..9 are replays, the 10 published after the reset are not");
  assert.deepEqual(got.map((m) => m.value), Array.from({ length: 17 }, (_, i) => 3 + i));
}

async function replayMarkEnds(b: Broker): Promise<void> {
  const topic = uniq("replay-end");
  const group = uniq("g");
  await b.createTopic(topic);
  await b.publishBatch(topic, values(0, 10));
  await consume(b, topic, group, 10);
  // A dry run changes nothing: the group goes on at 10, nothing marked.
  const dry = await b.resetGroup(group, topic, { partitions: { 0: 3 } }, { dryRun: true });
  assert.deepEqual(dry.partitions, [{ partition: 0, previous: 10, next: 3 }]);
  await b.publishBatch(topic, values(10, 2));
  assert.deepEqual(summary(await consume(b, topic, group, 2)), expect(10, 12, 0), "a dry run marks nothing");
  // Back to 3 (mark 12), then forward to 6: still below the mark, which stays.
  await b.resetGroup(group, topic, { partitions: { 0: 3 } });
  await b.resetGroup(group, topic, { partitions: { 0: 6 } });
  assert.deepEqual(summary(await consume(b, topic, group, 2)), expect(6, 8, 12), "a reset forward below the mark keeps it");
  // A commit of 8 (below the mark) keeps it; back to 4: the mark is the higher of 8 and 12.
  await b.resetGroup(group, topic, { partitions: { 0: 4 } });
  await b.publishBatch(topic, values(12, 3));
  assert.deepEqual(summary(await consume(b, topic, group, 11)), expect(4, 15, 12), "the mark is the highest position reached");
  // Committed 15, past the mark: it is gone, and later deliveries are no replays.
  await b.publishBatch(topic, values(15, 2));
  assert.deepEqual(summary(await consume(b, topic, group, 2)), expect(15, 17, 0));
  // A reset back then forward to the mark ends it too.
  await b.resetGroup(group, topic, "earliest");
  await b.resetGroup(group, topic, "latest");
  await b.publishBatch(topic, values(17, 2));
  assert.deepEqual(summary(await consume(b, topic, group, 2)), expect(17, 19, 0), "a reset to the mark ends it");
}

async function replayAcrossRebalance(b: Broker): Promise<void> {
  const topic = uniq("replay-rb");
  const group = uniq("g");
  await b.createTopic(topic, { partitions: 2 });
  await b.publishBatch(topic, [...values(0, 10), ...values(10, 10).map((r) => ({ ...r, partition: 1 }))]);
  // Everything consumed and committed, then the group is moved back to the start.
  const sub0 = b.subscribe<number>(topic, { group, start: "earliest" });
  const all = await take(sub0, 20);
  await Promise.all(all.map((m) => m.commit()));
  await sub0.close();
  await b.resetGroup(group, topic, "earliest");
  // Member a reads and commits a few; member b joins, then a leaves: b owns both partitions.
  const a = b.subscribe<number>(topic, { group, start: "earliest" });
  const early = await take(a, 3);
  for (const m of early) assert.equal(m.replay, true, `offset ${m.partition}/${m.offset} is a replay`);
  await Promise.all(early.map((m) => m.commit()));
  const other = b.subscribe<number>(topic, { group, start: "earliest" });
  await a.close();
  await b.publishBatch(topic, [{ value: 100, partition: 0 }, { value: 101, partition: 1 }]);
  // b delivers what is left below the marks (replays), then the two new records (not): the
  // 22 records less the 3 a committed, each once (b keeps what it owns through the changes).
  const got = await take(other, 19);
  await other.close();
  for (const m of got) assert.equal(m.replay, m.offset < 10, `partition ${m.partition} offset ${m.offset}: replay iff below the mark 10`);
  assert.deepEqual(got.filter((m) => !m.replay).map((m) => m.value).sort((x, y) => x - y), [100, 101], "only the new records are no replays");
}
