// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, job schedules of a queue (`upsertSchedule`, `listSchedules`,
 * `pauseSchedule`, `resumeSchedule`, `removeSchedule`): validation, ticks enqueuing jobs with
 * their schedule headers, pause / resume / remove, and durability across a restart without a
 * tick enqueued twice. Registered by `defineConformanceSuite` (conformance.ts), whose rules
 * they follow: short `everyMs` and waits on conditions with deadlines.
 */
import assert from "node:assert/strict";
import { NotFoundError, ValidationError } from "../errors.js";
import type { BrowsedJob, Queue, ScheduleOptions } from "../queues/types.js";
import type { Broker } from "../types.js";
import { uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueScheduleTests(t: DefineTest): void {
  t("queue schedules: upsert validates (cron, tz, everyMs, names) with ValidationError; list reports the definition", validation);
  t("queue schedules: everyMs ticks enqueue one job each with data, key, headers and the schedule headers, on the tick grid", ticksEnqueue);
  t("queue schedules: pause stops ticks, resume restarts them, remove ends them; unknown names are NotFoundError", pauseResumeRemove);
  t("queue schedules: an unchanged upsert keeps the schedule; a changed one keeps its last tick", upsertKeeps);
  t("queue schedules: schedules and their last tick survive a restart; no tick is enqueued twice", survivesRestart);
  t("queue schedules: deleteQueue removes the queue's schedules (no tick re-creates it)", deleteQueueRemoves);
}

/** Every job of the queue (browse pages), in id order. */
export async function allJobs<T>(q: Queue<T>): Promise<BrowsedJob<T>[]> {
  const out: BrowsedJob<T>[] = [];
  let after: string | undefined;
  for (;;) {
    const p = await q.browse({ limit: 1000, after });
    out.push(...p.jobs);
    if (p.next === null) return out;
    after = p.next;
  }
}

const tickOf = (j: BrowsedJob<unknown>): number => Number(j.headers["sluice-schedule-tick"]);

function assertUniqueTicks(jobs: BrowsedJob<unknown>[]): void {
  const ticks = jobs.map(tickOf);
  assert.equal(new Set(ticks).size, ticks.length, `a tick enqueued twice: ${ticks.join(",")}`);
}

async function validation(b: Broker): Promise<void> {
  const q = b.queue(uniq("sched-valid"));
  const bad: [string, ScheduleOptions, RegExp][] = [
    ["a", { cron: "61 * * * *" }, /invalid cron expression "61 \* \* \* \*": minute: 61 is outside 0-59/],
    ["a", { cron: "* * *" }, /expected 5 fields/],
    ["a", { cron: "0 9 * * *", tz: "Nowhere/Town" }, /unknown time zone "Nowhere\/Town"/],
    ["a", {}, /exactly one of cron or everyMs/],
    ["a", { cron: "* * * * *", everyMs: 1000 }, /exactly one of cron or everyMs/],
    ["a", { everyMs: 1 }, /everyMs must be an integer/],
    ["a", { everyMs: 1000, tz: "Europe/Berlin" }, /tz applies to cron schedules only/],
    ["a", { everyMs: 1000, catchUp: "all" as never }, /catchUp must be "skip" or "once"/],
    ["a", { everyMs: 1000, headers: { "sluice-x": "1" } }, /reserved/],
    ["a", { everyMs: 1000, headers: { "sluice-schedule-tick": "1" } }, /set by the schedule itself/],
    ["", { everyMs: 1000 }, /schedule name/],
  ];
  for (const [name, opts, re] of bad) {
    await assert.rejects(q.upsertSchedule(name, opts), (e: unknown) => e instanceof ValidationError && re.test(e.message), `${name} ${JSON.stringify(opts)}`);
  }
  assert.deepEqual(await q.listSchedules(), [], "nothing stored by a refused upsert");
  const before = Date.now();
  const info = await q.upsertSchedule("nightly", { cron: "0 3 * * *", tz: "Europe/Berlin", data: { report: true }, key: "k", headers: { team: "ops" }, delayMs: 5, catchUp: "once" });
  assert.equal(info.name, "nightly");
  assert.equal(info.cron, "0 3 * * *");
  assert.equal(info.everyMs, null);
  assert.equal(info.tz, "Europe/Berlin");
  assert.equal(info.catchUp, "once");
  assert.equal(info.paused, false);
  assert.deepEqual(info.data, { report: true });
  assert.equal(info.key, "k");
  assert.deepEqual(info.headers, { team: "ops" });
  assert.equal(info.delayMs, 5);
  assert.equal(info.lastRunAt, null);
  assert.ok(info.nextRunAt !== null && info.nextRunAt > before && info.nextRunAt <= before + 25 * 3_600_000, "next 03:00 Berlin within a day");
  const berlinHour = new Intl.DateTimeFormat("en-GB", { timeZone: "Europe/Berlin", hour: "numeric", hourCycle: "h23" }).format(new Date(info.nextRunAt as number));
  assert.equal(Number(berlinHour), 3);
  await q.upsertSchedule("every", { everyMs: 60_000, data: new Uint8Array([1, 2, 3]) });
  const list = await q.listSchedules();
  assert.deepEqual(list.map((s) => s.name), ["every", "nightly"], "by name");
  assert.deepEqual([...(list[0].data as Uint8Array)], [1, 2, 3]);
  assert.equal(list[0].catchUp, "skip", "the default");
  assert.equal(list[0].tz, "UTC");
  // Schedules belong to their queue.
  assert.deepEqual(await b.queue(uniq("sched-other")).listSchedules(), []);
  // A factory may hand out the same broker again: leave nothing ticking.
  assert.equal(await q.removeSchedule("every"), true);
  assert.equal(await q.removeSchedule("nightly"), true);
}

async function ticksEnqueue(b: Broker): Promise<void> {
  const q = b.queue<{ n: number }>(uniq("sched-ticks"));
  const info = await q.upsertSchedule("fast", { everyMs: 100, data: { n: 1 }, key: "sk", headers: { origin: "cron" } });
  const jobs = await waitUntil(async () => {
    const j = await allJobs(q);
    return j.length >= 4 ? j : null;
  }, "4 scheduled jobs");
  assertUniqueTicks(jobs);
  for (const j of jobs) {
    assert.deepEqual(j.data, { n: 1 });
    assert.equal(j.key, "sk");
    assert.equal(j.headers.origin, "cron");
    assert.equal(j.headers["sluice-schedule"], "fast");
    assert.equal(j.headers["sluice-schedule-ticks"], "1");
    const tick = tickOf(j);
    assert.ok(tick > info.createdAt && (tick - info.createdAt) % 100 === 0, `tick ${tick} on the grid from ${info.createdAt}`);
  }
  const ticks = jobs.map(tickOf).sort((x, y) => x - y);
  for (let i = 1; i < ticks.length; i++) assert.equal(ticks[i] - ticks[i - 1], 100, `consecutive ticks: ${ticks.join(",")}`);
  const listed = (await q.listSchedules())[0];
  assert.ok(listed.lastRunAt !== null && listed.lastRunAt >= ticks[ticks.length - 1] - 1000);
  assert.ok(listed.nextRunAt !== null && listed.nextRunAt > (listed.lastRunAt as number));
  // A worker receives them, with the schedule headers.
  const w = q.work({ prefetch: 1 });
  try {
    const it = w[Symbol.asyncIterator]();
    const r = await it.next();
    assert.equal(r.done, false);
    const job = r.value!;
    assert.equal(Buffer.from(job.headers["sluice-schedule"]).toString(), "fast");
    await job.ack();
  } finally {
    await w.close();
  }
  assert.equal(await q.removeSchedule("fast"), true);
}

async function pauseResumeRemove(b: Broker): Promise<void> {
  const q = b.queue(uniq("sched-pause"));
  await assert.rejects(q.pauseSchedule("nope"), (e: unknown) => e instanceof NotFoundError);
  await assert.rejects(q.resumeSchedule("nope"), (e: unknown) => e instanceof NotFoundError);
  assert.equal(await q.removeSchedule("nope"), false);
  await q.upsertSchedule("p", { everyMs: 50 });
  await waitUntil(async () => (await q.stats()).depth >= 2, "2 jobs before the pause");
  await q.pauseSchedule("p");
  await q.pauseSchedule("p"); // idempotent
  const info = (await q.listSchedules())[0];
  assert.equal(info.paused, true);
  assert.equal(info.nextRunAt, null);
  // Once pauseSchedule resolved no round is running: the count stays for 6 intervals.
  const frozen = (await q.stats()).depth;
  const until = Date.now() + 300;
  while (Date.now() < until) {
    assert.equal((await q.stats()).depth, frozen, "no job while paused");
    await new Promise((r) => setTimeout(r, 25));
  }
  const resumedAt = Date.now();
  await q.resumeSchedule("p");
  assert.equal((await q.listSchedules())[0].paused, false);
  await waitUntil(async () => (await q.stats()).depth >= frozen + 2, "jobs again after resume");
  const jobs = await allJobs(q);
  assertUniqueTicks(jobs);
  const paused = jobs.map(tickOf).filter((t) => t > info.lastRunAt! && t <= resumedAt - 1100);
  assert.deepEqual(paused, [], "no catch-up of ticks while paused");
  assert.equal(await q.removeSchedule("p"), true);
  assert.equal(await q.removeSchedule("p"), false);
  assert.deepEqual(await q.listSchedules(), []);
  const after = (await q.stats()).depth;
  const until2 = Date.now() + 200;
  while (Date.now() < until2) {
    assert.equal((await q.stats()).depth, after, "no job after remove");
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function upsertKeeps(b: Broker): Promise<void> {
  const q = b.queue(uniq("sched-upsert"));
  const a = await q.upsertSchedule("s", { everyMs: 100, data: "v1" });
  await waitUntil(async () => (await q.stats()).depth >= 2, "2 jobs");
  const same = await q.upsertSchedule("s", { everyMs: 100, data: "v1" });
  assert.equal(same.createdAt, a.createdAt);
  assert.equal(same.updatedAt, a.updatedAt, "an unchanged definition is not rewritten (the tick grid stays)");
  const changed = await q.upsertSchedule("s", { everyMs: 100, data: "v2" });
  assert.equal(changed.createdAt, a.createdAt);
  assert.ok(changed.updatedAt >= a.updatedAt);
  assert.ok(changed.lastRunAt !== null, "the last tick carries over");
  await waitUntil(async () => (await allJobs(q)).some((j) => j.data === "v2"), "a job with the new data");
  const jobs = await allJobs(q);
  assertUniqueTicks(jobs);
  const v1 = jobs.filter((j) => j.data === "v1").map(tickOf);
  const v2 = jobs.filter((j) => j.data === "v2").map(tickOf);
  assert.ok(Math.min(...v2) > Math.max(...v1), "ticks only move forward across an upsert");
  await q.removeSchedule("s");
}

async function survivesRestart(b0: Broker, kit: { reopen?: () => Promise<Broker> }): Promise<void> {
  if (kit.reopen === undefined) return;
  const name = uniq("sched-restart");
  let b = b0;
  await b.queue(name).upsertSchedule("r", { everyMs: 100, data: { r: 1 } });
  await waitUntil(async () => (await b.queue(name).stats()).depth >= 3, "3 jobs before the restart");
  b = await kit.reopen();
  const q = b.queue<{ r: number }>(name);
  const [info] = await q.listSchedules();
  assert.equal(info.name, "r");
  assert.deepEqual(info.data, { r: 1 });
  const before = (await q.stats()).depth;
  await waitUntil(async () => (await q.stats()).depth >= before + 3, "3 more jobs after the restart");
  assertUniqueTicks(await allJobs(q));
  await q.removeSchedule("r");
}

async function deleteQueueRemoves(b: Broker): Promise<void> {
  const name = uniq("sched-delete");
  const q = b.queue(name);
  await q.upsertSchedule("d", { everyMs: 50 });
  await waitUntil(async () => (await q.stats()).depth >= 1, "a tick");
  // Both brokers have it; the Broker interface does not name it.
  await (b as Broker & { deleteQueue(n: string): Promise<void> }).deleteQueue(name);
  assert.deepEqual(await b.queue(name).listSchedules(), []);
  const until = Date.now() + 300;
  while (Date.now() < until) {
    assert.ok(!(await b.listQueues()).includes(name), "not re-created by a tick");
    await new Promise((r) => setTimeout(r, 25));
  }
}
