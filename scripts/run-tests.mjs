#!/usr/bin/env node
// Runs the default suite: every compiled dist/test/**/*.test.js with node's test runner
// (spec output on the console, TAP captured to count results), then prints the closing line
// "N passed, N failed, N skipped". Longer soak/fuzz runs: `npm run soak`.
import { readdirSync, statSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { spawnSync } from "node:child_process";

function walk(dir, out = []) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (name.endsWith(".test.js")) out.push(p);
  }
  return out;
}
const only = process.argv.slice(2);
const files = walk("dist/test").filter((f) => only.length === 0 || only.some((o) => f.includes(o))).sort();
if (files.length === 0) {
  console.error("no test files found under dist/test");
  process.exit(1);
}
const tmp = mkdtempSync(join(tmpdir(), "sluice-tap-"));
const tap = join(tmp, "results.tap");
const started = Date.now();
const r = spawnSync(
  process.execPath,
  [
    "--test",
    `--test-concurrency=${process.env.SLUICE_TEST_CONCURRENCY ?? 2}`,
    `--test-timeout=${process.env.SLUICE_TEST_TIMEOUT_MS ?? 300_000}`,
    "--test-reporter=spec",
    "--test-reporter-destination=stdout",
    "--test-reporter=tap",
    `--test-reporter-destination=${tap}`,
    ...files,
  ],
  { stdio: "inherit" },
);
let passed = 0;
let failed = 0;
let skipped = 0;
try {
  const text = readFileSync(tap, "utf8");
  passed = Number(/^# pass (\d+)/m.exec(text)?.[1] ?? 0);
  failed = Number(/^# fail (\d+)/m.exec(text)?.[1] ?? 0) + Number(/^# cancelled (\d+)/m.exec(text)?.[1] ?? 0);
  skipped = Number(/^# skipped (\d+)/m.exec(text)?.[1] ?? 0) + Number(/^# todo (\d+)/m.exec(text)?.[1] ?? 0);
} catch {
  failed = Math.max(failed, 1);
}
rmSync(tmp, { recursive: true, force: true });
console.log(`\n${files.length} test files in ${((Date.now() - started) / 1000).toFixed(0)} s`);
console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(r.status === 0 && failed === 0 ? 0 : 1);
