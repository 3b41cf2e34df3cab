// SPDX-License-Identifier: Apache-2.0
/** The in-memory tail of published batches (src/log/tail-cache.ts): lookups, contiguity, the global bound. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PartitionTail, TAIL_CACHE_BYTES, tailCacheBytes } from "../src/log/tail-cache.js";
import { openBroker } from "../src/index.js";

const batch = (baseOffset: number, count: number, bytes = 100) => ({ baseOffset, count, buf: Buffer.alloc(bytes, baseOffset & 0xff) });

test("lookup returns whole batches from the one holding the offset, within maxBytes and maxRecords", () => {
  const t = new PartitionTail();
  t.add([batch(10, 5), batch(15, 5), batch(20, 5)]);
  assert.equal(t.lookup(9, 1000), null, "below the cached range: read the file");
  assert.equal(t.lookup(25, 1000), null, "at the end: nothing cached");
  const h = t.lookup(12, 1000)!;
  assert.equal(h.bufs.length, 3);
  assert.equal(h.records, 13);
  assert.equal(h.nextOffset, 25);
  const one = t.lookup(17, 150)!; // at least one batch, then only what fits
  assert.equal(one.bufs.length, 1);
  assert.equal(one.nextOffset, 20);
  assert.equal(t.lookup(10, 1000, 6)!.bufs.length, 2, "maxRecords stops after the batch that reaches it");
  t.clear();
});

test("a gap in offsets clears the partition's entries (they stay contiguous)", () => {
  const t = new PartitionTail();
  t.add([batch(0, 2), batch(2, 2)]);
  t.add([batch(10, 1)]);
  assert.equal(t.lookup(1, 1000), null);
  assert.equal(t.lookup(10, 1000)!.records, 1);
  t.clear();
});

test("memory stays within the process-wide budget whatever the number of partitions", () => {
  const before = tailCacheBytes();
  const tails = Array.from({ length: 50 }, () => new PartitionTail());
  const size = 256 * 1024;
  for (let round = 0; round < 10; round++) tails.forEach((t, i) => t.add([batch(round, 1, size)]));
  assert.ok(tailCacheBytes() <= TAIL_CACHE_BYTES, `${tailCacheBytes()} bytes cached`);
  // The newest batches survive, the oldest were dropped.
  assert.ok(tails[49].lookup(9, size) !== null);
  assert.equal(tails[0].lookup(0, size), null);
  for (const t of tails) t.clear();
  assert.equal(tailCacheBytes(), before);
});

test("a broker serves the live end from the tail and older offsets from the file, identically", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-tail-"));
  try {
    let b = await openBroker({ dataDir: dir });
    await b.createTopic("t", { partitions: 1 });
    for (let i = 0; i < 20; i++) await b.publishBatch("t", [{ value: `a${i}` }, { value: `b${i}`, key: "k" }]);
    const hot = await b.fetch("t", 0, 5, { maxBytes: 1 << 20 });
    await b.close();
    b = await openBroker({ dataDir: dir }); // nothing cached after reopen: read from the file
    const cold = await b.fetch("t", 0, 5, { maxBytes: 1 << 20 });
    assert.deepEqual(
      hot.records.map((r) => [r.offset, r.value, r.key?.toString()]),
      cold.records.map((r) => [r.offset, r.value, r.key?.toString()]),
    );
    assert.equal(hot.records[0].offset, 5);
    assert.equal(hot.records.length, 35);
    await b.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
