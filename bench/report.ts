/**
 * Shared reporting for `npm run bench`: one row shape for every figure (sluice's and its peers'),
 * an aligned table that always prints each system's durability next to its figure, and ratios
 * "sluice / peer" for named pairs so a goal like "10x Redis Streams with appendfsync always" is
 * read straight off the output.
 *
 * Invariant: a figure that could not be measured is a row with `value: NaN` and a note starting
 * with "unavailable:", never a thrown error and never a zero (a zero would make a ratio look
 * infinitely good).
 */
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";

/** One measured figure. `name` is the metric (shared across systems so rows can be paired). */
export type BenchRow = {
  name: string;
  system: string;
  durability: string;
  /** The median of the repetitions when `reps` > 1. */
  value: number;
  unit: string;
  note?: string;
  /** The client shape that produced the figure (window in flight, calls, ack discipline). */
  shape?: string;
  /** Lowest and highest of the repetitions (same unit as `value`). */
  min?: number;
  max?: number;
  /** Repetitions the median is taken over. */
  reps?: number;
  /** Which summary table the row belongs to: "per-message", "batch", "embedded", "engine", "storage", "info". */
  table?: string;
};

/**
 * Metric names used by the peer benchmarks. Sluice rows that use the same names pair up with
 * peer rows by name in `printTable({ baseline })` and in `ratioRows`.
 */
export const METRIC = {
  publish: "publish 256 B, 1 producer, acked",
  consume: "consume+commit 256 B from backlog",
  latencyP50: "e2e latency p50 @ fixed rate",
  latencyP99: "e2e latency p99 @ fixed rate",
  jobs: "queue jobs end to end (enqueue, receive, ack)",
} as const;

/** Units where a smaller number is better; every other unit is treated as a rate. */
const LOWER_IS_BETTER = new Set(["ms", "us", "µs", "s", "MB", "bytes", "B"]);

export function lowerIsBetter(unit: string): boolean {
  return LOWER_IS_BETTER.has(unit);
}

/** Nearest-rank percentile of an ascending array; NaN for an empty array. p in [0, 100]. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  const n = sorted.length;
  if (n === 0) return Number.NaN;
  if (p <= 0) return sorted[0];
  if (p >= 100) return sorted[n - 1];
  const rank = Math.ceil((p / 100) * n);
  return sorted[Math.min(n - 1, Math.max(0, rank - 1))];
}

export type LatencySummary = { count: number; p50Ms: number; p99Ms: number; maxMs: number; meanMs: number };

/** Sorts a copy of the samples (milliseconds) and returns the usual summary. */
export function summarizeLatencies(samplesMs: ArrayLike<number>): LatencySummary {
  const sorted = Float64Array.from(samplesMs).sort();
  let sum = 0;
  for (const v of sorted) sum += v;
  return {
    count: sorted.length,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    maxMs: sorted.length ? sorted[sorted.length - 1] : Number.NaN,
    meanMs: sorted.length ? sum / sorted.length : Number.NaN,
  };
}

/** A row for a figure that could not be measured (peer down, feature missing, ...). */
export function unavailableRow(
  name: string,
  system: string,
  durability: string,
  unit: string,
  reason: unknown,
): BenchRow {
  return { name, system, durability, value: Number.NaN, unit, note: `unavailable: ${reasonText(reason)}` };
}

export function reasonText(reason: unknown): string {
  if (reason instanceof AggregateError && reason.errors.length > 0) return reasonText(reason.errors[0]);
  if (reason instanceof Error) {
    const code = (reason as NodeJS.ErrnoException).code;
    const msg = reason.message || reason.name;
    return code && !msg.includes(code) ? `${code} ${msg}` : msg;
  }
  return String(reason);
}

/** Human formatting: 3 significant figures for small values, thousands separators for large. */
export function formatValue(value: number, unit: string): string {
  if (!Number.isFinite(value)) return "n/a";
  let text: string;
  const abs = Math.abs(value);
  if (abs >= 1000) text = Math.round(value).toLocaleString("en-US");
  else if (abs >= 100) text = value.toFixed(0);
  else if (abs >= 10) text = value.toFixed(1);
  else if (abs >= 1) text = value.toFixed(2);
  else text = value.toPrecision(3);
  return `${text} ${unit}`;
}

export type PrintOptions = {
  /** System whose rows are the reference: other rows with the same `name` get "baseline / row". */
  baseline?: string;
  title?: string;
  /** Where lines go (default console.log). The full text is also returned. */
  write?: (line: string) => void;
  /** Print each row's shape on its own line under the row instead of in a column. */
  shapeLines?: boolean;
};

/**
 * Prints rows aligned in columns: metric, system, value, durability, note. With `baseline`, a
 * column "<baseline>/this" shows the baseline's value divided by this row's value for the same
 * metric (for latency units a figure below 1 means the baseline is faster).
 */
export function printTable(rows: readonly BenchRow[], options: PrintOptions = {}): string {
  const write = options.write ?? ((line: string) => console.log(line));
  const base = options.baseline;
  const baseByName = new Map<string, BenchRow>();
  if (base !== undefined) {
    for (const r of rows) if (r.system === base && !baseByName.has(r.name)) baseByName.set(r.name, r);
  }
  const withShape = !options.shapeLines && rows.some((r) => r.shape !== undefined);
  const header = ["metric", "system", "value", "min-max", ...(base !== undefined ? [`${base}/this`] : []), ...(withShape ? ["shape"] : []), "durability", "note"];
  const table: string[][] = [header];
  for (const r of rows) {
    const cells = [r.name, r.system, formatValue(r.value, r.unit), rangeText(r)];
    if (base !== undefined) {
      const b = baseByName.get(r.name);
      cells.push(b && r.system !== base && b.unit === r.unit ? formatRatio(b.value / r.value) : "");
    }
    if (withShape) cells.push(r.shape ?? "");
    cells.push(r.durability, r.note ?? "");
    table.push(cells);
  }
  const widths = header.map((_, i) => Math.max(...table.map((row) => row[i].length)));
  // Numbers and ratios right-aligned, text left-aligned.
  const rightAligned = new Set([2, 3, ...(base !== undefined ? [4] : [])]);
  const lines: string[] = [];
  if (options.title) lines.push(`== ${options.title} ==`);
  table.forEach((row, idx) => {
    lines.push(
      row
        .map((cell, i) => (i === row.length - 1 ? cell : rightAligned.has(i) ? cell.padStart(widths[i]) : cell.padEnd(widths[i])))
        .join("  ")
        .trimEnd(),
    );
    if (idx === 0) lines.push(widths.map((w) => "-".repeat(w)).join("  "));
    else if (options.shapeLines && rows[idx - 1].shape) lines.push(`    shape: ${rows[idx - 1].shape}`);
  });
  for (const line of lines) write(line);
  return lines.join("\n");
}

/** The summary tables, in this order; rows name theirs in `table`. */
export const TABLES: readonly (readonly [string, string])[] = [
  ["per-message", "Table 1: per-message shapes as users write them (every system: same window, one call per message, ack/commit every message)"],
  ["batch", "Table 2: each system's best batch shape (every system: the same records in flight)"],
  ["engine", "Storage engine (embedded, durability always) vs the raw disk"],
  ["storage", "Durable logs: key compaction and archive replay, beside the raw disk"],
  ["info", "Other figures"],
];

/** Prints rows grouped by their summary table (ratio rows after the figures), shapes on their own lines. */
export function printByTable(rows: readonly BenchRow[], write: (line: string) => void = (l) => console.log(l)): void {
  const known = new Set(TABLES.map(([k]) => k));
  for (const [key, title] of TABLES) {
    const mine = rows.filter((r) => (r.table ?? "info") === key || (key === "info" && r.table !== undefined && !known.has(r.table)));
    if (mine.length === 0) continue;
    write("");
    const figures = mine.filter((r) => r.unit !== "x");
    const ratios = mine.filter((r) => r.unit === "x");
    if (figures.length) printTable(figures, { title, write, shapeLines: true });
    if (ratios.length) {
      write("");
      printTable(
        ratios.map((r) => ({ ...r, shape: undefined })),
        { title: `${title.split(":")[0]}: ratios (sluice / peer, same shape on both sides)`, write },
      );
    }
  }
}

/** "min-max (n reps)" of a row measured more than once; "" otherwise. */
export function rangeText(r: BenchRow): string {
  if (r.min === undefined || r.max === undefined || !Number.isFinite(r.min)) return "";
  const f = (v: number) => formatValue(v, "").trim();
  return `${f(r.min)}-${f(r.max)}${r.reps !== undefined ? ` (${r.reps})` : ""}`;
}

export function formatRatio(r: number): string {
  if (!Number.isFinite(r)) return "n/a";
  return r >= 10 ? `${r.toFixed(1)}x` : `${r.toFixed(2)}x`;
}

/** A named "sluice / peer" comparison, optionally with a goal. */
export type RatioPair = {
  /** Metric name of the sluice row. */
  metric: string;
  sluiceSystem: string;
  peerSystem: string;
  /** Metric name of the peer row when it differs (default: same as `metric`). */
  peerMetric?: string;
  /** Goal on the ratio sluice/peer: e.g. `{ atLeast: 10 }` for throughput, `{ atMost: 1 }` for latency. */
  goal?: { atLeast?: number; atMost?: number };
  label?: string;
};

export type RatioResult = {
  label: string;
  sluice: BenchRow | undefined;
  peer: BenchRow | undefined;
  /** sluice.value / peer.value; NaN when either side is missing or unmeasured. */
  ratio: number;
  goal?: { atLeast?: number; atMost?: number };
  /** undefined when there is no goal or the ratio is not a number. */
  met?: boolean;
};

function findRow(rows: readonly BenchRow[], metric: string, system: string): BenchRow | undefined {
  return rows.find((r) => r.name === metric && r.system === system);
}

export function computeRatios(rows: readonly BenchRow[], pairs: readonly RatioPair[]): RatioResult[] {
  return pairs.map((p) => {
    const sluice = findRow(rows, p.metric, p.sluiceSystem);
    const peer = findRow(rows, p.peerMetric ?? p.metric, p.peerSystem);
    const ratio = sluice && peer ? sluice.value / peer.value : Number.NaN;
    let met: boolean | undefined;
    if (p.goal && Number.isFinite(ratio)) {
      met = (p.goal.atLeast === undefined || ratio >= p.goal.atLeast) && (p.goal.atMost === undefined || ratio <= p.goal.atMost);
    }
    return { label: p.label ?? `${p.metric}: ${p.sluiceSystem} / ${p.peerSystem}`, sluice, peer, ratio, goal: p.goal, met };
  });
}

/** Ratios as BenchRows (unit "x"), so they can go in the same table or a JSON dump. */
export function ratioRows(rows: readonly BenchRow[], pairs: readonly RatioPair[]): BenchRow[] {
  return computeRatios(rows, pairs).map((r) => ({
    name: r.label,
    system: "ratio",
    durability: r.peer ? `peer: ${r.peer.durability}` : "",
    value: r.ratio,
    unit: "x",
    note: goalText(r),
  }));
}

function goalText(r: RatioResult): string | undefined {
  if (!r.goal) return undefined;
  const parts: string[] = [];
  if (r.goal.atLeast !== undefined) parts.push(`>= ${r.goal.atLeast}x`);
  if (r.goal.atMost !== undefined) parts.push(`<= ${r.goal.atMost}x`);
  const verdict = r.met === undefined ? "not measured" : r.met ? "met" : "MISSED";
  return `goal ${parts.join(" and ")}: ${verdict}`;
}

/** Prints "sluice / peer" ratios with the peer's durability and the goal verdict. */
export function printRatios(rows: readonly BenchRow[], pairs: readonly RatioPair[], options: Omit<PrintOptions, "baseline"> = {}): RatioResult[] {
  const results = computeRatios(rows, pairs);
  const write = options.write ?? ((line: string) => console.log(line));
  const table = results.map((r) => [
    r.label,
    Number.isFinite(r.ratio) ? formatRatio(r.ratio) : "n/a",
    r.sluice ? formatValue(r.sluice.value, r.sluice.unit) : "missing",
    r.peer ? formatValue(r.peer.value, r.peer.unit) : "missing",
    r.peer ? r.peer.durability : "",
    goalText(r) ?? "",
  ]);
  const header = ["pair", "sluice/peer", "sluice", "peer", "peer durability", "goal"];
  const all = [header, ...table];
  const widths = header.map((_, i) => Math.max(...all.map((row) => row[i].length)));
  if (options.title) write(`== ${options.title} ==`);
  all.forEach((row, idx) => {
    write(row.map((c, i) => (i === 1 || i === 2 || i === 3 ? c.padStart(widths[i]) : c.padEnd(widths[i]))).join("  ").trimEnd());
    if (idx === 0) write(widths.map((w) => "-".repeat(w)).join("  "));
  });
  return results;
}

export type RssResult = {
  /** Highest resident set size sampled from /proc while the child ran (bytes; NaN off Linux). */
  peakRssBytes: number;
  /** Last RSS sample before the child exited (bytes). */
  lastRssBytes: number;
  /** If the child printed a line `RSS_BYTES=<n>`, that value (e.g. measured at a chosen moment). */
  reportedRssBytes?: number;
  exitCode: number | null;
  stdout: string;
  stderr: string;
};

/**
 * Runs `node childScript ...args` and samples its RSS from /proc/<pid>/status every `sampleMs`.
 * A child that knows the interesting moment (e.g. "after retaining 10 M records") can print
 * `RSS_BYTES=<process.memoryUsage().rss>`; that is returned as `reportedRssBytes`.
 * Output kept is capped at `maxOutputBytes` so a chatty child cannot grow the parent's memory.
 */
export async function measureRss(
  childScript: string,
  args: readonly string[] = [],
  options: { sampleMs?: number; timeoutMs?: number; nodeArgs?: readonly string[]; env?: NodeJS.ProcessEnv; maxOutputBytes?: number } = {},
): Promise<RssResult> {
  const sampleMs = options.sampleMs ?? 100;
  const timeoutMs = options.timeoutMs ?? 10 * 60_000;
  const maxOut = options.maxOutputBytes ?? 1 << 20;
  const child = spawn(process.execPath, [...(options.nodeArgs ?? []), childScript, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: options.env ?? process.env,
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => {
    if (stdout.length < maxOut) stdout += d.slice(0, maxOut - stdout.length);
  });
  child.stderr.setEncoding("utf8").on("data", (d: string) => {
    if (stderr.length < maxOut) stderr += d.slice(0, maxOut - stderr.length);
  });
  let peak = Number.NaN;
  let last = Number.NaN;
  const sample = async () => {
    if (child.pid === undefined) return;
    try {
      const status = await readFile(`/proc/${child.pid}/status`, "utf8");
      const m = /VmRSS:\s+(\d+)\s+kB/.exec(status);
      if (m) {
        last = Number(m[1]) * 1024;
        peak = Number.isNaN(peak) ? last : Math.max(peak, last);
      }
    } catch {
      // The child may have exited between samples; the previous sample stands.
    }
  };
  const timer = setInterval(() => void sample(), sampleMs);
  const killTimer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const exitCode = await new Promise<number | null>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => resolve(code));
  }).finally(() => {
    clearInterval(timer);
    clearTimeout(killTimer);
  });
  const rep = /RSS_BYTES=(\d+)/.exec(stdout);
  return { peakRssBytes: peak, lastRssBytes: last, reportedRssBytes: rep ? Number(rep[1]) : undefined, exitCode, stdout, stderr };
}
