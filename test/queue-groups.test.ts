// SPDX-License-Identifier: Apache-2.0
/**
 * Job groups at the engine level: across a power loss (recovered from the records and the
 * journal, no snapshot: the group of each job, a restored lease counting against its group's
 * cap, GRP-Q1), the snapshot's `groups` field, and a seeded model of the pure state
 * (job-state.ts + groups.ts): caps never exceeded by a grant, no group with room and READY jobs
 * passed over, priority order within a group, round-robin shares within a grant (GRP-Q2),
 * per-group windows, and memory back to nothing once every job settled.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { NodeFileSystem } from "../src/log/io.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { JobState } from "../src/store/disk/queues/job-state.js";
import type { DiskLease } from "../src/store/disk/queues/lease.js";
import { JobTable, St } from "../src/store/disk/queues/table.js";
import type { GrantRequest, Lease, LeaseConsumer } from "../src/store/queue-store.js";
import { nextJob, rng, TestQueues, tempDir } from "./fixtures/queue-helpers.js";

async function open(dir: string, fs = new NodeFileSystem()): Promise<TestQueues> {
  const engine = new DiskEngine({ dataDir: dir, fs });
  await engine.open();
  return new TestQueues(engine);
}

test("groups survive a power loss (from the records); a restored lease counts against its group's cap until it ends", async () => {
  const t = tempDir();
  try {
    const fs = new FaultyFileSystem();
    const config = { groupConcurrency: 1, visibilityTimeoutMs: 1500 };
    {
      const m = await open(t.dir, fs);
      const q = m.queue<string>("grp", config);
      await q.enqueueBatch([
        { data: "a1", group: "A" },
        { data: "a2", group: "A" },
        { data: "b1", group: "B" },
        { data: "u1" },
      ]);
      const w = q.work({ prefetch: 1 });
      assert.equal((await nextJob(w[Symbol.asyncIterator]())).data, "a1");
      // The process dies holding a1: nothing it does later reaches the disk.
      await fs.crash();
      await fs.powerLoss();
      await m.close().catch(() => {});
    }
    const m = await open(t.dir);
    try {
      const q = m.queue<string>("grp", config);
      const page = await q.browse();
      assert.deepEqual(
        page.jobs.map((j) => [j.data, j.group]),
        [
          ["a1", "A"],
          ["a2", "A"],
          ["b1", "B"],
          ["u1", undefined],
        ],
      );
      const w = q.work({ prefetch: 4 });
      const it = w[Symbol.asyncIterator]();
      const first = [(await nextJob(it)).data, (await nextJob(it)).data].sort();
      assert.deepEqual(first, ["b1", "u1"], "a2 waits: a1's restored lease holds group A's one slot");
      const again = await nextJob(it);
      assert.deepEqual([again.data, again.attempt], ["a1", 2], "a1 once its restored lease ran out, before a2");
      assert.equal((await q.stats()).waiting, 1);
      await again.ack();
      assert.equal((await nextJob(it)).data, "a2");
      await w.close();
    } finally {
      await m.close();
    }
  } finally {
    t.cleanup();
  }
});

test("the snapshot lists live grouped jobs (groups), and only when there are any", async () => {
  const t = tempDir();
  try {
    {
      const m = await open(t.dir);
      await m.queue<string>("g").enqueueBatch([{ data: "x", group: "X" }, { data: "y" }]);
      await m.queue<string>("plain").enqueue("p");
      await m.close();
    }
    const manifest = JSON.parse(readFileSync(join(t.dir, "queues", "queues.json"), "utf8")) as { queues: Record<string, { incarnation: string }> };
    const meta = (name: string): Record<string, unknown> => {
      const buf = readFileSync(join(t.dir, "queues", manifest.queues[name].incarnation, "snapshot.bin"));
      return JSON.parse(buf.toString("utf8", 12, 12 + buf.readUInt32LE(8))) as Record<string, unknown>;
    };
    assert.deepEqual(meta("g").groups, [[0, "X"]]);
    assert.equal("groups" in meta("plain"), false);
  } finally {
    t.cleanup();
  }
});

// ─────────────────────────────── model of the pure state ───────────────────────────────

class Consumer implements LeaseConsumer {
  readonly codeVersion = undefined;
  constructor(
    readonly consumerId: string,
    readonly leaseMs: number,
  ) {}
  leaseLost(_lease: Lease): void {}
}

interface MJob {
  off: number;
  group: string | null;
  key: string | null;
  prio: number;
  visibleAt: number;
  status: "waiting" | "inflight" | "done";
  lease: DiskLease | null;
}

/** The model rescans every job each step (quadratic): soak runs stop at 20,000 steps. */
const STEPS = Math.min(20_000, Number(process.env.SLUICE_FUZZ_ITERATIONS ?? 3000));

for (const seed of [1, 2, 3]) {
  test(`groups: grants respect caps, windows, priority within a group and round-robin shares (seed ${seed}, ${STEPS} steps)`, () => {
    const r = rng(seed);
    const st = new JobState(new JobTable(0));
    const consumers = [new Consumer("a", 100), new Consumer("b", 100)];
    const groups = ["g1", "g2", "g3", "g4"];
    const keys = ["k1", "k2"];
    let cap = 2;
    let rate: { max: number; durationMs: number } | null = null;
    st.configureGroups({ concurrency: cap, rate });
    const jobs: MJob[] = [];
    /** Monotonic start times per group (rate windows). */
    const starts = new Map<string, number[]>();
    let now = 1_000_000;
    let mono = 0;
    const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)];
    const inflight = (g: string | null): number => jobs.filter((j) => j.status === "inflight" && j.group === g).length;
    /** Waiting jobs that may be granted now (KEY-1: a key's first live job only). */
    const eligible = (): MJob[] => {
      const heads = new Set<string>();
      const out: MJob[] = [];
      for (const j of jobs) {
        if (j.status === "done") continue;
        if (j.key !== null) {
          if (heads.has(j.key)) continue;
          heads.add(j.key);
        }
        if (j.status === "waiting" && j.visibleAt <= now) out.push(j);
      }
      return out;
    };
    const roomOf = (g: string | null): number => {
      if (g === null) return Infinity;
      let room = cap > 0 ? cap - inflight(g) : Infinity;
      if (rate !== null) room = Math.min(room, rate.max - (starts.get(g) ?? []).filter((s) => s > mono - rate!.durationMs).length);
      return Math.max(0, room);
    };
    for (let step = 0; step < STEPS; step++) {
      const op = r();
      if (op < 0.3) {
        const group = r() < 0.8 ? pick(groups) : null;
        const key = r() < 0.2 ? pick(keys) : null;
        const prio = r() < 0.3 ? 1 + Math.floor(r() * 3) : 0;
        const off = jobs.length;
        st.setPriority(off, prio);
        if (group !== null) st.setGroup(off, group);
        const delay = r() < 0.2 ? 1 + Math.floor(r() * 20) : 0;
        st.addJob(off, key, now + delay, now, 10, now);
        jobs.push({ off, group, key, prio, visibleAt: now + delay, status: "waiting", lease: null });
      } else if (op < 0.4) {
        const dt = Math.floor(r() * 30);
        now += dt;
        mono += dt;
        st.promoteDue(now);
      } else if (op < 0.6) {
        st.promoteDue(now);
        const want = eligible();
        const byGroup = new Map<string | null, MJob[]>();
        for (const j of want) {
          const list = byGroup.get(j.group) ?? [];
          list.push(j);
          byGroup.set(j.group, list);
        }
        const roomBefore = new Map<string | null, number>();
        let grantable = 0;
        for (const [g, list] of byGroup) {
          roomBefore.set(g, roomOf(g));
          grantable += Math.min(list.length, roomOf(g));
        }
        const upTo = 1 + Math.floor(r() * 6);
        const reqs: GrantRequest[] = consumers.map((c) => ({ consumer: c, upTo: st.heldBy(c) + upTo }));
        const got = st.grant(reqs, 1000, now, mono).flat();
        // No group with room and an eligible job is passed over: exactly what can go, goes.
        assert.equal(got.length, Math.min(grantable, 2 * upTo), `step ${step}: granted ${got.length} of ${grantable} grantable (${JSON.stringify({ cap, rate, mono, groups: [...byGroup].map(([g, l]) => [g, l.length, roomBefore.get(g), inflight(g), starts.get(g ?? "")]), got: got.map((l) => jobs[l.off].group) })})`);
        const per = new Map<string | null, number>();
        for (const l of got) {
          const j = jobs[l.off];
          assert.equal(j.status, "waiting");
          assert.ok(want.includes(j), `step ${step}: job ${j.off} was eligible`);
          j.status = "inflight";
          j.lease = l;
          per.set(j.group, (per.get(j.group) ?? 0) + 1);
          if (j.group !== null && rate !== null) {
            const s = starts.get(j.group) ?? [];
            s.push(mono);
            starts.set(j.group, s);
          }
        }
        for (const [g, list] of byGroup) {
          const n = per.get(g) ?? 0;
          // GRP-Q1: never beyond the cap / window; within a group by (priority desc, offset).
          assert.ok(n <= roomBefore.get(g)!, `step ${step}: group ${g} got ${n}, room ${roomBefore.get(g)}`);
          const best = [...list].sort((x, y) => y.prio - x.prio || x.off - y.off).slice(0, n).map((j) => j.off);
          const given = got.filter((l) => jobs[l.off].group === g).map((l) => l.off);
          assert.deepEqual(given.sort((x, y) => x - y), best.sort((x, y) => x - y), `step ${step}: group ${g} gives its best jobs`);
        }
        // GRP-Q2: groups that could still have taken more got shares within one of each other.
        const unsated = [...byGroup.keys()].filter((g) => (per.get(g) ?? 0) < Math.min(byGroup.get(g)!.length, roomBefore.get(g)!));
        for (const g of unsated) for (const h of byGroup.keys()) assert.ok((per.get(h) ?? 0) <= (per.get(g) ?? 0) + 1, `step ${step}: ${h} got ${per.get(h)}, ${g} only ${per.get(g)}`);
      } else if (op < 0.85) {
        const held = jobs.filter((j) => j.status === "inflight");
        if (held.length === 0) continue;
        const j = pick(held);
        const l = st.current(j.lease!)!;
        const kind = r();
        if (kind < 0.5) {
          st.ack(l, now, mono);
          j.status = "done";
        } else if (kind < 0.7) {
          st.release(l, true, now);
          j.status = "waiting";
          j.visibleAt = now;
        } else if (kind < 0.85) {
          const delay = Math.floor(r() * 10);
          st.retry(l, now + delay, { at: now, attempt: l.attempt, consumer: "a", errorClass: "E", error: "" }, now);
          j.status = "waiting";
          j.visibleAt = now + delay;
        } else {
          st.expire(l, { at: now, attempt: l.attempt, consumer: "a", errorClass: "E", error: "" }, 1000, now);
          j.status = "waiting";
          j.visibleAt = now;
        }
        j.lease = null;
      } else if (op < 0.9) {
        // Limits change on the open queue: they apply to the next grant.
        cap = pick([0, 1, 2, 3]);
        const before = rate;
        // One window length (a shorter window forgets starts a longer one would count again).
        rate = r() < 0.5 ? null : { max: 1 + Math.floor(r() * 3), durationMs: 25 };
        // A limit set anew starts with empty windows; a changed one keeps what it counted.
        if (before === null || rate === null) starts.clear();
        st.configureGroups({ concurrency: cap, rate });
      } else if (op < 0.905) {
        st.purge();
        for (const j of jobs) if (j.status !== "done") Object.assign(j, { status: "done", lease: null });
      }
      assert.equal(st.leases.size, jobs.filter((j) => j.status === "inflight").length);
      assert.equal(st.counts[St.INFLIGHT], st.leases.size);
    }
    // Everything settles; then the groups are forgotten (memory bounded by live jobs).
    st.configureGroups({ concurrency: 0, rate: null });
    for (let round = 0; round < 10_000 && jobs.some((j) => j.status !== "done"); round++) {
      now += 50;
      mono += 50;
      st.promoteDue(now);
      for (const l of st.grant([{ consumer: consumers[0], upTo: 1000 }], 1000, now, mono).flat()) jobs[l.off].lease = l;
      for (const j of jobs) if (j.lease !== null && st.current(j.lease) !== null) {
        st.ack(st.current(j.lease)!, now, mono);
        j.status = "done";
        j.lease = null;
      }
    }
    assert.equal(st.live, 0, "every job settled");
    assert.equal(st.groups?.jobs ?? 0, 0, "no grouped job left");
    st.grant([{ consumer: consumers[0], upTo: 1 }], 1000, now + 1e6, mono + 1e6);
    assert.equal(st.groups?.size ?? 0, 0, "every group forgotten");
  });
}
