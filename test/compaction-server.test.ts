// SPDX-License-Identifier: Apache-2.0
/**
 * A compacted topic through a server: the keyless refusal (CMP-1) reaches the client as
 * ValidationError, and compacted batches (gaps between offsets, CMP-2) are served by fetch and
 * by raw pushes to a subscription exactly as the embedded broker reads them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { ValidationError } from "../src/errors.js";
import { NodeFileSystem } from "../src/log/io.js";
import { startServer } from "../src/server/index.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir } from "../src/testing/helpers.js";

test("compacted topic through a server: keyless publish refused, fetch and subscription read across compaction gaps", async () => {
  using tmp = tempDir("sluice-compact-srv-");
  const engine = new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem(), cleanerIntervalMs: 0 });
  const broker = await openBroker({ engine, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const client = await connect({ url: srv.url });
  try {
    await client.createTopic("table", { segmentBytes: 1024, cleanupPolicy: "compact" });
    await assert.rejects(client.publish("table", "no key"), (e: unknown) => e instanceof ValidationError && /needs a key/.test(e.message));
    await assert.rejects(client.publishBatch("table", [{ key: "a", value: 1 }, { value: 2 }]), ValidationError);
    for (let i = 0; i < 40; i++) await client.publishBatch("table", [0, 1, 2].map((j) => ({ key: `k${(i * 3 + j) % 4}`, value: i * 3 + j, partition: 0 })));
    await engine.compact();
    const embedded: { offset: number; key: string; value: unknown }[] = [];
    let off = 0;
    const hwm = (await broker.describeTopic("table")).partitions[0].highWatermark;
    assert.equal(hwm, 120, "the refused records took no offsets");
    while (off < hwm) {
      const r = await broker.fetch("table", 0, off);
      for (const m of r.records) embedded.push({ offset: m.offset, key: String(m.key), value: m.value });
      off = r.nextOffset;
    }
    assert.ok(embedded.length < 120, "compaction removed records");
    assert.ok((await broker.describeTopic("table")).partitions[0].bytesReclaimed! > 0);
    // fetch through the client, from every offset of a gap too
    const fetched: number[] = [];
    off = 0;
    while (off < hwm) {
      const r = await client.fetch("table", 0, off);
      fetched.push(...r.records.map((m) => m.offset));
      off = r.nextOffset;
    }
    assert.deepEqual(fetched, embedded.map((e) => e.offset));
    // a subscription from the start: raw pushes of compacted batches
    const sub = client.subscribe<number>("table", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    for (const e of embedded) {
      const m = (await it.next()).value!;
      assert.equal(m.offset, e.offset);
      assert.equal(String(m.key), e.key);
      assert.equal(m.value, e.value);
    }
    await sub.close();
  } finally {
    await client.close();
    await srv.close({ graceMs: 100 });
    await broker.close();
  }
});
