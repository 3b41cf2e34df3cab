// SPDX-License-Identifier: Apache-2.0
/**
 * `npm run bench`: every figure in one run, sluice beside its peers, as ratios.
 *   --quick          ~1 s per figure (smoke)
 *   --only=engine,queues,server
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
import { printTable, type BenchRow } from "./report.js";
import { runEngineBench } from "./engine.js";

const { values } = parseArgs({ options: { quick: { type: "boolean", default: false }, only: { type: "string" }, "rss-records": { type: "string" } } });
const only = values.only ? new Set(values.only.split(",")) : null;
const SECTIONS = ["engine", "queues", "server"] as const;
type Section = (typeof SECTIONS)[number];
const wanted = SECTIONS.filter((s) => only === null || only.has(s));
const rowsOut = process.env.SLUICE_BENCH_ROWS;
const tmp = mkdtempSync(join(process.env.SLUICE_BENCH_TMP ?? tmpdir(), "sluice-bench-"));

/** Runs one section in this process and prints its table. */
async function runSection(section: Section): Promise<BenchRow[]> {
  if (section === "engine") {
    const rows = await runEngineBench({ tmpDir: tmp, quick: values.quick, rssRecords: values["rss-records"] ? Number(values["rss-records"]) : undefined });
    printTable(rows, { title: "storage engine (embedded, durability always)" });
    return rows;
  }
  const [mod, fn, title] =
    section === "queues"
      ? ["./queues.js", "runQueueBench", "work queues (embedded) vs BullMQ and pg-boss"]
      : ["./server.js", "runServerBench", "server mode vs NATS JetStream, Redis Streams, RabbitMQ"];
  const m = (await import(mod).catch((e: unknown) => {
    console.log(`(${section} bench unavailable: ${(e as Error).message})`);
    return null;
  })) as Record<string, (o: { tmpDir: string; quick?: boolean }) => Promise<BenchRow[]>> | null;
  if (!m?.[fn]) return [];
  const rows = await m[fn]({ tmpDir: tmp, quick: values.quick });
  printTable(rows, { title });
  return rows;
}

/** Runs one section in a fresh child process and returns the rows it wrote. */
function runSectionInChild(section: Section): BenchRow[] {
  const rowsFile = join(tmp, `${section}.rows.json`);
  const args = [fileURLToPath(import.meta.url), `--only=${section}`];
  if (values.quick) args.push("--quick");
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
try {
  if (!rowsOut) console.log(`sluice bench ${new Date().toISOString()} node ${process.version} quick=${values.quick}`);
  for (const section of wanted) all.push(...(wanted.length > 1 ? runSectionInChild(section) : await runSection(section)));
  if (rowsOut) writeFileSync(rowsOut, JSON.stringify(all));
  else {
    const ratios = all.filter((r) => r.unit === "x");
    if (ratios.length > 0) printTable(ratios, { title: "summary: ratios measured in this run" });
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
