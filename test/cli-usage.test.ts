// SPDX-License-Identifier: Apache-2.0
/**
 * The compiled `sluice` binary's command line: `--help` on every command and subcommand exits 0
 * with usage text; a mistyped flag, a bad number, a missing name or a negative offset is ONE
 * line `error [USAGE]: ...` with exit 2 and never a stack trace; destructive commands without a
 * terminal need --yes. None of these reach a broker.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

function cli(...args: string[]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [CLI, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    p.once("error", reject);
    p.once("close", (status) => {
      assert.ok(!stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${stderr}`);
      resolve({ status, stdout, stderr });
    });
  });
}

/** Runs `checks` a few at a time: each is a process start, which is most of the cost. */
async function inParallel<T>(items: readonly T[], check: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await check(items[next++]);
  };
  await Promise.all([worker(), worker(), worker()]);
}

/** Exit 2 with exactly one line on stderr matching `re`. */
async function usageError(args: string[], re: RegExp): Promise<void> {
  const r = await cli(...args);
  assert.equal(r.status, 2, `${args.join(" ")} → ${r.status}: ${r.stderr}`);
  const lines = r.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 1, `one line for ${args.join(" ")}: ${r.stderr}`);
  assert.match(lines[0], /^error \[USAGE\]: /);
  assert.match(lines[0], re);
}

const HELPS: string[][] = [
  [],
  ["--help"],
  ["serve", "--help"],
  ["serve", "-h"],
  ["topics", "--help"],
  ["topics", "list", "--help"],
  ["topics", "describe", "--help"],
  ["topics", "create", "--help"],
  ["topics", "delete", "-h"],
  ["topics", "alter", "--help"],
  ["groups", "--help"],
  ["groups", "list", "--help"],
  ["groups", "describe", "--help"],
  ["groups", "reset", "--help"],
  ["group", "lag", "--help"],
  ["group", "reset", "--help"],
  ["queues", "--help"],
  ["queues", "list", "--help"],
  ["queues", "stats", "--help"],
  ["queues", "purge", "--help"],
  ["pub", "--help"],
  ["tail", "--help"],
  ["doctor", "--help"],
  ["archive", "--help"],
  ["schema", "--help"],
  ["demo", "--help"],
  ["apply", "--help"],
  ["dlq", "--help"],
  ["dlq", "list", "--help"],
  ["dlq", "show", "--help"],
  ["dlq", "redrive", "--help"],
  ["dlq", "purge", "--help"],
  ["explain", "--help"],
];

test("--help on every command and subcommand prints usage and exits 0", async () => {
  await inParallel(HELPS, async (args) => {
    const r = await cli(...args);
    assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
    assert.match(r.stdout, /Usage/, `usage text for ${args.join(" ")}`);
    assert.equal(r.stderr, "", `nothing on stderr for ${args.join(" ")}`);
  });
  // Help wins over everything else on the line, even a mistyped flag.
  assert.equal((await cli("topics", "create", "x", "--parttions", "3", "--help")).status, 0);
});

test("mistyped flags, bad numbers and missing names: one line, exit 2, no stack trace", async () => {
  using tmp = tempDir("sluice-cli-usage-");
  const d = ["--data", join(tmp.dir, "never")];
  const cases: [string[], RegExp][] = [
    [["topics", "create", "orders", "--parttions", "3", ...d], /unknown option --parttions \(did you mean --partitions\?\)/],
    [["topics", "create", "orders", "--partitions", "abc", ...d], /--partitions must be an integer 1\.\.10000, got "abc"/],
    [["topics", "create", "orders", "--partitions", "0", ...d], /--partitions must be an integer 1\.\.10000, got 0/],
    [["topics", "create", ...d], /missing topic name/],
    [["topics", "create", "orders", ...d, "--partitions"], /--partitions needs a value/],
    [["topics", "create", "orders", "--partitions", "--json", ...d], /--partitions needs a value/],
    [["topics", "create", "a", "b", ...d], /unexpected argument "b"/],
    [["topics", "lst", ...d], /unknown topics command "lst" \(did you mean list\?\)/],
    [["topcs", "list"], /unknown command "topcs" \(did you mean topics\?\)/],
    [["topics"], /missing topics command/],
    [["serve", "--data", tmp.dir, "--prot", "0"], /unknown option --prot \(did you mean --port\?\)/],
    [["tail", "t", "--max", "ten", ...d], /--max must be an integer >= 1, got "ten"/],
    [["tail", "t", "--from", "sometime", ...d], /--from must be earliest, latest, an offset or an ISO time/],
    [["tail", "t", "--group", "g", "--from", "5", ...d], /with --group, --from is earliest or latest/],
    [["pub", "t", "x", "--header", "novalue", ...d], /--header must be k=v/],
    [["groups", "describe", ...d], /missing group name/],
    [["topics", "list"], /no broker given: use --url/],
    [["topics", "list", "--url", "sluice://127.0.0.1:1", ...d], /either --url or --data/],
  ];
  await inParallel(cases, ([args, re]) => usageError(args, re));
  assert.equal(existsSync(join(tmp.dir, "never")), false, "no usage error created the data directory");
});

test("groups reset: one target, negative offsets refused (not clamped), ISO times checked", async () => {
  using tmp = tempDir("sluice-cli-usage-");
  const d = ["--data", tmp.dir];
  const cases: [string[], RegExp][] = [
    [["groups", "reset", "g", "t", ...d], /say where to: --to-earliest/],
    [["groups", "reset", "g", "t", "--to-earliest", "--to-latest", ...d], /give one target/],
    [["groups", "reset", "g", "t", "--to-offset", "-5", ...d], /--to-offset must be an integer >= 0, got -5 \(negative values are refused, not clamped\)/],
    [["groups", "reset", "g", "t", "--to-offset=-5", ...d], /negative values are refused/],
    [["group", "reset", "g", "t", "--to=-5", ...d], /negative values are refused/],
    [["groups", "reset", "g", "t", "--to-offset", "1.5", ...d], /--to-offset must be an integer/],
    [["groups", "reset", "g", "t", "--to-datetime", "yesterday", ...d], /--to-datetime must be an ISO-8601 time/],
    [["groups", "reset", "g", "t", "--to-latest", "--partition", "x", ...d], /--partition must be an integer >= 0, got "x"/],
    [["groups", "reset", "g", "t", "--to-latest", "--partition", "-1", ...d], /--partition must be an integer >= 0/],
    [["groups", "reset", "g", "--to-latest", ...d], /missing topic name/],
  ];
  await inParallel(cases, ([args, re]) => usageError(args, re));
});

test("destructive commands without a terminal need --yes (exit 2, one-line hint, nothing opened)", async () => {
  using tmp = tempDir("sluice-cli-usage-");
  const missing = join(tmp.dir, "none");
  await usageError(["queues", "purge", "jobs", "--data", missing], /queues purge jobs is destructive: add --yes/);
  assert.equal(existsSync(missing), false);
});
