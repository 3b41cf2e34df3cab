// SPDX-License-Identifier: Apache-2.0
/**
 * Tail reads (LOG-10): a read of the last 64 KiB of the active segment, soon after a publish,
 * is a synchronous pread (the bytes are in the page cache); every other read goes through the
 * thread pool. Both must return exactly the same verified records, and a tail read must never
 * hand out bytes beyond the high watermark.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { NodeFileSystem, type FileHandle, type FileSystem, type OpenMode } from "../src/log/io.js";
import { PartitionLog, type LogConfig } from "../src/log/partition-log.js";
import type { PreparedRecord } from "../src/log/record-batch.js";
import { tempDir } from "../src/testing/helpers.js";

/** Counts synchronous and asynchronous reads of the log files. */
class CountingFs extends NodeFileSystem {
  syncReads = 0;
  asyncReads = 0;
  override async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const h = await super.open(path, mode);
    const fs = this;
    return {
      path: h.path,
      write: (b, p) => h.write(b, p),
      writeDurable: (b, p) => h.writeDurable(b, p),
      read(b, o, l, p) {
        if (path.endsWith(".log")) fs.asyncReads++;
        return h.read(b, o, l, p);
      },
      readSync(b, o, l, p) {
        if (path.endsWith(".log")) fs.syncReads++;
        return h.readSync(b, o, l, p);
      },
      datasync: () => h.datasync(),
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
}

function config(): LogConfig {
  return { segmentBytes: 8 << 20, segmentMs: 7 * 86_400_000, maxMessageBytes: 1 << 20, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 };
}

const rec = (i: number): PreparedRecord => ({ key: null, value: Buffer.from(`v${i}-${"x".repeat(500)}`), valueKind: 0, timestamp: Date.now(), headers: null });

async function open(fs: FileSystem, dir: string): Promise<PartitionLog> {
  return PartitionLog.open({ fs, dir, topic: "t", partition: 0, config: config(), preallocate: "always" });
}

test("reads at the live end are synchronous preads; older reads use the thread pool; both return the same records", async () => {
  using tmp = tempDir();
  const dir = tmp.dir;
  const fs = new CountingFs();
  const log = await open(fs, dir);
  try {
    // ~512 KiB of single-record batches: the start is far behind the 64 KiB tail window.
    for (let i = 0; i < 1000; i++) await log.append([rec(i)]);
    assert.equal(log.highWatermark, 1000);

    fs.syncReads = fs.asyncReads = 0;
    const tail = await log.read(990, 1 << 20);
    assert.deepEqual(
      tail.records.map((r) => r.value!.toString()),
      Array.from({ length: 10 }, (_, k) => rec(990 + k).value!.toString()),
    );
    assert.equal(tail.nextOffset, 1000);
    const raw = await log.readRaw(995, 1 << 20);
    assert.equal(raw.records, 5);
    assert.equal(raw.nextOffset, 1000);
    assert.ok(fs.syncReads >= 2, `tail reads were synchronous (${fs.syncReads} sync, ${fs.asyncReads} async)`);
    assert.equal(fs.asyncReads, 0, "no thread-pool read at the tail");

    fs.syncReads = fs.asyncReads = 0;
    const old = await log.read(0, 16 * 1024);
    assert.equal(old.records[0].value!.toString(), rec(0).value!.toString());
    assert.ok(fs.asyncReads >= 1 && fs.syncReads === 0, `an old read went through the thread pool (${fs.syncReads} sync, ${fs.asyncReads} async)`);

    // Every record reads back identically whichever path served it.
    let off = 0;
    let n = 0;
    while (off < log.highWatermark) {
      const r = await log.read(off, 64 * 1024);
      for (const x of r.records) {
        assert.equal(x.offset, n);
        assert.equal(x.value!.toString(), rec(n).value!.toString());
        n++;
      }
      off = r.nextOffset;
    }
    assert.equal(n, 1000);
  } finally {
    await log.close();
  }
});

test("a tail read never returns records beyond the high watermark, even while an append is being written", async () => {
  using tmp = tempDir();
  const dir = tmp.dir;
  const fs = new CountingFs();
  const log = await open(fs, dir);
  try {
    for (let i = 0; i < 10; i++) await log.append([rec(i)]);
    // Start an append and read the tail before it is published.
    const pending = log.append([rec(10)]);
    const r = await log.readRaw(5, 1 << 20);
    assert.ok(r.nextOffset <= log.highWatermark);
    await pending;
    const after = await log.readRaw(10, 1 << 20);
    assert.equal(after.records, 1);
    assert.equal(after.nextOffset, 11);
  } finally {
    await log.close();
  }
});
