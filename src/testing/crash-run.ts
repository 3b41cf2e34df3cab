// SPDX-License-Identifier: Apache-2.0
/**
 * One crash point of the enumeration (crash-points.ts): the workload (crash-workload.ts) on a
 * FaultyFileSystem with the crash model that freezes at operation k, a seeded power loss, then
 * a broker reopened on the data dir and checked against the ledger (crash-check.ts).
 *
 * While the workload runs, `performance.now()` is a virtual clock that advances by 1 ms per
 * counted I/O operation (so rate- and lease-dependent behaviour, e.g. preallocation, is a
 * function of the seed) and `Date.now()` a virtual wall clock that only moves when the
 * workload sleeps; while the recovered broker is checked `Date.now()` runs `clockSkewMs`
 * ahead. All are restored afterwards.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../broker/broker.js";
import { RecoveryChecker, type Problem } from "./crash-check.js";
import { Ledger } from "./crash-ledger.js";
import type { CrashPointOptions, CrashPointResult } from "./crash-points.js";
import { CrashedError, Workload, type WorkloadContext } from "./crash-workload.js";
import { FaultyFileSystem, prng, type IoOp, type PowerLossMode } from "./faulty-fs.js";
import { withTimeout } from "./helpers.js";

/** A counted I/O operation of a run, with the workload phase it was issued in. */
export interface TraceOp {
  kind: string;
  path: string;
  phase: string;
}

export interface RunOut extends CrashPointResult {
  trace: TraceOp[];
  ledger: Ledger;
  workloadError: string | null;
  totalOps: number;
}

/** The workload's side of a run: filled in while it runs (the trace) and once it is abandoned. */
interface WorkloadRun {
  trace: TraceOp[];
  /** The abandoned broker's close() settled in time. */
  closed: boolean;
  /** An error of the workload not caused by the crash. */
  workloadError: string | null;
}

const POWER_MODES: [PowerLossMode, number][] = [
  ["drop", 0.3],
  ["keep", 0.1],
  ["prefix", 0.2],
  ["random", 0.2],
  ["mixed", 0.2],
];

/** The seed of crash point k's own choices (its power loss), from the enumeration's seed. */
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

/** `path` relative to the run's root, with the names that differ between runs (incarnations, UUIDs) masked. */
function normalize(path: string, root: string): string {
  let p = path.startsWith(root) ? path.slice(root.length) : path;
  p = p.replace(/(cp\.jobs(?:\.dlq)?)\.[0-9a-z]{16}/g, "$1.<inc>").replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "<uuid>");
  return p;
}

async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

/**
 * Replaces `performance.now()` and `Date.now()` with virtual clocks: the monotonic one
 * advances 1 ms per `tick()`, the wall clock only by `advanceWall()`.
 * (The monotonic one from a fixed start: compared with a log's initial 0 -- e.g. the
 * tail-read window -- the real uptime would make the first run in a process behave unlike the
 * later ones.)
 */
function installVirtualClocks(): { tick(): void; advanceWall(ms: number): void; restore(): void } {
  const perf = globalThis.performance as unknown as { now: () => number };
  let virtual = 10_000_000;
  Object.defineProperty(perf, "now", { value: () => virtual, configurable: true, writable: true });
  const realDateNow = Date.now;
  let wall = realDateNow();
  Date.now = () => wall;
  return {
    tick: () => void (virtual += 1),
    advanceWall: (ms) => void (wall += ms),
    restore: () => {
      delete (perf as { now?: unknown }).now;
      Date.now = realDateNow;
    },
  };
}

/** Where a run's operations before the crash point k first differ from the dry run's, or null. */
function divergence(trace: TraceOp[], dry: TraceOp[], k: number): string | null {
  const n = Math.min(k + 1, trace.length, dry.length);
  for (let i = 0; i < n; i++) {
    if (trace[i].kind !== dry[i].kind || trace[i].path !== dry[i].path) {
      const ctx = (t: TraceOp[]): string => t.slice(Math.max(0, i - 2), i + 4).map((x) => `${x.kind} ${x.path.replace(/^.*\/data\//, "")}`).join(", ");
      return `operation ${i}: dry run ${dry[i].kind} ${dry[i].path}, this run ${trace[i].kind} ${trace[i].path} (dry run: ${ctx(dry)}; this run: ${ctx(trace)})`;
    }
  }
  return null;
}

export class Runner {
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
    const w = await this.crashWorkload(seed, k, root, dataDir, fs, ledger);
    const { trace } = w;
    const totalOps = fs.opCount;
    const crashOp = fs.crashedAt;
    const phase = k < trace.length ? trace[k].phase : "end";
    const diverged = dry !== null ? divergence(trace, dry, k) : null;
    const mode = this.o.powerLossMode ?? powerModeFor(seed, k);
    const pl = await fs.powerLoss({ seed: mix(seed, k), mode });
    fs.dispose();

    const notes: string[] = [...ledger.notes];
    if (!w.closed) notes.push("the abandoned broker's close() did not settle within 2 s after the crash");
    const problems = await this.recover(root, dataDir, ledger, notes);
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
      workloadError: w.workloadError ?? (ledger.errors.length > 0 ? ledger.errors.join("\n") : null),
      totalOps,
    };
  }

  /**
   * Runs the workload on the virtual clocks until the file system freezes at `k` (or, after
   * its end, freezes it), lets completions that are due arrive, freezes the ledger and
   * abandons the broker.
   */
  private async crashWorkload(seed: number, k: number, root: string, dataDir: string, fs: FaultyFileSystem, ledger: Ledger): Promise<WorkloadRun> {
    const clocks = installVirtualClocks();
    const ctx: WorkloadContext = { fs, dataDir, ledger, rng: prng(seed), phaseName: "open", advanceClock: clocks.advanceWall };
    const out: WorkloadRun = { trace: [], closed: false, workloadError: null };
    fs.onOp = (op: IoOp) => {
      clocks.tick();
      out.trace.push({ kind: op.kind, path: normalize(op.path, root), phase: ctx.phaseName });
    };
    fs.crashAtOp(k);
    this.unhandled = [];
    const w = new Workload(ctx);
    const done = w.run().then(
      () => "done" as const,
      (e) => {
        if (!(e instanceof CrashedError) && !fs.isCrashed) out.workloadError = (e as Error)?.stack ?? String(e);
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
    clocks.restore();
    out.closed = await w.abandon();
    return out;
  }

  /**
   * Reopens a broker on the power-lost data dir (with `Date.now()` moved on by the clock skew)
   * and checks it against the ledger; returns the problems, adds the checker's notes to `notes`.
   */
  private async recover(root: string, dataDir: string, ledger: Ledger, notes: string[]): Promise<Problem[]> {
    const problems: Problem[] = [];
    const realNow = Date.now;
    const skew = this.o.clockSkewMs ?? 3_600_000;
    Date.now = () => realNow() + skew;
    const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch2"), durableMkdir: this.o.durableMkdir } });
    try {
      let b2: EmbeddedBroker | null = null;
      try {
        b2 = await withTimeout(openBroker({ dataDir, fs: fs2, retentionCheckIntervalMs: 0 }), 20_000, "recovery");
      } catch (e) {
        problems.push({ invariant: "recovery-failed", detail: `openBroker threw after the crash: ${(e as Error)?.stack ?? String(e)}` });
      }
      if (b2 !== null) await this.check(b2, ledger, problems, notes);
    } finally {
      Date.now = realNow;
      fs2.dispose();
    }
    return problems;
  }

  /** Runs the recovery checks on `b`, then closes it. */
  private async check(b: EmbeddedBroker, ledger: Ledger, problems: Problem[], notes: string[]): Promise<void> {
    const c = new RecoveryChecker(b, ledger);
    try {
      await withTimeout(c.run(), 60_000, "recovery checks");
    } catch (e) {
      problems.push({ invariant: "check-failed", detail: `checking the recovered broker threw: ${(e as Error)?.stack ?? String(e)}` });
    }
    problems.push(...c.problems);
    notes.push(...c.notes);
    try {
      await withTimeout(b.close(), 20_000, "close after recovery");
    } catch (e) {
      problems.push({ invariant: "close-failed", detail: `closing the recovered broker threw: ${(e as Error)?.stack ?? String(e)}` });
    }
  }
}
