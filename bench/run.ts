// SPDX-License-Identifier: Apache-2.0
/**
 * `npm run bench`: every figure in one run, sluice beside its peers in the same client shapes,
 * as medians of interleaved repetitions with their range, and ratios (docs/benchmarks.md).
 *   --quick              1 s per figure, 1 repetition (smoke)
 *   --only=server,queues,engine,storage,contracts,metrics,security,postgres
 *   --groups=consume-msg,latency,...   only these rows (ids in docs/benchmarks.md)
 *   --reps=N             repetitions per row (default 3; quick 1)
 *   --rss-records=N      records retained for the engine's RSS figure
 *
 * With more than one section, each runs in a fresh child process (this script with --only):
 * a section's leftovers -- a heap that held 10 M records or 1 M jobs, JIT state, open files --
 * must not tax the next one's figures (they did: the server section's latency p99 doubled
 * when it ran after the others in the same process). A child writes its rows to the file
 * named by SLUICE_BENCH_ROWS, and the parent prints the summary of all of them.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { FULL_LIMITS, QUICK_LIMITS, type RunGroupOptions } from "./harness.js";
import { printByTable, type BenchRow } from "./report.js";

const { values } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    only: { type: "string" },
    groups: { type: "string" },
    reps: { type: "string" },
    "rss-records": { type: "string" },
  },
});
const only = values.only ? new Set(values.only.split(",").map((s) => (s === "topics" ? "server" : s))) : null;
const groupsWanted = values.groups ? new Set(values.groups.split(",")) : null;
const SECTIONS = ["server", "queues", "engine", "storage", "contracts", "metrics", "security", "postgres"] as const;
type Section = (typeof SECTIONS)[number];
const wanted = SECTIONS.filter((s) => only === null || only.has(s));
const rowsOut = process.env.SLUICE_BENCH_ROWS;
const tmp = mkdtempSync(join(process.env.SLUICE_BENCH_TMP ?? tmpdir(), "sluice-bench-"));
const reps = values.reps ? Number(values.reps) : values.quick ? 1 : 3;
const run: RunGroupOptions = { limits: values.quick ? QUICK_LIMITS : FULL_LIMITS, reps };

/** Runs one section in this process. */
async function runSection(section: Section): Promise<BenchRow[]> {
  const common = { tmpDir: tmp, quick: values.quick, run, only: groupsWanted };
  try {
    if (section === "engine") {
      const { runEngineBench } = await import("./engine.js");
      return await runEngineBench({ ...common, rssRecords: values["rss-records"] ? Number(values["rss-records"]) : undefined });
    }
    if (section === "storage") return await (await import("./storage.js")).runStorageBench(common);
    if (section === "security") return await (await import("./security.js")).runSecurityBench(common);
    if (section === "postgres") return await (await import("./postgres.js")).runPostgresBench(common);
    if (section === "queues") return await (await import("./queues.js")).runQueueBench(common);
    if (section === "contracts") return await (await import("./contracts.js")).runContractsBench(common);
    if (section === "metrics") return await (await import("./metrics.js")).runMetricsBench(common);
    return await (await import("./server.js")).runServerBench(common);
  } catch (err) {
    console.log(`(${section} bench failed: ${(err as Error).stack ?? err})`);
    return [];
  }
}

/** Runs one section in a fresh child process and returns the rows it wrote. */
function runSectionInChild(section: Section): BenchRow[] {
  const rowsFile = join(tmp, `${section}.rows.json`);
  const args = [fileURLToPath(import.meta.url), `--only=${section}`, `--reps=${reps}`];
  if (values.quick) args.push("--quick");
  if (values.groups) args.push(`--groups=${values.groups}`);
  if (values["rss-records"]) args.push(`--rss-records=${values["rss-records"]}`);
  const r = spawnSync(process.execPath, args, { stdio: "inherit", env: { ...process.env, SLUICE_BENCH_ROWS: rowsFile } });
  if (r.status !== 0) console.log(`(${section} bench exited with ${r.status ?? r.signal})`);
  try {
    return JSON.parse(readFileSync(rowsFile, "utf8")) as BenchRow[];
  } catch {
    return []; // the section printed its own error
  }
}

const all: BenchRow[] = [];
const started = performance.now();
try {
  if (!rowsOut) {
    console.log(
      `sluice bench ${new Date().toISOString()} node ${process.version} quick=${values.quick}: ${reps} interleaved repetition(s) per row, each ${run.limits.warmupMs} ms warm-up then ${run.limits.maxMessages.toLocaleString("en-US")} messages or ${run.limits.maxMs / 1000} s, whichever first`,
    );
  }
  for (const section of wanted) {
    const rows = wanted.length > 1 ? runSectionInChild(section) : await runSection(section);
    // A child (rowsOut) prints only its progress lines: the parent prints every table once.
    if (wanted.length === 1 && !rowsOut) printByTable(rows);
    all.push(...rows);
  }
  if (rowsOut) writeFileSync(rowsOut, JSON.stringify(all));
  else if (wanted.length > 1) {
    console.log(`\n== summary of all sections (${((performance.now() - started) / 60_000).toFixed(1)} min) ==`);
    printByTable(all);
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
// A client library that keeps a handle open (a timer, a socket being torn down) must not keep
// the section's child alive: the parent waits for it.
process.exit(process.exitCode ?? 0);
