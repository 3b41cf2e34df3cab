// SPDX-License-Identifier: Apache-2.0
/** Projection rebuild from a snapshot plus a bounded replay; checksums; version gaps reported. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { projectionChecksum, rebuildProjection } from "../src/contracts/rebuild.js";
import { tempDir } from "../src/testing/helpers.js";
import type { ConsumedRecord } from "../src/types.js";

type Ev = { order: string; version: number; total: number };
const apply = (s: Record<string, { version: number; total: number }>, r: ConsumedRecord) => {
  const e = r.value as Ev;
  s[e.order] = { version: e.version, total: (s[e.order]?.total ?? 0) + e.total };
};

test("snapshot + replay gives the live projection's checksum; offsets to store with the state; gaps reported", async () => {
  const d = tempDir("sluice-rebuild-");
  const b = await openBroker({ dataDir: d.dir, retentionCheckIntervalMs: 0 });
  try {
    await b.createTopic("orders", { partitions: 3 });
    const events: Ev[] = [];
    for (let v = 1; v <= 20; v++) for (let o = 0; o < 10; o++) events.push({ order: `o${o}`, version: v, total: o + v });
    await b.publishBatch("orders", events.slice(0, 100).map((e) => ({ key: e.order, value: e })));
    // The live projection and a snapshot of it after the first 100 events.
    const live = await rebuildProjection({ broker: b, topic: "orders", initial: () => ({}), apply });
    const snapshot = { offsets: live.offsets, state: structuredClone(live.state) };
    await b.publishBatch("orders", events.slice(100).map((e) => ({ key: e.order, value: e })));
    const liveState = structuredClone(live.state);
    for (const e of events.slice(100)) apply(liveState, { value: e } as ConsumedRecord);
    const versionOf = (r: ConsumedRecord) => ({ entityId: (r.value as Ev).order, version: (r.value as Ev).version });
    const rebuilt = await rebuildProjection({ broker: b, topic: "orders", snapshot, apply, versionOf });
    assert.equal(rebuilt.records, 100, "only the records after the snapshot");
    assert.deepEqual(rebuilt.gaps.filter((g) => g.got !== 11), [], "contiguous after each entity's first replayed version");
    assert.equal(projectionChecksum(rebuilt.state), projectionChecksum(liveState));
    const desc = await b.describeTopic("orders");
    assert.deepEqual(rebuilt.offsets, Object.fromEntries(desc.partitions.map((p) => [p.partition, p.highWatermark])));
    // A lost event shows as a gap.
    await b.publish("orders", { order: "o3", version: 23, total: 1 }, { key: "o3" });
    const full = await rebuildProjection({ broker: b, topic: "orders", initial: () => ({}), apply, versionOf });
    assert.deepEqual(full.gaps.map((g) => [g.entityId, g.expected, g.got]), [["o3", 21, 23]]);
    assert.notEqual(projectionChecksum(full.state), projectionChecksum(liveState));
    assert.equal(projectionChecksum({ b: 1, a: [1, { d: 2, c: 3 }] }), projectionChecksum({ a: [1, { c: 3, d: 2 }], b: 1 }), "key order does not matter");
  } finally {
    await b.close();
    d.cleanup();
  }
});
