// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, rate limits of work queues: the queue's own (`rateLimit`, RATE-1)
 * and a downstream's (`job.retryAfter`, `RateLimitedError`: no attempt spent, RATE-2). Registered by `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { RateLimitedError, ValidationError } from "../errors.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueLimitTests(t: DefineTest): void {
  t("queue limits: rateLimit: at most max starts in any window, lookahead included; workers waiting for it are woken when the window has room", rateLimitWindow);
  t("queue limits: rateLimit is validated; lifting it on an open queue releases waiting workers", rateLimitConfig);
  t("queue limits: job.retryAfter(ms): back after ms without spending an attempt (also across a restart); a nack still counts", retryAfterJob);
  t("queue limits: a process() handler throwing RateLimitedError gives the job back after retryAfterMs without an attempt", retryAfterProcess);
}

async function retryAfterJob(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("retry-after");
  // maxAttempts 2: two counted deliveries would dead-letter it.
  let q = b.queue<string>(name, { maxAttempts: 2, visibilityTimeoutMs: 10_000 });
  const { id } = await q.enqueue("x");
  let w = q.work({ prefetch: 1 });
  let it = w[Symbol.asyncIterator]();
  let job = await nextJob(it);
  assert.equal(job.attempt, 1);
  const t0 = performance.now();
  await job.retryAfter(300);
  assert.equal((await q.getJob(id))?.state, "delayed");
  job = await nextJob(it);
  assert.ok(performance.now() - t0 >= 250, `visible again after ${Math.round(performance.now() - t0)} ms, asked 300`);
  assert.equal(job.attempt, 1, "the given-back delivery was not an attempt");
  for (let i = 0; i < 3; i++) {
    await job.retryAfter(0);
    job = await nextJob(it);
    assert.equal(job.attempt, 1);
  }
  await assert.rejects(job.retryAfter(-1), ValidationError);
  assert.equal(job.attempt, 1, "a refused retryAfter leaves the job leased");
  await job.nack({ delayMs: 0 });
  job = await nextJob(it);
  assert.equal(job.attempt, 2, "a nack counts");
  // Not visible before the worker closed: its lookahead cannot re-grant it meanwhile.
  await job.retryAfter(300);
  await w.close();
  if (kit.reopen) {
    b = await kit.reopen();
    q = b.queue<string>(name, { maxAttempts: 2, visibilityTimeoutMs: 10_000 });
  }
  w = q.work({ prefetch: 1 });
  it = w[Symbol.asyncIterator]();
  job = await nextJob(it);
  assert.equal(job.attempt, 2, "the give-back is kept (across a restart)");
  await job.ack();
  await w.close();
  assert.equal((await q.stats()).completed, 1);
}

async function retryAfterProcess(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("rate-limited"), { maxAttempts: 1 });
  await q.enqueue("x");
  const attempts: number[] = [];
  const times: number[] = [];
  const ac = new AbortController();
  await q.process(
    (job) => {
      attempts.push(job.attempt);
      times.push(performance.now());
      if (attempts.length < 4) throw new RateLimitedError(100);
      ac.abort();
    },
    { signal: ac.signal },
  );
  assert.deepEqual(attempts, [1, 1, 1, 1], "maxAttempts 1: a counted failure would have dead-lettered it");
  for (let i = 1; i < times.length; i++) assert.ok(times[i] - times[i - 1] >= 80, `given back for ${Math.round(times[i] - times[i - 1])} ms, asked 100`);
  await waitUntil(async () => (await q.stats()).completed === 1, "the job completed");
  assert.equal((await q.stats()).deadLettered, 0);
  const e = new RateLimitedError(250);
  assert.equal(e.code, "RATE_LIMITED");
  assert.equal(e.retriable, true);
}

async function rateLimitWindow(b: Broker): Promise<void> {
  const max = 4;
  const durationMs = 400;
  const q = b.queue<number>(uniq("rate"), { rateLimit: { max, durationMs } });
  const total = 3 * max;
  await q.enqueueBatch(Array.from({ length: total }, (_, i) => ({ data: i })));
  const starts: number[] = [];
  const ac = new AbortController();
  // concurrency 8 (and the worker's lookahead) ask for far more than the limit allows.
  const run = q.process(
    () => {
      starts.push(performance.now());
      if (starts.length === total) ac.abort();
    },
    { concurrency: 8, signal: ac.signal },
  );
  await waitUntil(() => starts.length === total, "every job started (the window woke the worker)", 15_000);
  await run;
  // Grants are exactly `durationMs` apart at least; the hand-out after a grant (an fdatasync,
  // a network hop) may shift a start by a little, never by a quarter of the window.
  for (let i = 0; i + max < starts.length; i++)
    assert.ok(starts[i + max] - starts[i] >= durationMs * 0.75, `starts ${i} and ${i + max} are ${Math.round(starts[i + max] - starts[i])} ms apart: more than ${max} in a ${durationMs} ms window`);
  // Three windows' worth: the last ones start two windows after the first.
  assert.ok(starts[total - 1] - starts[0] >= 2 * durationMs * 0.75);
  await waitUntil(async () => (await q.stats()).completed === total, "every job completed");
}

async function rateLimitConfig(b: Broker): Promise<void> {
  for (const rateLimit of [{ max: 0, durationMs: 10 }, { max: 1, durationMs: 0 }, { max: 1.5, durationMs: 10 }, { max: 1 }, { max: 1, durationMs: 10, burst: 2 }]) {
    // Refused by queue() itself or by its first use, before anything is stored.
    await assert.rejects(async () => b.queue<string>(uniq("rate-bad"), { rateLimit: rateLimit as never }).enqueue("x"), ValidationError, JSON.stringify(rateLimit));
  }
  const name = uniq("rate-lift");
  const q = b.queue<string>(name, { rateLimit: { max: 1, durationMs: 3_600_000 } });
  await q.enqueueBatch([{ data: "a" }, { data: "b" }]);
  const seen: string[] = [];
  const ac = new AbortController();
  const run = q.process(
    (job) => {
      seen.push(job.data);
      if (seen.length === 3) ac.abort();
    },
    { concurrency: 2, signal: ac.signal },
  );
  await waitUntil(() => seen.length === 1, "the first job started");
  await waitUntil(async () => (await q.stats()).completed === 1, "the first job completed");
  assert.equal((await q.stats()).waiting, 1, "the second waits for the window (an hour)");
  // Using the queue with a config without the limit lifts it at once.
  await b.queue<string>(name, {}).enqueue("c");
  await waitUntil(() => seen.length === 3, "the waiting jobs started once the limit was lifted");
  await run;
}
