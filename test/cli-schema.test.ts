// SPDX-License-Identifier: Apache-2.0
/** `sluice schema check`: exit 0 when compatible, 2 with the problems, 1 on bad input; --json. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const run = (...args: string[]) => spawnSync(process.execPath, [CLI, "schema", ...args], { encoding: "utf8" });

test("sluice schema check", () => {
  const d = tempDir("sluice-cli-schema-");
  try {
    const v1 = { type: "object", properties: { id: { type: "string" }, total: { type: "integer" } }, required: ["id"] };
    const v2 = { ...v1, properties: { ...v1.properties, note: { type: "string" } } };
    const bad = { ...v1, required: ["id", "total"] };
    for (const [n, s] of Object.entries({ v1, v2, bad })) writeFileSync(join(d.dir, `${n}.json`), JSON.stringify(s));
    writeFileSync(join(d.dir, "broken.json"), "{ not json");
    const ok = run("check", join(d.dir, "v1.json"), join(d.dir, "v2.json"));
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /is backward compatible/);
    const no = run("check", join(d.dir, "v1.json"), join(d.dir, "bad.json"));
    assert.equal(no.status, 2);
    assert.match(no.stdout, /\/total: required now but not before/);
    const json = run("check", join(d.dir, "v1.json"), join(d.dir, "bad.json"), "--json");
    assert.equal(JSON.parse(json.stdout).compatible, false);
    const broken = run("check", join(d.dir, "v1.json"), join(d.dir, "broken.json"));
    assert.equal(broken.status, 1);
    assert.match(broken.stderr, /^error \[VALIDATION\]: .*not a JSON Schema object/);
    assert.equal(run("check", join(d.dir, "v1.json")).status, 2, "one file: usage");
  } finally {
    d.cleanup();
  }
});
