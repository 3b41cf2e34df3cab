// SPDX-License-Identifier: Apache-2.0
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { LeaseExpiredError, PermanentError, QueueFullError, QueueNotFoundError, ValidationError } from "../src/errors.js";
import type { Job } from "../src/queues/index.js";
import { iter, nextJob, openManager, tempDir, waitFor } from "./fixtures/queue-helpers.js";

const dirs: (() => void)[] = [];
after(() => dirs.forEach((c) => c()));
function dataDir(): string {
  const t = tempDir();
  dirs.push(t.cleanup);
  return t.dir;
}

describe("queue basics", () => {
  test("enqueue, work, ack; ack is durable across restart; ids and fields", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    const q = m.queue<{ n: number }>("basic");
    const r1 = await q.enqueue({ n: 1 }, { headers: { trace: "abc" } });
    const r2 = await q.enqueue({ n: 2 });
    assert.equal(r1.duplicate, false);
    assert.notEqual(r1.id, r2.id);
    const w = q.work({ prefetch: 1 });
    const it = iter(w);
    const j1 = await nextJob(it);
    assert.deepEqual(j1.data, { n: 1 });
    assert.equal(j1.attempt, 1);
    assert.equal(j1.id, r1.id);
    assert.equal(Buffer.from(j1.headers.trace).toString(), "abc");
    assert.ok(j1.enqueuedAt > 0);
    await j1.ack();
    await w.close();
    await m.close();
    m = await openManager(dir);
    const q2 = m.queue<{ n: number }>("basic");
    const s = await q2.stats();
    assert.equal(s.depth, 1);
    const it2 = iter(q2.work());
    const j2 = await nextJob(it2);
    assert.deepEqual(j2.data, { n: 2 });
    // Job 2 may have been prefetched (a delivery) and released on close: attempts never go backwards.
    assert.ok(j2.attempt >= 1 && j2.attempt <= 2);
    await j2.ack();
    assert.equal((await q2.stats()).depth, 0);
    await m.close();
  });

  test("bad input gets typed errors before anything is stored", async () => {
    const m = await openManager(dataDir());
    assert.throws(() => m.queue("bad/name"), ValidationError);
    assert.throws(() => m.queue("q", { visibilityTimeoutMs: -1 }), ValidationError);
    assert.throws(() => m.queue("q", { maxAttempts: 0 }), ValidationError);
    const q = m.queue("q", { maxMessageBytes: 1024 });
    await assert.rejects(q.enqueue("x", { headers: { "sluice-at": "1" } }), ValidationError);
    await assert.rejects(q.enqueue("x", { delayMs: -5 }), ValidationError);
    await assert.rejects(q.enqueue("x", { dedupeId: "sys:dlq:x" }), ValidationError);
    await assert.rejects(q.enqueue("x", { key: "k".repeat(2000) }), ValidationError);
    await assert.rejects(q.enqueueBatch([{ data: 1 }, { data: 2, delayMs: 1, deliverAt: 5 }]), ValidationError);
    await assert.rejects(q.enqueue("x".repeat(5000)), (e: Error) => e.name === "RecordTooLargeError");
    assert.equal((await q.stats()).depth, 0);
    // A batch whose jobs each fit but together exceed one write (64 MiB): refused as bad input,
    // nothing stored, and the queue keeps serving (it is not failed by the log).
    const big = m.queue("big", { maxMessageBytes: 4 * 1024 * 1024 });
    const held = await big.enqueue("held");
    const w = big.work({ prefetch: 1 });
    const job = await nextJob(iter(w));
    const v = "x".repeat(3 * 1024 * 1024);
    await assert.rejects(big.enqueueBatch(Array.from({ length: 30 }, () => ({ data: v }))), (e: Error) => e instanceof ValidationError && /smaller batches/.test(e.message));
    await job.ack(); // its lease survived the refused batch
    await w.close();
    assert.equal(job.id, held.id);
    assert.equal((await big.stats()).depth, 0);
    await big.enqueueBatch(Array.from({ length: 10 }, () => ({ data: v })));
    assert.equal((await big.stats()).depth, 10);
    await m.close();
  });

  test("delayed jobs are not delivered early and survive restart", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    let q = m.queue("delayed");
    const t0 = Date.now();
    // Ready jobs are served in enqueue order, so "at" comes first only if the worker is back
    // before "later" is due: 1.3 s of margin for a restart on a loaded machine.
    await q.enqueue("later", { delayMs: 1500 });
    await q.enqueue("at", { deliverAt: t0 + 200 });
    assert.equal((await q.stats()).delayed, 2);
    await m.close();
    m = await openManager(dir);
    q = m.queue("delayed");
    const it = iter(q.work());
    const a = await nextJob(it);
    assert.equal(a.data, "at");
    assert.ok(Date.now() >= t0 + 200, "delivered no earlier than deliverAt");
    await a.ack();
    const b = await nextJob(it);
    assert.equal(b.data, "later");
    assert.ok(Date.now() >= t0 + 1500);
    await b.ack();
    await m.close();
  });
});

describe("leases", () => {
  test("expiry redelivers no earlier than the timeout; stale receipt gets LeaseExpiredError; signal aborts", async () => {
    const m = await openManager(dataDir());
    const q = m.queue("lease", { visibilityTimeoutMs: 150 });
    await q.enqueue("job");
    const it = iter(q.work({ prefetch: 2 }));
    const j1 = await nextJob(it);
    const t1 = performance.now();
    let aborted = false;
    j1.signal.addEventListener("abort", () => (aborted = true));
    const j2 = await nextJob(it);
    const t2 = performance.now();
    assert.ok(t2 - t1 >= 140, `redelivered after ${t2 - t1} ms`);
    assert.equal(j2.id, j1.id);
    assert.equal(j2.attempt, 2);
    assert.notEqual(j2.receipt, j1.receipt);
    assert.ok(aborted && j1.signal.aborted, "job.signal aborted on lease loss");
    await assert.rejects(j1.ack(), LeaseExpiredError);
    await assert.rejects(j1.nack(), LeaseExpiredError);
    await assert.rejects(j1.extend(1000), LeaseExpiredError);
    const s = await q.stats();
    assert.equal(s.inFlight, 1, "stale settlements changed nothing");
    assert.equal(s.redeliveries, 1);
    await j2.ack();
    assert.equal((await q.stats()).depth, 0);
    await m.close();
  });

  test("extend keeps the lease; ack after the original timeout succeeds", async () => {
    const m = await openManager(dataDir());
    const q = m.queue("extend", { visibilityTimeoutMs: 100 });
    await q.enqueue("job");
    const it = iter(q.work({ prefetch: 2 }));
    const j = await nextJob(it);
    const t0 = performance.now();
    await j.extend(2000);
    // Wait (bounded) past the original 100 ms lease: nothing may be redelivered meanwhile.
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(performance.now() - t0 >= 250);
    const s = await q.stats();
    assert.equal(s.inFlight, 1);
    assert.equal(s.redeliveries, 0);
    assert.equal(j.signal.aborted, false);
    await j.ack();
    assert.equal((await q.stats()).depth, 0);
    await m.close();
  });

  test("an unexpired lease survives restart with its wall-clock deadline", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    let q = m.queue("lease-restart", { visibilityTimeoutMs: 400 });
    await q.enqueue("x");
    const it = iter(q.work({ onUnsettled: "error" }));
    const j = await nextJob(it);
    const t0 = Date.now();
    assert.equal(j.attempt, 1);
    await m.close(); // leaves the lease in place (onUnsettled: "error"), as a crash would
    m = await openManager(dir);
    q = m.queue("lease-restart");
    const j2 = await nextJob(iter(q.work()));
    assert.ok(Date.now() - t0 >= 390, "not redelivered before the persisted deadline");
    assert.equal(j2.attempt, 2, "attempt count survives restart");
    await j2.ack();
    await m.close();
  });
});

describe("dead letters, redrive, purge, delete", () => {
  test("DLQ after exactly maxAttempts with full metadata and redaction", async () => {
    const m = await openManager(dataDir(), () => 0.5);
    const q = m.queue<{ v: number }>("dl", {
      maxAttempts: 3,
      backoff: { minDelayMs: 5, maxDelayMs: 20 },
      redactHeaders: ["Authorization"],
    });
    const { id } = await q.enqueue({ v: 7 }, { headers: { authorization: "secret", trace: "t1" } });
    const seen: number[] = [];
    const ac = new AbortController();
    const done = q.process(
      async (job) => {
        seen.push(job.attempt);
        throw new TypeError(`boom ${job.attempt}`);
      },
      { concurrency: 2, signal: ac.signal, consumerId: "c-1", codeVersion: "v42" },
    );
    const dlq = m.queue<{ v: number }>("dl.dlq");
    await waitFor(async () => (await dlq.stats()).waiting === 1, "job in DLQ");
    ac.abort();
    await done;
    assert.deepEqual(seen, [1, 2, 3]);
    const s = await q.stats();
    assert.equal(s.depth, 0);
    assert.equal(s.deadLettered, 1);
    assert.equal(s.retries, 2);
    const dj = await nextJob(iter(dlq.work()));
    assert.deepEqual(dj.data, { v: 7 });
    const info = dj.deadLetter!;
    assert.ok(info);
    assert.equal(info.sourceQueue, "dl");
    assert.equal(info.sourceId, id);
    assert.equal(info.attempts, 3);
    assert.equal(info.errorClass, "TypeError");
    assert.equal(info.error, "boom 3");
    assert.equal(info.codeVersion, "v42");
    assert.equal(info.history.length, 3);
    assert.deepEqual(info.history.map((h) => h.attempt), [1, 2, 3]);
    assert.ok(info.history.every((h) => h.consumer === "c-1" && h.errorClass === "TypeError" && h.at > 0));
    assert.ok(info.firstEnqueuedAt <= info.deadLetteredAt);
    assert.deepEqual(info.redacted, ["authorization"]);
    assert.equal(dj.headers.authorization, undefined);
    assert.equal(Buffer.from(dj.headers.trace).toString(), "t1");
    assert.equal(info.repeat, false);
    await dj.ack();
    await m.close();
  });

  test("PermanentError and nack({ requeue: false }) go straight to the DLQ", async () => {
    const m = await openManager(dataDir());
    const q = m.queue("perm", { maxAttempts: 10 });
    await q.enqueue("a");
    await q.enqueue("b");
    const ac = new AbortController();
    let calls = 0;
    const p = q.process(
      async (job) => {
        calls++;
        if (job.data === "a") throw new PermanentError("bad input");
        await job.nack({ requeue: false, reason: "manual" });
      },
      { signal: ac.signal },
    );
    const dlq = m.queue("perm.dlq");
    await waitFor(async () => (await dlq.stats()).waiting === 2, "two jobs in DLQ");
    ac.abort();
    await p;
    assert.equal(calls, 2);
    const it = iter(dlq.work({ prefetch: 2 }));
    const got = [await nextJob(it), await nextJob(it)].map((j) => [j.data, j.deadLetter!.errorClass, j.deadLetter!.error, j.deadLetter!.attempts]);
    got.sort();
    assert.deepEqual(got, [
      ["a", "PermanentError", "bad input", 1],
      ["b", "Nack", "manual", 1],
    ]);
    await m.close();
  });

  test("redrive round trip, filters, and the repeat guard", async () => {
    const m = await openManager(dataDir());
    const q = m.queue<string>("rd", { maxAttempts: 1, maxRedrives: 1 });
    const dlq = m.queue<string>("rd.dlq");
    await q.enqueue("x", { key: "k", headers: { h: "1" } });
    await q.enqueue("y");
    const it = iter(q.work({ prefetch: 1 }));
    for (let i = 0; i < 2; i++) {
      const j = await nextJob(it);
      await j.nack({ error: j.data === "x" ? new RangeError("r") : new Error("e") });
    }
    assert.equal((await dlq.stats()).waiting, 2);
    // Filter by error class: only x moves.
    const r1 = await dlq.redrive({ filter: { errorClass: "RangeError" } });
    assert.deepEqual(r1, { moved: 1, skippedRepeats: 0 });
    assert.equal((await dlq.stats()).waiting, 1);
    const back = await nextJob(it);
    assert.equal(back.data, "x");
    assert.equal(back.key, "k");
    assert.equal(back.attempt, 1);
    assert.equal(back.redriveCount, 1);
    assert.equal(Buffer.from(back.headers.h).toString(), "1");
    // It fails again: past maxRedrives it stays in the DLQ marked as a repeat.
    await back.nack({ error: new RangeError("again") });
    await waitFor(async () => (await dlq.stats()).waiting === 2, "x back in DLQ");
    const r2 = await dlq.redrive();
    assert.deepEqual(r2, { moved: 1, skippedRepeats: 1 });
    const y = await nextJob(it);
    assert.equal(y.data, "y");
    await y.ack();
    const dw = dlq.work();
    const dj = await nextJob(iter(dw));
    assert.equal(dj.data, "x");
    assert.equal(dj.deadLetter!.repeat, true);
    assert.equal(dj.deadLetter!.redriveCount, 1);
    assert.ok(dj.deadLetter!.firstEnqueuedAt <= back.enqueuedAt, "first-enqueue time kept across redrive");
    await dw.close(); // releases dj unsettled: back to waiting in the DLQ
    // Explicit target and includeRepeats.
    const other = m.queue<string>("rd-other");
    const r3 = await dlq.redrive({ target: "rd-other", includeRepeats: true });
    assert.equal(r3.moved, 1);
    const oj = await nextJob(iter(other.work()));
    assert.equal(oj.data, "x");
    assert.equal(oj.redriveCount, 2);
    await oj.ack();
    await m.close();
  });

  test("purge is durable and a purged queue never delivers old jobs", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    let q = m.queue("purge");
    for (let i = 0; i < 10; i++) await q.enqueue(`old-${i}`, i % 2 ? { delayMs: 50 } : { key: `k${i % 3}` });
    const it = iter(q.work({ prefetch: 1 }));
    const inflight = await nextJob(it);
    assert.equal(await q.purge(), 10);
    assert.equal((await q.stats()).depth, 0);
    await assert.rejects(inflight.ack(), LeaseExpiredError);
    await q.enqueue("new-1");
    const j = await nextJob(it);
    assert.equal(j.data, "new-1");
    await m.close();
    m = await openManager(dir);
    q = m.queue("purge");
    const s = await q.stats();
    assert.equal(s.depth, 1, "only the new, unacked job remains after restart");
    const j2 = await nextJob(iter(q.work()));
    assert.equal(j2.data, "new-1");
    await j2.ack();
    await m.close();
  });

  test("delete then re-create never delivers old jobs", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    const q = m.queue("gone");
    await q.enqueue("old");
    assert.deepEqual((await m.listQueues()).sort(), ["gone", "gone.dlq"], "a queue's dead-letter queue is created with it");
    await m.deleteQueue("gone");
    assert.deepEqual(await m.listQueues(), ["gone.dlq"]);
    await m.close();
    m = await openManager(dir);
    const q2 = m.queue("gone");
    await assert.rejects(q2.stats(), (e: unknown) => e instanceof QueueNotFoundError, "a deleted queue is not re-created by a read");
    await q2.enqueue("new");
    assert.equal((await q2.stats()).depth, 1);
    const j = await nextJob(iter(q2.work()));
    assert.equal(j.data, "new");
    await m.close();
  });
});

describe("dedupe and overflow", () => {
  test("dedupe window returns the original id, also across restart (snapshot and log-scan paths)", async () => {
    const dir = dataDir();
    const fs1 = new FaultyFileSystem();
    let m = await openManager(dir, undefined, fs1);
    let q = m.queue("dd", { dedupeWindowMs: 60_000 });
    const a = await q.enqueue("a", { dedupeId: "order-1" });
    const [b, c] = await Promise.all([q.enqueue("a2", { dedupeId: "order-1" }), q.enqueue("z", { dedupeId: "order-2" })]);
    assert.deepEqual(b, { id: a.id, duplicate: true });
    assert.equal(c.duplicate, false);
    const batch = await q.enqueueBatch([
      { data: 1, dedupeId: "order-3" },
      { data: 2, dedupeId: "order-3" },
    ]);
    assert.equal(batch[1].duplicate, true);
    assert.equal(batch[1].id, batch[0].id);
    assert.equal((await q.stats()).depth, 3);
    // Restart without a clean close (a killed process: no snapshot, its directory lock gone):
    // the window is rebuilt from the message log.
    await fs1.crash("abandoned");
    const m2 = await openManager(dir);
    const q2 = m2.queue("dd", { dedupeWindowMs: 60_000 });
    assert.deepEqual(await q2.enqueue("again", { dedupeId: "order-1" }), { id: a.id, duplicate: true });
    await m2.close();
    // Clean restart (snapshot path).
    m = await openManager(dir);
    q = m.queue("dd", { dedupeWindowMs: 60_000 });
    assert.deepEqual(await q.enqueue("again", { dedupeId: "order-2" }), { id: c.id, duplicate: true });
    assert.equal((await q.stats()).depth, 3);
    await m.close();
  });

  test("dedupe entries expire after the window", async () => {
    const m = await openManager(dataDir());
    const q = m.queue("dd-short", { dedupeWindowMs: 50 });
    const a = await q.enqueue("a", { dedupeId: "x" });
    const t0 = Date.now();
    await waitFor(() => Date.now() > t0 + 60, "window to pass");
    const b = await q.enqueue("b", { dedupeId: "x" });
    assert.equal(b.duplicate, false);
    assert.notEqual(b.id, a.id);
    await m.close();
  });

  test("overflow reject: retriable QueueFullError with the depth, also after restart", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    let q = m.queue("full", { maxDepth: 3 });
    for (let i = 0; i < 3; i++) await q.enqueue(i);
    await assert.rejects(q.enqueue(3), (e: unknown) => e instanceof QueueFullError && e.depth === 3 && e.retriable);
    await m.close();
    m = await openManager(dir);
    q = m.queue("full");
    await assert.rejects(q.enqueue(3), QueueFullError);
    const j = await nextJob(iter(q.work()));
    await j.ack();
    await q.enqueue(3);
    await m.close();
  });

  test("overflow block: waits for room, times out with QueueFullError", async () => {
    const m = await openManager(dataDir());
    const q = m.queue("block", { maxDepth: 2, overflow: "block", blockTimeoutMs: 5000 });
    await q.enqueue(1);
    await q.enqueue(2);
    let resolved = false;
    const p = q.enqueue(3).then((r) => ((resolved = true), r));
    await new Promise((r) => setImmediate(r));
    assert.equal(resolved, false);
    const j = await nextJob(iter(q.work()));
    await j.ack();
    const r = await p;
    assert.equal(r.duplicate, false);
    const q2 = m.queue("block2", { maxDepth: 1, overflow: "block", blockTimeoutMs: 30 });
    await q2.enqueue(1);
    const t0 = performance.now();
    await assert.rejects(q2.enqueue(2), QueueFullError);
    assert.ok(performance.now() - t0 >= 25);
    await m.close();
  });
});

describe("stats", () => {
  test("blocked keys and ages are reported; a failing key holds back only itself", async () => {
    const m = await openManager(dataDir());
    const q = m.queue<string>("st", { backoff: { minDelayMs: 60_000, maxDelayMs: 60_000 } });
    await q.enqueue("k1-a", { key: "k1" });
    await q.enqueue("k1-b", { key: "k1" });
    await q.enqueue("k2-a", { key: "k2" });
    const it = iter(q.work({ prefetch: 1 }));
    const first = await nextJob(it);
    assert.equal(first.data, "k1-a");
    await first.nack({ error: new Error("x") });
    const second: Job<string> = await nextJob(it);
    assert.equal(second.data, "k2-a", "k1-b is held behind the failing k1-a; k2 proceeds");
    await second.ack();
    const s = await q.stats();
    assert.equal(s.delayed, 1);
    assert.equal(s.blockedByKey, 1);
    assert.equal(s.blockedKeys.length, 1);
    assert.equal(s.blockedKeys[0].key, "k1");
    assert.equal(s.blockedKeys[0].attempts, 1);
    assert.equal(s.retries, 1);
    assert.equal(s.completed, 1);
    await m.close();
  });
});

describe("storage", () => {
  test("settled segments are deleted: storage stays proportional to the backlog", async () => {
    const { readdirSync, statSync } = await import("node:fs");
    const { join } = await import("node:path");
    const dir = dataDir();
    const du = (p: string): number =>
      readdirSync(p, { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile())
        .reduce((a, e) => a + statSync(join(e.parentPath ?? (e as unknown as { path: string }).path, e.name)).size, 0);
    let m = await openManager(dir);
    const q = m.queue("store", { segmentBytes: 32 * 1024 });
    for (let i = 0; i < 20; i++) await q.enqueueBatch(Array.from({ length: 250 }, (_, k) => ({ data: { i, k, pad: "p".repeat(100) } })));
    const keep = await q.enqueue("the one job left");
    const root = join(dir, "queues");
    const full = du(root);
    assert.ok(full > 500_000, `backlog on disk: ${full}`);
    const ac = new AbortController();
    let n = 0;
    const p = q.process(
      async (job) => {
        if (job.id === keep.id) throw new Error("stays");
        if (++n === 5000) ac.abort();
      },
      { concurrency: 64, signal: ac.signal },
    );
    await p;
    await m.close(); // snapshot + delete settled prefixes
    const after = du(root);
    assert.ok(after < full / 4, `after settling: ${after} bytes (was ${full})`);
    m = await openManager(dir);
    const s = await m.queue("store").stats();
    assert.equal(s.depth, 1, "the unsettled job survives compaction");
    await m.close();
  });
});

describe("dead-letter move safety", () => {
  test("a move that cannot land (DLQ full) stays in the source, survives restart and lands once there is room", async () => {
    const dir = dataDir();
    let m = await openManager(dir);
    const dlq = m.queue<string>("mv.dlq", { maxDepth: 1 });
    await dlq.enqueue("filler");
    const q = m.queue<string>("mv", { maxAttempts: 1 });
    await q.enqueue("x");
    const job = await nextJob(iter(q.work()));
    await assert.rejects(job.nack({ error: new Error("fails") }), QueueFullError);
    assert.equal((await q.stats()).depth, 1, "still in the source while the move is pending");
    await m.close();
    m = await openManager(dir);
    const q2 = m.queue<string>("mv");
    const d2 = m.queue<string>("mv.dlq");
    assert.equal((await q2.stats()).depth, 1);
    const f = await nextJob(iter(d2.work()));
    assert.equal(f.data, "filler");
    await f.ack();
    await waitFor(async () => (await q2.stats()).depth === 0, "move retried after room appeared");
    const s = await d2.stats();
    assert.equal(s.depth, 1);
    assert.equal((await q2.stats()).deadLettered, 1);
    await m.close();
  });
});
