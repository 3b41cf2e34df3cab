// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, per-job enqueue options of work queues: priorities (JOB-1),
 * singleton / debounce / throttle keys (JOB-2), expiry (JOB-3) and `remove(id)` (JOB-4), each
 * also across a restart where the target can restart. Registered by `defineConformanceSuite`
 * (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { JobActiveError, ValidationError } from "../errors.js";
import type { Job, Queue, QueueEvent } from "../queues/types.js";
import type { Broker } from "../types.js";
import { drain, nextJob, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueOptionTests(t: DefineTest): void {
  t("queue options: priority: higher first, FIFO within a priority; a key's order wins over priority; out-of-range refused", priorityOrder);
  t("queue options: priority is strict: waiting higher-priority jobs hold a lower one back however long it waits", priorityStarvation);
  t("queue options: priority survives a restart", priorityRestart);
  t("queue options: singletonKey: one waiting-or-active job per key; duplicates return its id; free again once it completes", singletonMode);
  t("queue options: debounce replaces the waiting job (result names it), never an active one", debounceMode);
  t("queue options: throttle: one job per key per window, counted from the first", throttleMode);
  t("queue options: singleton keys survive a restart", singletonRestart);
  t("queue options: a job not started by its expiry is dead-lettered with JobExpiredError (default) or dropped (onExpire: drop)", expiry);
  t("queue options: a started job no longer expires; expiry is kept across a restart", expiryStartedAndRestart);
  t("queue options: remove(id) removes waiting and delayed jobs durably; an active job gives JobActiveError; unknown ids false", removeJobs);
  t("queue options: removals, debounce replacements and dropped expired jobs are removed events with their reason", removedEvents);
}

async function priorityOrder(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("prio"));
  await q.enqueue("low-1");
  await q.enqueue("high-1", { priority: 9 });
  await q.enqueue("mid-1", { priority: 5 });
  await q.enqueue("high-2", { priority: 9 });
  await q.enqueue("low-2", { priority: 0 });
  assert.deepEqual(await drain(q, 5), ["high-1", "high-2", "mid-1", "low-1", "low-2"]);

  // Only a key's first job competes, with its own priority; the key keeps its order.
  const k = b.queue<string>(uniq("prio-key"));
  await k.enqueue("k-first-low", { key: "k", priority: 0 });
  await k.enqueue("k-second-high", { key: "k", priority: 9 });
  await k.enqueue("free-mid", { priority: 5 });
  assert.deepEqual(await drain(k, 3), ["free-mid", "k-first-low", "k-second-high"]);

  for (const priority of [-1, 10, 1.5]) await assert.rejects(q.enqueue("x", { priority }), ValidationError, `priority ${priority}`);
}

async function priorityStarvation(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("prio-starve"));
  const low = await q.enqueue("low");
  // More than a worker's prefetch + lookahead can hold (MIN_LOOKAHEAD_CAP 512): some always wait.
  const highs = 600;
  await q.enqueueBatch(Array.from({ length: highs }, (_, i) => ({ data: `high-${i}`, priority: 9 })));
  const w = q.work({ prefetch: 1 });
  const it = w[Symbol.asyncIterator]();
  try {
    // Each ack is replaced by a new high-priority job: the low one is never granted meanwhile.
    for (let i = 0; i < 50; i++) {
      const job = await nextJob(it);
      assert.notEqual(job.data, "low", `handed out after ${i} high-priority jobs`);
      await job.ack();
      await q.enqueue(`high-new-${i}`, { priority: 9 });
    }
    assert.equal((await q.getJob(low.id))?.state, "waiting", "the low-priority job still waits");
    let last: Job<string> | null = null;
    for (let i = 0; i < highs + 1; i++) {
      last = await nextJob(it);
      await last.ack();
    }
    assert.equal(last?.data, "low", "served once no higher-priority job waits");
  } finally {
    await w.close();
  }
}

async function priorityRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("prio-restart");
  const q = b.queue<string>(name);
  await q.enqueue("a-low");
  await q.enqueue("b-high", { priority: 8 });
  await q.enqueue("c-mid", { priority: 3 });
  if (kit.reopen === undefined) return;
  const b2 = await kit.reopen();
  await b2.queue<string>(name).enqueue("d-high", { priority: 8 });
  assert.deepEqual(await drain(b2.queue<string>(name), 4), ["b-high", "d-high", "c-mid", "a-low"]);
}

async function singletonMode(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("single"));
  const first = await q.enqueue(1, { singletonKey: "report" });
  assert.equal(first.duplicate, false);
  assert.deepEqual(await q.enqueue(2, { singletonKey: "report" }), { id: first.id, duplicate: true });
  const other = await q.enqueue(3, { singletonKey: "other" });
  assert.equal(other.duplicate, false, "another key");
  const w = q.work({ prefetch: 1 });
  const it = w[Symbol.asyncIterator]();
  const job = await nextJob(it);
  assert.equal(job.id, first.id);
  assert.deepEqual(await q.enqueue(4, { singletonKey: "report" }), { id: first.id, duplicate: true }, "active counts");
  await job.ack();
  await (await nextJob(it)).ack();
  await w.close();
  const again = await q.enqueue(5, { singletonKey: "report" });
  assert.equal(again.duplicate, false, "free once the job completed");
  assert.notEqual(again.id, first.id);
  // In one batch, the first job takes the key.
  const batch = await q.enqueueBatch([
    { data: 6, singletonKey: "b" },
    { data: 7, singletonKey: "b" },
  ]);
  assert.equal(batch[0].duplicate, false);
  assert.deepEqual(batch[1], { id: batch[0].id, duplicate: true });
  await assert.rejects(q.enqueue(8, { singletonMode: "singleton" }), ValidationError, "a mode without a key");
  await assert.rejects(q.enqueue(8, { singletonKey: "t", singletonMode: "throttle" }), ValidationError, "throttle without a window");
}

async function debounceMode(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("debounce"));
  const a = await q.enqueue("v1", { singletonKey: "doc", singletonMode: "debounce" });
  const c = await q.enqueue("v2", { singletonKey: "doc", singletonMode: "debounce" });
  assert.equal(c.duplicate, false);
  assert.equal(c.replaced, a.id, "the result names the replaced job");
  assert.equal(await q.getJob(a.id), null, "the replaced job is gone");
  assert.equal((await q.stats()).depth, 1);
  const w = q.work({ prefetch: 1 });
  const it = w[Symbol.asyncIterator]();
  const job = await nextJob(it);
  assert.equal(job.data, "v2");
  // An active job is not replaced: the new one waits behind it.
  const d = await q.enqueue("v3", { singletonKey: "doc", singletonMode: "debounce" });
  assert.equal(d.replaced, undefined);
  assert.equal((await q.stats()).depth, 2);
  await job.ack();
  const next = await nextJob(it);
  assert.equal(next.data, "v3");
  await next.ack();
  await w.close();
  // The quiet period: the job waits singletonWindowMs, a new enqueue replaces it meanwhile.
  const e = await q.enqueue("w1", { singletonKey: "doc", singletonMode: "debounce", singletonWindowMs: 60_000 });
  assert.equal((await q.getJob(e.id))?.state, "delayed");
  const f = await q.enqueue("w2", { singletonKey: "doc", singletonMode: "debounce", singletonWindowMs: 60_000 });
  assert.equal(f.replaced, e.id);
  assert.equal((await q.stats()).delayed, 1);
}

async function throttleMode(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("throttle"));
  const windowMs = 400;
  // Before the call: the window counts from the job's timestamp, taken during the call (an
  // fsync under load can make the call itself take a good part of the window).
  const started = Date.now();
  const first = await q.enqueue(1, { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: windowMs });
  assert.equal(first.duplicate, false);
  assert.deepEqual(await q.enqueue(2, { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: windowMs }), { id: first.id, duplicate: true });
  // Completing the job does not end the window.
  assert.deepEqual(await drain(q, 1), [1]);
  const r = await q.enqueue(3, { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: windowMs });
  if (Date.now() - started < windowMs) assert.deepEqual(r, { id: first.id, duplicate: true });
  const fresh = await waitUntil(async () => {
    const x = await q.enqueue(4, { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: windowMs });
    return x.duplicate ? null : x;
  }, "a new job once the window ended");
  assert.ok(Date.now() - started >= windowMs - 5, "not before the window ended");
  assert.notEqual(fresh.id, first.id);
}

async function singletonRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("single-restart");
  const q = b.queue<string>(name);
  const s = await q.enqueue("s", { singletonKey: "s" });
  const t = await q.enqueue("t", { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: 3_600_000 });
  const d1 = await q.enqueue("d1", { singletonKey: "d", singletonMode: "debounce" });
  if (kit.reopen === undefined) return;
  const b2 = await kit.reopen();
  const q2 = b2.queue<string>(name);
  assert.deepEqual(await q2.enqueue("s2", { singletonKey: "s" }), { id: s.id, duplicate: true });
  assert.deepEqual(await q2.enqueue("t2", { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: 3_600_000 }), { id: t.id, duplicate: true });
  const d2 = await q2.enqueue("d2", { singletonKey: "d", singletonMode: "debounce" });
  assert.equal(d2.replaced, d1.id);
  const b3 = await kit.reopen();
  const q3 = b3.queue<string>(name);
  assert.equal(await q3.getJob(d1.id), null, "the replaced job stays removed");
  assert.deepEqual((await drain(q3, 3)).sort(), ["d2", "s", "t"]);
  assert.equal((await q3.enqueue("s3", { singletonKey: "s" })).duplicate, false, "free after it completed");
}

async function expiry(b: Broker): Promise<void> {
  const name = uniq("expire");
  const q = b.queue<string>(name, { deadLetter: `${name}.dead` });
  const gone = await q.enqueue("late", { expireInMs: 150 });
  const kept = await q.enqueue("kept", { expireInMs: 3_600_000 });
  await waitUntil(async () => (await q.getJob(gone.id)) === null, "the expired job left the queue");
  assert.equal((await q.getJob(kept.id))?.state, "waiting");
  const dlq = b.queue<string>(`${name}.dead`);
  const page = await waitUntil(async () => {
    const p = await dlq.browse().catch(() => null);
    return p !== null && p.jobs.length === 1 ? p : null;
  }, "the expired job is in the dead-letter queue");
  assert.equal(page.jobs[0].data, "late");
  assert.equal(page.jobs[0].deadLetter?.errorClass, "JobExpiredError");
  assert.equal(page.jobs[0].deadLetter?.sourceId, gone.id);

  const dropName = uniq("expire-drop");
  const d = b.queue<string>(dropName, { onExpire: "drop", deadLetter: `${dropName}.dead` });
  const x = await d.enqueue("x", { expiresAt: Date.now() + 100 });
  await d.enqueue("y");
  await waitUntil(async () => (await d.getJob(x.id)) === null, "the expired job was dropped");
  assert.equal((await d.stats()).deadLettered, 0);
  assert.deepEqual(await drain(d, 1), ["y"]);
  await assert.rejects(d.enqueue("z", { expireInMs: 10, expiresAt: Date.now() + 10 }), ValidationError);
  await assert.rejects(d.enqueue("z", { expireInMs: 0 }), ValidationError);
}

async function expiryStartedAndRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("expire-started");
  const q = b.queue<string>(name, { onExpire: "drop", maxAttempts: 10 });
  const job = await q.enqueue("started", { expireInMs: 300 });
  const w = q.work({ prefetch: 1 });
  const got = await nextJob(w[Symbol.asyncIterator]());
  assert.equal(got.id, job.id);
  await got.nack({ delayMs: 0 });
  await w.close();
  const past = Date.now() + 400;
  await waitUntil(() => Date.now() > past, "the expiry time passed");
  assert.equal((await q.getJob(job.id))?.state, "waiting", "a started job does not expire");
  if (kit.reopen === undefined) return;
  const late = await q.enqueue("late", { expireInMs: 600 });
  const b2 = await kit.reopen();
  const q2 = b2.queue<string>(name);
  await waitUntil(async () => (await q2.getJob(late.id)) === null, "expired after the restart");
  assert.deepEqual(await drain(q2, 1), ["started"]);
}

async function removeJobs(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("remove");
  const q = b.queue<string>(name);
  const a = await q.enqueue("a");
  const later = await q.enqueue("later", { delayMs: 3_600_000 });
  const k1 = await q.enqueue("k1", { key: "k" });
  const k2 = await q.enqueue("k2", { key: "k" });
  assert.equal(await q.remove(a.id), true);
  assert.equal(await q.remove(a.id), false, "already removed");
  assert.equal(await q.remove(later.id), true, "a delayed job");
  assert.equal(await q.remove(k2.id), true, "a job held behind its key");
  assert.equal(await q.remove("123456789"), false, "unknown id");
  assert.equal(await q.remove("nope"), false, "not an id");
  assert.equal(await q.getJob(a.id), null);
  const w = q.work({ prefetch: 1 });
  const job = await nextJob(w[Symbol.asyncIterator]());
  assert.equal(job.id, k1.id);
  await assert.rejects(q.remove(k1.id), (e: unknown) => e instanceof JobActiveError && e.code === "JOB_ACTIVE");
  await job.ack();
  await w.close();
  assert.equal(await q.remove(k1.id), false, "completed");
  const st = await q.stats();
  assert.equal(st.depth, 0);
  await assert.rejects(b.queue(uniq("remove-missing")).remove("1"), (e: unknown) => (e as { code?: string }).code === "QUEUE_NOT_FOUND");
  if (kit.reopen === undefined) return;
  const c = await q.enqueue("c");
  const keep = await q.enqueue("keep");
  assert.equal(await q.remove(c.id), true);
  const b2 = await kit.reopen();
  const q2 = b2.queue<string>(name);
  assert.equal(await q2.getJob(c.id), null, "removed stays removed after a restart");
  assert.equal((await q2.getJob(keep.id))?.state, "waiting");
  assert.equal((await q2.stats()).depth, 1);
}

async function removedEvents(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("removed-events"), { onExpire: "drop" });
  const a = await q.enqueue("a");
  await q.remove(a.id);
  const d1 = await q.enqueue("d1", { singletonKey: "d", singletonMode: "debounce" });
  await q.enqueue("d2", { singletonKey: "d", singletonMode: "debounce" });
  const e = await q.enqueue("e", { expireInMs: 50 });
  await waitUntil(async () => (await q.getJob(e.id)) === null, "expired");
  const want = new Map([
    [a.id, "removed"],
    [d1.id, "replaced"],
    [e.id, "expired"],
  ]);
  const events = q.events({ from: "earliest" });
  const it = events[Symbol.asyncIterator]();
  const seen = new Map<string, string | undefined>();
  try {
    const deadline = Date.now() + 10_000;
    while (seen.size < want.size) {
      assert.ok(Date.now() < deadline, `removed events seen: ${JSON.stringify([...seen])}`);
      const r = await it.next();
      if (r.done) break;
      const ev: QueueEvent = r.value;
      if (ev.type === "removed") seen.set(ev.jobId, ev.reason);
    }
  } finally {
    await it.return?.();
  }
  assert.deepEqual(seen, want);
}
