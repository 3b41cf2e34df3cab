// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, consumer groups: subscriptions and commits, start positions,
 * batches, rebalancing between members, aborting, resets. Registered by
 * `defineConformanceSuite` (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { GroupActiveError, NotAssignedError, ValidationError } from "../errors.js";
import { replay } from "../contracts/replay.js";
import type { Broker, Message, SubscriptionStatus } from "../types.js";
import { take, uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function groupTests(t: DefineTest): void {
  t("subscribe from earliest delivers every record in per-partition order; commit() resumes exactly there", subscribeAndCommit);
  t("start latest skips the backlog; groups are independent", startLatest);
  t("batches(): commit() stores the highest offset per partition", batchesCommit);
  t("two members split the partitions; a revoked partition aborts msg.signal and its commit fails; onRebalance reports each change", rebalance);
  t("members beyond the partition count stay idle", idleMembers);
  t("aborting the subscription signal ends the loop cleanly", abortSubscription);
  t("resetGroup: dry run reports without changing; a reset moves the group; active groups are refused", resetGroup);
  t("aborting the signal while a message is handled: no further message, its commit succeeds, then the member leaves (graceful drain)", drainOnAbort);
  t("graceful drain ends at drainTimeoutMs when the loop never comes back", drainTimeout);
  t("a member that left while its loop held a message does not join again when the loop comes back", noRejoinAfterLeave);
  t("listGroups: groups with commits or members, per topic, with lag; deleted topics' groups are gone", listGroupsTest);
  t("groupLag: retention headroom per partition, the generation, the members with their partitions, the recent resets", lagHeadroomAndMembers);
  t("a member joining while a reset runs starts from the reset's offsets, or the reset is refused (GRP-2)", resetRacesJoin);
  t("resetGroup per partition (exact offsets, others untouched, out of range refused); a bounded replay stops at its end offsets", resetPerPartitionAndReplay);
}

async function subscribeAndCommit(b: Broker): Promise<void> {
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
}

async function startLatest(b: Broker): Promise<void> {
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
}

async function batchesCommit(b: Broker): Promise<void> {
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
}

async function rebalance(b: Broker): Promise<void> {
  const name = uniq("rebalance");
  const group = uniq("g");
  await b.createTopic(name, { partitions: 4 });
  await b.publishBatch(name, Array.from({ length: 40 }, (_, i) => ({ value: i, partition: i % 4 })));
  const eventsA: SubscriptionStatus[] = [];
  const eventsB: SubscriptionStatus[] = [];
  const a = b.subscribe<number>(name, { group, start: "earliest", onRebalance: (e) => eventsA.push(e) });
  const first = await take(a, 40);
  await waitUntil(() => a.assignment().length === 4, "a owns all partitions");
  assert.deepEqual(eventsA.at(-1)?.assigned, [0, 1, 2, 3], "onRebalance: the whole assignment");
  const b2 = b.subscribe<number>(name, { group, start: "earliest", onRebalance: (e) => eventsB.push(e) });
  const pendingB = take(b2, 1);
  await waitUntil(() => a.assignment().length === 2 && b2.assignment().length === 2, "partitions split 2/2", 15_000);
  await pendingB;
  const union = [...a.assignment(), ...b2.assignment()].sort();
  assert.deepEqual(union, [0, 1, 2, 3], "disjoint and complete");
  await waitUntil(() => eventsB.some((e) => e.assigned.length === 2), "b told of its partitions");
  const revokedFromA = eventsA.flatMap((e) => e.revoked).sort();
  assert.deepEqual(revokedFromA, [...b2.assignment()].sort(), "a told which partitions it lost");
  assert.deepEqual(eventsA.at(-1)?.assigned, a.assignment().sort(), "a's last event: its assignment now");
  assert.ok(eventsA.every((e) => e.type === "group:rebalance" && Number.isSafeInteger(e.generation)));
  const moved = first.find((m) => !a.assignment().includes(m.partition))!;
  assert.ok(moved, "some partition moved");
  await waitUntil(() => moved.signal.aborted, "signal of a revoked partition aborts");
  await assert.rejects(moved.commit(), NotAssignedError);
  await b2.close();
  await waitUntil(() => a.assignment().length === 4, "the survivor gets everything back", 15_000);
  // The partition came back, but that message belongs to an earlier ownership period.
  await assert.rejects(moved.commit(), NotAssignedError);
  await a.close();
}

async function idleMembers(b: Broker): Promise<void> {
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
}

async function abortSubscription(b: Broker): Promise<void> {
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
}

async function resetGroup(b: Broker): Promise<void> {
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
}

async function resetPerPartitionAndReplay(b: Broker): Promise<void> {
  const name = uniq("reset-pp");
  const group = uniq("g");
  await b.createTopic(name, { partitions: 3 });
  await b.publishBatch(name, Array.from({ length: 30 }, (_, i) => ({ value: i, partition: i % 3 })));
  await b.resetGroup(group, name, "latest");
  const dry = await b.resetGroup(group, name, { partitions: { 0: 2, 2: 7 } }, { dryRun: true });
  assert.deepEqual(dry.partitions.map((p) => [p.partition, p.previous, p.next]), [
    [0, 10, 2],
    [2, 10, 7],
  ]);
  await b.resetGroup(group, name, { partitions: { 0: 2, 2: 7 } });
  const lag = await b.groupLag(group, name);
  assert.deepEqual(lag.partitions.map((p) => p.committedOffset), [2, 10, 7], "partition 1 keeps its position");
  await assert.rejects(b.resetGroup(group, name, { partitions: { 1: 11 } }), ValidationError, "beyond the end: refused");
  await assert.rejects(b.resetGroup(group, name, { partitions: { 5: 0 } }), ValidationError, "no such partition");
  await assert.rejects(b.resetGroup(group, name, { partitions: {} }), ValidationError);
  // A bounded replay from a snapshot's offsets to fixed end offsets, then it ends.
  const got: [number, number][] = [];
  for await (const r of replay<number>(b, name, { from: { 0: 2, 1: 0, 2: 7 }, to: { 0: 5, 1: 1, 2: 10 } })) got.push([r.partition, r.offset]);
  assert.deepEqual(got.sort((x, y) => x[0] - y[0] || x[1] - y[1]), [[0, 2], [0, 3], [0, 4], [1, 0], [2, 7], [2, 8], [2, 9]]);
  let all = 0;
  for await (const r of replay(b, name)) all += r.partition >= 0 ? 1 : 0;
  assert.equal(all, 30, "default: earliest to the high watermark at start");
}

async function drainOnAbort(b: Broker): Promise<void> {
  const name = uniq("drain");
  const group = uniq("g");
  await b.createTopic(name);
  await b.publishBatch(name, Array.from({ length: 5 }, (_, i) => ({ value: i })));
  const ac = new AbortController();
  const sub = b.subscribe<number>(name, { group, start: "earliest", signal: ac.signal });
  const seen: number[] = [];
  for await (const m of sub) {
    seen.push(m.offset);
    if (m.offset === 2) {
      ac.abort(); // e.g. SIGTERM while this message is being handled
      await new Promise((r) => setImmediate(r));
      assert.equal(m.signal.aborted, false, "the partition stays assigned while the handler finishes");
    }
    await m.commit(); // succeeds: the member has not left yet
  }
  assert.deepEqual(seen, [0, 1, 2], "nothing handed out after the abort");
  await waitUntil(async () => (await b.groupLag(group, name)).partitions[0].committedOffset === 3, "the drained message's commit is durable");
  // The member left: another one gets the partition and resumes after the committed message.
  const next = b.subscribe<number>(name, { group, start: "earliest" });
  const [m] = await take(next, 1);
  assert.equal(m.offset, 3);
  await next.close();
}

async function drainTimeout(b: Broker): Promise<void> {
  const name = uniq("drain-t");
  const group = uniq("g");
  await b.createTopic(name);
  await b.publishBatch(name, Array.from({ length: 3 }, (_, i) => ({ value: i })));
  const ac = new AbortController();
  const sub = b.subscribe<number>(name, { group, start: "earliest", signal: ac.signal, drainTimeoutMs: 200 });
  const [held] = await take(sub, 1); // held, never committed, the loop never comes back
  const t0 = Date.now();
  ac.abort();
  await waitUntil(() => held.signal.aborted, "the member left after the drain deadline", 10_000);
  assert.ok(Date.now() - t0 >= 150, `left after ${Date.now() - t0} ms, before the 200 ms deadline`);
  await assert.rejects(held.commit(), NotAssignedError);
  await sub.close();
}

async function noRejoinAfterLeave(b: Broker): Promise<void> {
  const name = uniq("left");
  const group = uniq("g");
  await b.createTopic(name);
  await b.publishBatch(name, Array.from({ length: 3 }, (_, i) => ({ value: i })));
  const ac = new AbortController();
  const sub = b.subscribe<number>(name, { group, start: "earliest", signal: ac.signal, drainTimeoutMs: 0 });
  const it = sub[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  const held = first.value as Message<number>;
  ac.abort(); // drainTimeoutMs 0: the member leaves while the handler still holds `held`
  await waitUntil(() => held.signal.aborted, "the member left");
  await assert.rejects(held.commit(), NotAssignedError);
  assert.equal((await it.next()).done, true, "the loop comes back and ends");
  // Nobody holds the partition now: a new member gets it and every record from the start.
  const next = b.subscribe<number>(name, { group, start: "earliest" });
  const got = await take(next, 3, 5_000);
  assert.deepEqual(got.map((m) => m.offset), [0, 1, 2]);
  await next.close();
}

async function listGroupsTest(b: Broker): Promise<void> {
  const name = uniq("list");
  const g1 = uniq("g");
  const g2 = uniq("g");
  await b.createTopic(name, { partitions: 2 });
  await b.publishBatch(name, Array.from({ length: 10 }, (_, i) => ({ value: i, partition: i % 2 })));
  await b.resetGroup(g1, name, { partitions: { 0: 3 } });
  const sub = b.subscribe(name, { group: g2, start: "earliest" });
  await take(sub, 1);
  await waitUntil(async () => (await b.listGroups({ topic: name })).some((l) => l.group === g2 && l.members === 1), "the active member is listed");
  const mine = (await b.listGroups({ topic: name })).filter((l) => l.topic === name);
  const one = mine.find((l) => l.group === g1)!;
  assert.deepEqual([one.members, one.committedPartitions, one.lagRecords], [0, 1, 7], "g1: partition 0 at 3 (2 left), partition 1 from the start (5)");
  assert.ok(mine.every((l) => l.topic === name));
  assert.ok((await b.listGroups()).some((l) => l.group === g1 && l.topic === name), "unfiltered too");
  await sub.close();
  await b.deleteTopic(name);
  assert.ok(!(await b.listGroups()).some((l) => l.topic === name), "a deleted topic's groups are not listed");
}

async function lagHeadroomAndMembers(b: Broker): Promise<void> {
  const name = uniq("headroom");
  const group = uniq("g");
  const retentionMs = 3_600_000;
  await b.createTopic(name, { partitions: 2, retentionMs });
  const t0 = Date.now() - 600_000; // records written "10 minutes ago": 50 minutes of headroom left
  await b.publishBatch(name, Array.from({ length: 6 }, (_, i) => ({ value: i, partition: i % 2, timestamp: t0 + i })));
  const idle = await b.groupLag(group, name);
  assert.equal(idle.generation, 0, "never had members");
  assert.deepEqual(idle.members, []);
  const p0 = idle.partitions[0];
  assert.ok(p0.headroomMs !== null && Math.abs(p0.headroomMs - (t0 + retentionMs - Date.now())) < 60_000, `headroom ~50 min, got ${p0.headroomMs}`);
  assert.equal(idle.minHeadroomMs, Math.min(...idle.partitions.map((p) => p.headroomMs!)));
  const sub = b.subscribe<number>(name, { group, start: "earliest" });
  const got = await take(sub, 6);
  for (const m of got) void m.commit();
  await waitUntil(async () => (await b.groupLag(group, name)).totalRecords === 0, "every commit is durable");
  const live = await b.groupLag(group, name);
  assert.ok(live.generation >= 1, "a member joined: generation moved");
  assert.equal(live.members.length, 1);
  assert.deepEqual(live.members[0].partitions, [0, 1], "the one member owns both partitions");
  for (const p of live.partitions) assert.equal(p.headroomMs, retentionMs, "caught up: the whole retention period");
  await sub.close();
  assert.deepEqual((await b.groupLag(group, name)).members, [], "the member left");
  assert.deepEqual((await b.groupLag(group, name)).recentResets, [], "no reset yet");
  await b.resetGroup(group, name, "earliest", { dryRun: true });
  assert.deepEqual((await b.groupLag(group, name)).recentResets, [], "a dry run is not a reset");
  await b.resetGroup(group, name, "earliest");
  const resets = (await b.groupLag(group, name)).recentResets;
  assert.equal(resets.length, 1);
  assert.deepEqual(resets[0].partitions, [{ partition: 0, from: 3, to: 0 }, { partition: 1, from: 3, to: 0 }], "each partition's offset before and after");
  const unlimited = uniq("headroom-inf");
  await b.createTopic(unlimited, { retentionMs: -1 });
  await b.publish(unlimited, 1);
  const inf = await b.groupLag(group, unlimited);
  assert.equal(inf.partitions[0].headroomMs, null, "no time retention: no headroom figure");
  assert.equal(inf.minHeadroomMs, null);
}

async function resetRacesJoin(b: Broker): Promise<void> {
  for (let round = 0; round < 5; round++) {
    const name = uniq("reset-race");
    const group = uniq("g");
    await b.createTopic(name, { partitions: 2 });
    await b.publishBatch(name, Array.from({ length: 10 }, (_, i) => ({ value: i, partition: i % 2 })));
    await b.resetGroup(group, name, "latest"); // everything consumed
    // The reset and the join race; whichever order they land in, no record may be skipped.
    const reset = b.resetGroup(group, name, "earliest").then(
      () => "applied",
      (e: unknown) => {
        if (e instanceof GroupActiveError) return "refused";
        throw e;
      },
    );
    const sub = b.subscribe<number>(name, { group, start: "earliest" });
    const outcome = await reset;
    if (outcome === "applied") {
      const got = await take(sub, 10);
      assert.deepEqual(got.map((m) => m.value).sort((x, y) => x - y), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], "the member starts from the reset's offsets");
    } else {
      await waitUntil(async () => (await b.groupLag(group, name)).members.length === 1, "the member that won holds the group");
      assert.equal((await b.groupLag(group, name)).partitions.reduce((s, p) => s + (p.committedOffset ?? 0), 0), 10, "refused: offsets unchanged");
    }
    await sub.close();
  }
}
