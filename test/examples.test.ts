// SPDX-License-Identifier: Apache-2.0
/** README snippets are real files under examples/: each must run to completion. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { tempDir } from "../src/testing/helpers.js";

const dir = fileURLToPath(new URL("../examples/", import.meta.url));
const examples = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith(".js")) : [];

for (const file of examples) {
  test(`example ${file} runs (twice on the same data dir)`, { timeout: 60_000 }, () => {
    using tmp = tempDir();
    for (let run = 0; run < 2; run++) {
      const r = spawnSync(process.execPath, [`${dir}${file}`], { env: { ...process.env, SLUICE_DATA: tmp.dir }, encoding: "utf8", timeout: 50_000 });
      assert.equal(r.status, 0, `${file} exited ${r.status}: ${r.stderr}`);
      assert.ok(r.stdout.length > 0);
    }
  });
}
