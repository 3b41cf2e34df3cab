// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, job progress and lifecycle events: `job.progress(value)` durable
 * and visible through `getJob`, `queue.events()` in order for a job that fails once and then
 * completes, resuming from a position, a reader that stops reading does not hold workers up,
 * and both survive a restart (where the target can restart). Registered by
 * `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { LeaseExpiredError, ValidationError } from "../errors.js";
import { MAX_PROGRESS_BYTES } from "../queues/config.js";
import type { Queue, QueueEvent } from "../queues/types.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueEventTests(t: DefineTest): void {
  t("queue progress: job.progress() is visible through getJob while the job is live; too large is ValidationError, a stale lease LeaseExpiredError", progressVisible);
  t("queue events: a job that fails once then completes reports enqueued, active, failed, active, progress, completed in order", eventsInOrder);
  t("queue events: from a position resumes after that event (nothing repeated or skipped); from now skips the past", resumeFromPosition);
  t("queue events: a reader that stops reading does not hold up workers, and later reads everything", slowReaderDoesNotBlock);
  t("queue events: progress and events survive a restart", survivesRestart);
  t("queue events: an expired lease reports stalled, a nack without requeue failed (willRetry false) then dead-lettered; purge reports purged", stalledAndDead);
}

/** Reads events until `n` arrived (with a deadline), leaving the iterator open. */
async function takeEvents(it: AsyncIterator<QueueEvent>, n: number, timeoutMs = 10_000): Promise<QueueEvent[]> {
  const out: QueueEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  while (out.length < n) {
    const left = deadline - Date.now();
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([it.next(), new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), Math.max(1, left))))]);
    clearTimeout(timer);
    if (r === "timeout") throw new Error(`timed out: got ${out.length} of ${n} events: ${JSON.stringify(out.map((e) => e.type))}`);
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

function summary(evs: QueueEvent[]): string[] {
  return evs.map((e) => ("jobId" in e ? `${e.type}:${e.jobId}` : e.type));
}

async function progressVisible(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("prog"), { maxAttempts: 3 });
  const { id } = await q.enqueue("p");
  const w = q.work({ prefetch: 1 });
  try {
    const job = await nextJob(w[Symbol.asyncIterator]());
    assert.equal((await q.getJob(id))?.progress, undefined, "no progress yet");
    await job.progress(42);
    assert.equal((await q.getJob(id))?.progress, 42);
    await job.progress({ step: "upload", pct: 0.5 });
    assert.deepEqual((await q.getJob(id))?.progress, { step: "upload", pct: 0.5 }, "the latest value replaces the previous one");
    await assert.rejects(job.progress("x".repeat(MAX_PROGRESS_BYTES)), ValidationError);
    await assert.rejects(job.progress(() => 1), ValidationError);
    assert.deepEqual((await q.getJob(id))?.progress, { step: "upload", pct: 0.5 }, "a refused value changes nothing");
    await job.nack({ delayMs: 0, reason: "again" });
    await assert.rejects(job.progress(1), LeaseExpiredError, "progress after the lease ended");
    const info = await q.getJob(id);
    assert.deepEqual(info?.progress, { step: "upload", pct: 0.5 }, "progress stays while the job waits for its retry");
    const again = await nextJob(w[Symbol.asyncIterator]());
    await again.ack();
  } finally {
    await w.close();
  }
}

/** Enqueues one job, fails its first attempt, completes the second with progress. */
async function failOnceThenComplete(q: Queue<string>): Promise<string> {
  const { id } = await q.enqueue("j");
  const w = q.work({ prefetch: 1 });
  try {
    const it = w[Symbol.asyncIterator]();
    const first = await nextJob(it);
    await first.nack({ delayMs: 0, error: new TypeError("boom") });
    const second = await nextJob(it);
    assert.equal(second.attempt, 2);
    await second.progress({ pct: 100 });
    await second.ack({ ok: true });
  } finally {
    await w.close();
  }
  return id;
}

function checkLifecycle(evs: QueueEvent[], id: string): void {
  const mine = evs.filter((e) => "jobId" in e && e.jobId === id);
  assert.deepEqual(
    mine.map((e) => e.type),
    ["enqueued", "active", "failed", "active", "progress", "completed"],
  );
  const [enq, a1, failed, a2, prog, done] = mine;
  assert.equal(enq.type === "enqueued" && enq.key, null);
  assert.ok(a1.type === "active" && a1.attempt === 1 && a1.leaseExpiresAt > 0);
  assert.ok(failed.type === "failed");
  assert.equal(failed.attempt, 1);
  assert.equal(failed.willRetry, true);
  assert.equal(failed.errorClass, "TypeError");
  assert.equal(failed.error, "boom");
  assert.ok(a2.type === "active" && a2.attempt === 2);
  assert.ok(prog.type === "progress");
  assert.deepEqual(prog.progress, { pct: 100 });
  assert.ok(done.type === "completed" && done.attempt === 2);
  assert.deepEqual(done.result, { ok: true }, "the result, as the queue keeps results");
  for (const e of evs) assert.equal(typeof e.position, "string");
  assert.equal(new Set(evs.map((e) => e.position)).size, evs.length, "every event has its own position");
}

async function eventsInOrder(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("ev-order"), { resultRetentionMs: 60_000, deadLetter: null });
  await using events = q.events({ from: "earliest" });
  const it = events[Symbol.asyncIterator]();
  const id = await failOnceThenComplete(q);
  checkLifecycle(await takeEvents(it, 6), id);
}

async function resumeFromPosition(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("ev-resume"), { deadLetter: null });
  const ids = (await q.enqueueBatch([{ data: "a" }, { data: "b" }, { data: "c" }])).map((r) => r.id);
  const all = await takeEvents(q.events({ from: "earliest" })[Symbol.asyncIterator](), 3);
  assert.deepEqual(summary(all), ids.map((id) => `enqueued:${id}`));
  const rest = q.events({ from: all[0].position });
  const resumed = await takeEvents(rest[Symbol.asyncIterator](), 2);
  await rest.close();
  assert.deepEqual(summary(resumed), summary(all.slice(1)), "resumes after the event whose position it names");
  assert.deepEqual(resumed.map((e) => e.position), all.slice(1).map((e) => e.position));
  // "now" is taken when events() is called: the past is not reported, what follows is.
  const now = q.events();
  const { id } = await q.enqueue("d");
  const later = await takeEvents(now[Symbol.asyncIterator](), 1);
  await now.close();
  assert.deepEqual(summary(later), [`enqueued:${id}`]);
  await assert.rejects(async () => {
    for await (const _ of q.events({ from: "not-a-position" })) break;
  }, ValidationError);
}

async function slowReaderDoesNotBlock(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("ev-slow"), { deadLetter: null });
  const ac = new AbortController();
  const events = q.events({ from: "earliest", signal: ac.signal });
  const it = events[Symbol.asyncIterator]();
  const n = 600;
  const ids = (await q.enqueueBatch(Array.from({ length: n }, (_, i) => ({ data: i })))).map((r) => r.id);
  // One event read, then the reader stops: the workers go on regardless.
  assert.equal((await takeEvents(it, 1))[0].type, "enqueued");
  let done = 0;
  const stop = new AbortController();
  const run = q.process(() => void done++, { signal: stop.signal, concurrency: 8 });
  try {
    await waitUntil(() => done === n, `all ${n} jobs processed`, 20_000);
  } finally {
    stop.abort();
    await run;
  }
  // Then everything is still there: the rest of the enqueued events, and active and
  // completed for each job (a worker shutting down may also report released ones).
  const completed = new Set<string>();
  let enqueued = 1;
  const deadline = Date.now() + 20_000;
  while (completed.size < n) {
    const [e] = await takeEvents(it, 1, Math.max(1, deadline - Date.now()));
    if (e.type === "completed") completed.add(e.jobId);
    if (e.type === "enqueued") enqueued++;
  }
  ac.abort();
  assert.equal((await it.next()).done, true, "aborting the signal ends the iteration");
  assert.equal(enqueued, n);
  for (const id of ids) assert.ok(completed.has(id));
}

async function survivesRestart(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("ev-restart");
  const config = { resultRetentionMs: 60_000, deadLetter: null };
  let q = b.queue<string>(name, config);
  const id = await failOnceThenComplete(q);
  const { id: live } = await q.enqueue("live");
  const w = q.work({ prefetch: 1 });
  const job = await nextJob(w[Symbol.asyncIterator]());
  assert.equal(job.id, live);
  await job.progress({ step: 3 });
  const before = await takeEvents(q.events({ from: "earliest" })[Symbol.asyncIterator](), 9);
  if (kit.reopen) {
    b = await kit.reopen();
    q = b.queue<string>(name, config);
  } else await w.close();
  assert.deepEqual((await q.getJob(live))?.progress, { step: 3 }, "progress of a live job survives");
  const after = await takeEvents(q.events({ from: "earliest" })[Symbol.asyncIterator](), 9);
  assert.deepEqual(after, before, "the same events, with the same positions");
  checkLifecycle(after, id);
  assert.deepEqual(summary(after.slice(6)), [`enqueued:${live}`, `active:${live}`, `progress:${live}`]);
  // Resuming from a position taken before the restart.
  const resumed = await takeEvents(q.events({ from: before[5].position })[Symbol.asyncIterator](), 3);
  assert.deepEqual(resumed, before.slice(6));
}

async function stalledAndDead(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("ev-stalled"), { maxAttempts: 5 });
  await using events = q.events({ from: "earliest" });
  const it = events[Symbol.asyncIterator]();
  const { id } = await q.enqueue("s");
  const w = q.work({ prefetch: 1, visibilityTimeoutMs: 200 });
  try {
    const jobs = w[Symbol.asyncIterator]();
    const first = await nextJob(jobs);
    assert.equal(first.attempt, 1);
    // Not settled: the lease runs out and the job comes back with attempt 2.
    const second = await nextJob(jobs);
    assert.equal(second.attempt, 2);
    await second.nack({ requeue: false, reason: "bad input" });
  } finally {
    await w.close();
  }
  const evs = await takeEvents(it, 6);
  assert.deepEqual(summary(evs), ["enqueued", "active", "stalled", "active", "failed", "dead-lettered"].map((t) => `${t}:${id}`));
  const stalled = evs[2];
  assert.ok(stalled.type === "stalled" && stalled.attempt === 1 && stalled.willRetry === true);
  const failed = evs[4];
  assert.ok(failed.type === "failed");
  assert.equal(failed.willRetry, false);
  assert.equal(failed.error, "bad input");
  assert.equal(failed.attempt, 2);
  const { id: later } = await q.enqueue("p");
  assert.equal(await q.purge(), 1);
  const tail = await takeEvents(it, 2);
  assert.deepEqual(summary(tail), [`enqueued:${later}`, "purged"]);
  assert.ok(tail[1].type === "purged" && BigInt(tail[1].beforeId) > BigInt(later));
}
