// SPDX-License-Identifier: Apache-2.0
/**
 * Crash-point enumeration: runs a scripted, deterministic workload (crash-workload.ts) against
 * an embedded broker on a FaultyFileSystem with the crash model, counts its I/O operations
 * (every call that changes or syncs state), and for every operation index k (or a seeded
 * sample) runs it again, freezing the file system at k: that operation and every later one
 * throws, so the abandoned broker can not write after the crash. Then a power loss keeps a
 * seeded subset of the un-synced writes (torn and reordered, at sector granularity) and undoes
 * a seeded suffix of the directory operations not made durable by a directory fsync, a broker
 * is reopened on the same data dir with a fresh file system, and the invariants are checked
 * (crash-check.ts):
 *
 *  - the broker opens at all (recovery never throws on any crash state);
 *  - every acknowledged record is at its acknowledged offset with its content; offsets are
 *    contiguous from the log start; every record read is one the workload sent, once; an offset
 *    read once always holds the same record;
 *  - producer state matches the log: a retry of a stored batch is a duplicate with its offset,
 *    a batch that is not in the log is stored fresh (never answered as a duplicate), the next
 *    new sequence is accepted;
 *  - committed group offsets are never below an acknowledged commit, never beyond any commit
 *    issued, never beyond the log end;
 *  - every acknowledged enqueue is still there (or settled), an acknowledged ack is never
 *    delivered again, an acknowledged dead-letter is in the DLQ (or redriven), attempts never
 *    go back, an acknowledged redrive is in its target; no job is in two places;
 *  - the log start never goes back behind acknowledged retention, never beyond what it deleted.
 *
 * One crash point is run by crash-run.ts. While the workload runs, `performance.now()` is a
 * virtual clock that advances by 1 ms per counted I/O operation (so rate- and
 * lease-dependent behaviour, e.g. preallocation, is a function of the seed) and `Date.now()`
 * a virtual wall clock that only moves when the workload sleeps (so a nack delay can not
 * expire between two steps on a slow machine); while the recovered broker is checked
 * `Date.now()` runs `clockSkewMs` ahead (a reboot that took that long: restored leases and
 * short delays are due, so every job can be drained). All are restored afterwards. Not safe
 * to run concurrently with other code in the same process that depends on those clocks.
 */
import type { Problem } from "./crash-check.js";
import { Runner, type RunOut, type TraceOp } from "./crash-run.js";
import { DEFAULT_EXHAUSTIVE_PHASES } from "./crash-workload.js";
import { prng, type PowerLossMode, type PowerLossReport } from "./faulty-fs.js";

export { DEFAULT_EXHAUSTIVE_PHASES, type Problem };

export interface CrashPointOptions {
  /** Seeds the workload (sizes, contents, shapes), the sample and every power loss. Default 1. */
  seed?: number;
  /**
   * Crash points to try. The exhaustive phases are always enumerated in full; the rest of the
   * budget is a seeded sample of the other operations (Infinity: all of them). Default 120.
   */
  budget?: number;
  /** Phases whose every operation is a crash point. Default DEFAULT_EXHAUSTIVE_PHASES. */
  exhaustive?: string[];
  /**
   * Also enumerate this many operations after each exhaustive phase (whatever phase they belong
   * to): a crash right after an acknowledgement is where "acknowledged before durable" shows.
   * Default 3.
   */
  exhaustiveTail?: number;
  /**
   * Extra event-loop turns (0..jitter, seeded) before each I/O call completes, so concurrent
   * chains interleave differently for each seed (see CrashModelOptions.jitter). Default 2; 0:
   * every call completes in call order.
   */
  jitter?: number;
  /** Try only these crash points (re-running a failure from its seed and k). */
  only?: number[];
  /** Stop sampling (not the exhaustive phases) once this much time has passed. */
  timeLimitMs?: number;
  /** Parent of the scratch data dirs. Default $SLUICE_TEST_TMP or the OS temp dir. */
  tmpDir?: string;
  /** Keep the data dirs of failing crash points (after the recovery check) for inspection. */
  keepFailedDirs?: boolean;
  /** Force one power-loss mode for every crash point (default: seeded per crash point). */
  powerLossMode?: PowerLossMode;
  /** How far `Date.now()` runs ahead while the recovered broker is checked. Default 1 hour. */
  clockSkewMs?: number;
  /** mkdir is durable in its parent (FS-2: FileSystem.mkdir fsyncs new directories into their parents). Default true; false models the contract before FS-2. */
  durableMkdir?: boolean;
  /** Progress lines. */
  log?: (line: string) => void;
  /** Put the dry run's operations (index, phase, kind, path) in the report. */
  includeTrace?: boolean;
  /** Put every crash point's result (not only failures) in the report. */
  includeResults?: boolean;
}

export interface CrashPointResult {
  k: number;
  phase: string;
  /** The operation at k, as in the dry run ("kind path"). */
  op: string;
  powerLoss: PowerLossMode;
  problems: Problem[];
  notes: string[];
  /** Set when this run's operations before k differed from the dry run's (not deterministic). */
  diverged: string | null;
  ms: number;
  dataDir?: string;
  /** What the power loss did (only kept for failures). */
  powerLossReport?: PowerLossReport | null;
}

export interface PhaseReport {
  phase: string;
  /** Operations of the workload in this phase (crash points). */
  ops: number;
  tried: number;
  failed: number;
  exhaustive: boolean;
}

export interface CrashPointReport {
  seed: number;
  /** Counted I/O operations of the whole workload (crash points 0 .. totalOps - 1; totalOps = after the end). */
  totalOps: number;
  tried: number;
  phases: PhaseReport[];
  failures: CrashPointResult[];
  diverged: number;
  /** Crash points enumerated exhaustively (the exhaustive phases and the operations right after them). */
  exhaustivePoints: number;
  durationMs: number;
  stoppedByTimeLimit: boolean;
  /** Facts about the dry run (e.g. where the roll happened). */
  notes: string[];
  /** With `includeTrace`: the dry run's operations; crash point k freezes the file system at trace[k]. */
  trace?: { k: number; phase: string; kind: string; path: string }[];
  /** With `includeResults`: every crash point tried. */
  results?: CrashPointResult[];
}

/** Per phase: its crash points, how many were tried and failed; and the failures and results. */
class Tally {
  readonly phases: PhaseReport[] = [];
  private readonly phaseOf = new Map<string, PhaseReport>();
  readonly failures: CrashPointResult[] = [];
  readonly results: CrashPointResult[] = [];
  tried = 0;
  diverged = 0;

  constructor(
    private readonly seed: number,
    private readonly trace: TraceOp[],
    exhaustive: Set<string>,
    private readonly includeResults: boolean,
    private readonly log: (line: string) => void,
  ) {
    for (const t of [...trace, { kind: "", path: "", phase: "end" }]) {
      let p = this.phaseOf.get(t.phase);
      if (!p) {
        this.phases.push((p = { phase: t.phase, ops: 0, tried: 0, failed: 0, exhaustive: exhaustive.has(t.phase) }));
        this.phaseOf.set(t.phase, p);
      }
      p.ops++;
    }
  }

  account(r: CrashPointResult): void {
    // Attributed to the dry run's phase of k (a run that diverged may have been elsewhere).
    r.phase = r.k < this.trace.length ? this.trace[r.k].phase : "end";
    this.tried++;
    if (this.includeResults) {
      const { k, phase, op, powerLoss, problems, notes, diverged, ms, dataDir } = r;
      this.results.push({ k, phase, op, powerLoss, problems, notes, diverged, ms, dataDir });
    }
    const p = this.phaseOf.get(r.phase)!;
    p.tried++;
    if (r.diverged) this.diverged++;
    if (r.problems.length > 0) {
      p.failed++;
      this.failures.push(r);
      const first = r.problems[0];
      this.log(`  FAIL seed ${this.seed} k ${r.k} [${r.phase}] ${r.op} (power loss ${r.powerLoss}): ${first.invariant}: ${first.detail.slice(0, 300)}${r.problems.length > 1 ? ` (+${r.problems.length - 1} more)` : ""}`);
    }
  }
}

/**
 * The crash points to try, in order: every operation of an exhaustive phase and the
 * `exhaustiveTail` after each, then a seeded sample of the rest, up to the budget (one is
 * kept for the crash after the end). `exhaustive`: the points that are not sampled.
 */
function planPoints(trace: TraceOp[], exhaustive: Set<string>, opts: CrashPointOptions, seed: number): { points: number[]; exhaustive: Set<number> } {
  const ex: number[] = [];
  const rest: number[] = [];
  const tail = opts.exhaustiveTail ?? 3;
  let since = Infinity; // operations since the end of an exhaustive phase
  for (let k = 0; k < trace.length; k++) {
    if (exhaustive.has(trace[k].phase)) since = 0;
    else since++;
    (since <= tail ? ex : rest).push(k);
  }
  const rnd = prng(seed ^ 0xc0ffee);
  for (let i = rest.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [rest[i], rest[j]] = [rest[j], rest[i]];
  }
  const budget = opts.budget ?? 120;
  const sample = rest.slice(0, Math.max(0, Math.min(rest.length, budget - ex.length - 1)));
  return { points: [...ex, ...sample.sort((a, b) => a - b)], exhaustive: new Set(ex) };
}

/** Runs the enumeration's crash points; returns whether the time limit cut the sample. */
async function tryPoints(runner: Runner, dry: RunOut, points: number[], exhaustive: Set<number>, tally: Tally, opts: CrashPointOptions, seed: number, started: number): Promise<boolean> {
  const log = opts.log ?? (() => {});
  const N = dry.trace.length;
  for (const k of points) {
    if (opts.timeLimitMs !== undefined && Date.now() - started > opts.timeLimitMs && !exhaustive.has(k) && opts.only === undefined) return true;
    const r = k >= N ? dry : await runner.run(seed, k, dry.trace);
    if (r.workloadError !== null && r !== dry)
      r.problems.push({ invariant: "workload-error", detail: `the workload failed before the crash point: ${r.workloadError}` });
    if (r.diverged) log(`  note: k ${k} diverged from the dry run at ${r.diverged}`);
    if (r !== dry || opts.only !== undefined) tally.account(r);
    if (tally.tried % 25 === 0) log(`  ... ${tally.tried} crash points tried, ${tally.failures.length} failing (${((Date.now() - started) / 1000).toFixed(0)} s)`);
  }
  return false;
}

/** Runs the crash-point enumeration; see the module comment. Never throws for a failing crash point: they are in the report. */
export async function runCrashPoints(opts: CrashPointOptions = {}): Promise<CrashPointReport> {
  const seed = opts.seed ?? 1;
  const log = opts.log ?? (() => {});
  const exhaustive = new Set(opts.exhaustive ?? DEFAULT_EXHAUSTIVE_PHASES);
  const started = Date.now();
  const runner = new Runner(opts);
  const dateNow = Date.now;
  process.on("unhandledRejection", runner.onUnhandled);
  try {
    // Dry run: the whole workload, then a power loss after its end (crash point N).
    const dry = await runner.run(seed, Infinity, null);
    if (dry.workloadError !== null) throw new Error(`crash points: the workload failed without a crash (seed ${seed}): ${dry.workloadError}`);
    const N = dry.trace.length;
    dry.k = N;
    const trace = dry.trace;
    log(`crash points: seed ${seed}, ${N} I/O operations in the workload (dry run ${dry.ms} ms)`);
    const tally = new Tally(seed, trace, exhaustive, opts.includeResults ?? false, log);
    let plan: { points: number[]; exhaustive: Set<number> };
    if (opts.only !== undefined) plan = { points: [...opts.only], exhaustive: new Set() };
    else {
      plan = planPoints(trace, exhaustive, opts, seed);
      tally.account(dry);
    }
    const stoppedByTimeLimit = await tryPoints(runner, dry, plan.points, plan.exhaustive, tally, opts, seed, started);
    return {
      seed,
      totalOps: N,
      tried: tally.tried,
      phases: tally.phases,
      failures: tally.failures,
      diverged: tally.diverged,
      exhaustivePoints: plan.exhaustive.size,
      durationMs: Date.now() - started,
      stoppedByTimeLimit,
      notes: dry.ledger.notes,
      ...(opts.includeTrace ? { trace: trace.map((t, k) => ({ k, ...t })) } : {}),
      ...(opts.includeResults ? { results: tally.results } : {}),
    };
  } finally {
    process.off("unhandledRejection", runner.onUnhandled);
    Date.now = dateNow;
    delete (globalThis.performance as unknown as { now?: unknown }).now;
  }
}

/** The report as text: per phase crash points tried and failures, then every failure with how to re-run it. */
export function formatCrashPointReport(r: CrashPointReport, maxFailures = 30): string {
  const lines: string[] = [];
  const failed = r.failures.length;
  lines.push(
    `crash points, seed ${r.seed}: ${r.totalOps} I/O operations in the workload; ${r.tried} crash points tried in ${(r.durationMs / 1000).toFixed(1)} s, ` +
      `${failed === 0 ? "no failures (found nothing)" : `${failed} failing`}${r.diverged ? `, ${r.diverged} diverged from the dry run` : ""}${r.stoppedByTimeLimit ? " (sample cut by the time limit)" : ""}`,
  );
  const w = Math.max(...r.phases.map((p) => p.phase.length), 5);
  for (const p of r.phases) {
    if (p.tried === 0 && !p.exhaustive) {
      lines.push(`  ${p.phase.padEnd(w)}  ${"0".padStart(4)}/${String(p.ops).padEnd(4)} crash points`);
      continue;
    }
    lines.push(`  ${p.phase.padEnd(w)}  ${String(p.tried).padStart(4)}/${String(p.ops).padEnd(4)} crash points, ${p.failed} failures${p.exhaustive ? " (exhaustive)" : ""}`);
  }
  for (const n of r.notes) lines.push(`  note: ${n}`);
  if (r.failures.length > 0) {
    const by = new Map<string, number[]>();
    for (const f of r.failures) for (const inv of new Set(f.problems.map((p) => p.invariant))) by.get(inv)?.push(f.k) ?? by.set(inv, [f.k]);
    lines.push("broken invariants:");
    for (const [inv, ks] of [...by].sort((a, b) => b[1].length - a[1].length))
      lines.push(`  ${inv}: ${ks.length} crash points (k ${ks.slice(0, 12).join(", ")}${ks.length > 12 ? ", ..." : ""})`);
  }
  for (const f of r.failures.slice(0, maxFailures)) lines.push(...formatFailure(r.seed, f));
  if (r.failures.length > maxFailures) lines.push(`... and ${r.failures.length - maxFailures} more failing crash points (k ${r.failures.slice(maxFailures).map((f) => f.k).join(", ")})`);
  return lines.join("\n");
}

/** One failing crash point: its first problems, what the power loss did, how to re-run it. */
function formatFailure(seed: number, f: CrashPointResult): string[] {
  const lines: string[] = [];
  lines.push(`FAIL seed ${seed} k ${f.k} [${f.phase}] at ${f.op}, power loss "${f.powerLoss}"${f.diverged ? ` (diverged: ${f.diverged})` : ""}`);
  // The first problem of each broken invariant, then the first few of the rest.
  const shown: Problem[] = [];
  const seenInv = new Set<string>();
  for (const p of f.problems) if (!seenInv.has(p.invariant) && shown.length < 10) (seenInv.add(p.invariant), shown.push(p));
  for (const p of f.problems) if (shown.length < 6 && !shown.includes(p)) shown.push(p);
  for (const p of f.problems.filter((x) => shown.includes(x))) lines.push(`    ${p.invariant}: ${p.detail}`);
  if (f.problems.length > shown.length) {
    const more = new Map<string, number>();
    for (const p of f.problems) if (!shown.includes(p)) more.set(p.invariant, (more.get(p.invariant) ?? 0) + 1);
    lines.push(`    ... and ${f.problems.length - shown.length} more (${[...more].map(([k, n]) => `${k} x${n}`).join(", ")})`);
  }
  if (f.powerLossReport) {
    const pl = f.powerLossReport;
    const files = pl.files.map((x) => `${x.path.replace(/^.*\/data\//, "")} ${x.mode} kept ${x.keptSectors}/${x.sectors} sectors, ${x.before} -> ${x.size} B (synced ${x.durableSize})`);
    if (files.length) lines.push(`    power loss: ${files.join("; ")}`);
    if (pl.undone.length) lines.push(`    undone directory operations: ${pl.undone.map((u) => `${u.kind} ${u.path.replace(/^.*\/data\//, "")}${u.to ? ` -> ${u.to.replace(/^.*\/data\//, "")}` : ""}`).join("; ")}`);
  }
  if (f.dataDir) lines.push(`    data dir kept: ${f.dataDir}`);
  lines.push(`    re-run: runCrashPoints({ seed: ${seed}, only: [${f.k}] }) or SLUICE_CRASH_POINTS_SEED=${seed} SLUICE_CRASH_POINTS_ONLY=${f.k} node scripts/run-tests.mjs crash-points`);
  return lines;
}
