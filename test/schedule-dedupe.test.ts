// SPDX-License-Identifier: Apache-2.0
// SCHED-2 in the disk engine's dedupe table: one remembered tick per schedule, older ticks of
// it answered as duplicates, with the queue's dedupeWindowMs 0.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DedupeTable } from "../src/store/disk/queues/dedupe.js";

const entry = (off: number) => ({ off, exp: Date.now() + 60_000, wait: null, idx: 0 });

test("dedupe: schedule ticks keep one entry per schedule; older ticks are duplicates of the latest", () => {
  const d = new DedupeTable(0);
  assert.ok(d.window("sys:sch:a:100") > 0, "remembered with the queue's window 0");
  d.set("sys:sch:a:100", entry(1));
  d.set("sys:sch:a:200", entry(2));
  d.set("sys:sch:a:300", entry(3));
  d.set("sys:sch:b:x:150", entry(4)); // a name with a colon
  assert.equal(d.size, 2, "only the latest tick of each schedule is kept");
  assert.equal(d.get("sys:sch:a:100")?.off, 3, "an older tick counts as stored");
  assert.equal(d.get("sys:sch:a:300")?.off, 3);
  assert.equal(d.get("sys:sch:a:400"), undefined, "a later tick is new");
  assert.equal(d.get("sys:sch:b:x:150")?.off, 4);
  assert.equal(d.get("sys:sch:b:x:100")?.off, 4);
  assert.equal(d.get("sys:sch:c:1"), undefined);
  // Recovery out of order keeps the later tick.
  d.set("sys:sch:a:250", entry(9));
  assert.equal(d.get("sys:sch:a:300")?.off, 3);
  assert.equal(d.size, 2);
  // A latest tick still being appended is not an answer for older ones.
  d.set("sys:sch:a:500", { off: -1, exp: Date.now() + 60_000, wait: {} as never, idx: 0 });
  assert.equal(d.get("sys:sch:a:400"), undefined);
});
