// SPDX-License-Identifier: Apache-2.0
/**
 * The Scheduler (src/queues/schedules/scheduler.ts) on an in-memory schedule store and a fake
 * enqueue: pending ticks re-enqueued on start with their dedupe ids, catch-up "once" and "skip"
 * for a cron after downtime, a failing enqueue retried, the document durable before the
 * enqueue (SCHED-1), one timer for all schedules (none after close), a damaged document.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { NewJob } from "../src/store/queue-store.js";
import type { ScheduleStore, StoredSchedule } from "../src/store/schedule-store.js";
import { GRACE_MS, RETRY_MS, Scheduler } from "../src/queues/schedules/scheduler.js";
import { buildSchedule } from "../src/queues/schedules/spec.js";
import { StorageError } from "../src/errors.js";
import { waitUntil } from "../src/testing/helpers.js";

class MemStore implements ScheduleStore {
  doc: StoredSchedule[] = [];
  saves = 0;
  fail: Error | null = null;
  async load(): Promise<StoredSchedule[]> {
    if (this.fail) throw this.fail;
    return structuredClone(this.doc);
  }
  async save(all: readonly StoredSchedule[]): Promise<void> {
    this.saves++;
    this.doc = structuredClone([...all]);
  }
}

interface Enqueued {
  queue: string;
  dedupeId: string | null;
  tick: number;
  ticks: number;
  /** The stored document's pending ticks when the enqueue ran. */
  pendingAtEnqueue: number[];
}

function host(store: MemStore, out: Enqueued[], failFirst = 0) {
  let failures = failFirst;
  return {
    async enqueueTicks(queue: string, make: (max: number, now: number) => NewJob[]): Promise<void> {
      if (failures-- > 0) throw new StorageError("disk on fire");
      const pendingAtEnqueue = store.doc.flatMap((s) => s.pending.map(([t]) => t));
      for (const j of make(1 << 20, Date.now())) {
        const h = new Map((j.record.headers ?? []).map(([k, v]) => [k, v.toString()]));
        out.push({ queue, dedupeId: j.dedupeId, tick: Number(h.get("sluice-schedule-tick")), ticks: Number(h.get("sluice-schedule-ticks")), pendingAtEnqueue });
      }
    },
  };
}

function stored(opts: Parameters<typeof buildSchedule>[2], at: number, patch: Partial<StoredSchedule> = {}): StoredSchedule {
  return { ...buildSchedule("q", "s", opts, at, 1 << 20), ...patch };
}

test("scheduler: a pending tick is enqueued again on start with the same dedupe id, then the schedule goes on", async () => {
  const store = new MemStore();
  const now = Date.now();
  const anchor = now - 30_000;
  // Crashed 20 s ago while enqueuing tick anchor + 9900 (it may or may not have been stored).
  store.doc = [stored({ everyMs: 100 }, anchor, { lastTick: anchor + 9800, pending: [[anchor + 9900, 1]] })];
  const out: Enqueued[] = [];
  const s = new Scheduler(store, host(store, out));
  await s.start();
  await waitUntil(() => out.length >= 3, "the pending tick and later ones");
  await s.close();
  assert.equal(out[0].tick, anchor + 9900);
  assert.equal(out[0].dedupeId, `sys:sch:s:${anchor + 9900}`);
  assert.equal(out[0].ticks, 1);
  // Ticks after it up to now - GRACE_MS were missed (skip): none of them is enqueued.
  for (const e of out.slice(1)) assert.ok(e.tick > now - GRACE_MS, `tick ${e.tick} was missed, yet enqueued`);
  assert.equal(new Set(out.map((e) => e.tick)).size, out.length);
  assert.deepEqual(store.doc[0].pending, [], "a clean close leaves nothing pending");
  assert.equal(store.doc[0].lastTick, out[out.length - 1].tick);
});

test("scheduler: catchUp once after downtime enqueues one job for all missed cron ticks; skip enqueues none of them", async () => {
  for (const catchUp of ["once", "skip"] as const) {
    const store = new MemStore();
    const now = Date.now();
    const since = Math.floor(now / 1000) * 1000 - 20_000;
    store.doc = [stored({ cron: "* * * * * *", catchUp }, since, { lastTick: since })];
    const out: Enqueued[] = [];
    const s = new Scheduler(store, host(store, out));
    await s.start();
    await waitUntil(() => out.some((e) => e.tick > now), `a tick after the start (${catchUp})`);
    await s.close();
    const missed = out.filter((e) => e.tick <= now - GRACE_MS);
    if (catchUp === "once") {
      assert.equal(missed.length, 1, "one catch-up job");
      assert.equal(missed[0].ticks, (missed[0].tick - since) / 1000, "standing for every missed tick");
      assert.ok(missed[0].ticks >= 18);
    } else {
      assert.deepEqual(missed, [], "missed ticks skipped");
    }
    for (const e of out) assert.equal(e.tick % 1000, 0, "every-second cron ticks");
    for (const e of out.slice(catchUp === "once" ? 1 : 0)) assert.equal(e.ticks, 1);
    assert.equal(new Set(out.map((e) => e.tick)).size, out.length);
  }
});

test("scheduler: ticks are durable as pending before their enqueue (SCHED-1); a failing enqueue is retried with the same ticks", async () => {
  const store = new MemStore();
  const out: Enqueued[] = [];
  const s = new Scheduler(store, host(store, out, 2));
  await s.start();
  const info = await s.upsert("q", "s", { everyMs: 50 }, 1 << 20);
  assert.equal(store.doc.length, 1, "durable before upsert resolved");
  assert.equal(store.doc[0].name, "s");
  const t0 = Date.now();
  await waitUntil(() => out.length >= 3, "ticks after two failed attempts", 10_000);
  assert.ok(Date.now() - t0 >= 2 * RETRY_MS - 100, "retried every RETRY_MS");
  await s.close();
  for (const e of out) assert.ok(e.pendingAtEnqueue.includes(e.tick), `tick ${e.tick} was pending in the stored document when enqueued`);
  assert.equal(out[0].tick, info.createdAt + 50, "the failed tick is the one that went through first");
  assert.equal(new Set(out.map((e) => e.tick)).size, out.length);
});

test("scheduler: one unref'd timer for all schedules, none after close; paused schedules arm nothing", async () => {
  // Live timers created while the scheduler works (the test itself creates none meanwhile).
  const live = new Set<NodeJS.Timeout>();
  const realSet = globalThis.setTimeout;
  const realClear = globalThis.clearTimeout;
  globalThis.setTimeout = ((fn: () => void, ms?: number) => {
    const t: NodeJS.Timeout = realSet(() => {
      live.delete(t);
      fn();
    }, ms);
    live.add(t);
    return t;
  }) as typeof setTimeout;
  globalThis.clearTimeout = ((t: NodeJS.Timeout) => {
    live.delete(t);
    realClear(t);
  }) as typeof clearTimeout;
  try {
    const store = new MemStore();
    const s = new Scheduler(store, host(store, []));
    await s.start();
    assert.equal(live.size, 0);
    for (let i = 0; i < 50; i++) await s.upsert("q", `s${i}`, { everyMs: 3_600_000 + i }, 1 << 20);
    await s.upsert("q2", "cron", { cron: "0 0 1 1 *" }, 1 << 20);
    assert.equal(live.size, 1, "one timer");
    for (const t of live) assert.equal(t.hasRef(), false, "unref'd: it does not keep the process alive");
    for (let i = 0; i < 50; i++) await s.pause("q", `s${i}`);
    await s.pause("q2", "cron");
    assert.equal(live.size, 0, "nothing to wait for");
    await s.resume("q2", "cron");
    assert.equal(live.size, 1);
    await s.close();
    assert.equal(live.size, 0, "cleared on close");
    assert.equal((await s.list("q").catch((e: Error) => e.name)) as unknown, "BrokerClosedError");
  } finally {
    globalThis.setTimeout = realSet;
    globalThis.clearTimeout = realClear;
  }
});

test("scheduler: a damaged document keeps the broker up; schedule calls report StorageError", async () => {
  const store = new MemStore();
  store.fail = new StorageError("metadata file schedules.json is damaged");
  const s = new Scheduler(store, host(store, []));
  await s.start();
  await assert.rejects(s.list("q"), (e: unknown) => e instanceof StorageError && /schedules are unavailable: metadata file/.test((e as Error).message));
  await s.close();
});
