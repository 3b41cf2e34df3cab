// SPDX-License-Identifier: Apache-2.0
/**
 * Memory of key compaction: a topic of SLUICE_COMPACT_RSS_KEYS distinct keys (default 1
 * million here; `npm run soak` and `npm run bench` use 10 million), 10% of them updated and 1%
 * deleted, is compacted by a broker opened on it as after a restart (the whole log dirty, as
 * many passes as the 64 MiB key map needs). The compacting process's RSS, sampled from /proc,
 * stays under 300 MB, and a separate scan finds every key's latest value (bench/compaction-child.ts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { measureRss } from "../bench/report.js";
import { tempDir } from "../src/testing/helpers.js";

const KEYS = Number(process.env.SLUICE_COMPACT_RSS_KEYS ?? 1_000_000);
const RSS_BOUND = 300 * 1024 * 1024;
const CHILD = fileURLToPath(new URL("../bench/compaction-child.js", import.meta.url));

function result(stdout: string): Record<string, number | string | null> {
  const m = /^RESULT (.*)$/m.exec(stdout);
  assert.ok(m, `no RESULT line in ${stdout.slice(-400)}`);
  return JSON.parse(m[1]) as Record<string, number | string | null>;
}

test(`compacting ${KEYS.toLocaleString("en-US")} distinct keys keeps the process under 300 MB RSS and every key's latest value`, { timeout: 1_800_000 }, async (t) => {
  using tmp = tempDir("sluice-compact-rss-");
  const dir = join(tmp.dir, "data");
  const w = spawnSync(process.execPath, [CHILD, "write", dir, String(KEYS)], { encoding: "utf8" });
  assert.equal(w.status, 0, w.stderr);
  const rss = await measureRss(CHILD, ["compact", dir, String(KEYS), "Infinity"], { sampleMs: 50, timeoutMs: 1_500_000 });
  assert.equal(rss.exitCode, 0, rss.stderr);
  const c = result(rss.stdout);
  const v = spawnSync(process.execPath, [CHILD, "verify", dir, String(KEYS)], { encoding: "utf8" });
  const checked = result(v.stdout);
  assert.equal(checked.error, null, `verification: ${checked.error}`);
  assert.equal(v.status, 0);
  t.diagnostic(
    `keys=${KEYS} input=${(Number(c.inputBytes) / 1e6).toFixed(0)}MB passes=${c.passes} reclaimed=${(Number(c.bytesReclaimed) / 1e6).toFixed(1)}MB compact=${c.compactMs}ms peakRss=${(rss.peakRssBytes / 2 ** 20).toFixed(0)}MB records left=${checked.recordsLeft}`,
  );
  assert.ok(Number(c.bytesReclaimed) > 0, "compaction reclaimed bytes");
  assert.equal(c.dirtyRatioAfter, 0, "the whole sealed log was covered");
  // Every update, delete and original shadowed by them is gone, except in the active segment.
  assert.ok(Number(checked.recordsLeft) < Number(checked.records), "records were removed");
  assert.ok(rss.peakRssBytes < RSS_BOUND, `peak RSS ${(rss.peakRssBytes / 2 ** 20).toFixed(0)} MB >= 300 MB`);
});
