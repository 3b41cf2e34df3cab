// SPDX-License-Identifier: Apache-2.0
/**
 * A tight polling loop over an embedded broker's calls that can complete without waiting (a
 * fetch at the log end, a fetch of the live tail served by a synchronous read, offsets, topic
 * descriptions, lag) must still let timers and I/O run (src/turn-yield.ts): the loop's
 * `stop` flag is set by a timer, and the loop must see it. A performance.now() guard (it needs
 * no event loop) ends a loop that starves the timer, so a regression fails instead of hanging.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { tempDir } from "../src/testing/helpers.js";

/** Runs `call` in a tight loop until a 50 ms timer stops it; returns whether the timer did. */
async function pollUntilTimer(call: () => Promise<unknown>): Promise<{ byTimer: boolean; ms: number; calls: number }> {
  let stop = false;
  const timer = setTimeout(() => (stop = true), 50);
  const t0 = performance.now();
  const guard = t0 + 5000;
  let calls = 0;
  while (!stop && performance.now() < guard) {
    await call();
    calls++;
  }
  clearTimeout(timer);
  return { byTimer: stop, ms: performance.now() - t0, calls };
}

test("polling loops over embedded calls with a synchronous fast path let timers run", async () => {
  const tmp = tempDir("sluice-poll-");
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("t", { partitions: 2 });
    await b.publishBatch("t", Array.from({ length: 100 }, (_, i) => ({ value: `v${i}`, partition: 0 })));
    const q = b.queue("jobs");
    await q.enqueue({ n: 1 });
    const cases: [string, () => Promise<unknown>][] = [
      ["fetch at the log end", () => b.fetch("t", 0, 100)],
      ["fetch of the live tail (synchronous read)", () => b.fetch("t", 0, 90)],
      ["fetch of an empty partition", () => b.fetch("t", 1, 0)],
      ["describeTopic", () => b.describeTopic("t")],
      ["listTopics", () => b.listTopics()],
      ["offsetForTimestamp", () => b.offsetForTimestamp("t", 1, 0)],
      ["groupLag", () => b.groupLag("g", "t")],
      ["resetGroup dry run", () => b.resetGroup("g", "t", "earliest", { dryRun: true })],
      ["queue stats", () => q.stats()],
    ];
    for (const [what, call] of cases) {
      const r = await pollUntilTimer(call);
      assert.ok(r.byTimer, `${what}: the 50 ms timer never ran during ${r.ms.toFixed(0)} ms (${r.calls} calls)`);
      assert.ok(r.ms < 2000, `${what}: stopped after ${r.ms.toFixed(0)} ms`);
    }
  } finally {
    await b.close();
    tmp.cleanup();
  }
});
