// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues on the PostgreSQL engine with two broker nodes on one schema (what the
 * conformance suite, one broker per target, cannot show): a worker on one node wakes for jobs
 * enqueued on the other (LISTEN/NOTIFY), per-key FIFO and `maxInFlight` hold across nodes, and
 * a lease of a node that went away expires on the other at its stored deadline (LEASE-1/3).
 * Queues keep all their state in the database, so this holds across nodes.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { openBroker } from "../src/broker/broker.js";
import { resolveQueueConfig } from "../src/queues/config.js";
import { nextJob } from "../src/testing/conformance-helpers.js";
import { waitUntil } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine } from "./fixtures/postgres.js";

async function twoNodes(): Promise<{ a: Broker; b: Broker; close(): Promise<void> }> {
  const schema = freshSchema();
  const open = (): Promise<Broker> => needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));
  const a = await open();
  const b = await open();
  return {
    a,
    b,
    async close() {
      await a.close().catch(() => {});
      await b.close().catch(() => {});
      await dropSchema(schema);
    },
  };
}

test("postgres queues, two nodes: a worker on one node gets jobs enqueued on the other, in key order, one per key at a time", async () => {
  const n = await twoNodes();
  try {
    const qa = n.a.queue<number>("shared");
    const qb = n.b.queue<number>("shared");
    const w = qb.work({ prefetch: 4 });
    const it = w[Symbol.asyncIterator]();
    // The worker waits first: only a wake-up from node a (or the poll) can bring it the job.
    const first = nextJob(it);
    await qa.enqueueBatch([0, 1, 2].map((i) => ({ data: i, key: "k" })));
    const j0 = await first;
    assert.equal(j0.data, 0);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal((await qa.stats()).inFlight, 1, "the key's next job waits while its first is leased");
    await j0.ack();
    const j1 = await nextJob(it);
    assert.equal(j1.data, 1);
    await j1.ack();
    assert.equal((await nextJob(it)).data, 2);
    await w.close();
  } finally {
    await n.close();
  }
});

test("postgres queues, two nodes: maxInFlight holds across nodes", async () => {
  const n = await twoNodes();
  try {
    const qa = n.a.queue<number>("capped", { maxInFlight: 2, visibilityTimeoutMs: 30_000 });
    const qb = n.b.queue<number>("capped", { maxInFlight: 2, visibilityTimeoutMs: 30_000 });
    await qa.enqueueBatch([0, 1, 2, 3].map((i) => ({ data: i })));
    const wa = qa.work({ prefetch: 2 });
    const wb = qb.work({ prefetch: 2 });
    const ia = wa[Symbol.asyncIterator]();
    await nextJob(ia);
    await waitUntil(async () => (await qa.stats()).inFlight === 2, "two leased");
    await new Promise((r) => setTimeout(r, 600));
    assert.equal((await qa.stats()).inFlight, 2, "never more than maxInFlight, whichever node grants");
    await wa.close();
    await wb.close();
  } finally {
    await n.close();
  }
});

test("postgres queues, two nodes: the lease of a node that went away stays in force until its stored deadline, then the other node redelivers the job", async () => {
  const schema = freshSchema();
  const engine = newPgEngine(schema);
  await needingPostgres(() => engine.open());
  let b: Broker | null = null;
  try {
    // Node a, at the engine's level: it grants the job, then goes away without settling it.
    const name = "handover";
    const opened = await engine.queues.open(name, { config: {}, settings: (c) => resolveQueueConfig(name, c), peer: () => Promise.reject(new Error("no peers here")) });
    const rec = { key: null, value: Buffer.from("x"), valueKind: 0 as const, timestamp: Date.now(), headers: null };
    await opened.enqueue([{ record: rec, key: null, deliverAt: rec.timestamp, dedupeId: null, size: 1, origin: null }]);
    const lost: string[] = [];
    const consumer = { consumerId: "node-a", codeVersion: undefined, leaseMs: 1_000, leaseLost: (l: { jobId: string }) => void lost.push(l.jobId) };
    const [[granted]] = await opened.grant([{ consumer, upTo: 1 }]);
    assert.equal(granted.lease.attempt, 1);
    const leasedAt = Date.now();
    await engine.close();
    assert.deepEqual(lost, [granted.id], "its holder heard the lease end (LEASE-2)");
    // Node b: the row is still leased; its sweep requeues it once the stored deadline passed.
    b = await needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));
    const q = b.queue<Buffer>(name);
    const w = q.work({ prefetch: 1 });
    const job = await nextJob(w[Symbol.asyncIterator](), 15_000);
    assert.equal(job.id, granted.id);
    assert.equal(job.attempt, 2, "the expired delivery counted");
    assert.ok(Date.now() - leasedAt >= 1_000, `not redelivered before the stored deadline (${Date.now() - leasedAt} ms)`);
    await job.ack();
    await w.close();
    assert.equal((await q.stats()).completed, 1);
  } finally {
    await b?.close();
    await engine.close();
    await dropSchema(schema);
  }
});
