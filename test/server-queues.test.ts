// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues over the network: enqueue/work/ack/nack/extend/stats/purge through connect(),
 * typed LeaseExpiredError for stale settles, and leases that belong to the connection (a
 * dropped connection releases its in-flight jobs for redelivery at once).

 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { LeaseExpiredError, PermanentError } from "../src/errors.js";
import { startServer } from "../src/server/index.js";
import type { Broker } from "../src/types.js";

async function withQueueServer(fn: (url: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-queues-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  try {
    await fn(srv.url);
  } finally {
    await srv.close({ graceMs: 200 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function waitUntil(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test("queues over the network: enqueue, work, ack, nack with delay, extend, stats, purge", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const client = await connect({ url });
    try {
      const q = client.queue<{ n: number }>("emails", { visibilityTimeoutMs: 5_000, maxAttempts: 3 });
      const r = await q.enqueue({ n: 1 }, { headers: { trace: "t1" } });
      assert.equal(typeof r.id, "string");
      assert.equal(r.duplicate, false);
      const batch = await q.enqueueBatch([{ data: { n: 2 } }, { data: { n: 3 }, key: "k" }]);
      assert.equal(batch.length, 2);
      const worker = q.work({ prefetch: 4 });
      const it = worker[Symbol.asyncIterator]();
      const got = new Map<number, { n: number; job: Awaited<ReturnType<typeof it.next>>["value"] }>();
      while (got.size < 3) {
        const j = (await it.next()).value!;
        got.set(j.data.n, { n: j.data.n, job: j });
      }
      const j1 = got.get(1)!.job!;
      assert.equal(j1.attempt, 1);
      assert.deepEqual(Buffer.from(j1.headers.trace), Buffer.from("t1"));
      assert.ok(j1.signal instanceof AbortSignal && !j1.signal.aborted);
      await j1.extend(10_000);
      await j1.ack();
      await assert.rejects(j1.ack(), (e: unknown) => e instanceof Error);
      await got.get(3)!.job!.ack();
      // nack with a short delay: redelivered with attempt 2.
      await got.get(2)!.job!.nack({ delayMs: 50 });
      const again = (await it.next()).value!;
      assert.equal(again.data.n, 2);
      assert.equal(again.attempt, 2);
      await again.ack();
      const stats = await q.stats();
      assert.equal(stats.name, "emails");
      assert.equal(stats.inFlight, 0);
      assert.equal(stats.waiting, 0);
      await worker.close();
      await q.enqueueBatch([{ data: { n: 9 } }, { data: { n: 10 } }]);
      assert.equal(await q.purge(), 2);
      assert.equal((await q.stats()).depth, 0);
    } finally {
      await client.close();
    }
  });
});

test("leases belong to the connection: a dropped connection releases in-flight jobs at once", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const a = await connect({ url, reconnectMinDelayMs: 10 });
    const b = await connect({ url });
    try {
      const qa = a.queue<string>("jobs", { visibilityTimeoutMs: 60_000 });
      await qa.enqueue("only-job");
      const wa = qa.work({ prefetch: 1 });
      const ja = (await wa[Symbol.asyncIterator]().next()).value!;
      assert.equal(ja.data, "only-job");
      // Drop A's connection: the server releases A's lease now (not in 60 s).
      a.transport.destroySocketForTest();
      await waitUntil(() => ja.signal.aborted, "A's job signal aborts");
      // A's worker would re-register after the reconnect and compete for the job: stop it.
      await wa.close();
      const qb = b.queue<string>("jobs");
      const wb = qb.work({ prefetch: 1 });
      const jb = (await wb[Symbol.asyncIterator]().next()).value!;
      assert.equal(jb.data, "only-job");
      assert.equal(jb.id, ja.id);
      assert.ok(jb.attempt >= 2, "redelivery counts as a new attempt");
      await assert.rejects(ja.ack(), LeaseExpiredError);
      await jb.ack();
      await wb.close();
    } finally {
      await a.close();
      await b.close();
    }
  });
});

test("queue.process over the network: return acks, PermanentError dead-letters", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const client = await connect({ url });
    try {
      const q = client.queue<number>("work", { maxAttempts: 5, deadLetter: "work.dlq" });
      await q.enqueueBatch(Array.from({ length: 20 }, (_, i) => ({ data: i })));
      const done = new Set<number>();
      const ac = new AbortController();
      const running = q.process(
        async (job) => {
          if (job.data === 13) throw new PermanentError("unlucky");
          done.add(job.data);
          if (done.size === 19) ac.abort();
        },
        { concurrency: 4, signal: ac.signal },
      );
      await running;
      assert.equal(done.size, 19);
      const dlq = client.queue<number>("work.dlq");
      await waitUntil(async () => (await dlq.stats()).waiting === 1, "the failed job is in the DLQ");
      const w = dlq.work();
      const dead = (await w[Symbol.asyncIterator]().next()).value!;
      assert.equal(dead.data, 13);
      assert.equal(dead.deadLetter?.sourceQueue, "work");
      assert.equal(dead.deadLetter?.errorClass, "PermanentError");
      await dead.ack();
      await w.close();
    } finally {
      await client.close();
    }
  });
});

test("onUnsettled: \"error\" keeps a dropped connection's leases until they expire", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const a = await connect({ url, reconnectMinDelayMs: 10 });
    const b = await connect({ url });
    try {
      const qa = a.queue<string>("keep", { visibilityTimeoutMs: 1500 });
      await qa.enqueue("leased");
      const wa = qa.work({ prefetch: 1, onUnsettled: "error" });
      const ja = (await wa[Symbol.asyncIterator]().next()).value!;
      const leasedAt = Date.now();
      a.transport.destroySocketForTest();
      await waitUntil(() => ja.signal.aborted, "A's job signal aborts");
      await wa.close();
      const wb = b.queue<string>("keep").work({ prefetch: 1 });
      const jb = (await wb[Symbol.asyncIterator]().next()).value!;
      assert.equal(jb.id, ja.id);
      assert.ok(Date.now() - leasedAt >= 1400, `redelivered only after the lease expired (${Date.now() - leasedAt} ms)`);
      await jb.ack();
      await wb.close();
    } finally {
      await a.close();
      await b.close();
    }
  });
});
