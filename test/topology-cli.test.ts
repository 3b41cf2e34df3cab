// SPDX-License-Identifier: Apache-2.0
/**
 * The compiled `sluice` binary with topology files: `apply --dry-run` changes nothing, `apply`
 * twice against a spawned server (the second prints "no changes"), a changed queue setting is
 * one `~` line, bad files and refused partition changes are one error line (exit 1), and
 * `serve --topology` applies a file at startup or refuses to start (exit 1, one line).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

const FILE = `queues:
  - name: certificate-generation
    visibilityTimeoutMs: 120000
    retries: { maximumAttempts: 5, backoff: exponential, jitter: true, minDelayMs: 1000, maxDelayMs: 60000 }
    deadLetter: certificate-generation-failures
    concurrencyHint: 8
topics:
  - name: learning-domain-events
    partitions: 12
    retentionMs: 604800000
    groups: [notifications, search-index]
`;

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

function cli(args: string[]): Run {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
  assert.ok(!r.stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${r.stderr}`);
  if (r.status !== 0) assert.equal(r.stderr.trimEnd().split("\n").length, 1, `one error line for ${args.join(" ")}: ${r.stderr}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** As `cli`, without blocking: the checks that reach no broker run side by side. */
function cliAsync(args: string[]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [CLI, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    p.once("error", reject);
    p.once("close", (status) => {
      assert.ok(!stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${stderr}`);
      if (status !== 0) assert.equal(stderr.trimEnd().split("\n").length, 1, `one error line for ${args.join(" ")}: ${stderr}`);
      resolve({ status, stdout, stderr });
    });
  });
}

function ok(args: string[]): string {
  const r = cli(args);
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

test("sluice apply against a running server: dry run, apply, apply again (no changes), a change, refusals", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-topology-cli-");
  const file = join(tmp.dir, "topology.yaml");
  writeFileSync(file, FILE);
  const server = await spawnServer(["--data", join(tmp.dir, "data"), "--port", "0", "--http-port", "off", "--log-level", "error"]);
  const u = ["--url", server.url];
  try {
    const dry = ok(["apply", "-f", file, "--dry-run", ...u]);
    assert.match(dry, /^\+ topic learning-domain-events \(partitions=12, retentionMs=604800000\)$/m);
    assert.match(dry, /^\+ group notifications on topic learning-domain-events \(offsets start at latest\)$/m);
    assert.match(dry, /^\+ queue certificate-generation \(visibilityTimeoutMs=120000, deadLetter=certificate-generation-failures, maxAttempts=5, backoff\.type=exponential, backoff\.minDelayMs=1000, backoff\.maxDelayMs=60000; its dead-letter queue certificate-generation-failures is created with it\)$/m);
    assert.match(dry, /\ndry run, nothing changed: 4 to create\n$/);
    // Nothing changed: the same plan again (as JSON).
    const dryJson = JSON.parse(ok(["apply", "-f", file, "--dry-run", "--json", ...u])) as { dryRun: boolean; applied: boolean; entries: { op: string }[] };
    assert.deepEqual([dryJson.dryRun, dryJson.applied, dryJson.entries.map((e) => e.op)], [true, false, ["create", "create", "create", "create"]]);

    assert.match(ok(["apply", "-f", file, ...u]), /\napplied: 4 created\n$/);
    assert.equal(ok(["apply", "-f", file, ...u]), "no changes\n");
    const json = JSON.parse(ok(["apply", "--file", file, "--json", ...u])) as { applied: boolean; entries: unknown[]; errors: string[] };
    assert.deepEqual(json, { dryRun: false, applied: false, entries: [], errors: [], skippedGroups: [] });

    writeFileSync(file, FILE.replace("visibilityTimeoutMs: 120000", "visibilityTimeoutMs: 90000"));
    assert.equal(ok(["apply", "-f", file, ...u]), "~ queue certificate-generation: visibilityTimeoutMs 120000 → 90000\napplied: 1 changed\n");

    writeFileSync(file, FILE.replace("partitions: 12", "partitions: 4").replace("604800000", "86400000"));
    const refused = cli(["apply", "-f", file, ...u]);
    assert.equal(refused.status, 1);
    assert.match(refused.stdout, /^! topic learning-domain-events: partitions 12 → 4 \(refused: cannot change partitions/m);
    assert.match(refused.stdout, /^~ topic learning-domain-events: retentionMs 604800000 → 86400000$/m);
    assert.equal(refused.stderr, "error [VALIDATION]: cannot change partitions of an existing topic: learning-domain-events has 12, file says 4 (nothing was applied)\n");
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});

test("sluice apply without a broker: --help, bad and missing files, usage errors", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-topology-cli-usage-");
  const file = join(tmp.dir, "bad.yaml");
  writeFileSync(file, "queues:\n  - name: q\n    retries: { maximumAttempts: 0 }\n");
  // The file is checked before the broker is reached: this URL is never dialled.
  const u = ["--url", "sluice://127.0.0.1:1"];
  const [help, bad, missing, usage, typo] = await Promise.all([
    cliAsync(["apply", "--help"]),
    cliAsync(["apply", "-f", file, ...u]),
    cliAsync(["apply", "-f", join(tmp.dir, "nope.yaml"), ...u]),
    cliAsync(["apply", ...u]),
    cliAsync(["apply", "-f", file, "--dryrun", ...u]),
  ]);
  assert.equal(help.status, 0);
  assert.match(help.stdout, /^Usage: sluice apply -f FILE/);
  assert.equal(bad.status, 1);
  assert.equal(bad.stderr, `error [VALIDATION]: ${file}: queues[0].retries.maximumAttempts: must be an integer 1..1000, got 0\n`);
  assert.equal(bad.stdout, "");
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /^error \[VALIDATION\]: cannot read topology file .*nope\.yaml: ENOENT/);
  assert.equal(usage.status, 2);
  assert.match(usage.stderr, /^error \[USAGE\]: missing -f FILE/);
  assert.equal(typo.status, 2);
  assert.match(typo.stderr, /unknown option --dryrun \(did you mean --dry-run\?\)/);
});

test("sluice serve --topology: applied before listening; a bad file or a refused change stops the start (exit 1, one line)", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-topology-serve-");
  const file = join(tmp.dir, "topology.yaml");
  const data = join(tmp.dir, "data");

  writeFileSync(file, "topics:\n  - name: t\n    partitons: 3\n");
  const bad = cli(["serve", "--data", data, "--port", "0", "--http-port", "off", "--topology", file]);
  assert.equal(bad.status, 1);
  assert.equal(bad.stderr, `error [VALIDATION]: ${file}: topics[0].partitons: unknown key (did you mean partitions?)\n`);
  assert.equal(existsSync(data), false, "a bad file stops the start before the data directory is opened");

  writeFileSync(file, FILE);
  const server = await spawnServer(["--data", data, "--port", "0", "--http-port", "off", "--log-level", "error", "--topology", file]);
  try {
    assert.equal(ok(["apply", "-f", file, "--dry-run", "--url", server.url]), "no changes\n");
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }

  writeFileSync(file, FILE.replace("partitions: 12", "partitions: 3"));
  const refused = cli(["serve", "--data", data, "--port", "0", "--http-port", "off", "--log-level", "error", "--topology", file]);
  assert.equal(refused.status, 1);
  assert.equal(refused.stderr, `error [VALIDATION]: topology ${file}: cannot change partitions of an existing topic: learning-domain-events has 12, file says 3 (nothing was applied)\n`);
  // The data directory was closed cleanly (its lock released): it opens again at once.
  assert.match(ok(["topics", "list", "--data", data]), /learning-domain-events/);
});
