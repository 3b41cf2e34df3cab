// SPDX-License-Identifier: Apache-2.0
/**
 * The dashboard's browser-side arithmetic, run in Node (the modules are plain ES modules and
 * touch the DOM only when drawing): rates from the bounded history, the alert checks, and how
 * the Schedules page reads and words schedules.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath, pathToFileURL } from "node:url";

const PUBLIC = fileURLToPath(new URL("../../src/server/dashboard/public/", import.meta.url));
const load = async (f: string): Promise<any> => import(pathToFileURL(PUBLIC + f).href);

test("history: bounded, aligned per key; rates over a window; no rate when a value goes down", async () => {
  const { History } = await load("history.js");
  const h = new History(5);
  for (let i = 0; i < 8; i++) h.push(100 + 2 * i, { a: 10 * i, ...(i >= 6 ? { b: 1 } : {}) });
  assert.equal(h.t.length, 5, "bounded");
  assert.deepEqual(h.data(["a", "b"]), [[106, 108, 110, 112, 114], [30, 40, 50, 60, 70], [null, null, null, 1, 1]]);
  assert.equal(h.rate("a", 10), 5, "10 per 2 s");
  assert.equal(h.rate("b", 10), 0);
  assert.equal(h.rate("missing", 10), null);
  h.push(116, { a: 0, b: 1 }); // re-created topic: the counter went down
  assert.equal(h.rate("a", 10), null);
  assert.equal(h.rose("b", 10), false);
  h.push(118, { a: 0, b: 2 });
  assert.equal(h.rose("b", 10), true);
  assert.equal(h.rose("b", 1), false, "outside the window");
  for (let i = 0; i < 5; i++) h.push(120 + i, { a: 1 });
  assert.equal(h.series.has("b"), false, "a key absent for the whole window leaves");
});

test("alert checks: thresholds of the shipped rules; dead letters firing only when seen growing", async () => {
  const { evaluate, THRESHOLDS } = await load("alerts.js");
  const { hist } = await load("poll.js");
  assert.equal(THRESHOLDS.queueOldestWaitingS, 300);
  assert.equal(THRESHOLDS.groupLagS, 300);
  const queue = (name: string, o: object) => ({ name, depth: 0, deadLettered: 0, oldestWaitingAgeMs: 0, ...o });
  const state = (deadLettered: number) => ({
    queues: [queue("emails", { oldestWaitingAgeMs: 301_000, deadLettered }), queue("emails.dlq", { depth: deadLettered }), queue("thumbs", { oldestWaitingAgeMs: 300_000 })],
    groups: [{ group: "billing", topic: "orders", maxLagMs: 600_000 }, { group: "search", topic: "orders", maxLagMs: 0 }],
  });
  const firing = (s: object) => evaluate(s).filter((a: { firing: boolean }) => a.firing).map((a: { rule: string; subject: string }) => `${a.rule} ${a.subject}`);
  hist.queueDeadLettered.push(1000, { emails: 1 });
  hist.queueDepth.push(1000, { "emails.dlq": 1 });
  assert.deepEqual(firing(state(1)), ["queue-oldest-waiting queue emails", "group-lag group billing on orders"], "no growth seen yet: dead letters quiet");
  hist.queueDeadLettered.push(1002, { emails: 2 });
  hist.queueDepth.push(1002, { "emails.dlq": 2 });
  assert.deepEqual(firing(state(2)).slice(2), ["dlq-growing queue emails", "dlq-growing dead-letter queue emails.dlq"]);
  hist.queueDeadLettered.push(1002 + 901, { emails: 2 });
  hist.queueDepth.push(1002 + 901, { "emails.dlq": 2 });
  assert.deepEqual(firing(state(2)).slice(2), [], "quiet again 15 minutes after the last growth");
});

test("schedules: read per queue (a deleted queue left out, an old server said once, other errors per queue); wording", async () => {
  const { readSchedules, every, nextRun } = await load("schedules.js");
  const reply = (status: number, body: object): Response => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
  const err = (status: number, code: string, message: string): Response => reply(status, { error: { code, message } });
  const s = (name: string): object => ({ name, cron: null, everyMs: 1000, tz: "UTC", catchUp: "skip", paused: false, nextRunAt: 1, lastRunAt: null });
  const asked: string[] = [];
  const realFetch = globalThis.fetch;
  globalThis.fetch = (async (path: string) => {
    asked.push(path);
    const q = decodeURIComponent(path.split("/")[3]);
    if (q === "a b") return reply(200, { schedules: [s("x"), s("y")] });
    if (q === "gone") return err(404, "QUEUE_NOT_FOUND", `queue "gone" does not exist`);
    if (q === "broken") return err(500, "STORAGE_FAULT", "disk said no");
    return reply(200, { schedules: [] });
  }) as typeof fetch;
  try {
    const r = await readSchedules(["a b", "gone", "broken", "empty"]);
    assert.deepEqual(asked, ["/v1/queues/a%20b/schedules", "/v1/queues/gone/schedules", "/v1/queues/broken/schedules", "/v1/queues/empty/schedules"]);
    assert.deepEqual(r.rows.map((x: { queue: string; s: { name: string } }) => `${x.queue}/${x.s.name}`), ["a b/x", "a b/y"]);
    assert.deepEqual(r.errors, ["broken: STORAGE_FAULT: disk said no"]);
    globalThis.fetch = (async () => err(404, "NOT_FOUND", "no route")) as typeof fetch;
    assert.deepEqual((await readSchedules(["a", "b"])).errors, ["This server cannot list schedules (no GET /v1/queues/:queue/schedules route)."]);
  } finally {
    globalThis.fetch = realFetch;
  }
  assert.equal(every({ cron: "*/5 * * * *", everyMs: null, tz: "Asia/Tokyo" }), "*/5 * * * * (Asia/Tokyo)");
  assert.equal(every({ cron: null, everyMs: 250, tz: "UTC" }), "every 250 ms");
  assert.equal(every({ cron: null, everyMs: 90_000, tz: "UTC" }), "every 1 m 30 s");
  assert.equal(nextRun({ paused: true, nextRunAt: null }, 0), "— (paused)");
  assert.equal(nextRun({ paused: false, nextRunAt: null }, 0), "never", "a cron that never matches again");
  assert.match(nextRun({ paused: false, nextRunAt: 1_000_000 }, 1_000_000 - 42_000), / \(in 42 s\)$/);
  assert.match(nextRun({ paused: false, nextRunAt: 1_000_000 }, 1_000_500), / \(due now\)$/);
});

test("topics: compaction and archive figures, worded per partition; none for topics they do not concern", async () => {
  const s = await load("storage.js");
  const plain = { name: "plain", partitions: [{ partition: 0, highWatermark: 5 }] };
  assert.equal(s.isCompacted(plain), false);
  assert.equal(s.isArchived(plain), false);
  assert.deepEqual(s.cleanerRows(plain, 0), []);
  assert.deepEqual(s.archiveRows(plain, () => null), []);
  const now = Date.UTC(2026, 0, 1, 12, 0, 0);
  const table = {
    name: "table",
    partitions: [
      { partition: 0, cleanerDirtyRatio: 0.25, bytesReclaimed: 3 * 1024 * 1024, cleanerPasses: 4, lastCleanedAt: now - 90_000, cleanerPassProgress: null },
      { partition: 1, cleanerDirtyRatio: 1, bytesReclaimed: 0, cleanerPasses: 0, lastCleanedAt: null, cleanerPassProgress: 0.375 },
    ],
  };
  assert.equal(s.isCompacted(table), true);
  const text = (rows: { cells: { v: string }[] }[]): string[][] => rows.map((r) => r.cells.map((c) => c.v));
  const { time } = await load("format.js");
  assert.deepEqual(text(s.cleanerRows(table, now)), [
    ["0", "25 %", "3 MiB", "4", `${time(now - 90_000)} (1 m 30 s ago)`, "idle"],
    ["1", "100 %", "0 B", "0", "none since the broker started", "running, 38 % done"],
  ]);
  assert.deepEqual(s.cleanerRows(table, now)[1].attrs, { "data-partition": 1 });
  const cold = {
    name: "cold",
    partitions: [
      { partition: 0, archivedBytes: 22 * 1024, archivedSegments: 6, archiveStartOffset: 0, archiveLagBytes: 0, archiveReadBytes: 1536 },
      { partition: 1, archivedBytes: 0, archivedSegments: 0, archiveStartOffset: null, archiveLagBytes: 8 * 1024 * 1024, archiveReadBytes: 0 },
    ],
  };
  const rates = new Map([[0, 2048]]);
  const rows = s.archiveRows(cold, (p: number) => rates.get(p) ?? null);
  assert.deepEqual(text(rows), [
    ["0", "0", "22 KiB", "6", "0 B", "1.5 KiB", "2 KiB/s"],
    ["1", "none", "0 B", "0", "8 MiB", "0 B", "—"],
  ]);
  assert.match(rows[1].cells[4].class, /\bwarn\b/, "bytes waiting to be archived are highlighted");
  assert.doesNotMatch(rows[0].cells[4].class, /\bwarn\b/);
});
