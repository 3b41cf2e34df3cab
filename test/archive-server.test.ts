// SPDX-License-Identifier: Apache-2.0
/**
 * Transparent reads from the segment archive through a `sluice serve` child process (ARC-2):
 * a topic whose older segments retention archived and deleted serves fetches and a
 * subscription (the server's raw batch push) from offset 0, identical to what was written.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import type { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

test("a client fetches and subscribes from archived offsets through the server, byte for byte", { timeout: 120_000 }, async () => {
  using tmp = tempDir("sluice-archive-srv-");
  const dataDir = join(tmp.dir, "data");
  const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  const want: [number, string, number][] = [];
  try {
    await b.createTopic("t", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: join(tmp.dir, "archive") } });
    for (let i = 0; i < 50; i++) await b.publishBatch("t", Array.from({ length: 4 }, (_, j) => ({ value: `record ${i}.${j} `.repeat(12), partition: 0, timestamp: 1_000_000 + i })));
    await b.enforceRetention(Date.now());
    assert.ok((b.engine as DiskEngine).log("t", 0).onlineLogStartOffset > 100, "most of the log is archived only");
    for (let off = 0; off < 200; ) {
      const r = await b.fetch("t", 0, off);
      for (const m of r.records) want.push([m.offset, m.value as string, m.timestamp]);
      off = r.nextOffset;
    }
  } finally {
    await b.close();
  }
  const server = await spawnServer(["--data", dataDir, "--port", "0", "--http-port", "off", "--log-level", "error"]);
  const c = await connect({ url: server.url });
  try {
    const d = await c.describeTopic("t");
    assert.equal(d.partitions[0].logStartOffset, 0, "the archive's start is the log start");
    const fetched: [number, string, number][] = [];
    for (let off = 0; off < 200; ) {
      const r = await c.fetch("t", 0, off, { maxBytes: 2000 });
      for (const m of r.records) fetched.push([m.offset, m.value as string, m.timestamp]);
      assert.ok(r.nextOffset > off);
      off = r.nextOffset;
    }
    assert.deepEqual(fetched, want);
    const sub = c.subscribe<string>("t", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    const pushed: [number, string, number][] = [];
    while (pushed.length < 200) {
      const r = await it.next();
      assert.ok(!r.done);
      pushed.push([r.value.offset, r.value.value, r.value.timestamp]);
    }
    await sub.close();
    assert.deepEqual(pushed, want);
    assert.equal(await c.offsetForTimestamp("t", 0, 1_000_000 + 5), 20);
  } finally {
    await c.close();
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
