// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, work queues: enqueue/work/ack, leases, dedupe and purge,
 * process() and its shutdown. Registered by `defineConformanceSuite`
 * (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { AbortedError, LeaseExpiredError, PermanentError } from "../errors.js";
import type { Job } from "../queues/types.js";
import type { Broker } from "../types.js";
import { nextJob, uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueTests(t: DefineTest): void {
  t("queues: enqueue, work, ack; nack redelivers with a higher attempt; stats", enqueueWorkAck);
  t("queues: a stale receipt after lease expiry fails with LeaseExpiredError; job.signal aborts", staleReceiptAfterLeaseExpiry);
  t("queues: dedupe window returns the original id; purge empties the queue", dedupeAndPurge);
  t("queues: process() acks on return; PermanentError dead-letters with metadata", processAcksAndDeadLetters);
  t("queues: process() shutdown: running jobs' signals abort; a handler that returns acks, one that throws is released (not failed); unstarted jobs keep their attempts", processShutdown);
  t("queues: un-awaited acks (the README loop): no unhandled rejection; jobs not durably settled stay within prefetch + maxPendingSettlements; close() resolves once they are durable", unawaitedAcks);
  t("queues: a worker hands at most prefetch unsettled jobs to application code; process() completes under maxPendingSettlements 1", handOutBounds);
}

/** Resolves after the current macrotask's microtasks and its unhandled-rejection check ran. */
function nextTurn(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

async function unawaitedAcks(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("unawaited"), { visibilityTimeoutMs: 30_000 });
  const n = 300;
  await q.enqueueBatch(Array.from({ length: n }, (_, i) => ({ data: i })));
  const prefetch = 4;
  const maxPendingSettlements = 3;
  const unhandled: unknown[] = [];
  const onUnhandled = (e: unknown): void => void unhandled.push(e);
  process.on("unhandledRejection", onUnhandled);
  try {
    const w = q.work({ prefetch, maxPendingSettlements });
    let unresolved = 0;
    let most = 0;
    let handled = 0;
    let twice: Promise<void> | null = null;
    for await (const job of w) {
      // This job is in application code; the acks issued before it and not yet resolved are pending.
      most = Math.max(most, unresolved + 1);
      unresolved++;
      const p = job.ack();
      p.then(
        () => unresolved--,
        () => unresolved--,
      );
      // A second ack of the same job fails; left un-awaited it must not be an unhandled rejection.
      if (handled === 0) twice = job.ack();
      if (++handled === n) break; // break closes the worker: close() waits for the pending acks
    }
    assert.equal(unresolved, 0, "close() resolved after every un-awaited ack settled");
    assert.ok(most <= prefetch + maxPendingSettlements, `jobs handed out and not durably settled: ${most} <= ${prefetch + maxPendingSettlements}`);
    await nextTurn();
    assert.deepEqual(unhandled, [], "no unhandled rejection");
    await assert.rejects(twice!);
    const st = await q.stats();
    assert.equal(st.completed, n);
    assert.equal(st.depth, 0);
  } finally {
    process.off("unhandledRejection", onUnhandled);
  }
}

async function handOutBounds(b: Broker): Promise<void> {
  const q = b.queue<number>(uniq("bounds"), { visibilityTimeoutMs: 30_000 });
  await q.enqueueBatch(Array.from({ length: 200 }, (_, i) => ({ data: i })));
  const w = q.work({ prefetch: 2 });
  const it = w[Symbol.asyncIterator]();
  const a = await nextJob(it);
  const c = await nextJob(it);
  let third: Job<number> | null = null;
  const pending = it.next().then((r) => (third = r.value as Job<number>));
  // A round trip to the queue gives the worker every chance to hand out a third job.
  await waitUntil(async () => (await q.stats()).inFlight >= 2, "two jobs leased");
  await nextTurn();
  assert.equal(third, null, "no third job while two are unsettled");
  await a.ack();
  await pending;
  assert.notEqual(third, null);
  await c.ack();
  await third!.ack();
  await w.close();

  const ac = new AbortController();
  let done = 0;
  await q.process(
    () => {
      if (++done === 197) ac.abort();
    },
    { concurrency: 4, maxPendingSettlements: 1, signal: ac.signal },
  );
  assert.equal(done, 197);
  await waitUntil(async () => (await q.stats()).completed === 200, "every job completed");
}

async function enqueueWorkAck(b: Broker): Promise<void> {
  const q = b.queue<{ n: number }>(uniq("q"), { visibilityTimeoutMs: 10_000 });
  const r1 = await q.enqueue({ n: 1 }, { headers: { h: "v" } });
  assert.equal(r1.duplicate, false);
  await q.enqueueBatch([{ data: { n: 2 } }]);
  const w = q.work({ prefetch: 2 });
  const it = w[Symbol.asyncIterator]();
  const a = await nextJob(it);
  const c = await nextJob(it);
  const byN = new Map([a, c].map((j) => [j.data.n, j]));
  assert.deepEqual([...byN.keys()].sort(), [1, 2]);
  assert.equal(byN.get(1)!.attempt, 1);
  assert.deepEqual(Buffer.from(byN.get(1)!.headers.h), Buffer.from("v"));
  await byN.get(1)!.ack();
  await byN.get(2)!.nack({ delayMs: 0 });
  const again = await nextJob(it);
  assert.equal(again.data.n, 2);
  assert.equal(again.attempt, 2);
  await again.extend(5_000);
  await again.ack();
  const st = await q.stats();
  assert.equal(st.inFlight, 0);
  assert.equal(st.depth, 0);
  await w.close();
}

async function staleReceiptAfterLeaseExpiry(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("lease"), { visibilityTimeoutMs: 300 });
  await q.enqueue("x");
  const w1 = q.work({ prefetch: 1 });
  const j1 = await nextJob(w1[Symbol.asyncIterator]());
  await waitUntil(() => j1.signal.aborted, "lease loss aborts job.signal", 10_000);
  await assert.rejects(j1.ack(), LeaseExpiredError);
  // w1 has room again and could receive the job itself; close it so w2 gets the redelivery.
  await w1.close();
  const w2 = q.work({ prefetch: 1 });
  const j2 = await nextJob(w2[Symbol.asyncIterator]());
  assert.equal(j2.id, j1.id);
  assert.ok(j2.attempt >= 2);
  await assert.rejects(j1.ack(), LeaseExpiredError);
  await j2.ack();
  await w2.close();
}

async function dedupeAndPurge(b: Broker): Promise<void> {
  const q = b.queue<string>(uniq("dedupe"), { dedupeWindowMs: 60_000 });
  const a = await q.enqueue("a", { dedupeId: "d1" });
  const again = await q.enqueue("a", { dedupeId: "d1" });
  assert.equal(again.id, a.id);
  assert.equal(again.duplicate, true);
  await q.enqueue("b");
  assert.equal((await q.stats()).waiting, 2);
  assert.equal(await q.purge(), 2);
  assert.equal((await q.stats()).depth, 0);
}

async function processAcksAndDeadLetters(b: Broker): Promise<void> {
  const name = uniq("proc");
  const q = b.queue<number>(name, { maxAttempts: 3 });
  await q.enqueueBatch([1, 2, 3, 4].map((n) => ({ data: n })));
  const ac = new AbortController();
  const done: number[] = [];
  await q.process(
    async (job) => {
      if (job.data === 3) throw new PermanentError("bad job");
      done.push(job.data);
      if (done.length === 3) ac.abort();
    },
    { concurrency: 2, signal: ac.signal },
  );
  assert.deepEqual(done.sort(), [1, 2, 4]);
  const dlq = b.queue<number>(`${name}.dlq`);
  await waitUntil(async () => (await dlq.stats()).waiting === 1, "job in the DLQ");
  const w = dlq.work();
  const dead = await nextJob(w[Symbol.asyncIterator]());
  assert.equal(dead.data, 3);
  assert.equal(dead.deadLetter?.sourceQueue, name);
  assert.equal(dead.deadLetter?.errorClass, "PermanentError");
  await dead.ack();
  await w.close();
}

// Shutdown semantics of process() (docs/queues.md, PROC-1), the same embedded and remote.
async function processShutdown(b: Broker): Promise<void> {
  const name = uniq("shutdown");
  // maxAttempts 1: a failure recorded for the interrupted job would dead-letter it.
  const q = b.queue<string>(name, { maxAttempts: 1, visibilityTimeoutMs: 60_000 });
  await q.enqueueBatch(["finishes", "interrupted", "unstarted"].map((data) => ({ data })));
  const ac = new AbortController();
  const reasons = new Map<string, unknown>();
  const order: string[] = [];
  let letFinish!: () => void;
  const finishGate = new Promise<void>((r) => (letFinish = r));
  const running = new Set<string>();
  const done = q.process(
    async (job) => {
      running.add(job.data);
      await new Promise<void>((r) => job.signal.addEventListener("abort", () => r(), { once: true }));
      reasons.set(job.data, job.signal.reason);
      if (job.data === "interrupted") {
        order.push("interrupted threw");
        throw new Error("interrupted by the shutdown");
      }
      await finishGate;
      order.push("finishes returned");
    },
    { concurrency: 2, signal: ac.signal },
  );
  void done.then(() => order.push("process resolved"));
  // Both handlers started (leased on the broker is not enough: over the network a pushed job
  // may still be on its way to the client when the signal aborts, and then it never starts).
  await waitUntil(() => running.size === 2, "two handlers running");
  ac.abort(new Error("shutting down"));
  await waitUntil(() => reasons.size === 2, "both signals aborted");
  for (const [data, reason] of reasons) assert.ok(reason instanceof AbortedError, `${data}: signal aborted with AbortedError`);
  letFinish();
  await done;
  assert.deepEqual(order, ["interrupted threw", "finishes returned", "process resolved"], "process() resolves after its handlers finished");
  const s = await q.stats();
  assert.equal(s.inFlight, 0, "nothing left leased");
  assert.equal(s.deadLettered, 0, "the interrupted job was not failed");
  assert.equal(s.completed, 1, "the handler that returned was acked");
  assert.equal(s.depth, 2);
  const w = q.work({ prefetch: 2 });
  const it = w[Symbol.asyncIterator]();
  const attempts = new Map<string, number>();
  for (let i = 0; i < 2; i++) {
    const j = await nextJob(it);
    attempts.set(j.data, j.attempt);
    await j.ack();
  }
  await w.close();
  assert.deepEqual(Object.fromEntries(attempts), { interrupted: 2, unstarted: 1 }, "released with its delivery counted; never delivered: first attempt");
}
