// SPDX-License-Identifier: Apache-2.0
/**
 * The capacity run reports sane numbers for small, fast steps: publish latency is measured,
 * depth and the oldest record's age grow when the dependency is slow and concurrency low (or
 * one hot key funnels the records to one member), and storage grows with the record size.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { capacityRun, formatCapacityReport, type CapacityStep } from "../src/testing/capacity-run.js";
import { ValidationError } from "../src/errors.js";

const base = { ratePerSec: 200, recordBytes: 100, concurrency: 4, dependencyLatencyMs: 0, durationMs: 800 };
const steps: CapacityStep[] = [
  { name: "fast", ...base },
  { name: "slow dependency", ...base, concurrency: 1, dependencyLatencyMs: 20 },
  { name: "large records", ...base, recordBytes: 2000 },
  { name: "even keys", ...base, dependencyLatencyMs: 12 },
  { name: "hot key", ...base, dependencyLatencyMs: 12, hotKeyShare: 0.9 },
];

test("capacity run: latency, depth, age, redeliveries and storage per step", async () => {
  let handled = 0;
  const result = await capacityRun({ steps, handler: async () => void handled++, partitions: 4 });
  const report = formatCapacityReport(result);
  const [fast, slow, large, even, hot] = result.steps;
  const why = `\n${report}`;
  for (const r of result.steps) {
    assert.ok(r.published >= 0.8 * base.ratePerSec * (base.durationMs / 1000), `${r.step.name}: published ${r.published}${why}`);
    assert.equal(r.publishErrors, 0);
    assert.ok(r.publishLatencyMs.p50 > 0 && r.publishLatencyMs.p99 >= r.publishLatencyMs.p50 && r.publishLatencyMs.max >= r.publishLatencyMs.p99, `${r.step.name}: latency${why}`);
    assert.ok(r.depth.peak >= r.depth.end && r.oldestAgeMs.peak >= r.oldestAgeMs.end, `${r.step.name}: peaks${why}`);
    assert.ok(Number.isInteger(r.redeliveries) && r.redeliveries >= 0);
    assert.ok(r.consumed > 0 && r.consumed <= r.published, `${r.step.name}: consumed ${r.consumed}${why}`);
    assert.ok(r.storage.logBytes >= r.published * r.step.recordBytes, `${r.step.name}: log bytes${why}`);
    assert.ok(r.storage.dataDirGrowth > 0, `${r.step.name}: the data dir grew${why}`);
  }
  assert.ok(handled > 0, "the user's handler ran");
  // 20 ms per record on one member: at most 50/s of 200/s; the fast step keeps up.
  assert.ok(slow.depth.end > 50 && slow.depth.end > fast.depth.end, `depth grows with a slow dependency${why}`);
  assert.ok(slow.oldestAgeMs.end > 200 && slow.oldestAgeMs.end > fast.oldestAgeMs.end, `the oldest record ages${why}`);
  assert.ok(slow.timeToDrainMs !== null && slow.timeToDrainMs > 500, `the backlog takes time to drain${why}`);
  assert.ok(large.storage.logBytes > 5 * fast.storage.logBytes, `storage grows with the record size${why}`);
  // Even keys: ~50/s per member at 12 ms (0.6 s of work per second). One hot key: ~180/s on
  // one member (2 s of work per second).
  assert.ok(hot.depth.end > 30 && hot.depth.end > even.depth.end, `a hot key concentrates the backlog${why}`);
  for (const name of ["fast", "slow dependency", "large records", "hot key", "pub p50/p99 ms", "depth end/peak", "oldest age end/peak"]) assert.ok(report.includes(name), name);
});

test("capacity run: limits are checked before anything runs", async () => {
  await assert.rejects(capacityRun({ steps: [] }), ValidationError);
  await assert.rejects(capacityRun({ steps: [{ ...base, durationMs: 120_000 }] }), ValidationError);
  await assert.rejects(capacityRun({ steps: [{ ...base, ratePerSec: 50_000, durationMs: 60_000 }] }), /at most/);
  await assert.rejects(capacityRun({ steps: [{ ...base, hotKeyShare: 2 }] }), ValidationError);
});
