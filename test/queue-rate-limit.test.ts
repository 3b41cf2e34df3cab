// SPDX-License-Identifier: Apache-2.0
// Queue rate limit (RATE-1): the window (rate-limit.ts) and its accuracy with 8 workers in two
// client processes of one `sluice serve`. Give-backs (`job.retryAfter`, RATE-2) across a power loss.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import { RateLimiter } from "../src/store/disk/queues/rate-limit.js";
import { openBroker } from "../src/index.js";
import { CountingEngine } from "../src/testing/counting-engine.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { NodeFileSystem } from "../src/log/io.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { iter, nextJob, TestQueues } from "./fixtures/queue-helpers.js";
import { JobState } from "../src/store/disk/queues/job-state.js";
import { JobTable } from "../src/store/disk/queues/table.js";
import { replay } from "../src/store/disk/queues/recovery.js";
import { Ev, type JournalEvent } from "../src/store/disk/queues/events.js";
import { journalEvent } from "../src/store/disk/queues/event-reader.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CHILD = fileURLToPath(new URL("./fixtures/rate-limit-child.js", import.meta.url));

test("RateLimiter: at most max grants in any window; rounds leave it durationMs after they were counted", () => {
  const r = new RateLimiter(5, 100);
  assert.equal(r.nextOpening(), Infinity);
  assert.equal(r.room(0), 5);
  r.take(3, 0);
  r.take(2, 40);
  assert.equal(r.room(40), 0);
  assert.equal(r.nextOpening(), 100);
  assert.equal(r.room(99.9), 0);
  assert.equal(r.room(100), 3, "the first round left the window");
  r.take(3, 100);
  assert.equal(r.room(139), 0);
  assert.equal(r.nextOpening(), 140);
  assert.equal(r.room(140), 2);
  r.configure({ max: 10, durationMs: 100 });
  assert.equal(r.room(140), 7, "a raised limit applies at once, counted grants stay");
  assert.equal(r.room(1000), 10);
  // Many rounds: the log is compacted and stays exact.
  const big = new RateLimiter(1_000_000, 1000);
  for (let t = 0; t < 5000; t++) big.take(1, t);
  assert.equal(big.room(4999), 1_000_000 - 1000);
});

test("rate limit: workers waiting for the window do not poll (a handful of grant calls per window)", async () => {
  using tmp = tempDir("sluice-rate-idle-");
  const engine = new CountingEngine(new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem() }));
  const broker = await openBroker({ engine });
  try {
    const q = broker.queue<number>("slow", { rateLimit: { max: 1, durationMs: 500 } });
    await q.enqueueBatch([{ data: 1 }, { data: 2 }, { data: 3 }]);
    const before = engine.calls.get("queues.grant") ?? 0;
    let started = 0;
    const ac = new AbortController();
    const run = q.process(
      () => {
        if (++started === 3) ac.abort();
      },
      { concurrency: 4, signal: ac.signal },
    );
    await waitUntil(() => started === 3, "three windows passed", 10_000);
    await run;
    const grants = (engine.calls.get("queues.grant") ?? 0) - before;
    // One round per wake-up and per settlement, roughly: far from a polling loop's thousands.
    assert.ok(grants <= 20, `${grants} grant calls over about a second`);
  } finally {
    await broker.close();
  }
});

test("rate limit accuracy: 8 workers in 2 client processes start max jobs per window (within 5%)", { timeout: 60_000 }, async (t) => {
  using tmp = tempDir("sluice-rate-");
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--log-level", "warn"]);
  const children: ChildProcess[] = [];
  const starts: number[] = [];
  const max = 50;
  const durationMs = 500;
  const windows = 8;
  const total = max * windows;
  try {
    const admin = await connect({ url: server.url });
    const q = admin.queue<number>("limited", { rateLimit: { max, durationMs } });
    await q.enqueueBatch(Array.from({ length: total }, (_, i) => ({ data: i })));
    let ready = 0;
    for (let c = 0; c < 2; c++) {
      const child = spawn(process.execPath, [CHILD, server.url, "limited", "4", String(max), String(durationMs)], { stdio: ["pipe", "pipe", "inherit"] });
      children.push(child);
      let buf = "";
      child.stdout!.on("data", (d: Buffer) => {
        buf += d.toString();
        let i: number;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line === "READY") ready++;
          else if (line.startsWith("S ")) starts.push(Number(line.slice(2)));
        }
      });
    }
    await waitUntil(() => ready === 2, "both client processes run their workers", 15_000);
    await waitUntil(() => starts.length >= total, `all ${total} jobs started`, 30_000);
    await waitUntil(async () => (await q.stats()).completed === total, "every job completed");
    assert.equal(starts.length, total, "no job started twice");
    starts.sort((a, b) => a - b);
    // Starts come in bursts at each window's opening: count them in windows centred on the
    // bursts (half a window either side absorbs the hand-out's jitter).
    const t0 = starts[0] - durationMs / 2;
    const perWindow = new Array<number>(windows + 2).fill(0);
    for (const t of starts) perWindow[Math.floor((t - t0) / durationMs)]++;
    const used = perWindow.filter((n) => n > 0);
    assert.equal(used.length, windows, `${windows} windows' worth of starts: ${perWindow.join(",")}`);
    for (const n of used) assert.ok(Math.abs(n - max) <= max * 0.05, `a window started ${n} jobs, limit ${max}: ${perWindow.join(",")}`);
    t.diagnostic(`limit ${max} per ${durationMs} ms; starts per window: ${used.join(", ")} (worst ${Math.max(...used.map((n) => Math.abs(n - max) / max)) * 100}% off)`);
    await admin.close();
  } finally {
    for (const c of children) c.stdin!.end();
    await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once("exit", r)))));
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});

async function openQueues(dir: string, fs = new NodeFileSystem()): Promise<TestQueues> {
  const engine = new DiskEngine({ dataDir: dir, fs });
  await engine.open();
  return new TestQueues(engine);
}

test("retryAfter: a durable give-back survives a power loss (replayed from the journal); later deliveries are never lowered", async () => {
  using tmp = tempDir("sluice-give-back-");
  const fs = new FaultyFileSystem();
  let aId = "";
  {
    const m = await openQueues(tmp.dir, fs);
    const q = m.queue<string>("gb", { maxAttempts: 5 });
    aId = (await q.enqueue("a")).id;
    await q.enqueue("b");
    const w = q.work({ prefetch: 1 });
    const it = iter(w);
    // a: delivered (1), given back, delivered (1) again, nacked (1 counted), delivered (2), given back: 1 counted.
    let job = await nextJob(it);
    assert.equal(job.data, "a");
    await job.retryAfter(0);
    job = await nextJob(it);
    assert.equal([job.data, job.attempt].join(), "a,1");
    await job.nack({ delayMs: 0 });
    job = await nextJob(it);
    assert.equal([job.data, job.attempt].join(), "a,2");
    await job.retryAfter(60_000);
    // b: delivered (1) and given back: nothing counted.
    job = await nextJob(it);
    assert.equal([job.data, job.attempt].join(), "b,1");
    await job.retryAfter(0);
    job = await nextJob(it);
    assert.equal([job.data, job.attempt].join(), "b,1");
    // Not visible before the worker closed (its lookahead would lease it again meanwhile).
    await job.retryAfter(300);
    await w.close();
    await fs.powerLoss();
  }
  const m = await openQueues(tmp.dir);
  try {
    const q = m.queue<string>("gb");
    const w = q.work({ prefetch: 1 });
    const it = iter(w);
    const job = await nextJob(it);
    assert.equal([job.data, job.attempt].join(), "b,1", "b's give-backs were replayed; a waits for its minute");
    await job.ack();
    assert.equal((await q.stats()).delayed, 1);
    const a = await q.getJob(aId);
    assert.equal(a?.state, "delayed");
    assert.equal(a?.attempts, 1, "a: the nacked delivery counts, the given-back ones do not");
    await w.close();
  } finally {
    await m.close();
  }
});

test("GIVE_BACK replay (RATE-2): lowers the count only while the given-back delivery is the latest; replaying twice changes nothing more", () => {
  const st = new JobState(new JobTable(0));
  st.addJob(0, null, 0, 0, 1, 0);
  const t = st.table;
  const leases = new Map();
  const ev = (type: Ev, attempt: number, time = 0): JournalEvent => ({ type, offset: 0, attempt, time, data: undefined });
  const attempts = (): number => t.attempts[t.idx(0)];
  replay(st, ev(Ev.DELIVER, 1, 9e12), leases);
  replay(st, ev(Ev.GIVE_BACK, 0, 5), leases);
  assert.equal(attempts(), 0);
  assert.equal(leases.size, 0, "the lease ended");
  replay(st, ev(Ev.GIVE_BACK, 0, 5), leases);
  assert.equal(attempts(), 0, "idempotent");
  replay(st, ev(Ev.DELIVER, 1, 9e12), leases);
  replay(st, ev(Ev.NACK, 1, 6), leases);
  replay(st, ev(Ev.DELIVER, 2, 9e12), leases);
  // A stale give-back of delivery 1 (already reflected) never lowers delivery 2's count.
  replay(st, ev(Ev.GIVE_BACK, 0, 5), leases);
  assert.equal(attempts(), 2);
  replay(st, ev(Ev.GIVE_BACK, 1, 7), leases);
  assert.equal(attempts(), 1);
  // queue.events() reports a give-back as `released` with the delivery's number and retryAt.
  assert.deepEqual(journalEvent(ev(Ev.GIVE_BACK, 1, 7), 3), { position: "", at: 3, jobId: "0", type: "released", attempt: 2, retryAt: 7 });
});
