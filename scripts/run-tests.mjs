#!/usr/bin/env node
// Runs the default suite: every compiled dist/test/**/*.test.js with node's test runner.
// Soak/fuzz runs with bigger budgets live behind `npm run soak` (SLUICE_SOAK=1).
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
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
const r = spawnSync(
  process.execPath,
  ["--test", "--test-concurrency=2", "--test-reporter=spec", ...files],
  { stdio: "inherit" },
);
process.exit(r.status ?? 1);
