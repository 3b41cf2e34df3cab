// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, flows of work queues (`queue.enqueueFlow`): a parent runs only
 * after all its children (FLOW-2), with their results; stored whole or not at all (FLOW-1);
 * the child-failure policies; across a restart where the target can restart. Registered by
 * `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { ValidationError } from "../errors.js";
import type { ChildOutcome, FlowJob, Job, Queue } from "../queues/types.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueFlowTests(t: DefineTest): void {
  t("queue flows: a parent waits for its children (waiting-children), then runs once with their results", parentAfterChildren);
  t("queue flows: three levels: every parent runs after all its children; results flow up", threeLevels);
  t("queue flows: a dead-lettered child fails its parent (and its parent's parent) by default", childFailureFails);
  t("queue flows: onChildFailure continue: the parent runs and sees the failure; a removed child counts as finished", childFailureContinues);
  t("queue flows: waiting parents and children's results survive a restart", flowRestart);
  t("queue flows: malformed flows are refused whole, nothing stored", flowValidation);
}

async function parentAfterChildren(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("flow"));
  const ids = await q.enqueueFlow({ data: "parent", children: [{ data: "a" }, { data: "b" }, { data: "c" }] });
  assert.equal(ids.children.length, 3);
  const parent = await q.getJob(ids.id);
  assert.equal(parent?.state, "waiting-children");
  assert.deepEqual(Object.keys(parent?.children ?? {}).sort(), ids.children.map((c) => c.id).sort());
  assert.ok(Object.values(parent?.children ?? {}).every((c) => c.state === "pending"));
  assert.equal((await q.getJob(ids.children[0].id))?.parentId, ids.id);
  assert.equal((await q.stats()).waitingChildren, 1);

  const w = q.work({ prefetch: 10 });
  const it = w[Symbol.asyncIterator]();
  try {
    // Only the children are deliverable; acking them one by one keeps the parent waiting.
    const kids: Job<string>[] = [];
    for (let i = 0; i < 3; i++) kids.push(await nextJob(it));
    assert.deepEqual(kids.map((k) => k.data).sort(), ["a", "b", "c"]);
    await kids[0].ack({ n: 1 });
    await kids[1].ack("two");
    assert.equal((await q.getJob(ids.id))?.state, "waiting-children");
    assert.deepEqual((await q.getJob(ids.id))?.children?.[kids[0].id], { state: "completed", result: { n: 1 } });
    await kids[2].ack();
    const p = await nextJob(it);
    assert.equal(p.data, "parent");
    const results = await p.childResults();
    assert.deepEqual(results[kids[0].id], { state: "completed", result: { n: 1 } });
    assert.deepEqual(results[kids[1].id], { state: "completed", result: "two" });
    assert.deepEqual(results[kids[2].id], { state: "completed" });
    await p.ack();
    assert.equal((await q.stats()).depth, 0);
    assert.deepEqual(await kids[0].childResults(), {}, "a job without children");
  } finally {
    await w.close();
  }
}

/** A flow of `fan`^depth leaves; every node's data names its level. */
function tree(depth: number, fan: number, label = "n"): FlowJob {
  return depth === 0 ? { data: { label, level: 0 } } : { data: { label, level: depth }, children: Array.from({ length: fan }, (_, k) => tree(depth - 1, fan, `${label}.${k}`)) };
}

async function threeLevels(b: Broker): Promise<void> {
  const q = b.queue<{ label: string; level: number }>(uniq("flow3"));
  const ids = await q.enqueueFlow(tree(2, 3));
  const total = 1 + 3 + 9;
  const done = new Map<string, number>(); // label -> sum of leaves below it
  const ac = new AbortController();
  const run = q.process(
    async (job) => {
      const kids = Object.values(await job.childResults());
      if (job.data.level > 0) {
        assert.equal(kids.length, 3, `${job.data.label} sees its 3 children`);
        for (const k of kids) assert.equal(k.state, "completed", `${job.data.label}: every child finished before it runs`);
      }
      const sum = job.data.level === 0 ? 1 : kids.reduce((s, k) => s + (k.result as number), 0);
      assert.ok(!done.has(job.data.label), `${job.data.label} runs once`);
      done.set(job.data.label, sum);
      return sum;
    },
    { concurrency: 4, signal: ac.signal },
  );
  await waitUntil(() => done.size === total, "every job of the flow ran", 15_000);
  ac.abort();
  await run;
  assert.equal(done.get("n"), 9, "the root saw the sum of its 9 leaves");
  assert.equal((await q.stats()).depth, 0);
  assert.equal(ids.children[2].children.length, 3);
}

/** A worker that acks every job but the ones `fail` names (dead-lettered at once). */
async function runUntil(q: Queue<string>, fail: Set<string>, until: () => Promise<boolean>): Promise<string[]> {
  const ran: string[] = [];
  const ac = new AbortController();
  const run = q.process(
    async (job) => {
      ran.push(job.data);
      if (fail.has(job.data)) return job.nack({ requeue: false, error: new Error(`${job.data} broke`) });
      return job.data.toUpperCase();
    },
    { concurrency: 2, signal: ac.signal },
  );
  await waitUntil(until, "the flow settled");
  ac.abort();
  await run;
  return ran;
}

async function childFailureFails(b: Broker): Promise<void> {
  const name = uniq("flow-fail");
  const q = b.queue<string>(name, { deadLetter: `${name}.dlq` });
  const ids = await q.enqueueFlow({ data: "root", children: [{ data: "mid", children: [{ data: "bad" }, { data: "good" }] }, { data: "other" }] });
  const dlq = b.queue<string>(`${name}.dlq`);
  const ran = await runUntil(q, new Set(["bad"]), async () => (await q.stats()).depth === 0);
  assert.ok(!ran.includes("mid") && !ran.includes("root"), `failed parents never run (ran ${ran.join(",")})`);
  const page = await dlq.browse({ limit: 10 });
  const dead = new Map(page.jobs.map((j) => [j.data, j.deadLetter]));
  assert.deepEqual([...dead.keys()].sort(), ["bad", "mid", "root"]);
  assert.equal(dead.get("mid")?.errorClass, "ChildFailedError");
  assert.match(dead.get("mid")?.error ?? "", /bad broke/);
  assert.match(dead.get("root")?.error ?? "", new RegExp(`child ${ids.children[0].id} failed`));
}

async function childFailureContinues(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("flow-cont"), { deadLetter: null });
  const ids = await q.enqueueFlow({ data: "root", onChildFailure: "continue", children: [{ data: "bad" }, { data: "ok" }, { data: "gone", delayMs: 60_000 }] });
  assert.equal(await q.remove(ids.children[2].id), true, "a waiting child can be removed");
  let seen: Record<string, ChildOutcome> = {};
  const ac = new AbortController();
  const ran: string[] = [];
  const run = q.process(
    async (job) => {
      ran.push(job.data);
      if (job.data === "bad") return job.nack({ requeue: false, error: new Error("bad broke") });
      if (job.data === "root") seen = await job.childResults();
      return job.data;
    },
    { signal: ac.signal },
  );
  await waitUntil(() => ran.includes("root"), "the parent ran");
  ac.abort();
  await run;
  assert.deepEqual(seen[ids.children[0].id], { state: "failed", error: "bad broke" });
  assert.deepEqual(seen[ids.children[1].id], { state: "completed", result: "ok" });
  assert.deepEqual(seen[ids.children[2].id], { state: "removed" });
}

async function flowRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("flow-restart");
  const q = b.queue<string>(name);
  const ids = await q.enqueueFlow({ data: "parent", children: [{ data: "a" }, { data: "b" }] });
  const w = q.work({ prefetch: 1 });
  const first = await nextJob(w[Symbol.asyncIterator]());
  await first.ack({ from: first.data });
  await w.close();
  if (kit.reopen === undefined) return;
  const b2 = await kit.reopen();
  const q2 = b2.queue<string>(name);
  const p = await q2.getJob(ids.id);
  assert.equal(p?.state, "waiting-children", "still waiting after the restart");
  assert.deepEqual(p?.children?.[first.id], { state: "completed", result: { from: first.data } });
  const w2 = q2.work({ prefetch: 1 });
  const it = w2[Symbol.asyncIterator]();
  try {
    const second = await nextJob(it);
    assert.notEqual(second.data, "parent");
    await second.ack(second.data);
    const parent = await nextJob(it);
    assert.equal(parent.data, "parent");
    const r = await parent.childResults();
    assert.deepEqual(r[first.id], { state: "completed", result: { from: first.data } });
    assert.deepEqual(r[second.id], { state: "completed", result: second.data });
    await parent.ack();
  } finally {
    await w2.close();
  }
}

async function flowValidation(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("flow-bad"));
  const bad: unknown[] = [
    { data: "p", children: "nope" },
    { data: "p", onChildFailure: "explode", children: [{ data: "c" }] },
    { data: "p", children: [{ data: "c", dedupeId: "d" }] },
    { data: "p", children: [{ data: "c", singletonKey: "s" }] },
    { data: "p", children: [null] },
    { data: "p", children: Array.from({ length: 10_000 }, () => ({ data: "c" })) },
  ];
  for (const f of bad) await assert.rejects(q.enqueueFlow(f as FlowJob), ValidationError, JSON.stringify(f).slice(0, 80));
  // Links that do not form whole trees are refused, however they arrive.
  const forged = [
    { data: "child", flow: { parentDelta: 1, children: 0, onChildFailure: "fail" } },
    { data: "p", flow: { parentDelta: 0, children: 2, onChildFailure: "fail" } },
    { data: "c", flow: { parentDelta: 1, children: 0, onChildFailure: "fail" } },
  ];
  await assert.rejects(q.enqueueBatch(forged.slice(0, 1) as never), ValidationError, "a child without a parent");
  await assert.rejects(q.enqueueBatch(forged.slice(1) as never), ValidationError, "a parent declaring more children than it has");
  assert.equal((await q.stats()).depth, 0, "nothing stored");
}
