// SPDX-License-Identifier: Apache-2.0
/**
 * Concurrent fdatasyncs at a trickle (LOG-9): an append that arrives while one fdatasync runs is
 * written and synced at once on another descriptor, not held until the running one returns
 * (EAGER_SYNCS);
 * when the later fdatasync returns first it publishes the older append too, in order.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { NodeFileSystem, type FileHandle, type OpenMode } from "../src/log/io.js";
import { PartitionLog, type LogConfig } from "../src/log/partition-log.js";
import type { PreparedRecord } from "../src/log/record-batch.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";

/** fdatasyncs of the log files wait until released, one by one, in any order. */
class HeldSyncFs extends NodeFileSystem {
  hold = false;
  held: { release: () => void; done: Promise<void> }[] = [];
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await super.open(path, mode);
    const fs = this;
    return {
      path: h.path,
      write: (b, p) => h.write(b, p),
      writeDurable: (b, p) => h.writeDurable(b, p),
      read: (b, o, l, p) => h.read(b, o, l, p),
      readSync: (b, o, l, p) => h.readSync(b, o, l, p),
      async datasync() {
        if (!fs.hold || !path.endsWith(".log")) return h.datasync();
        let release!: () => void;
        const gate = new Promise<void>((r) => (release = r));
        const done = gate.then(() => h.datasync());
        fs.held.push({ release, done });
        return done;
      },
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
}

const config: LogConfig = { segmentBytes: 8 << 20, segmentMs: 7 * 86_400_000, maxMessageBytes: 1 << 20, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 };
const rec = (i: number): PreparedRecord => ({ key: null, value: Buffer.from(`v${i}`), valueKind: 0, timestamp: Date.now(), headers: null });

test("an append arriving during an fdatasync gets its own at once; the later one returning first publishes both, in order", async () => {
  using tmp = tempDir();
  const fs = new HeldSyncFs();
  const log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config, preallocate: "off" });
  try {
    await log.append([rec(0)]);
    fs.hold = true;
    const order: number[] = [];
    const a = log.append([rec(1)]).then((r) => (order.push(r.baseOffset), r));
    await waitUntil(() => fs.held.length === 1, "the first fdatasync started", 5000);
    // A second append while the first fdatasync is still running: its fdatasync must start
    // without waiting for the first to return.
    const b = log.append([rec(2)]).then((r) => (order.push(r.baseOffset), r));
    await waitUntil(() => fs.held.length === 2, "the second append's fdatasync started while the first was running", 5000);
    assert.equal(log.highWatermark, 1, "nothing is visible before an fdatasync covering it returns");
    // The later fdatasync returns first: it covers both appends (LOG-9).
    fs.held[1].release();
    const [ra, rb] = await Promise.all([a, b]);
    assert.deepEqual([ra.baseOffset, rb.baseOffset], [1, 2]);
    assert.deepEqual(order, [1, 2], "published in append order");
    assert.equal(log.highWatermark, 3);
    fs.held[0].release();
    await fs.held[0].done;
    fs.hold = false;
    const r = await log.read(0, 1 << 20);
    assert.deepEqual(r.records.map((x) => x.value!.toString()), ["v0", "v1", "v2"]);
  } finally {
    fs.hold = false;
    for (const h of fs.held) h.release();
    await log.close();
  }
});
