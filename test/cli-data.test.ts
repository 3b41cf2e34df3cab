// SPDX-License-Identifier: Apache-2.0
/**
 * The compiled `sluice` binary on a data directory (`--data`, embedded): pub from stdin and
 * tail --max --json, reset dry run vs --execute, groups describe of an unknown group, read
 * commands that create nothing, and doctor naming the damaged segment file.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

function cli(args: string[], input = ""): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, input, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
  assert.ok(!r.stderr.includes("    at "), `no stack trace for ${args.join(" ")}:\n${r.stderr}`);
  if (r.status !== 0) assert.equal(r.stderr.trimEnd().split("\n").length, 1, `one error line for ${args.join(" ")}: ${r.stderr}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function ok(args: string[], input = ""): string {
  const r = cli(args, input);
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

test("sluice CLI on a data directory (--data)", { timeout: 60_000 }, () => {
  using tmp = tempDir("sluice-cli-data-");
  const d = ["--data", tmp.dir];
  ok(["topics", "create", "log", ...d]);
  assert.match(ok(["pub", "log", ...d], "one\ntwo\n\n"), /published 2 records to log \(p0=2\)/);
  assert.match(ok(["pub", "log", "three", ...d]), /published log partition 0 offset 2/); // a second batch
  const recs = ok(["tail", "log", "--from", "earliest", "--max", "3", "--json", ...d])
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as { value: unknown });
  assert.deepEqual(recs.map((r) => r.value), ["one", "two", "three"]);
  assert.match(ok(["tail", "log", "--from", "1", "--no-follow", ...d]), /^0:1 .*two\n0:2 .*three\n$/);

  const unknown = cli(["groups", "describe", "ghost", ...d]);
  assert.equal(unknown.status, 1);
  assert.match(unknown.stderr, /^error \[NOT_FOUND\]: group "ghost" does not exist/);
  assert.equal(cli(["group", "lag", "ghost", "log", ...d]).status, 1, "the old spelling too");

  ok(["tail", "log", "--group", "g", "--from", "earliest", "--max", "3", ...d]);
  const lag = () => (JSON.parse(ok(["groups", "describe", "g", "--json", ...d])) as { partitions: { committedOffset: number }[] }[])[0].partitions[0].committedOffset;
  assert.equal(lag(), 3);
  assert.match(ok(["groups", "reset", "g", "log", "--to-offset", "1", ...d]), /PREVIOUS\s+NEXT\s+CHANGE\n0\s+3\s+1\s+-2/);
  assert.equal(lag(), 3, "dry run by default");
  ok(["groups", "reset", "g", "log", "--to-offset", "1", "--execute", ...d]);
  assert.equal(lag(), 1);
  ok(["group", "reset", "g", "log", "--to", "earliest", ...d]); // old spelling: a dry run now
  assert.equal(lag(), 1);

  // doctor: clean, then one damaged batch named by file
  assert.match(ok(["doctor", ...d]), /^ok log\/0: 3 records verified \[0, 3\)/);
  const dir = join(tmp.dir, "topics", "log", "0");
  const seg = join(dir, readdirSync(dir).find((f) => f.endsWith(".log"))!);
  const bytes = readFileSync(seg);
  const at = bytes.indexOf(Buffer.from("three"));
  assert.ok(at > 0);
  bytes[at] ^= 0xff;
  writeFileSync(seg, bytes);
  const doc = cli(["doctor", ...d]);
  assert.equal(doc.status, 1);
  assert.match(doc.stdout, /DAMAGED log\/0/);
  assert.ok(doc.stdout.includes(seg) && doc.stderr.includes(seg), `the damaged file is named: ${doc.stdout}${doc.stderr}`);
  assert.match(doc.stderr, /^error \[CORRUPT_RECORD\]: 1 damaged batch/);
  const json = JSON.parse(cli(["doctor", "--json", ...d]).stdout) as { ok: boolean; damaged: { file: string; offset: number }[] };
  assert.equal(json.ok, false);
  assert.deepEqual(json.damaged.map((x) => [x.file, x.offset]), [[seg, 2]]);
});

test("read commands on a missing data directory fail and create nothing", () => {
  using tmp = tempDir("sluice-cli-data-");
  const missing = join(tmp.dir, "nope");
  for (const args of [["topics", "list"], ["groups", "list"], ["queues", "list"], ["queues", "stats", "q"], ["tail", "t", "--max", "1"], ["pub", "t", "x"], ["doctor"], ["groups", "reset", "g", "t", "--to-earliest"]]) {
    const r = cli([...args, "--data", missing]);
    assert.equal(r.status, 1, args.join(" "));
    assert.match(r.stderr, /^error \[VALIDATION\]: data directory .* does not exist/);
    assert.equal(existsSync(missing), false, `${args.join(" ")} created the directory`);
  }
  // An existing directory that is not a data directory is left as it is.
  const other = join(tmp.dir, "elsewhere");
  mkdirSync(other);
  const r = cli(["topics", "list", "--data", other]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^error \[VALIDATION\]: .* is not a sluice data directory/);
  assert.deepEqual(readdirSync(other), []);
});
