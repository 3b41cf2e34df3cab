// SPDX-License-Identifier: Apache-2.0
// Priorities, singleton keys, expiry and remove(id) across crashes (power loss: recovered from
// the logs and the journal, no final snapshot) and on data dirs written without them.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { NodeFileSystem } from "../src/log/io.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { waitUntil } from "../src/testing/helpers.js";
import { JobState } from "../src/store/disk/queues/job-state.js";
import type { DiskLease } from "../src/store/disk/queues/lease.js";
import { JobTable } from "../src/store/disk/queues/table.js";
import type { LeaseConsumer } from "../src/store/queue-store.js";
import { TestQueues, rng, tempDir } from "./fixtures/queue-helpers.js";

async function open(dir: string, fs = new NodeFileSystem()): Promise<TestQueues> {
  const engine = new DiskEngine({ dataDir: dir, fs });
  await engine.open();
  return new TestQueues(engine);
}

/** Payloads of the next `n` jobs a prefetch-1 worker gets, in order, each acked. */
async function drain(m: TestQueues, name: string, n: number): Promise<string[]> {
  const w = m.queue<string>(name).work({ prefetch: 1 });
  const it = w[Symbol.asyncIterator]();
  const out: string[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const r = await it.next();
      if (r.done) break;
      out.push(r.value.data);
      await r.value.ack();
    }
  } finally {
    await w.close();
  }
  return out;
}

function snapshotMeta(dir: string, queueDir: string): Record<string, unknown> {
  const buf = readFileSync(join(dir, "queues", queueDir, "snapshot.bin"));
  return JSON.parse(buf.toString("utf8", 12, 12 + buf.readUInt32LE(8))) as Record<string, unknown>;
}

test("priorities, singleton keys, expiries and removals survive a power loss (recovered from the logs and the journal)", async () => {
  const t = tempDir();
  try {
    const fs = new FaultyFileSystem();
    {
      const m = await open(t.dir, fs);
      const q = m.queue<string>("opts", { onExpire: "drop" });
      await q.enqueue("low");
      await q.enqueue("high", { priority: 9 });
      await q.enqueue("mid", { priority: 4 });
      await q.enqueue("single", { singletonKey: "s" });
      const gone = await q.enqueue("removed", { priority: 9 });
      assert.equal(await q.remove(gone.id), true);
      await q.enqueue("expiring", { expireInMs: 300, priority: 9 });
      await fs.powerLoss();
    }
    const m = await open(t.dir);
    try {
      const q = m.queue<string>("opts");
      assert.equal((await q.enqueue("single-2", { singletonKey: "s" })).duplicate, true, "the key is still taken");
      await waitUntil(async () => (await q.stats()).depth === 4, "the expiring job expired after the restart");
      assert.deepEqual(await drain(m, "opts", 4), ["high", "mid", "low", "single"]);
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

test("debounce: when the replaced job's removal is lost (journal write failed), recovery removes it from the new job's record", async () => {
  const t = tempDir();
  try {
    const fs = new FaultyFileSystem();
    {
      const m = await open(t.dir, fs);
      const q = m.queue<string>("deb");
      const first = await q.enqueue("v1", { singletonKey: "k", singletonMode: "debounce" });
      // The new job's append is durable; the journal write of the old job's removal fails.
      fs.failNext("write", "EIO", { pathIncludes: "journal" });
      const second = await q.enqueue("v2", { singletonKey: "k", singletonMode: "debounce" });
      assert.equal(second.replaced, first.id);
      await fs.powerLoss();
    }
    const m = await open(t.dir);
    try {
      const q = m.queue<string>("deb");
      assert.equal((await q.stats()).depth, 1, "only the replacing job is left");
      assert.deepEqual(await drain(m, "deb", 1), ["v2"]);
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

test("a queue written without the new options opens unchanged, and its snapshot carries none of their fields", async () => {
  const t = tempDir();
  try {
    {
      const m = await open(t.dir);
      const q = m.queue<string>("plain");
      await q.enqueueBatch([{ data: "a" }, { data: "b", key: "k" }, { data: "c", delayMs: 1 }]);
      await m.close();
    }
    const queueDir = JSON.parse(readFileSync(join(t.dir, "queues", "queues.json"), "utf8")) as unknown;
    const dirName = findQueueDir(queueDir, "plain");
    const meta = snapshotMeta(t.dir, dirName);
    assert.equal(meta.version, 1);
    for (const field of ["priorities", "expiries", "singletons", "groups"]) assert.equal(field in meta, false, `no ${field}`);
    const m = await open(t.dir);
    try {
      assert.deepEqual((await drain(m, "plain", 3)).sort(), ["a", "b", "c"]);
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

/** The incarnation directory of queue `name` (queues.json: {version, queues: {name: {incarnation}}}). */
function findQueueDir(manifest: unknown, name: string): string {
  const dir = (manifest as { queues: Record<string, { incarnation: string }> }).queues[name]?.incarnation;
  assert.ok(dir, `queue ${name} in the manifest`);
  return dir;
}

test("a retried idempotent request with singleton, throttle and debounce jobs gets its original answer", async () => {
  const t = tempDir();
  try {
    const m = await open(t.dir);
    try {
      const q = m.queue<string>("idem");
      const pre = await q.enqueue("held", { singletonKey: "s" });
      const item = (v: string, opts: Record<string, unknown>) => ({ value: Buffer.from(v), valueKind: 1 as const, opts });
      const items = [
        item("dup-of-held", { singletonKey: "s" }),
        item("t1", { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: 60_000 }),
        item("t2", { singletonKey: "t", singletonMode: "throttle", singletonWindowMs: 60_000 }),
        item("d1", { singletonKey: "d", singletonMode: "debounce" }),
        item("d2", { singletonKey: "d", singletonMode: "debounce" }),
        item("plain", {}),
      ];
      const identity = { producerId: 7, sequence: 0 };
      const answer = async () => {
        const r = await q.enqueueCalls(items, undefined, { identity });
        return "first" in r ? r : r.results;
      };
      const first = await answer();
      assert.ok(Array.isArray(first));
      const ids = first.map((r) => r!.id);
      assert.deepEqual(first[0], { id: pre.id, duplicate: true });
      assert.equal(first[1]!.duplicate, false);
      assert.deepEqual(first[2], { id: ids[1], duplicate: true });
      assert.deepEqual(first[3], { id: ids[4], duplicate: true }, "replaced within the request");
      assert.equal(first[4]!.duplicate, false);
      assert.equal(first[5]!.duplicate, false);
      const again = await answer();
      assert.deepEqual(
        (again as { id: string; duplicate: boolean }[]).map((r) => ({ id: r.id, duplicate: r.duplicate })),
        first.map((r) => ({ id: r!.id, duplicate: r!.duplicate })),
        "the retry gets the same ids",
      );
      assert.equal((await q.stats()).depth, 4, "held, t1, d2, plain: nothing stored twice");
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

test("an enqueue refused for room (QueueFullError) takes no singleton key and leaves the job it would replace waiting", async () => {
  const t = tempDir();
  try {
    const m = await open(t.dir);
    try {
      const q = m.queue<string>("full", { maxDepth: 1 });
      const d1 = await q.enqueue("d1", { singletonKey: "d", singletonMode: "debounce" });
      // Replacing needs room for the new job first: refused, d1 stays.
      await assert.rejects(q.enqueue("d2", { singletonKey: "d", singletonMode: "debounce" }), (e: unknown) => (e as { code?: string }).code === "QUEUE_FULL");
      assert.equal((await q.getJob(d1.id))?.state, "waiting", "the job it would have replaced waits again");
      await assert.rejects(q.enqueue("s1", { singletonKey: "s" }), (e: unknown) => (e as { code?: string }).code === "QUEUE_FULL");
      assert.deepEqual(await drain(m, "full", 1), ["d1"]);
      const s = await q.enqueue("s2", { singletonKey: "s" });
      assert.equal(s.duplicate, false, "the refused enqueue did not take the key");
      const d3 = await q.enqueue("d3", { singletonKey: "d", singletonMode: "debounce" }).catch((e: unknown) => e);
      assert.equal((d3 as { code?: string }).code, "QUEUE_FULL");
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

test("model: grants take the waiting key heads by priority (higher first), then enqueue order (JOB-1, KEY-1)", () => {
  const rand = rng(42);
  const st = new JobState(new JobTable(0));
  const consumer: LeaseConsumer = { consumerId: "c", codeVersion: undefined, leaseMs: 60_000, leaseLost: () => {} };
  type M = { off: number; prio: number; key: string | null; status: "waiting" | "inflight" | "done"; lease: DiskLease | null };
  const jobs: M[] = [];
  const now = 1_000;
  let grants = 0;
  for (let step = 0; step < 3000; step++) {
    const r = rand();
    if (r < 0.45) {
      const off = jobs.length;
      const prio = Math.floor(rand() * 10);
      const key = rand() < 0.4 ? `k${Math.floor(rand() * 3)}` : null;
      st.setPriority(off, prio);
      st.addJob(off, key, now, now, 1, now);
      jobs.push({ off, prio, key, status: "waiting", lease: null });
    } else if (r < 0.75) {
      const heads = new Map<string, M>();
      for (const j of jobs) if (j.key !== null && j.status !== "done" && !heads.has(j.key)) heads.set(j.key, j);
      const eligible = jobs.filter((j) => j.status === "waiting" && (j.key === null || heads.get(j.key) === j));
      eligible.sort((a, b) => b.prio - a.prio || a.off - b.off);
      const [[l]] = st.grant([{ consumer, upTo: st.heldBy(consumer) + 1 }], 1e9, now, now);
      assert.equal(l?.off ?? -1, eligible[0]?.off ?? -1, `step ${step}: the best waiting key head is granted`);
      if (l !== undefined) {
        jobs[l.off].status = "inflight";
        jobs[l.off].lease = l;
        grants++;
      }
    } else {
      const inflight = jobs.filter((j) => j.status === "inflight");
      if (inflight.length === 0) continue;
      const j = inflight[Math.floor(rand() * inflight.length)];
      if (rand() < 0.6) {
        st.ack(j.lease!, now, now);
        j.status = "done";
      } else {
        st.retry(j.lease!, now, { at: now, attempt: j.lease!.attempt, consumer: "c", errorClass: "E", error: "" }, now);
        j.status = "waiting";
      }
      j.lease = null;
    }
  }
  assert.ok(grants > 500, `exercised (${grants} grants)`);
});
