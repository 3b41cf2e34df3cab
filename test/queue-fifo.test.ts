// SPDX-License-Identifier: Apache-2.0
// Per-key FIFO property test: over random schedules (random keys, handler latencies, nacks, lease
// expiries and a restart), jobs sharing a key are delivered strictly in order with at most one
// in flight, while other keys proceed.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { LeaseExpiredError } from "../src/errors.js";
import type { Job } from "../src/queues/index.js";
import { openManager, rng, tempDir, waitFor } from "./fixtures/queue-helpers.js";

const cleanups: (() => void)[] = [];
after(() => cleanups.forEach((c) => c()));

interface Item {
  key: string | null;
  seq: number;
}

for (const seed of [1, 2, 3, 4, 5]) {
  test(`per-key FIFO holds under concurrency, nacks, lease expiry and restart (seed ${seed})`, async () => {
    const t = tempDir();
    cleanups.push(t.cleanup);
    const rand = rng(seed);
    const keys = 1 + Math.floor(rand() * 6);
    const total = 60 + Math.floor(rand() * 60);
    let m = await openManager(t.dir, rng(seed + 100));
    const cfg = { visibilityTimeoutMs: 60, maxAttempts: 1000, backoff: { minDelayMs: 0, maxDelayMs: 8 } };
    let q = m.queue<Item>("fifo", cfg);
    // Enqueue with per-key sequence numbers; some jobs unkeyed, some delayed.
    const nextSeq = new Map<string, number>();
    const items: { data: Item; key?: string; delayMs?: number }[] = [];
    for (let i = 0; i < total; i++) {
      const key = rand() < 0.15 ? null : `k${Math.floor(rand() * keys)}`;
      const seq = key === null ? -1 : (nextSeq.get(key) ?? 0);
      if (key !== null) nextSeq.set(key, seq + 1);
      items.push({ data: { key, seq }, ...(key !== null ? { key } : {}), ...(rand() < 0.1 ? { delayMs: Math.floor(rand() * 20) } : {}) });
    }
    // Enqueue in random-sized concurrent batches (order of batches is preserved by awaiting each).
    for (let i = 0; i < items.length; ) {
      const n = 1 + Math.floor(rand() * 10);
      await q.enqueueBatch(items.slice(i, i + n).map((x) => ({ ...x })));
      i += n;
    }

    const completed = new Map<string, number>(); // key -> number of acked jobs of that key
    const inFlight = new Map<string, Job<Item>>();
    let done = 0;
    const violations: string[] = [];

    const handle = async (job: Job<Item>): Promise<void> => {
      const { key, seq } = job.data;
      if (key !== null) {
        // A previous holder whose lease was lost (signal aborted) no longer counts as in flight.
        const holder = inFlight.get(key);
        if (holder !== undefined && !holder.signal.aborted) violations.push(`two live leases for ${key} (seq ${seq})`);
        const expect = completed.get(key) ?? 0;
        if (seq !== expect) violations.push(`${key}: delivered seq ${seq}, expected ${expect}`);
        inFlight.set(key, job);
      }
      const r = rand();
      await new Promise((res) => setTimeout(res, Math.floor(rand() * 4)));
      try {
        if (r < 0.15) {
          if (key !== null && inFlight.get(key) === job) inFlight.delete(key);
          await job.nack({ error: new Error("random failure") });
        } else if (r < 0.2 && !job.signal.aborted) {
          // Let the lease expire: the job must come back (same key position), nothing overtakes it.
          await waitFor(() => job.signal.aborted, "lease loss", 5000);
          if (key !== null && inFlight.get(key) === job) inFlight.delete(key);
          // A shutdown abort (not a lease loss) leaves the lease valid: then ack would succeed; nack instead.
          if (job.signal.reason instanceof LeaseExpiredError) await assert.rejects(job.ack(), LeaseExpiredError);
          else await job.nack({ delayMs: 0 });
        } else {
          // Update the model before the ack resolves: the next job of the key may be delivered as
          // soon as the ack is applied (it is durable before this promise resolves).
          if (key !== null) {
            if (inFlight.get(key) === job) inFlight.delete(key);
            completed.set(key, (completed.get(key) ?? 0) + 1);
          }
          try {
            await job.ack();
            done++;
          } catch (e) {
            if (key !== null) completed.set(key, (completed.get(key) ?? 0) - 1);
            throw e;
          }
        }
      } catch (e) {
        if (!(e instanceof LeaseExpiredError)) throw e;
        if (key !== null && inFlight.get(key) === job) inFlight.delete(key);
      }
    };

    const run = async (until: number): Promise<void> => {
      const ac = new AbortController();
      const p = q.process(handle, { concurrency: 1 + Math.floor(rand() * 8), signal: ac.signal, onUnsettled: "error" });
      await waitFor(() => done >= until, `${until} jobs done (now ${done})`, 20_000);
      ac.abort();
      await p;
    };
    // Half the jobs, then a restart mid-way, then the rest.
    await run(Math.floor(total / 2));
    await m.close();
    // Jobs in flight at close were released or remain leased; either way the model forgets them.
    inFlight.clear();
    m = await openManager(t.dir, rng(seed + 200));
    q = m.queue<Item>("fifo", cfg);
    await run(total);
    assert.deepEqual(violations, []);
    const s = await q.stats();
    assert.equal(s.depth, 0);
    for (const [k, n] of nextSeq) assert.equal(completed.get(k), n, `all jobs of ${k} completed`);
    await m.close();
  });
}
