// SPDX-License-Identifier: Apache-2.0
/**
 * Crash-point enumeration (src/testing/crash-points.ts): a scripted workload (idempotent
 * producers across segment rolls, group commits, queue enqueue/ack/nack/dead-letter/redrive,
 * retention, close and reopen) is crashed at every I/O operation of a segment roll, a group
 * commit and one queue settle of each kind, and at a seeded sample of the others; after a
 * power loss (torn and reordered un-synced writes, un-synced directory entries lost) the
 * recovered broker must keep every acknowledged promise.
 *
 * SLUICE_CRASH_POINTS_BUDGET (default 120) sets how many crash points are tried (`npm run soak`
 * tries them all), SLUICE_CRASH_POINTS_SEED the seed, SLUICE_CRASH_POINTS_ONLY=k1,k2 re-runs
 * single crash points of a failure report.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { DEFAULT_EXHAUSTIVE_PHASES, formatCrashPointReport, runCrashPoints } from "../src/testing/index.js";

const SEED = Number(process.env.SLUICE_CRASH_POINTS_SEED ?? 1);
const BUDGET = process.env.SLUICE_CRASH_POINTS_BUDGET === "all" ? Infinity : Number(process.env.SLUICE_CRASH_POINTS_BUDGET ?? 120);
const ONLY = process.env.SLUICE_CRASH_POINTS_ONLY ? process.env.SLUICE_CRASH_POINTS_ONLY.split(",").map(Number) : undefined;

test("the crash-point workload is deterministic: the same seed issues the same I/O operations", async () => {
  const a = await runCrashPoints({ seed: SEED, only: [], includeTrace: true });
  const b = await runCrashPoints({ seed: SEED, only: [], includeTrace: true });
  assert.ok(a.totalOps > 300, `the workload does enough I/O (${a.totalOps} operations)`);
  assert.deepEqual(b.trace, a.trace);
  const phases = new Set(a.trace!.map((t) => t.phase));
  for (const p of DEFAULT_EXHAUSTIVE_PHASES) assert.ok(phases.has(p), `phase ${p} has I/O operations`);
  // The roll phase is one round of idempotent batches straddling a segment roll: it seals a
  // segment (fdatasync), creates the next, writes the producer snapshot, then writes the rest.
  const roll = a.trace!.filter((t) => t.phase === "roll");
  const kinds = roll.map((t) => `${t.kind} ${t.path.replace(/^.*\//, "")}`);
  assert.ok(kinds.some((k) => /^create \d{20}\.log$/.test(k)), `the roll creates a segment: ${kinds.join(", ")}`);
  assert.ok(kinds.some((k) => /^rename .*\.tmp$/.test(k)), "the roll writes the producer snapshot");
  assert.ok(/^write \d{20}\.log$/.test(kinds[kinds.length - 2]), "batches are written to the new segment after the roll");
  assert.deepEqual(a.notes, [], "the workload hit its marks (one roll in the roll phase, retention deleted segments)");
});

test(`crash points (seed ${SEED}, budget ${BUDGET}): every acknowledged promise survives a crash at any I/O operation`, { timeout: 1_800_000 }, async (t) => {
  const report = await runCrashPoints({ seed: SEED, budget: BUDGET, only: ONLY, log: (l) => t.diagnostic(l) });
  const text = formatCrashPointReport(report);
  console.log(text);
  if (ONLY === undefined) {
    for (const p of DEFAULT_EXHAUSTIVE_PHASES) {
      const ph = report.phases.find((x) => x.phase === p);
      assert.ok(ph && ph.ops > 0 && ph.tried === ph.ops, `phase ${p} enumerated exhaustively (${ph?.tried}/${ph?.ops})`);
    }
    // Exhaustive phases in full (and the operations right after them), the rest of the budget
    // sampled, plus a crash after the end.
    assert.equal(report.tried, Math.max(report.exhaustivePoints + 1, Math.min(BUDGET, report.totalOps + 1)), "crash points tried");
  }
  assert.ok(report.diverged <= Math.ceil(report.tried / 10), `the workload replays deterministically (${report.diverged} of ${report.tried} runs diverged)`);
  const summary = text.slice(text.indexOf("broken invariants:"), text.indexOf("\nFAIL"));
  assert.equal(report.failures.length, 0, `${report.failures.length} crash points broke an invariant (report above):\n${summary}`);
});
