// SPDX-License-Identifier: Apache-2.0
/**
 * `npm run bench`: every figure in one run, sluice beside its peers, as ratios.
 *   --quick          ~1 s per figure (smoke)
 *   --only=engine,queues,server,peers
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { printTable, type BenchRow } from "./report.js";
import { runEngineBench } from "./engine.js";

const { values } = parseArgs({ options: { quick: { type: "boolean", default: false }, only: { type: "string" }, "rss-records": { type: "string" } } });
const only = values.only ? new Set(values.only.split(",")) : null;
const want = (s: string): boolean => only === null || only.has(s);
const tmp = mkdtempSync(join(process.env.SLUICE_BENCH_TMP ?? tmpdir(), "sluice-bench-"));
const all: BenchRow[] = [];
try {
  console.log(`sluice bench ${new Date().toISOString()} node ${process.version} quick=${values.quick}`);
  if (want("engine")) {
    const rows = await runEngineBench({ tmpDir: tmp, quick: values.quick, rssRecords: values["rss-records"] ? Number(values["rss-records"]) : undefined });
    printTable(rows, { title: "storage engine (embedded, durability always)" });
    all.push(...rows);
  }
  for (const [section, mod, fn] of [
    ["queues", "./queues.js", "runQueueBench"],
    ["server", "./server.js", "runServerBench"],
  ] as const) {
    if (!want(section)) continue;
    const m = (await import(mod).catch((e: unknown) => {
      console.log(`(${section} bench unavailable: ${(e as Error).message})`);
      return null;
    })) as Record<string, (o: { tmpDir: string; quick?: boolean }) => Promise<BenchRow[]>> | null;
    if (!m?.[fn]) continue;
    const rows = await m[fn]({ tmpDir: tmp, quick: values.quick });
    printTable(rows, { title: section === "queues" ? "work queues (embedded) vs BullMQ and pg-boss" : "server mode vs NATS JetStream, Redis Streams, RabbitMQ" });
    all.push(...rows);
  }
  const ratios = all.filter((r) => r.unit === "x");
  if (ratios.length > 0) printTable(ratios, { title: "summary: ratios measured in this run" });
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
