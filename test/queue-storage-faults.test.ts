// SPDX-License-Identifier: Apache-2.0
/**
 * Storage faults under a queue (docs/ARCHITECTURE.md Q-7, REC-1):
 *  - a failed write (message log or journal) stops the queue's open instance; calls get a
 *    retriable StorageError while the disk queue reopens itself from disk with backoff (logged
 *    at error level once), and workers attached to it receive jobs again once it is back;
 *  - a damaged record of the message log after the snapshot does not keep the queue from
 *    opening: the damaged jobs are skipped, counted in stats().unreadable and logged; every
 *    intact job before and after them is delivered. Damage below the snapshot is found at
 *    hand-out time and counted the same way.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { LeaseExpiredError, StorageError } from "../src/errors.js";
import { NodeFileSystem } from "../src/log/io.js";
import type { Job } from "../src/queues/types.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { TestQueues } from "./fixtures/queue-helpers.js";

interface LogLine {
  level: string;
  msg: string;
}

/** Queues on a disk engine whose logger records what it was told. */
async function openQueues(dir: string, fs = new NodeFileSystem()): Promise<{ m: TestQueues; log: LogLine[] }> {
  const log: LogLine[] = [];
  const rec = (level: string) => (_obj: object | string, msg?: string) => void log.push({ level, msg: msg ?? "" });
  const engine = new DiskEngine({ dataDir: dir, fs, logger: { debug: rec("debug"), info: rec("info"), warn: rec("warn"), error: rec("error") } });
  await engine.open();
  return { m: new TestQueues(engine), log };
}

/** Receives `n` jobs through a worker, acking each; returns their payloads. */
async function drain(m: TestQueues, name: string, n: number): Promise<string[]> {
  const got: string[] = [];
  const ac = new AbortController();
  const done = m.queue<string>(name).process(
    (job) => {
      got.push(job.data);
      if (got.length === n) ac.abort();
    },
    { concurrency: 8, signal: ac.signal },
  );
  await waitUntil(() => got.length >= n, `${n} jobs`, 10_000);
  ac.abort();
  await done;
  return got;
}

for (const where of ["message log write", "journal fdatasync"] as const) {
  test(`a failed ${where} makes the queue reopen itself from disk; calls get a retriable StorageError meanwhile`, async () => {
    using tmp = tempDir();
    const fs = new FaultyFileSystem();
    const { m, log } = await openQueues(tmp.dir, fs);
    try {
      const q = m.queue<string>("q", { visibilityTimeoutMs: 500 });
      await q.enqueue("before");
      // A worker that holds a lease when the fault comes, and stays attached through it.
      const held: Job<string>[] = [];
      const received: string[] = [];
      const w = q.work({ prefetch: 1 });
      const consume = (async () => {
        for await (const j of w) {
          if (held.length === 0) held.push(j);
          else {
            received.push(j.data);
            await j.ack().catch(() => {});
          }
        }
      })();
      await waitUntil(() => held.length === 1, "a job leased");

      // The disk keeps failing for a while: recovery retries with backoff.
      if (where === "message log write") fs.failAlways("write", "EIO", "/msgs/");
      else fs.failAlways("datasync", "EIO", "/journal/");
      const failed = where === "message log write" ? q.enqueue("lost") : held[0].extend(1000);
      await assert.rejects(failed, (e: unknown) => e instanceof StorageError && e.retriable === true);
      // The leased job's signal aborted with the fault (its lease is gone).
      assert.ok(held[0].signal.aborted);
      assert.ok(held[0].signal.reason instanceof StorageError);
      await assert.rejects(q.enqueue("during"), (e: unknown) => e instanceof StorageError && e.retriable === true);
      await assert.rejects(q.stats(), StorageError);
      await assert.rejects(held[0].ack(), (e: unknown) => e instanceof StorageError || e instanceof LeaseExpiredError);

      // While the disk keeps failing, reopening fails too and is retried with backoff.
      fs.failAlways("open", "EIO", where === "message log write" ? "/msgs/" : "/journal/");
      await waitUntil(() => log.some((l) => l.level === "warn" && l.msg.startsWith("queue recovery failed")), "a failed reopen", 10_000);
      fs.clearFaults();
      // Back without a restart of the broker: the queue reopened from what the disk holds.
      const after = await waitUntil(() => q.enqueue("after").catch(() => null), "the queue is back", 20_000);
      assert.equal(after.duplicate, false);
      // The worker stayed attached: the job leased at the fault comes back once its lease's
      // stored deadline passes, and the new job is delivered.
      await waitUntil(() => received.includes("after") && received.includes("before"), "jobs after recovery", 20_000);
      assert.ok(!received.includes("lost"), "a failed enqueue stored nothing");
      const errors = log.filter((l) => l.level === "error" && l.msg.startsWith("queue storage failed"));
      assert.equal(errors.length, 1, "the fault is logged at error level once");
      assert.ok(log.some((l) => l.level === "info" && l.msg.startsWith("queue recovered")));
      await w.close();
      await consume;
      assert.equal((await q.stats()).depth, 0);
    } finally {
      fs.clearFaults();
      await m.close();
    }
  });
}

/** Flips one byte of the record holding `marker` in the queue's message log segment. */
function damage(dir: string, marker: string): void {
  const root = join(dir, "queues");
  const inc = readdirSync(root).find((n) => n.startsWith("q.") && !n.startsWith("q.dlq."))!; // not its dead-letter queue's
  const msgs = join(root, inc, "msgs");
  const seg = readdirSync(msgs).find((n) => n.endsWith(".log"))!;
  const path = join(msgs, seg);
  const buf = readFileSync(path);
  const at = buf.indexOf(marker);
  assert.ok(at > 0, "marker found");
  buf[at] ^= 0xff;
  writeFileSync(path, buf);
}

test("a damaged message-log record after the snapshot: the queue opens, skips and reports those jobs, delivers the rest", async () => {
  using tmp = tempDir();
  {
    const { m } = await openQueues(tmp.dir);
    await m.queue<string>("q").enqueueBatch([{ data: "a1" }, { data: "a2" }]);
    await m.close(); // clean close: the snapshot holds a1, a2
  }
  const fs = new FaultyFileSystem();
  {
    const { m } = await openQueues(tmp.dir, fs);
    const q = m.queue<string>("q");
    // Three appends after the snapshot; the middle one gets damaged. No clean close: recovery
    // must read them from the message log.
    await q.enqueueBatch([{ data: "b1" }]);
    await q.enqueueBatch([{ data: "DAMAGED-1" }, { data: "DAMAGED-2" }, { data: "DAMAGED-3" }]);
    await q.enqueueBatch([{ data: "b3" }]);
    await fs.powerLoss();
  }
  damage(tmp.dir, "DAMAGED-2");
  const { m, log } = await openQueues(tmp.dir);
  try {
    const q = m.queue<string>("q");
    const s = await q.stats();
    assert.equal(s.unreadable, 3, "the damaged append's jobs are counted");
    assert.equal(s.depth, 4);
    assert.deepEqual((await drain(m, "q", 4)).sort(), ["a1", "a2", "b1", "b3"]);
    assert.ok(log.some((l) => l.level === "error" && l.msg.startsWith("queue message log is damaged")));
    assert.equal((await q.stats()).depth, 0);
    // New jobs go on after the damaged range.
    await q.enqueue("c");
    assert.deepEqual(await drain(m, "q", 1), ["c"]);
  } finally {
    await m.close();
  }
});

test("a damaged record below the snapshot is found when its job is handed out: counted, logged, never delivered", async () => {
  using tmp = tempDir();
  {
    const { m } = await openQueues(tmp.dir);
    const q = m.queue<string>("q");
    await q.enqueueBatch([{ data: "x1" }]);
    await q.enqueueBatch([{ data: "DAMAGED-9" }]);
    await q.enqueueBatch([{ data: "x3" }]);
    await m.close(); // the snapshot holds all three rows
  }
  damage(tmp.dir, "DAMAGED-9");
  const { m, log } = await openQueues(tmp.dir);
  try {
    assert.deepEqual((await drain(m, "q", 2)).sort(), ["x1", "x3"]);
    const q = m.queue<string>("q");
    await waitUntil(async () => (await q.stats()).unreadable === 1, "the damaged job counted");
    assert.equal((await q.stats()).depth, 0);
    assert.ok(log.some((l) => l.level === "error" && l.msg.startsWith("job unreadable")));
  } finally {
    await m.close();
  }
});
