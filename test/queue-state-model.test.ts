// SPDX-License-Identifier: Apache-2.0
/**
 * Model test of the disk queue's pure state transitions (src/store/disk/queues/job-state.ts):
 * seeded random sequences of enqueues (keyed, delayed), clock steps, grants to several
 * consumers with caps, acks, retries, releases (counted or not), lease expiries, dead-letter
 * moves and purges, checked after every step against a plain model (one record per job) and
 * the structural invariants: TBL-1 (rows below the floor are terminal), KEY-1 (only a key's
 * head is deliverable, at most one in flight), the per-status counts, the heaps, the leases
 * (exactly the INFLIGHT rows) and the per-consumer lease counts that cap grants, and the
 * retained outcomes: an acked job's result is there until its retention passes,
 * never for a job that was not acked (purged, waiting, in flight), dead-lettered jobs as dead.
 *
 * SLUICE_FUZZ_ITERATIONS scales the number of steps (npm run soak).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { AttemptRecord } from "../src/queues/types.js";
import type { Lease, LeaseConsumer } from "../src/store/queue-store.js";
import { JobState } from "../src/store/disk/queues/job-state.js";
import type { DiskLease } from "../src/store/disk/queues/lease.js";
import { JobTable, St } from "../src/store/disk/queues/table.js";
import { rng } from "./fixtures/queue-helpers.js";

const STEPS = Number(process.env.SLUICE_FUZZ_ITERATIONS ?? 4000);
const MAX_ATTEMPTS = 3;
const MAX_IN_FLIGHT = 6;
/** Short enough that outcomes expire within a run (clock steps are up to 40 ms). */
const RETENTION_MS = 500;

type MStatus = "waiting" | "inflight" | "moving" | "done" | "dead";

interface MJob {
  off: number;
  key: string | null;
  visibleAt: number;
  size: number;
  attempts: number;
  status: MStatus;
  lease: DiskLease | null;
  consumer: Consumer | null;
  /** Set when acked (result JSON text or null) or dead-lettered, with the time. */
  outcome: { state: "completed" | "dead"; at: number; result: string | null } | null;
}

class Consumer implements LeaseConsumer {
  readonly codeVersion = undefined;
  readonly lost: Lease[] = [];
  constructor(
    readonly consumerId: string,
    readonly leaseMs: number,
    public cap: number,
  ) {}
  leaseLost(lease: Lease): void {
    this.lost.push(lease);
  }
}

function record(l: DiskLease, at: number): AttemptRecord {
  return { at, attempt: l.attempt, consumer: l.consumerId, errorClass: "E", error: "" };
}

/** The model's jobs that may be granted now, in the order the queue grants them (offset). */
function eligible(jobs: MJob[], now: number): MJob[] {
  const heads = new Set<string>();
  const out: MJob[] = [];
  for (const j of jobs) {
    if (j.status === "done" || j.status === "dead") continue;
    if (j.key !== null) {
      if (heads.has(j.key)) continue;
      heads.add(j.key);
    }
    if (j.status === "waiting" && j.visibleAt <= now) out.push(j);
  }
  return out;
}

function check(st: JobState, jobs: MJob[], consumers: Consumer[], now: number): void {
  const t = st.table;
  // TBL-1: one row per offset in [floor, end); everything below the floor is terminal.
  for (const j of jobs) {
    if (!t.has(j.off)) {
      assert.ok(j.status === "done" || j.status === "dead", `job ${j.off} below the floor is ${j.status}`);
      continue;
    }
    const s = t.status[t.idx(j.off)];
    const want: Record<MStatus, number[]> = {
      waiting: [St.READY, St.DELAYED, St.BLOCKED],
      inflight: [St.INFLIGHT],
      moving: [St.MOVING],
      done: [St.DONE],
      dead: [St.DEAD],
    };
    assert.ok(want[j.status].includes(s), `job ${j.off}: model ${j.status}, table ${s}`);
    assert.equal(t.attempts[t.idx(j.off)], j.attempts, `job ${j.off} attempts`);
  }
  // Counts, depth and bytes.
  const counts = new Map<number, number>();
  let live = 0;
  let bytes = 0;
  t.forEachLive((o, i) => {
    counts.set(t.status[i], (counts.get(t.status[i]) ?? 0) + 1);
    live++;
    bytes += t.size[i];
  });
  for (const s of [St.READY, St.DELAYED, St.INFLIGHT, St.BLOCKED, St.MOVING]) assert.equal(st.counts[s], counts.get(s) ?? 0, `count of status ${s}`);
  assert.equal(st.live, live);
  assert.equal(st.liveBytes, bytes);
  // KEY-1: per key, only the head may be anything but BLOCKED; at most one in flight.
  const seen = new Set<string>();
  for (const j of jobs) {
    if (j.key === null || j.status === "done" || j.status === "dead") continue;
    const s = t.status[t.idx(j.off)];
    if (seen.has(j.key)) assert.equal(s, St.BLOCKED, `job ${j.off} behind its key's head is blocked`);
    else assert.notEqual(s, St.BLOCKED, `key ${j.key}: its head ${j.off} is not blocked`);
    seen.add(j.key);
  }
  // Leases are exactly the INFLIGHT rows; per-consumer counts cap grants.
  assert.equal(st.leases.size, st.counts[St.INFLIGHT]);
  for (const [off, l] of st.leases) assert.equal(t.status[t.idx(off)], St.INFLIGHT);
  for (const c of consumers) assert.equal(st.heldBy(c), jobs.filter((j) => j.status === "inflight" && j.consumer === c).length, `${c.consumerId} lease count`);
  // Every READY row can be popped from the ready heap, every DELAYED one is in the delay heap.
  assert.ok(st.ready.size >= st.counts[St.READY]);
  assert.ok(st.delayed.size >= st.counts[St.DELAYED]);
  for (const j of jobs) if (j.status === "waiting" && t.status[t.idx(j.off)] === St.READY) assert.ok(j.visibleAt <= now, `job ${j.off} is READY only once visible`);
  // Retained outcomes: exactly the acked / dead-lettered jobs within their retention.
  for (const j of jobs) {
    const kept = st.retained.get(j.off, now);
    const o = j.outcome;
    if (o === null || o.at + RETENTION_MS <= now) {
      assert.equal(kept, undefined, `job ${j.off} (${j.status}) has no retained outcome`);
      continue;
    }
    assert.ok(kept, `job ${j.off}: its ${o.state} outcome is retained`);
    assert.equal(kept.state, o.state);
    assert.equal(kept.result, o.result ?? undefined, `job ${j.off} result`);
  }
}

for (const seed of [1, 2, 3]) {
  test(`job-state transitions match the model (seed ${seed}, ${STEPS} steps)`, () => {
    const r = rng(seed);
    const st = new JobState(new JobTable(0));
    st.retained.retentionMs = RETENTION_MS;
    const jobs: MJob[] = [];
    const consumers = [new Consumer("a", 100, 2), new Consumer("b", 250, 4), new Consumer("c", 50, 1)];
    let now = 1_000_000;
    let mono = 0;
    let next = 0;
    const keys = ["k1", "k2", "k3"];
    const live = (status: MStatus): MJob[] => jobs.filter((j) => j.status === status);
    const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)];
    for (let step = 0; step < STEPS; step++) {
      const op = r();
      if (op < 0.25) {
        const key = r() < 0.5 ? pick(keys) : null;
        const delay = r() < 0.3 ? Math.floor(r() * 50) + 1 : 0;
        const size = 1 + Math.floor(r() * 100);
        st.addJob(next, key, now + delay, now, size, now);
        jobs.push({ off: next, key, visibleAt: now + delay, size, attempts: 0, status: "waiting", lease: null, consumer: null, outcome: null });
        next++;
      } else if (op < 0.35) {
        const dt = Math.floor(r() * 40);
        now += dt;
        mono += dt;
        st.promoteDue(now);
      } else if (op < 0.5) {
        for (const c of consumers) c.cap = 1 + Math.floor(r() * 4);
        const reqs = consumers.filter(() => r() < 0.8).map((c) => ({ consumer: c, upTo: c.cap }));
        st.promoteDue(now);
        const want = eligible(jobs, now);
        let room = 0;
        for (const q of reqs) room += Math.max(0, q.upTo - st.heldBy(q.consumer));
        const n = Math.min(want.length, room, Math.max(0, MAX_IN_FLIGHT - st.leases.size));
        const got = st.grant(reqs, MAX_IN_FLIGHT, now, mono);
        const granted = got.flat().map((l) => l.off).sort((a, b) => a - b);
        assert.deepEqual(granted, want.slice(0, n).map((j) => j.off), `step ${step}: the lowest eligible offsets are granted`);
        got.forEach((ls, k) => {
          for (const l of ls) {
            const j = jobs[l.off];
            j.status = "inflight";
            j.attempts++;
            j.lease = l;
            j.consumer = reqs[k].consumer;
            assert.equal(l.attempt, j.attempts);
          }
        });
      } else if (op < 0.85) {
        const held = live("inflight");
        if (held.length === 0) continue;
        const j = pick(held);
        const l = st.current(j.lease!)!;
        assert.ok(l, "the current lease is found by its object");
        const kind = r();
        if (kind < 0.4) {
          const result = r() < 0.5 ? JSON.stringify({ off: j.off, step }) : null;
          st.ack(l, now, mono, result ?? undefined);
          j.status = "done";
          j.outcome = { state: "completed", at: now, result };
        } else if (kind < 0.6) {
          const delay = Math.floor(r() * 30);
          st.retry(l, now + delay, record(l, now), now);
          j.status = "waiting";
          j.visibleAt = now + delay;
        } else if (kind < 0.75) {
          const counted = r() < 0.5;
          st.release(l, counted, now);
          if (!counted) j.attempts--;
          j.status = "waiting";
          j.visibleAt = now;
        } else if (kind < 0.9) {
          if (st.expire(l, record(l, now), MAX_ATTEMPTS, now)) {
            st.startMove(j.off, { at: now, attempts: j.attempts, errorClass: "E", error: "", history: [] });
            j.status = "moving";
          } else {
            j.status = "waiting";
            j.visibleAt = now;
          }
        } else {
          st.endLease(l);
          st.startMove(j.off, { at: now, attempts: j.attempts, errorClass: "E", error: "", history: [] });
          j.status = "moving";
        }
        assert.equal(st.current(l), null, "a lease that ended is stale");
        j.lease = null;
        j.consumer = null;
      } else if (op < 0.95) {
        const moving = live("moving");
        if (moving.length === 0) continue;
        const j = pick(moving);
        assert.equal(st.finishMove(j.off, now), true);
        j.status = "dead";
        j.outcome = { state: "dead", at: now, result: null };
      } else if (op < 0.96) {
        const { purged, leases } = st.purge();
        let n = 0;
        for (const j of jobs) {
          if (j.status === "done" || j.status === "dead") continue;
          if (j.status === "inflight") assert.ok(leases.includes(j.lease!), `purge ends the lease of ${j.off}`);
          j.status = "done";
          j.lease = null;
          j.consumer = null;
          n++;
        }
        assert.equal(purged, n);
      }
      check(st, jobs, consumers, now);
    }
    // Everything settles: grant and ack until the model is empty.
    for (let round = 0; round < 10_000 && jobs.some((j) => j.status !== "done" && j.status !== "dead"); round++) {
      now += 100;
      mono += 100;
      st.promoteDue(now);
      for (const j of live("moving")) {
        st.finishMove(j.off, now);
        j.status = "dead";
        j.outcome = { state: "dead", at: now, result: null };
      }
      for (const l of st.grant(consumers.map((c) => ({ consumer: c, upTo: 10 })), 1000, now, mono).flat()) {
        jobs[l.off].attempts++;
        st.ack(l, now, mono);
        jobs[l.off].status = "done";
        jobs[l.off].outcome = { state: "completed", at: now, result: null };
      }
      for (const j of live("inflight")) {
        st.ack(st.current(j.lease!)!, now, mono);
        j.status = "done";
        j.outcome = { state: "completed", at: now, result: null };
      }
      check(st, jobs, consumers, now);
    }
    assert.equal(st.live, 0, "every job settled");
    assert.equal(st.table.rows, 0, "the floor reached the end: memory back to nothing");
  });
}
