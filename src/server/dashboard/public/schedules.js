// SPDX-License-Identifier: Apache-2.0
// Schedules: every queue's job schedules (cron or interval, time zone, catch-up, paused, next
// and last tick), read-only. The HTTP API has no route to change a schedule; clients and the
// CLI do that.
import { h, fill, table, seconds, time, empty } from "./format.js";
import { api, enc, errorLine, mapLimit } from "./api.js";
import { LIMITS } from "./poll.js";

/** One request per queue; fewer in flight than the poll uses, since this runs on top of it. */
const IN_FLIGHT = 4;

export function createSchedulesPage() {
  const el = h("section", { class: "page", "aria-label": "Schedules" });
  const list = h("div");
  fill(
    el,
    h("h2", null, "Schedules"),
    h(
      "p",
      { class: "hint" },
      "Each tick of a schedule enqueues one job into its queue. Every: the cron expression and the time zone it is evaluated in, or the interval. ",
      "Catch-up: what happens to ticks missed while the broker was down (skip: nothing; once: one job for all of them). Times are in this browser's time zone.",
    ),
    list,
  );
  /** The last read: queue → its schedules, plus the errors of that read; null before the first. */
  let read = null;
  let loading = false;
  let ctx = null;

  // Read only while the tab is shown: the shell calls render() for the visible page only (on
  // selection and after each poll), so a hidden Schedules tab sends nothing.
  const load = async () => {
    if (loading) return;
    const names = (ctx.state.queues ?? []).map((q) => q.name).slice(0, LIMITS.queues);
    loading = true;
    try {
      read = await readSchedules(names);
    } finally {
      loading = false;
    }
    draw();
  };

  function draw() {
    const { state } = ctx;
    if (state.queues === null) return fill(list, empty("Queues could not be read (see the error line above)."));
    if (read === null) return fill(list, h("p", { class: "hint" }, "Loading…"));
    const errors = read.errors.length === 0 ? null : h("p", { class: "error-line", id: "schedules-error" }, read.errors[0], read.errors.length > 1 ? ` (and ${read.errors.length - 1} more)` : "");
    const more = state.queueCount > LIMITS.queues ? h("p", { class: "hint" }, `Showing the schedules of the first ${LIMITS.queues} of ${state.queueCount} queues.`) : null;
    if (read.rows.length === 0) {
      return fill(
        list,
        errors,
        more,
        empty(
          "No job schedules.",
          'Create one from a client: queue.upsertSchedule("name", { cron: "*/5 * * * *", data }) (or { everyMs: 60000 }). `sluice queues schedules NAME` lists a queue\'s schedules.',
        ),
      );
    }
    const now = Date.now();
    const rows = read.rows.map(({ queue, s }) => ({
      attrs: { "data-queue": queue, "data-schedule": s.name, class: s.paused ? "paused" : null },
      cells: [queue, s.name, every(s), s.catchUp, { v: s.paused ? "paused" : "active", class: s.paused ? "state warn" : "state" }, { v: nextRun(s, now), class: "next-run" }, s.lastRunAt === null ? "not yet" : time(s.lastRunAt)],
    }));
    fill(list, errors, more, table(["Queue", "Schedule", "Every", "Catch-up", "State", "Next run", "Last run"], rows));
  }

  return {
    el,
    render(c) {
      ctx = c;
      draw();
      void load();
    },
  };
}

/** Every queue's schedules, in queue then schedule order; a queue deleted meanwhile is left out.
 * (Exported, like the two below, for test/dashboard-logic.test.ts.) */
export async function readSchedules(names) {
  const res = await mapLimit(names, IN_FLIGHT, (q) => api("GET", `/v1/queues/${enc(q)}/schedules`));
  const rows = [];
  const errors = [];
  let noRoute = false;
  res.forEach((r, i) => {
    if (r.ok) {
      for (const s of r.value.schedules ?? []) rows.push({ queue: names[i], s });
    } else if (r.error?.code === "NOT_FOUND") {
      // A server older than schedules answers every queue this way: say it once.
      noRoute = true;
    } else if (r.error?.code !== "QUEUE_NOT_FOUND") {
      errors.push(`${names[i]}: ${errorLine(r.error)}`);
    }
  });
  if (noRoute) errors.unshift("This server cannot list schedules (no GET /v1/queues/:queue/schedules route).");
  return { rows, errors };
}

/** The cron expression with its time zone, or the interval. */
export function every(s) {
  if (s.cron !== null && s.cron !== undefined) return `${s.cron} (${s.tz})`;
  if (s.everyMs < 1000) return `every ${s.everyMs} ms`;
  return `every ${seconds(s.everyMs / 1000)}`;
}

/** nextRunAt is null when paused or when the cron never matches again. */
export function nextRun(s, now) {
  if (s.nextRunAt === null || s.nextRunAt === undefined) return s.paused ? "— (paused)" : "never";
  const d = (s.nextRunAt - now) / 1000;
  return `${time(s.nextRunAt)} (${d > 0 ? `in ${seconds(d)}` : "due now"})`;
}
