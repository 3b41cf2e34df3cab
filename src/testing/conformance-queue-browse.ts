// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, browsing a queue without leasing (`queue.browse`): waiting and
 * delayed jobs with their metadata, paging with `after`, dead-letter entries with their
 * `deadLetter` record, that browsing counts no attempt and changes no stats, and that a queue
 * that does not exist raises QueueNotFoundError and is not created. Registered by
 * `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { QueueNotFoundError, ValidationError } from "../errors.js";
import type { BrowsedJob } from "../queues/types.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueBrowseTests(t: DefineTest): void {
  t("queue browse: lists waiting and delayed jobs in id order with key, headers, enqueuedAt and data; state filters", listsJobs);
  t("queue browse: pages with after/next until next is null; bad options are ValidationError", paging);
  t("queue browse: dead-letter entries carry their deadLetter record (source, error class, history)", deadLetterEntries);
  t("queue browse: browsing counts no attempt and changes no stats; a later lease sees attempt 1", noAttempt);
  t("queue browse: a queue that does not exist raises QueueNotFoundError and is not created", missingQueue);
}

async function listsJobs(b: Broker): Promise<void> {
  const q = b.queue<unknown>(uniq("browse-list"));
  const before = Date.now();
  const a = await q.enqueue({ n: 1 }, { key: "k1", headers: { trace: "abc", raw: new Uint8Array([0xff, 0xfe]) } });
  const c = await q.enqueue("text");
  const d = await q.enqueue({ n: 3 }, { delayMs: 60_000 });
  const page = await q.browse();
  assert.deepEqual(
    page.jobs.map((j) => [j.id, j.state, j.attempts, j.data]),
    [
      [a.id, "waiting", 0, { n: 1 }],
      [c.id, "waiting", 0, "text"],
      [d.id, "delayed", 0, { n: 3 }],
    ],
  );
  assert.equal(page.next, null);
  const first = page.jobs[0];
  assert.equal(first.key, "k1");
  assert.equal(first.headers.trace, "abc", "UTF-8 header values are strings");
  assert.deepEqual([...(first.headers.raw as Uint8Array)], [0xff, 0xfe], "other header values stay bytes");
  assert.ok(first.enqueuedAt >= before - 1000 && first.enqueuedAt <= Date.now() + 1000);
  assert.equal(first.deadLetter, null);
  assert.equal(first.redriveCount, 0);
  assert.deepEqual((await q.browse({ state: "delayed" })).jobs.map((j) => j.id), [d.id]);
  assert.deepEqual((await q.browse({ state: "waiting" })).jobs.map((j) => j.id), [a.id, c.id]);
}

async function paging(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("browse-page"));
  const ids = (await q.enqueueBatch(Array.from({ length: 7 }, (_, i) => ({ data: i })))).map((r) => r.id);
  const seen: string[] = [];
  let after: string | undefined;
  for (let pages = 0; pages < 10; pages++) {
    const p = await q.browse({ limit: 3, after });
    assert.ok(p.jobs.length <= 3);
    seen.push(...p.jobs.map((j) => j.id));
    if (p.next === null) break;
    after = p.next;
  }
  assert.deepEqual(seen, ids, "every job once, in id order");
  assert.deepEqual((await q.browse({ after: ids[5] })).jobs.map((j) => j.data), [6]);
  for (const bad of [{ limit: 0 }, { limit: 1001 }, { limit: 1.5 }, { state: "dead" as never }, { after: "not-an-id" }]) {
    await assert.rejects(q.browse(bad), (e: unknown) => e instanceof ValidationError, JSON.stringify(bad));
  }
}

async function deadLetterEntries(b: Broker): Promise<void> {
  const name = uniq("browse-dl");
  const q = b.queue<{ n: number }>(name, { maxAttempts: 1 });
  const { id } = await q.enqueue({ n: 7 }, { key: "cust-1", headers: { trace: "t1" } });
  const w = q.work({ prefetch: 1, consumerId: "c-browse" });
  try {
    const job = await nextJob(w[Symbol.asyncIterator]());
    await job.nack({ error: new TypeError("bad input"), reason: "bad input" });
  } finally {
    await w.close();
  }
  const dlq = b.queue<{ n: number }>(`${name}.dlq`);
  await waitUntil(async () => (await dlq.stats()).waiting === 1, "the job reached the dead-letter queue");
  const { jobs } = await dlq.browse();
  assert.equal(jobs.length, 1);
  const e: BrowsedJob<{ n: number }> = jobs[0];
  assert.deepEqual(e.data, { n: 7 });
  assert.equal(e.key, "cust-1", "the source job's key");
  assert.equal(e.headers.trace, "t1");
  assert.ok(e.deadLetter !== null);
  assert.equal(e.deadLetter.sourceQueue, name);
  assert.equal(e.deadLetter.sourceId, id);
  assert.equal(e.deadLetter.errorClass, "TypeError");
  assert.match(e.deadLetter.error, /bad input/);
  assert.equal(e.deadLetter.attempts, 1);
  assert.equal(e.deadLetter.redriveCount, 0);
  assert.equal(e.deadLetter.history.length, 1);
  assert.equal(e.deadLetter.history[0].consumer, "c-browse");
  assert.ok(e.deadLetter.deadLetteredAt > 0);
  assert.equal("key" in e.deadLetter, false, "the deadLetter record is the public DeadLetterInfo");
}

async function noAttempt(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("browse-noattempt"));
  await q.enqueue("x");
  const stats = await q.stats();
  for (let i = 0; i < 3; i++) assert.equal((await q.browse()).jobs[0].attempts, 0);
  const after = await q.stats();
  for (const k of ["waiting", "delayed", "inFlight", "redeliveries", "retries", "completed", "depth"] as const) assert.equal(after[k], stats[k], k);
  const w = q.work({ prefetch: 1 });
  try {
    const job = await nextJob(w[Symbol.asyncIterator]());
    assert.equal(job.attempt, 1, "browsing counted no attempt");
    const leased = (await q.browse()).jobs;
    assert.deepEqual(
      leased.map((j) => [j.state, j.attempts]),
      [["active", 1]],
    );
    assert.deepEqual((await q.browse({ state: "waiting" })).jobs, [], "a leased job is not waiting");
    await job.ack();
  } finally {
    await w.close();
  }
  assert.deepEqual((await q.browse()).jobs, []);
}

async function missingQueue(b: Broker): Promise<void> {
  const name = uniq("browse-none");
  await assert.rejects(b.queue(name).browse(), (e: unknown) => e instanceof QueueNotFoundError);
  assert.equal((await b.listQueues()).includes(name), false);
}
