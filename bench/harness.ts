// SPDX-License-Identifier: Apache-2.0
/**
 * The measurement protocol every figure of `npm run bench` goes through, so sluice and its peers
 * are measured the same way:
 *
 * - A *group* is one row of the comparison: one metric, several systems (*cases*), each case
 *   with the client shape it runs printed beside its figure (window of records in flight, batch
 *   or per-message calls, ack/commit discipline) and its durability.
 * - Repetitions are interleaved across systems (A B C, A B C, A B C), so a burst of outside load
 *   lands on every system rather than on one; the figure is the median with its min-max.
 * - Each repetition warms up (untimed), then runs until `maxMessages` messages or `maxMs`,
 *   whichever comes first (1,000,000 messages or 5 s by default).
 * - Ratios are computed per repetition (sluice's rep i / the peer's rep i, measured seconds
 *   apart) and printed as the ratio of the medians with the min-max of the paired ratios.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { formatValue, lowerIsBetter, unavailableRow, type BenchRow } from "./report.js";
import { withTimeout } from "./peers/common.js";

export type Limits = {
  /** The timed run stops after this many messages... */
  maxMessages: number;
  /** ...or after this long, whichever comes first. */
  maxMs: number;
  /** Untimed warm-up before the timed run. */
  warmupMs: number;
};

export const FULL_LIMITS: Limits = { maxMessages: 1_000_000, maxMs: 5000, warmupMs: 500 };
export const QUICK_LIMITS: Limits = { maxMessages: 200_000, maxMs: 1000, warmupMs: 200 };

export type CaseResult = { values: Record<string, number>; note?: string };

export interface BenchCase {
  system: string;
  durability: string;
  shape: string;
  /** One repetition: untimed preparation, warm-up, timed run. Throws when unavailable. */
  run(limits: Limits, rep: number): Promise<CaseResult>;
  /** Releases what the case kept across repetitions (a backlog, a connection). */
  close?(): Promise<void>;
}

export type MetricSpec = { key: string; name: string; unit: string };

export type GroupRatio = {
  sluice: string;
  peer: string;
  /** Metric key (default: the group's first metric). */
  key?: string;
  goal?: { atLeast?: number; atMost?: number };
};

export interface BenchGroup {
  /** Short id for `--groups=` (e.g. "consume-msg"). */
  id: string;
  /** Summary table the rows go to: "per-message", "batch", "embedded", "engine", "info". */
  table: string;
  metrics: MetricSpec[];
  cases: BenchCase[];
  ratios?: GroupRatio[];
  /** Repetitions for this group when it must differ from the run's (e.g. an expensive row). */
  reps?: number;
  /**
   * Run every case once, untimed and short, before the repetitions: a freshly started peer
   * (BullMQ on a new Redis) ran its first seconds several times slower than afterwards.
   */
  prime?: boolean;
  /**
   * Run the cases in reverse order on odd repetitions: for two configurations of one system
   * (metrics on / off), whichever runs second pays the first's garbage and cache leftovers.
   */
  alternate?: boolean;
}

/** Counts messages for one timed run: nothing during the warm-up, then until the limits. */
export class Meter {
  count = 0;
  private t0 = 0;
  private end = 0;
  private started = false;
  private readonly warmEnd: number;
  /** Messages seen during the warm-up (to size backlogs). */
  warmCount = 0;
  constructor(readonly limits: Limits) {
    this.warmEnd = performance.now() + limits.warmupMs;
  }
  get done(): boolean {
    return this.end !== 0;
  }
  get running(): boolean {
    return this.started && this.end === 0;
  }
  /** Records `n` processed messages; returns true once the timed run is over. */
  add(n: number): boolean {
    if (this.end !== 0) return true;
    const now = performance.now();
    if (!this.started) {
      this.warmCount += n;
      // The first event after the warm-up starts the clock; its own messages are not counted.
      if (now >= this.warmEnd) {
        this.started = true;
        this.t0 = now;
      }
      return false;
    }
    this.count += n;
    if (this.count >= this.limits.maxMessages || now - this.t0 >= this.limits.maxMs) this.end = now;
    return this.end !== 0;
  }
  /** Ends the run now (backlog exhausted), or moves its end to now (a final commit awaited). */
  finish(): void {
    if (!this.started) {
      this.started = true;
      this.t0 = performance.now();
    }
    this.end = performance.now();
  }
  get elapsedMs(): number {
    return (this.end || performance.now()) - this.t0;
  }
  rate(): number {
    return this.count / (this.elapsedMs / 1000);
  }
  /** "n=..., 5.00 s" for notes. */
  describe(): string {
    return `n=${this.count.toLocaleString("en-US")} in ${(this.elapsedMs / 1000).toFixed(2)} s`;
  }
}

/**
 * Backlog a consume run needs: enough for the warm-up and for the timed run to reach its
 * limits at `estRate` (measured in an earlier repetition, or a guess), with 20% to spare.
 */
export function backlogFor(limits: Limits, estRate: number): number {
  const timed = Math.min(limits.maxMessages, (estRate * limits.maxMs) / 1000);
  return Math.ceil((timed + (estRate * limits.warmupMs) / 1000) * 1.2) + 1000;
}

/** The rate to size the next repetition's backlog for: doubled when this one ran dry. */
export function nextEstimate(prev: number, m: Meter, exhausted: boolean): number {
  const measured = m.count > 0 ? m.rate() : 0;
  return exhausted ? Math.max(prev * 2, measured) : measured || prev;
}

export function median(v: readonly number[]): number {
  const s = v.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

type Collected = { values: Map<string, number[]>; notes: string[]; errors: string[] };

export type RunGroupOptions = { limits: Limits; reps: number; log?: (line: string) => void };

/** Runs a group's cases in interleaved repetitions and returns their rows and ratio rows. */
export async function runGroup(g: BenchGroup, o: RunGroupOptions): Promise<BenchRow[]> {
  const reps = g.reps ?? o.reps;
  const log = o.log ?? ((line: string) => console.error(`# ${line}`));
  const got: Collected[] = g.cases.map(() => ({ values: new Map(), notes: [], errors: [] }));
  const timeoutMs = o.limits.maxMs * 6 + o.limits.warmupMs + 60_000;
  try {
    if (g.prime) {
      for (const c of g.cases) {
        await withTimeout(c.run({ maxMessages: 10_000, maxMs: 1000, warmupMs: 200 }, -1), timeoutMs, `${g.id} ${c.system} (priming)`).catch(() => {});
      }
      log(`${g.id}: primed every system (untimed)`);
    }
    for (let rep = 0; rep < reps; rep++) {
      const order = g.alternate && rep % 2 === 1 ? [...g.cases.entries()].reverse() : [...g.cases.entries()];
      for (const [i, c] of order) {
        const t = performance.now();
        try {
          const r = await withTimeout(c.run(o.limits, rep), timeoutMs, `${g.id} ${c.system}`);
          for (const [k, v] of Object.entries(r.values)) {
            const arr = got[i].values.get(k) ?? [];
            arr[rep] = v;
            got[i].values.set(k, arr);
          }
          if (r.note) got[i].notes.push(r.note);
          const first = g.metrics[0];
          log(`${g.id} rep ${rep + 1}/${reps} ${c.system}: ${formatValue(r.values[first.key], first.unit)} (${((performance.now() - t) / 1000).toFixed(1)} s)`);
        } catch (err) {
          got[i].errors.push((err as Error).message ?? String(err));
          log(`${g.id} rep ${rep + 1}/${reps} ${c.system}: failed: ${(err as Error).message}`);
        }
      }
    }
  } finally {
    for (const c of g.cases) await c.close?.().catch(() => {});
  }
  const rows: BenchRow[] = [];
  for (const m of g.metrics) {
    g.cases.forEach((c, i) => {
      const v = got[i].values.get(m.key);
      if (v === undefined && got[i].errors.length === 0) return; // a metric this case does not measure
      const ok = (v ?? []).filter(Number.isFinite);
      if (ok.length === 0) {
        rows.push({ ...unavailableRow(m.name, c.system, c.durability, m.unit, got[i].errors[0] ?? "not measured"), shape: c.shape, table: g.table });
        return;
      }
      const failed = got[i].errors.length ? `; ${got[i].errors.length} rep(s) failed: ${got[i].errors[0]}` : "";
      rows.push({
        name: m.name,
        system: c.system,
        durability: c.durability,
        value: median(ok),
        unit: m.unit,
        min: Math.min(...ok),
        max: Math.max(...ok),
        reps: ok.length,
        shape: c.shape,
        table: g.table,
        note: `${got[i].notes.at(-1) ?? ""}${failed}`,
      });
    });
  }
  for (const r of g.ratios ?? []) rows.push(ratioRow(g, got, r));
  return rows;
}

function ratioRow(g: BenchGroup, got: Collected[], r: GroupRatio): BenchRow {
  const m = g.metrics.find((x) => x.key === (r.key ?? g.metrics[0].key)) ?? g.metrics[0];
  const si = g.cases.findIndex((c) => c.system === r.sluice);
  const pi = g.cases.findIndex((c) => c.system === r.peer);
  const sv = si >= 0 ? (got[si].values.get(m.key) ?? []) : [];
  const pv = pi >= 0 ? (got[pi].values.get(m.key) ?? []) : [];
  const paired: number[] = [];
  for (let i = 0; i < Math.max(sv.length, pv.length); i++) {
    if (Number.isFinite(sv[i]) && Number.isFinite(pv[i])) paired.push(sv[i] / pv[i]);
  }
  const value = median(sv) / median(pv);
  const verdict =
    r.goal === undefined || !Number.isFinite(value)
      ? ""
      : `goal ${r.goal.atLeast !== undefined ? `>= ${r.goal.atLeast}x` : `<= ${r.goal.atMost}x`}: ${
          (r.goal.atLeast === undefined || value >= r.goal.atLeast) && (r.goal.atMost === undefined || value <= r.goal.atMost) ? "met" : "MISSED"
        }; `;
  return {
    name: `${m.name}: ${r.sluice} / ${r.peer}`,
    system: "ratio",
    durability: pi >= 0 ? `peer: ${g.cases[pi].durability}` : "",
    value,
    unit: "x",
    min: paired.length ? Math.min(...paired) : undefined,
    max: paired.length ? Math.max(...paired) : undefined,
    reps: paired.length,
    shape: si >= 0 && pi >= 0 ? `${g.cases[si].shape} | ${g.cases[pi].shape}` : undefined,
    table: g.table,
    note: `${verdict}ratio of medians${lowerIsBetter(m.unit) ? " (below 1: sluice lower)" : ""}; min-max of the per-repetition ratios`,
  };
}

/** Runs groups one after the other (each interleaves its own cases). */
export async function runGroups(groups: readonly BenchGroup[], o: RunGroupOptions & { only?: Set<string> | null }): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  for (const g of groups) {
    if (o.only && !o.only.has(g.id)) continue;
    rows.push(...(await runGroup(g, o)));
  }
  return rows;
}

// ───────────────────────── CPU time of a server process ─────────────────────────

let clkTck = 0;

/** User + system CPU time of process `pid` (all threads) in milliseconds, from /proc/<pid>/stat. */
export function cpuMs(pid: number, statPath = `/proc/${pid}/stat`): number {
  if (clkTck === 0) {
    try {
      clkTck = Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim()) || 100;
    } catch {
      clkTck = 100;
    }
  }
  const stat = readFileSync(statPath, "utf8");
  // Fields after "(comm)": state is field 3, utime 14, stime 15.
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / clkTck;
}

/**
 * CPU time of this process's main thread (the JavaScript thread) in milliseconds, from
 * /proc/self/task/<pid>/stat; 0 where /proc is missing. The thread pool's fdatasyncs are not in
 * it, so it measures the work of the code itself, whatever the disk does.
 */
export function mainThreadCpuMs(): number {
  try {
    return cpuMs(process.pid, `/proc/self/task/${process.pid}/stat`);
  } catch {
    return 0;
  }
}

/** The first process named `comm` whose command line matches `test` (e.g. the machine's nats-server), or undefined. */
export function findPid(comm: string, test: (cmdline: string) => boolean): number | undefined {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readFileSync(`/proc/${d}/comm`, "utf8").trim() !== comm) continue;
      const cmd = readFileSync(`/proc/${d}/cmdline`, "utf8").replace(/\0/g, " ");
      if (test(cmd)) return Number(d);
    } catch {
      // exited meanwhile
    }
  }
  return undefined;
}

/** CPU of `pid` over `fn`, as microseconds per message (`messages` handled meanwhile). */
export async function cpuPerMessage<T>(pid: number | undefined, fn: () => Promise<{ messages: number; result: T }>): Promise<{ usPerMsg: number; result: T }> {
  const before = pid !== undefined ? cpuMs(pid) : Number.NaN;
  const { messages, result } = await fn();
  const after = pid !== undefined ? cpuMs(pid) : Number.NaN;
  return { usPerMsg: ((after - before) * 1000) / messages, result };
}
