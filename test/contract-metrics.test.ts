// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer-contract gauges (src/observability/contract-metrics.ts) with known values: a
 * version sequencer with a parked gap (a real one, on SQLite) and an ordered processor with
 * paused keys give the counts and ages a scrape reports.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import Database from "better-sqlite3";
import { Registry } from "prom-client";
import { contractMetrics, CONTRACT_METRICS } from "../src/observability/prometheus.js";
import { VersionSequencer } from "../src/contracts/sequencer.js";
import { sqliteDatabase } from "../src/contracts/stores/sql.js";
import type { PausedKey } from "../src/contracts/ordered.js";

async function values(registry: Registry): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of (await registry.metrics()).split("\n")) {
    const m = /^(sluice_consumer_\w+)\{consumer="([^"]+)"\} (\S+)$/.exec(line);
    if (m) out.set(`${m[1]}/${m[2]}`, Number(m[3]));
  }
  return out;
}

test("parked entities and paused keys: counts and oldest ages per consumer, read at scrape time", async () => {
  const db = new Database(":memory:");
  let clock = 1_000_000;
  type Msg = { value: { entity: string; v: number } };
  const seq = new VersionSequencer<unknown, Msg>(sqliteDatabase(db), { consumer: "accounts", entityOf: (m) => ({ entityId: m.value.entity, version: m.value.v }), now: () => clock });
  const apply = () => {};
  await seq.handle({ value: { entity: "a-1", v: 1 } }, apply);
  await seq.handle({ value: { entity: "a-1", v: 3 } }, apply); // 2 is missing: 3 parks
  clock += 90_000;
  const paused: PausedKey[] = [
    { key: "acct-7", partition: 2, offset: 41, reason: "defect", error: "TypeError: x is undefined", since: clock - 120_000, attempts: 3 },
    { key: "acct-9", partition: 0, offset: 12, reason: "missing-predecessor", error: "waiting for v4", since: clock - 30_000, attempts: 1 },
  ];
  const registry = new Registry();
  const remove = contractMetrics({ registry, sequencers: { accounts: seq }, processors: { ledger: { paused: () => paused } }, now: () => clock });
  const v = await values(registry);
  assert.equal(v.get(`${CONTRACT_METRICS.parkedEntities.name}/accounts`), 1);
  assert.equal(v.get(`${CONTRACT_METRICS.parkedOldestAge.name}/accounts`), 90);
  assert.equal(v.get(`${CONTRACT_METRICS.pausedKeys.name}/ledger`), 2);
  assert.equal(v.get(`${CONTRACT_METRICS.pausedOldestAge.name}/ledger`), 120);
  // Resolved: the gap arrives and the keys are resumed.
  await seq.handle({ value: { entity: "a-1", v: 2 } }, apply);
  paused.length = 0;
  const after = await values(registry);
  assert.equal(after.get(`${CONTRACT_METRICS.parkedEntities.name}/accounts`), 0);
  assert.equal(after.get(`${CONTRACT_METRICS.parkedOldestAge.name}/accounts`), 0);
  assert.equal(after.get(`${CONTRACT_METRICS.pausedKeys.name}/ledger`), 0);
  assert.throws(() => contractMetrics({ registry }), /already registered/);
  remove();
  assert.equal((await registry.metrics()).includes("sluice_consumer_"), false);
  db.close();
});
