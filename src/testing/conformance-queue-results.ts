// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, work-queue results and `getJob`: `job.ack(result)` and `process()`
 * return values kept for `resultRetentionMs`, expiry, the size limit, the job states, and that
 * reading never creates a queue. Registered by `defineConformanceSuite` (conformance.ts),
 * whose rules they follow.
 */
import assert from "node:assert/strict";
import { ValidationError } from "../errors.js";
import { MAX_RESULT_BYTES } from "../queues/config.js";
import type { Job } from "../queues/types.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueResultTests(t: DefineTest): void {
  t("queue results: getJob reports waiting, delayed, active, then completed with the ack's result; unknown ids are null", statesAndResult);
  t("queue results: process() keeps the handler's return value; an undefined return completes without one", processResults);
  t("queue results: resultRetentionMs 0 (the default) keeps nothing and ignores results", retentionOff);
  t("queue results: a result expires after resultRetentionMs", resultExpiry);
  t("queue results: an oversized or non-JSON result is refused with ValidationError and the job stays leased", oversizedResult);
  t("queue results: dead-lettered jobs report dead with the last error (nack and a process() result too large)", deadState);
  t("queue results: getJob on a queue that does not exist returns null and creates nothing", getJobCreatesNothing);
}

async function firstJob<T>(q: { work(o?: { prefetch?: number }): AsyncIterable<Job<T>> & { close(): Promise<void> } }): Promise<{ job: Job<T>; close(): Promise<void> }> {
  const w = q.work({ prefetch: 1 });
  const job = await nextJob(w[Symbol.asyncIterator]());
  return { job, close: () => w.close() };
}

async function statesAndResult(b: Broker): Promise<void> {
  const q = b.queue<{ n: number }>(uniq("res-states"), { resultRetentionMs: 60_000 });
  const a = await q.enqueue({ n: 1 });
  const later = await q.enqueue({ n: 2 }, { delayMs: 60_000 });
  assert.deepEqual(await q.getJob(a.id), { id: a.id, state: "waiting", attempts: 0, data: { n: 1 } });
  assert.deepEqual(await q.getJob(later.id), { id: later.id, state: "delayed", attempts: 0, data: { n: 2 } });
  assert.equal(await q.getJob("987654321"), null, "an id never handed out");
  assert.equal(await q.getJob("not-an-id"), null, "an id that is not one");
  const w = await firstJob(q);
  try {
    assert.equal(w.job.id, a.id);
    const active = await q.getJob(a.id);
    assert.equal(active?.state, "active");
    assert.equal(active?.attempts, 1);
    const before = Date.now();
    await w.job.ack({ ok: true, items: [1, 2], note: null });
    const done = await q.getJob(a.id);
    assert.ok(done !== null, "completed job is readable");
    assert.equal(done.state, "completed");
    assert.deepEqual(done.result, { ok: true, items: [1, 2], note: null });
    assert.equal(done.attempts, 1);
    assert.equal(done.data, undefined, "a completed job's payload is not kept");
    assert.ok(typeof done.completedAt === "number" && done.completedAt >= before - 1000, "completedAt is the ack's time");
  } finally {
    await w.close();
  }
}

async function processResults(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("res-process"), { resultRetentionMs: 60_000 });
  const ids = (await q.enqueueBatch([{ data: 2 }, { data: 3 }, { data: 0 }])).map((r) => r.id);
  const ac = new AbortController();
  const run = q.process(async (job) => (job.data === 0 ? undefined : { double: job.data * 2 }), { signal: ac.signal, concurrency: 2 });
  try {
    await waitUntil(async () => (await Promise.all(ids.map((id) => q.getJob(id)))).every((j) => j?.state === "completed"), "every job completed");
  } finally {
    ac.abort();
    await run;
  }
  assert.deepEqual((await q.getJob(ids[0]))?.result, { double: 4 });
  assert.deepEqual((await q.getJob(ids[1]))?.result, { double: 6 });
  const none = await q.getJob(ids[2]);
  assert.equal(none?.state, "completed");
  assert.equal("result" in none!, false, "an undefined return value is no result");
}

async function retentionOff(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("res-off"));
  const { id } = await q.enqueue("x");
  const w = await firstJob(q);
  try {
    // Not kept, so not checked either: a queue without retention behaves as before results existed.
    await w.job.ack("y".repeat(MAX_RESULT_BYTES + 10));
  } finally {
    await w.close();
  }
  assert.equal(await q.getJob(id), null, "nothing is kept for a completed job");
  assert.equal((await q.stats()).completed, 1);
}

async function resultExpiry(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("res-expiry"), { resultRetentionMs: 2000 });
  const { id } = await q.enqueue("x");
  const w = await firstJob(q);
  try {
    await w.job.ack("done");
  } finally {
    await w.close();
  }
  const kept = await q.getJob(id);
  assert.equal(kept?.state, "completed");
  assert.equal(kept?.result, "done");
  await waitUntil(async () => (await q.getJob(id)) === null, "the result expired", 15_000, 50);
}

async function oversizedResult(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("res-big"), { resultRetentionMs: 60_000 });
  const { id } = await q.enqueue("x");
  const w = await firstJob(q);
  try {
    await assert.rejects(w.job.ack("z".repeat(MAX_RESULT_BYTES)), ValidationError, "a result above the limit (as JSON, with quotes)");
    await assert.rejects(w.job.ack({ n: 1n }), ValidationError, "a result that is not JSON-serialisable");
    assert.equal((await q.getJob(id))?.state, "active", "the job is still leased");
    assert.equal((await q.stats()).inFlight, 1);
    // The worker may ack again (here with a result that fits).
    await w.job.ack("z".repeat(MAX_RESULT_BYTES - 2));
  } finally {
    await w.close();
  }
  const done = await q.getJob(id);
  assert.equal(done?.state, "completed");
  assert.equal((done?.result as string).length, MAX_RESULT_BYTES - 2);
}

async function deadState(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("res-dead"), { resultRetentionMs: 60_000, maxAttempts: 1 });
  const a = await q.enqueue("a");
  const w = await firstJob(q);
  try {
    await w.job.nack({ requeue: false, reason: "bad input" });
  } finally {
    await w.close();
  }
  const dead = await waitUntil(async () => {
    const j = await q.getJob(a.id);
    return j?.state === "dead" ? j : null;
  }, "the job is dead-lettered");
  assert.equal(dead.lastError, "bad input");
  assert.equal(dead.attempts, 1);
  // process(): a return value the queue cannot keep fails the attempt (maxAttempts 1: dead).
  const c = await q.enqueue("c");
  const ac = new AbortController();
  const run = q.process(() => "r".repeat(MAX_RESULT_BYTES + 1), { signal: ac.signal });
  try {
    const j = await waitUntil(async () => {
      const x = await q.getJob(c.id);
      return x?.state === "dead" ? x : null;
    }, "the job whose result was too large is dead-lettered");
    assert.match(j.lastError ?? "", /limit/);
  } finally {
    ac.abort();
    await run;
  }
}

async function getJobCreatesNothing(b: Broker): Promise<void> {
  const name = uniq("res-none");
  const before = await b.listQueues();
  assert.equal(await b.queue(name).getJob("1"), null);
  const after = await b.listQueues();
  assert.deepEqual(after, before, "listQueues is unchanged");
  assert.equal(after.includes(name), false);
}
