// SPDX-License-Identifier: Apache-2.0
/**
 * The dashboard's browser-side arithmetic, run in Node (the modules are plain ES modules and
 * touch the DOM only when drawing): rates from the bounded history, and the alert checks.
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
