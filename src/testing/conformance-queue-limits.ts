// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, queue-wide limits of work queues: the rate limit (`rateLimit`,
 * RATE-1). Registered by `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { ValidationError } from "../errors.js";
import type { Broker } from "../types.js";
import { uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueLimitTests(t: DefineTest): void {
  t("queue limits: rateLimit: at most max starts in any window, lookahead included; workers waiting for it are woken when the window has room", rateLimitWindow);
  t("queue limits: rateLimit is validated; lifting it on an open queue releases waiting workers", rateLimitConfig);
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
