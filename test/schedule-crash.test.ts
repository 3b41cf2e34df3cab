// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance: job schedules across crashes. A real `sluice serve` runs two `everyMs: 100`
 * schedules (catchUp "skip" and "once", each in its own queue) and is SIGKILLed and restarted
 * at random moments (SLUICE_SCHEDULE_KILLS, default 12) over well above 100 ticks. From the
 * jobs enqueued (their `sluice-schedule-tick` / `sluice-schedule-ticks` headers):
 * - no tick is enqueued twice, and every job's tick lies on the schedule's grid;
 * - "skip": every tick not enqueued lies in a downtime (from shortly before a kill to the
 *   restarted server answering), and ticks that were certainly more than 1 s overdue when the
 *   server came back are not enqueued; every job stands for one tick;
 * - "once": every job stands for exactly the ticks since the previous job (so each grid tick is
 *   covered exactly once), ticks not enqueued on time lie in a downtime, and a downtime with
 *   certainly-missed ticks got exactly one catch-up job.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import type { BrowsedJob, Queue } from "../src/queues/types.js";
import { allJobs } from "../src/testing/conformance-queue-schedules.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { GRACE_MS } from "../src/queues/schedules/scheduler.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const KILLS = Number(process.env.SLUICE_SCHEDULE_KILLS ?? 12);
const EVERY = 100;
/** A tick due this long before a kill may not have been planned or stored yet (timer, fsync). */
const BEFORE_KILL_MS = 300;

interface Downtime {
  kill: number;
  /** How long the test kept the server down (the restarted scheduler started after this). */
  down: number;
  ready: number;
}

const tick = (j: BrowsedJob<unknown>): number => Number(j.headers["sluice-schedule-tick"]);
const covers = (j: BrowsedJob<unknown>): number => Number(j.headers["sluice-schedule-ticks"]);

test(`sluice serve SIGKILLed x${KILLS} while everyMs schedules tick: no tick enqueued twice; missed ticks only in downtimes, as catchUp says`, { timeout: 60_000 + KILLS * 15_000 }, async (tc) => {
  using tmp = tempDir("sluice-sched-crash-");
  const args = (port: number): string[] => ["--data", tmp.dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const client = await connect({ url: server.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 100, requestTimeoutMs: 30_000 });
  const downtimes: Downtime[] = [];
  try {
    const skipQ: Queue<string> = client.queue<string>("sched-skip");
    const onceQ: Queue<string> = client.queue<string>("sched-once");
    const skipInfo = await skipQ.upsertSchedule("s", { everyMs: EVERY, data: "skip" });
    const onceInfo = await onceQ.upsertSchedule("o", { everyMs: EVERY, data: "once", catchUp: "once" });
    const started = Date.now();
    for (let k = 0; k < KILLS; k++) {
      // Running: at least one new job since the (re)start, then a random moment.
      const depth = (await skipQ.stats()).depth;
      await waitUntil(async () => (await skipQ.stats()).depth > depth, `a tick after restart ${k}`, 30_000);
      await new Promise((r) => setTimeout(r, Math.random() * 700));
      const kill = Date.now();
      server.proc.kill("SIGKILL");
      await server.exited;
      // Down: from nothing (the restart's own boot time) to well past GRACE_MS.
      const down = Math.random() < 0.3 ? 0 : Math.floor(Math.random() * 2500);
      await new Promise((r) => setTimeout(r, down));
      server = await spawnServer(args(port), { timeoutMs: 30_000 });
      downtimes.push({ kill, down, ready: Date.now() });
    }
    const d0 = (await skipQ.stats()).depth;
    await waitUntil(async () => (await skipQ.stats()).depth >= d0 + 3, "ticks after the last restart", 30_000);
    // Paused (durable) so the job set is final when read.
    await skipQ.pauseSchedule("s");
    await onceQ.pauseSchedule("o");
    const elapsedTicks = Math.floor((Date.now() - started) / EVERY);
    assert.ok(elapsedTicks >= 100, `ran over ${elapsedTicks} ticks (want >= 100)`);

    const inDowntime = (t: number): boolean => downtimes.some((d) => t >= d.kill - BEFORE_KILL_MS && t <= d.ready);
    /** Ticks certainly more than GRACE_MS overdue when the restarted scheduler started. */
    const certainlyMissed = (d: Downtime, t: number): boolean => t > d.kill + EVERY && t < d.kill + d.down - GRACE_MS - EVERY;
    const problems: string[] = [];

    for (const [label, q, anchor] of [
      ["skip", skipQ, skipInfo.createdAt],
      ["once", onceQ, onceInfo.createdAt],
    ] as const) {
      const jobs = (await allJobs(q)).sort((a, b) => tick(a) - tick(b));
      const ticks = jobs.map(tick);
      const span = Math.round((ticks[ticks.length - 1] - anchor) / EVERY);
      tc.diagnostic(`${label}: ${jobs.length} jobs over ${span} ticks, ${jobs.filter((j) => covers(j) > 1).length} catch-up jobs; downtimes ${downtimes.map((d) => d.ready - d.kill).join(",")} ms`);
      assert.ok(jobs.length >= 50, `${label}: ${jobs.length} jobs`);
      const seen = new Set<number>();
      for (const t of ticks) {
        if (seen.has(t)) problems.push(`${label}: tick ${t} enqueued twice`);
        seen.add(t);
        if ((t - anchor) % EVERY !== 0 || t <= anchor) problems.push(`${label}: tick ${t} is off the grid from ${anchor}`);
      }
      let prev = anchor;
      for (const j of jobs) {
        const t = tick(j);
        const n = covers(j);
        const gap = Math.round((t - prev) / EVERY);
        if (label === "skip" && n !== 1) problems.push(`skip: job for tick ${t} stands for ${n} ticks`);
        if (label === "once" && n !== gap) problems.push(`once: job for tick ${t} stands for ${n} ticks, ${gap} since the previous job`);
        // Grid ticks between the previous job and this one were not enqueued on their own.
        for (let m = prev + EVERY; m < t; m += EVERY) if (!inDowntime(m)) problems.push(`${label}: tick ${m} missed outside any downtime`);
        prev = t;
      }
      for (const d of downtimes) {
        const missed: number[] = [];
        for (let m = anchor + EVERY; m <= d.ready; m += EVERY) if (certainlyMissed(d, m)) missed.push(m);
        if (missed.length === 0) continue;
        if (label === "skip") {
          for (const m of missed) if (seen.has(m)) problems.push(`skip: tick ${m}, > ${GRACE_MS} ms overdue at the restart, was enqueued`);
        } else {
          // The one catch-up job: the first job after the kill covering these ticks.
          const catchUps = jobs.filter((j) => covers(j) > 1 && tick(j) - (covers(j) - 1) * EVERY <= missed[0] && tick(j) >= missed[missed.length - 1]);
          if (catchUps.length !== 1) problems.push(`once: downtime at ${d.kill} (${d.down} ms) has ${catchUps.length} catch-up jobs covering ${missed.length} missed ticks`);
        }
      }
    }
    assert.deepEqual(problems.slice(0, 20), [], `${problems.length} problems`);
  } finally {
    await client.close();
    server.proc.kill("SIGKILL");
    await server.exited;
  }
});
