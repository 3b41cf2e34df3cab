// SPDX-License-Identifier: Apache-2.0
/**
 * Concurrent fdatasyncs at a trickle (LOG-9): an append that arrives while one fdatasync runs is
 * written and synced at once on another descriptor, not held until the running one returns
 * (EAGER_SYNCS);
 * when the later fdatasync returns first it publishes the older append too, in order. Inside
 * durable preallocated zeros an append is one O_DSYNC write, which covers only its own bytes.
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

/** Durable (O_DSYNC) writes of the log files wait until released, one by one, in any order. */
class HeldDurableFs extends NodeFileSystem {
  hold = false;
  durableWrites = 0;
  held: { release: () => void; done: Promise<void> }[] = [];
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await super.open(path, mode);
    const fs = this;
    return {
      path: h.path,
      write: (b, p) => h.write(b, p),
      async writeDurable(b, p) {
        if (path.endsWith(".log")) fs.durableWrites++;
        if (!fs.hold || !path.endsWith(".log")) return h.writeDurable(b, p);
        let release!: () => void;
        const gate = new Promise<void>((r) => (release = r));
        const done = gate.then(() => h.writeDurable(b, p));
        fs.held.push({ release, done });
        return done;
      },
      read: (b, o, l, p) => h.read(b, o, l, p),
      readSync: (b, o, l, p) => h.readSync(b, o, l, p),
      datasync: () => h.datasync(),
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
}

test("appends inside durable preallocated zeros: one O_DSYNC write each, concurrent, published only in append order", async () => {
  using tmp = tempDir();
  const fs = new HeldDurableFs();
  const log = await PartitionLog.open({ fs, dir: tmp.dir, topic: "t", partition: 0, config, preallocate: "always" });
  try {
    // The first appends extend the file (write + fdatasync) until they reach the zeros of a
    // durable fill (it starts up to 64 KiB past the log's end): 8 KiB records get there soon.
    const filler: PreparedRecord = { ...rec(0), value: Buffer.alloc(8192, 0x66) };
    await waitUntil(async () => (await log.append([filler]), fs.durableWrites > 0), "an append written with one O_DSYNC write", 10_000);
    const base = log.highWatermark;
    let i = 0;
    fs.hold = true;
    const order: number[] = [];
    const a = log.append([rec(i++)]).then((r) => (order.push(r.baseOffset), r));
    await waitUntil(() => fs.held.length === 1, "the first durable write started", 5000);
    const b = log.append([rec(i++)]).then((r) => (order.push(r.baseOffset), r));
    await waitUntil(() => fs.held.length === 2, "the second append's durable write started while the first was running", 5000);
    // The later write returns first: it makes only its own bytes durable, so nothing is
    // published until the earlier one returns too (an O_DSYNC write covers no other byte).
    fs.held[1].release();
    await fs.held[1].done;
    await new Promise((r) => setImmediate(r));
    assert.equal(log.highWatermark, base, "the later append is not visible before the earlier one is durable");
    assert.deepEqual(order, []);
    fs.held[0].release();
    const [ra, rb] = await Promise.all([a, b]);
    assert.deepEqual([ra.baseOffset, rb.baseOffset], [base, base + 1]);
    assert.deepEqual(order, [base, base + 1], "published in append order");
    assert.equal(log.highWatermark, base + 2);
    fs.hold = false;
    const r = await log.read(base, 1 << 20);
    assert.deepEqual(r.records.map((x) => x.value!.toString()), ["v0", "v1"]);
  } finally {
    fs.hold = false;
    for (const h of fs.held) h.release();
    await log.close();
  }
});
