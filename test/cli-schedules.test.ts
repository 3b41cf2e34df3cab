// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice queues schedules NAME` on a data directory: the table and --json, an unknown queue,
 * and that a CLI command opening the data dir fires no tick (a catch-up "once" schedule whose
 * ticks are overdue stays as it is).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/broker/broker.js";
import { tempDir } from "../src/testing/helpers.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");

function cli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 30_000, env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

test("sluice queues schedules NAME (--data): table, --json, unknown queue; no tick fires", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-cli-sched-");
  const b = await openBroker({ dataDir: tmp.dir });
  const q = b.queue("reports");
  await q.upsertSchedule("nightly", { cron: "0 3 * * *", tz: "Europe/Berlin", data: { kind: "nightly" } });
  await q.upsertSchedule("fast", { everyMs: 50, catchUp: "once" });
  await q.pauseSchedule("nightly");
  await b.close();
  // Let ticks of "fast" become overdue: a broker that fires schedules would enqueue a catch-up job.
  await new Promise((r) => setTimeout(r, 1500));
  const d = ["--data", tmp.dir];
  const depth = (): number => (JSON.parse(cli(["queues", "stats", "reports", "--json", ...d]).stdout) as { depth: number }).depth;
  const before = depth();
  const table = cli(["queues", "schedules", "reports", ...d]);
  assert.equal(table.status, 0, table.stderr);
  assert.match(table.stdout, /^SCHEDULE\s+EVERY\s+TZ\s+CATCH-UP\s+STATE\s+NEXT\s+LAST\n/);
  assert.match(table.stdout, /\nfast\s+50 ms\s+-\s+once\s+active\s+\d{4}-\d\d-\d\dT/);
  assert.match(table.stdout, /\nnightly\s+0 3 \* \* \*\s+Europe\/Berlin\s+skip\s+paused\s+-\s+-\n/);
  const json = JSON.parse(cli(["queues", "schedules", "reports", "--json", ...d]).stdout) as { name: string; data: unknown }[];
  assert.deepEqual(json.map((s) => s.name), ["fast", "nightly"]);
  assert.deepEqual(json[1].data, { kind: "nightly" });
  assert.equal(depth(), before, "no tick fired by the CLI");
  const missing = cli(["queues", "schedules", "ghost", ...d]);
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /QUEUE_NOT_FOUND/);
});
