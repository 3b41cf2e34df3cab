/**
 * Smoke run of every peer in quick mode (~1 s per figure) plus the raw disk limit:
 * `npx tsc -p tsconfig.json && node dist/bench/peers/smoke.js [--json]`.
 */
import { tmpdir } from "node:os";
import { join } from "node:path";
import { rawDiskRows } from "../raw-disk.js";
import { printTable, type BenchRow } from "../report.js";
import { runAllPeers } from "./index.js";

const log = (line: string) => console.error(`# ${line}`);
const started = performance.now();
const rows: BenchRow[] = [];
rows.push(...(await rawDiskRows({ dir: join(tmpdir(), "sluice-bench-raw"), recordBytes: 256, recordsPerBatch: 1000, batches: 10_000, maxDurationMs: 1000 })));
rows.push(...(await runAllPeers({ quick: true, log })));
printTable(rows, { title: "peer smoke run (quick mode)" });
if (process.argv.includes("--json")) console.log(JSON.stringify(rows));
log(`done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
