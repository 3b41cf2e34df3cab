// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, job groups of work queues (`EnqueueOptions.group`): the per-group
 * lease cap (`groupConcurrency`, GRP-Q1, restored leases included), round-robin across groups
 * with priority within a group and a key's order first (GRP-Q2), the per-group rate limit
 * (`groupRateLimit`), restarts and validation. Registered by `defineConformanceSuite`
 * (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { ValidationError } from "../errors.js";
import type { Queue } from "../queues/types.js";
import type { Broker } from "../types.js";
import { drain, nextJob, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueGroupTests(t: DefineTest): void {
  t("queue groups: groupConcurrency caps a group's jobs in flight across workers; other groups and ungrouped jobs proceed; lifting it releases waiting workers", groupCap);
  t("queue groups: waiting jobs are served round-robin across groups; priority orders a group's jobs; a key's order wins", groupRoundRobin);
  t("queue groups: groups, their caps and their turns survive a restart", groupRestart);
  t("queue groups: groupRateLimit: at most max starts per group in any window, each group its own window", groupRate);
  t("queue groups: an invalid group or group config is refused with ValidationError; getJob and browse show the group", groupValidation);
}

async function groupCap(b: Broker): Promise<void> {
  const name = uniq("grp-cap");
  const q = b.queue<{ g: string | null; i: number }>(name, { groupConcurrency: 2 });
  const per = 10;
  const items = [];
  for (let i = 0; i < per; i++) for (const g of ["A", "B"]) items.push({ data: { g, i }, group: g });
  for (let i = 0; i < 4; i++) items.push({ data: { g: null, i } });
  await q.enqueueBatch(items);
  const running = new Map<string, number>();
  const most = new Map<string, number>();
  let overlap = 0; // most jobs running at once, all groups together
  let done = 0;
  const ac = new AbortController();
  const handler = async (job: { data: { g: string | null } }): Promise<void> => {
    const g = job.data.g ?? "(none)";
    const n = (running.get(g) ?? 0) + 1;
    running.set(g, n);
    most.set(g, Math.max(most.get(g) ?? 0, n));
    let total = 0;
    for (const v of running.values()) total += v;
    overlap = Math.max(overlap, total);
    await new Promise((r) => setTimeout(r, 15));
    running.set(g, running.get(g)! - 1);
    if (++done === items.length) ac.abort();
  };
  // Two workers with 6 slots each: far more than a group may hold.
  const runs = [q.process(handler, { concurrency: 6, signal: ac.signal }), q.process(handler, { concurrency: 6, signal: ac.signal })];
  await waitUntil(() => done === items.length, "every job ran", 20_000);
  await Promise.all(runs);
  assert.ok((most.get("A") ?? 0) <= 2 && (most.get("B") ?? 0) <= 2, `at most 2 of a group at once: A ${most.get("A")}, B ${most.get("B")}`);
  assert.equal(most.get("A"), 2, "a group uses its whole cap");
  assert.ok(overlap >= 4, `groups run side by side (${overlap} at once)`);
  assert.ok((most.get("(none)") ?? 0) >= 1);
  // A cap lifted on an open queue releases the jobs waiting for it.
  const name2 = uniq("grp-lift");
  const q2 = b.queue<number>(name2, { groupConcurrency: 1, visibilityTimeoutMs: 30_000 });
  await q2.enqueueBatch([0, 1, 2].map((i) => ({ data: i, group: "A" })));
  const w = q2.work({ prefetch: 4 });
  const it = w[Symbol.asyncIterator]();
  const first = await nextJob(it);
  assert.equal(first.data, 0);
  await waitUntil(async () => (await q2.stats()).inFlight === 1, "one leased");
  assert.equal((await q2.stats()).waiting, 2, "the rest of the group waits for the cap");
  await b.queue<number>(name2, { visibilityTimeoutMs: 30_000 }).enqueue(3);
  const got = [(await nextJob(it)).data, (await nextJob(it)).data, (await nextJob(it)).data].sort();
  assert.deepEqual(got, [1, 2, 3], "lifting the cap released the waiting worker");
  await w.close();
}

async function groupRoundRobin(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("grp-rr"));
  await q.enqueue("a1", { group: "A" });
  await q.enqueue("a2-high", { group: "A", priority: 5 });
  await q.enqueue("a3", { group: "A" });
  await q.enqueue("b1", { group: "B" });
  await q.enqueue("u1");
  await q.enqueue("b2", { group: "B" });
  await q.enqueue("c1", { group: "C" });
  // Groups take turns in the order they first had waiting jobs; ungrouped jobs are one more turn.
  assert.deepEqual(await drain(q, 7), ["a2-high", "b1", "u1", "c1", "a1", "b2", "a3"]);
  // Within a group only a key's first job competes (KEY-1 wins over priority).
  const k = b.queue<string>(uniq("grp-key"));
  await k.enqueue("k-first-low", { group: "K", key: "k" });
  await k.enqueue("k-second-high", { group: "K", key: "k", priority: 9 });
  await k.enqueue("free-mid", { group: "K", priority: 5 });
  await k.enqueue("other", { group: "L" });
  assert.deepEqual(await drain(k, 4), ["free-mid", "other", "k-first-low", "k-second-high"]);
  // Flow jobs carry groups too: the children take turns; the parent joins its group once they finished.
  const f = b.queue<string>(uniq("grp-flow"));
  const ids = await f.enqueueFlow({ data: "parent", group: "P", children: [{ data: "x1", group: "X" }, { data: "x2", group: "X" }, { data: "y1", group: "Y" }] });
  assert.equal((await f.getJob(ids.id))?.group, "P");
  assert.deepEqual(await drain(f, 4), ["x1", "y1", "x2", "parent"]);
}

async function groupRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  if (kit.reopen === undefined) return;
  const name = uniq("grp-restart");
  const config = { groupConcurrency: 1 };
  await b.queue<string>(name, config).enqueueBatch([
    { data: "a1", group: "A" },
    { data: "a2", group: "A" },
    { data: "b1", group: "B" },
    { data: "a3", group: "A" },
  ]);
  b = await kit.reopen();
  const q = b.queue<string>(name, config);
  assert.equal((await q.getJob((await q.browse()).jobs[0].id))?.group, "A");
  // The cap holds after the restart: a worker with room for 3 gets one job of each group.
  const w = q.work({ prefetch: 3 });
  const it = w[Symbol.asyncIterator]();
  const got = [await nextJob(it), await nextJob(it)];
  assert.deepEqual(got.map((j) => j.data), ["a1", "b1"]);
  await waitUntil(async () => (await q.stats()).inFlight === 2, "two leased");
  assert.equal((await q.stats()).waiting, 2, "a2 and a3 wait for group A's one slot");
  await got[1].ack();
  await got[0].ack();
  assert.equal((await nextJob(it)).data, "a2", "served once a1 was acked");
  await w.close();
  // Round-robin order holds across a restart too.
  const name2 = uniq("grp-restart-rr");
  const q2 = b.queue<string>(name2);
  for (const [data, group] of [["x1", "X"], ["x2", "X"], ["y1", "Y"], ["x3", "X"]]) await q2.enqueue(data, { group });
  const b3 = await kit.reopen();
  assert.deepEqual(await drain(b3.queue<string>(name2), 4), ["x1", "y1", "x2", "x3"]);
}

async function groupRate(b: Broker): Promise<void> {
  const max = 2;
  const durationMs = 400;
  const q = b.queue<string>(uniq("grp-rate"), { groupRateLimit: { max, durationMs } });
  const per = 6;
  const items = [];
  for (let i = 0; i < per; i++) for (const g of ["A", "B"]) items.push({ data: g, group: g });
  await q.enqueueBatch(items);
  const starts = new Map<string, number[]>([
    ["A", []],
    ["B", []],
  ]);
  let n = 0;
  const ac = new AbortController();
  const run = q.process(
    (job) => {
      starts.get(job.data)!.push(performance.now());
      if (++n === items.length) ac.abort();
    },
    { concurrency: 8, signal: ac.signal },
  );
  await waitUntil(() => n === items.length, "every job started (the group windows woke the worker)", 15_000);
  await run;
  const a = starts.get("A")!;
  const bs = starts.get("B")!;
  for (const s of [a, bs])
    for (let i = 0; i + max < s.length; i++)
      assert.ok(s[i + max] - s[i] >= durationMs * 0.75, `starts ${i} and ${i + max} of a group are ${Math.round(s[i + max] - s[i])} ms apart: more than ${max} in a ${durationMs} ms window`);
  // Each group has its own window: both groups' first starts share the first window.
  assert.ok(Math.max(a[max - 1], bs[max - 1]) - Math.min(a[0], bs[0]) < durationMs * 0.75, "the groups' windows are independent");
}

async function groupValidation(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("grp-bad"));
  for (const group of ["", 5, null, "x".repeat(1025)]) await assert.rejects(q.enqueue("x", { group: group as never }), ValidationError, `group ${JSON.stringify(group)}`);
  await assert.rejects(q.enqueueBatch([{ data: "ok", group: "g" }, { data: "bad", group: "" }]), ValidationError);
  const bad: object[] = [{ groupConcurrency: -1 }, { groupConcurrency: 1.5 }, { groupConcurrency: "2" }, { groupRateLimit: { max: 0, durationMs: 10 } }, { groupRateLimit: { max: 1 } }, { groupRateLimit: { max: 1, durationMs: 10, burst: 2 } }];
  for (const config of bad) await assert.rejects(async () => b.queue<string>(uniq("grp-bad-cfg"), config as never).enqueue("x"), ValidationError, JSON.stringify(config));
  assert.equal((await q.stats()).depth, 0, "nothing was stored");
  const { id } = await q.enqueue("ok", { group: "tenant-é" });
  const plain = await q.enqueue("plain");
  assert.equal((await q.getJob(id))?.group, "tenant-é");
  assert.equal((await q.getJob(plain.id))?.group, undefined);
  const page = await q.browse();
  assert.deepEqual(
    page.jobs.map((j) => [j.data, j.group]),
    [
      ["ok", "tenant-é"],
      ["plain", undefined],
    ],
  );
}
