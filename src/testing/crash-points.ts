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
 * While the workload runs, `performance.now()` is a virtual clock that advances by 1 ms per
 * counted I/O operation (so rate- and lease-dependent behaviour, e.g. preallocation, is a
 * function of the seed) and `Date.now()` a virtual wall clock that only moves when the
 * workload sleeps (so a nack delay can not expire between two steps on a slow machine); while
 * the recovered broker is checked `Date.now()` runs `clockSkewMs` ahead (a reboot that took
 * that long: restored leases and short delays are due, so every job can be drained). All are
 * restored afterwards. Not safe to run concurrently with other code in the same process that
 * depends on those clocks.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../broker/broker.js";
import { FaultyFileSystem, prng, type IoOp, type PowerLossMode, type PowerLossReport } from "./faulty-fs.js";
import { RecoveryChecker, type Problem } from "./crash-check.js";
import { Ledger } from "./crash-ledger.js";
import { CrashedError, DEFAULT_EXHAUSTIVE_PHASES, Workload, type WorkloadContext } from "./crash-workload.js";

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

interface TraceOp {
  kind: string;
  path: string;
  phase: string;
}

const POWER_MODES: [PowerLossMode, number][] = [
  ["drop", 0.3],
  ["keep", 0.1],
  ["prefix", 0.2],
  ["random", 0.2],
  ["mixed", 0.2],
];

function mix(seed: number, k: number): number {
  return Math.floor(prng((seed * 0x9e3779b1) ^ (k * 0x85ebca6b) ^ 0x27d4eb2f)() * 2 ** 32);
}

function powerModeFor(seed: number, k: number): PowerLossMode {
  let x = prng(mix(seed, k) ^ 0x1234567)();
  for (const [m, w] of POWER_MODES) {
    if (x < w) return m;
    x -= w;
  }
  return "drop";
}

function normalize(path: string, root: string): string {
  let p = path.startsWith(root) ? path.slice(root.length) : path;
  p = p.replace(/(cp\.jobs(?:\.dlq)?)\.[0-9a-z]{16}/g, "$1.<inc>").replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "<uuid>");
  return p;
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

interface RunOut extends CrashPointResult {
  trace: TraceOp[];
  ledger: Ledger;
  workloadError: string | null;
  totalOps: number;
}

class Runner {
  private readonly parent: string;
  private unhandled: string[] = [];

  constructor(private o: CrashPointOptions) {
    this.parent = o.tmpDir ?? process.env.SLUICE_TEST_TMP ?? tmpdir();
  }

  onUnhandled = (e: unknown): void => {
    this.unhandled.push(`unhandled rejection: ${(e as Error)?.stack ?? String(e)}`.slice(0, 2000));
  };

  /** One run: the workload until the file system freezes at `k` (or its end), power loss, recovery check. */
  async run(seed: number, k: number, dry: TraceOp[] | null): Promise<RunOut> {
    const started = Date.now();
    const root = mkdtempSync(join(this.parent, "sluice-cp-"));
    const dataDir = join(root, "data");
    mkdirSync(dataDir);
    const jitter = this.o.jitter ?? 2;
    const fs = new FaultyFileSystem({
      crashModel: { scratchDir: join(root, "scratch"), durableMkdir: this.o.durableMkdir, jitter: jitter > 0 ? { seed, maxTurns: jitter } : undefined },
    });
    const ledger = new Ledger();
    // Virtual clocks: the monotonic one advances 1 ms per counted operation, the wall clock only
    // when the workload sleeps.
    // (From a fixed start: compared with a log's initial 0 -- e.g. the tail-read window -- the
    // real uptime would make the first run in a process behave unlike the later ones.)
    const perf = globalThis.performance as unknown as { now: () => number };
    let virtual = 10_000_000;
    Object.defineProperty(perf, "now", { value: () => virtual, configurable: true, writable: true });
    const realDateNow = Date.now;
    let wall = realDateNow();
    Date.now = () => wall;
    const ctx: WorkloadContext = { fs, dataDir, ledger, rng: prng(seed), phaseName: "open", advanceClock: (ms) => (wall += ms) };
    const trace: TraceOp[] = [];
    fs.onOp = (op: IoOp) => {
      virtual += 1;
      trace.push({ kind: op.kind, path: normalize(op.path, root), phase: ctx.phaseName });
    };
    fs.crashAtOp(k);
    this.unhandled = [];
    const w = new Workload(ctx);
    let workloadError: string | null = null;
    const done = w.run().then(
      () => "done" as const,
      (e) => {
        if (!(e instanceof CrashedError) && !fs.isCrashed) workloadError = (e as Error)?.stack ?? String(e);
        return "error" as const;
      },
    );
    await Promise.race([done, fs.whenCrashed()]);
    if (fs.isCrashed) {
      // Let completions of operations issued before the crash arrive (acks that are due).
      await turns(20);
      await new Promise((r) => setTimeout(r, 5));
      await turns(20);
    } else {
      fs.crash("power lost after the end of the workload");
    }
    ledger.freeze();
    delete (perf as { now?: unknown }).now;
    Date.now = realDateNow;
    const closed = await w.abandon();
    const totalOps = fs.opCount;
    const crashOp = fs.crashedAt;
    const phase = k < trace.length ? trace[k].phase : "end";
    let diverged: string | null = null;
    if (dry !== null) {
      const n = Math.min(k + 1, trace.length, dry.length);
      for (let i = 0; i < n; i++) {
        if (trace[i].kind !== dry[i].kind || trace[i].path !== dry[i].path) {
          const ctx = (t: TraceOp[]): string => t.slice(Math.max(0, i - 2), i + 4).map((x) => `${x.kind} ${x.path.replace(/^.*\/data\//, "")}`).join(", ");
          diverged = `operation ${i}: dry run ${dry[i].kind} ${dry[i].path}, this run ${trace[i].kind} ${trace[i].path} (dry run: ${ctx(dry)}; this run: ${ctx(trace)})`;
          break;
        }
      }
    }
    const mode = this.o.powerLossMode ?? powerModeFor(seed, k);
    const pl = await fs.powerLoss({ seed: mix(seed, k), mode });
    fs.dispose();

    // Recovery and checks, with the wall clock moved on.
    const problems: Problem[] = [];
    const notes: string[] = [...ledger.notes];
    if (!closed) notes.push("the abandoned broker's close() did not settle within 2 s after the crash");
    const realNow = Date.now;
    const skew = this.o.clockSkewMs ?? 3_600_000;
    Date.now = () => realNow() + skew;
    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2"), durableMkdir: this.o.durableMkdir } });
    try {
      let b2: Awaited<ReturnType<typeof openBroker>> | null = null;
      try {
        b2 = await withTimeout(openBroker({ dataDir, fs: fs2, retentionCheckIntervalMs: 0 }), 20_000, "recovery");
      } catch (e) {
        problems.push({ invariant: "recovery-failed", detail: `openBroker threw after the crash: ${(e as Error)?.stack ?? String(e)}` });
      }
      if (b2 !== null) {
        const c = new RecoveryChecker(b2, ledger);
        try {
          await withTimeout(c.run(), 60_000, "recovery checks");
        } catch (e) {
          problems.push({ invariant: "check-failed", detail: `checking the recovered broker threw: ${(e as Error)?.stack ?? String(e)}` });
        }
        problems.push(...c.problems);
        notes.push(...c.notes);
        try {
          await withTimeout(b2.close(), 20_000, "close after recovery");
        } catch (e) {
          problems.push({ invariant: "close-failed", detail: `closing the recovered broker threw: ${(e as Error)?.stack ?? String(e)}` });
        }
      }
    } finally {
      Date.now = realNow;
      fs2.dispose();
    }
    notes.push(...this.unhandled);
    const op = k < trace.length ? `${trace[k].kind} ${trace[k].path}` : crashOp && k < totalOps ? `${crashOp.kind} ${normalize(crashOp.path, root)}` : "(after the end of the workload)";
    let kept: string | undefined;
    if (problems.length > 0 && this.o.keepFailedDirs) kept = dataDir;
    else rmSync(root, { recursive: true, force: true });
    return {
      k,
      phase,
      op,
      powerLoss: mode,
      problems,
      notes,
      diverged,
      ms: Date.now() - started,
      dataDir: kept,
      powerLossReport: problems.length > 0 ? pl : undefined,
      trace,
      ledger,
      workloadError: workloadError ?? (ledger.errors.length > 0 ? ledger.errors.join("\n") : null),
      totalOps,
    };
  }
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
    const phases: PhaseReport[] = [];
    const phaseOf = new Map<string, PhaseReport>();
    for (const t of [...trace, { kind: "", path: "", phase: "end" }]) {
      let p = phaseOf.get(t.phase);
      if (!p) {
        phases.push((p = { phase: t.phase, ops: 0, tried: 0, failed: 0, exhaustive: exhaustive.has(t.phase) }));
        phaseOf.set(t.phase, p);
      }
      p.ops++;
    }
    const failures: CrashPointResult[] = [];
    let tried = 0;
    let diverged = 0;
    const results: CrashPointResult[] = [];
    const account = (r: CrashPointResult): void => {
      // Attributed to the dry run's phase of k (a run that diverged may have been elsewhere).
      r.phase = r.k < N ? trace[r.k].phase : "end";
      tried++;
      if (opts.includeResults) {
        const { k, phase, op, powerLoss, problems, notes, diverged, ms, dataDir } = r;
        results.push({ k, phase, op, powerLoss, problems, notes, diverged, ms, dataDir });
      }
      const p = phaseOf.get(r.phase)!;
      p.tried++;
      if (r.diverged) diverged++;
      if (r.problems.length > 0) {
        p.failed++;
        failures.push(r);
        const first = r.problems[0];
        log(`  FAIL seed ${seed} k ${r.k} [${r.phase}] ${r.op} (power loss ${r.powerLoss}): ${first.invariant}: ${first.detail.slice(0, 300)}${r.problems.length > 1 ? ` (+${r.problems.length - 1} more)` : ""}`);
      }
    };
    let points: number[];
    const exSet = new Set<number>();
    if (opts.only !== undefined) points = [...opts.only];
    else {
      const ex: number[] = [];
      const rest: number[] = [];
      const tail = opts.exhaustiveTail ?? 3;
      let since = Infinity; // operations since the end of an exhaustive phase
      for (let k = 0; k < N; k++) {
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
      points = [...ex, ...sample.sort((a, b) => a - b)];
      for (const k of ex) exSet.add(k);
      account(dry);
    }
    let stoppedByTimeLimit = false;
    for (const k of points) {
      if (opts.timeLimitMs !== undefined && Date.now() - started > opts.timeLimitMs && !exSet.has(k) && opts.only === undefined) {
        stoppedByTimeLimit = true;
        break;
      }
      const r = k >= N ? dry : await runner.run(seed, k, trace);
      if (r.workloadError !== null && r !== dry)
        r.problems.push({ invariant: "workload-error", detail: `the workload failed before the crash point: ${r.workloadError}` });
      if (r.diverged) log(`  note: k ${k} diverged from the dry run at ${r.diverged}`);
      if (r !== dry || opts.only !== undefined) account(r);
      if (tried % 25 === 0) log(`  ... ${tried} crash points tried, ${failures.length} failing (${((Date.now() - started) / 1000).toFixed(0)} s)`);
    }
    return {
      seed,
      totalOps: N,
      tried,
      phases,
      failures,
      diverged,
      exhaustivePoints: exSet.size,
      durationMs: Date.now() - started,
      stoppedByTimeLimit,
      notes: dry.ledger.notes,
      ...(opts.includeTrace ? { trace: trace.map((t, k) => ({ k, ...t })) } : {}),
      ...(opts.includeResults ? { results } : {}),
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
  for (const f of r.failures.slice(0, maxFailures)) {
    lines.push(`FAIL seed ${r.seed} k ${f.k} [${f.phase}] at ${f.op}, power loss "${f.powerLoss}"${f.diverged ? ` (diverged: ${f.diverged})` : ""}`);
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
    lines.push(`    re-run: runCrashPoints({ seed: ${r.seed}, only: [${f.k}] }) or SLUICE_CRASH_POINTS_SEED=${r.seed} SLUICE_CRASH_POINTS_ONLY=${f.k} node scripts/run-tests.mjs crash-points`);
  }
  if (r.failures.length > maxFailures) lines.push(`... and ${r.failures.length - maxFailures} more failing crash points (k ${r.failures.slice(maxFailures).map((f) => f.k).join(", ")})`);
  return lines.join("\n");
}
