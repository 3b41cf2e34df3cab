// SPDX-License-Identifier: Apache-2.0
/**
 * PG-2 under contention: settlements by lease token take the queue row last, while lease
 * expiries that dead-letter, removals and purges take it first. Jobs whose handlers run about as
 * long as their lease, on two nodes, with a remover running beside them: each job ends exactly
 * one way (acked, dead-lettered by its expiry, or removed), and no call fails with anything but
 * the documented outcome of a lost race (LeaseExpiredError, JobActiveError): no lock cycle
 * surfaces as a STORAGE_ERROR.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { JobActiveError, LeaseExpiredError } from "../src/errors.js";
import { waitUntil } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine } from "./fixtures/postgres.js";

const JOBS = 600;
const CONFIG = { visibilityTimeoutMs: 100, maxAttempts: 1 };

test("postgres queues: acks, progress, lease expiries, removals and a purge racing on one queue from two nodes; each job ends one way, no lock cycle surfaces", { timeout: 120_000 }, async () => {
  const schema = freshSchema();
  const open = (): Promise<Broker> => needingPostgres(() => openBroker({ engine: newPgEngine(schema), retentionCheckIntervalMs: 0 }));
  const nodes = [await open(), await open()];
  const unexpected: string[] = [];
  let acked = 0;
  let removed = 0;
  const ac = new AbortController();
  try {
    const q = nodes[0].queue<number>("races", CONFIG);
    await q.enqueueBatch(Array.from({ length: JOBS }, (_, i) => ({ data: i })));
    const workers = nodes.map((b) =>
      (async () => {
        for await (const job of b.queue<number>("races", CONFIG).work({ prefetch: 16, signal: ac.signal })) {
          void (async () => {
            // About as long as the lease: some acks win, some expiries do.
            await new Promise((r) => setTimeout(r, 60 + Math.random() * 80));
            try {
              if (job.data % 3 === 0) await job.progress({ at: job.data });
              await job.ack();
              acked++;
            } catch (e) {
              if (!(e instanceof LeaseExpiredError)) unexpected.push(`job ${job.data}: ${String(e)}`);
            }
          })();
        }
      })(),
    );
    const remover = (async () => {
      const rq = nodes[1].queue<number>("races", CONFIG);
      while (!ac.signal.aborted) {
        try {
          if (await rq.remove(String(Math.floor(Math.random() * JOBS)))) removed++;
        } catch (e) {
          if (!(e instanceof JobActiveError)) unexpected.push(`remove: ${String(e)}`);
        }
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const dlq = nodes[0].queue("races.dlq");
    await waitUntil(
      async () => {
        const s = await q.stats();
        return s.waiting === 0 && s.delayed === 0 && s.inFlight === 0;
      },
      "every job settled one way",
      90_000,
    );
    ac.abort();
    await Promise.all([...workers, remover]);
    const dead = (await dlq.stats()).waiting;
    assert.deepEqual(unexpected.slice(0, 10), [], "no call failed but for a lost race");
    assert.equal(acked + dead + removed, JOBS, `each job ended exactly one way: ${acked} acked, ${dead} dead-lettered, ${removed} removed`);
    assert.ok(acked > 0 && dead > 0, `both outcomes happened (${acked} acked, ${dead} dead-lettered)`);
    // A purge racing with acks of its jobs: the same rule.
    await q.enqueueBatch(Array.from({ length: 200 }, (_, i) => ({ data: i })));
    const ac2 = new AbortController();
    const late: Promise<unknown>[] = [];
    const w2 = (async () => {
      for await (const job of nodes[1].queue<number>("races", CONFIG).work({ prefetch: 32, signal: ac2.signal })) {
        late.push(job.ack().catch((e: unknown) => (e instanceof LeaseExpiredError ? null : unexpected.push(`ack during purge: ${String(e)}`))));
      }
    })();
    await waitUntil(async () => (await q.stats()).inFlight > 0, "jobs leased before the purge");
    await q.purge();
    ac2.abort();
    await w2;
    await Promise.all(late);
    assert.deepEqual(unexpected.slice(0, 10), [], "no ack failed but for a lost race during the purge");
    assert.equal((await q.stats()).depth, 0);
  } finally {
    ac.abort();
    for (const b of nodes) await b.close().catch(() => {});
    await dropSchema(schema);
  }
});
