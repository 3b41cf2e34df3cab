// SPDX-License-Identifier: Apache-2.0
// Job progress and lifecycle events on the disk engine: how much journal outlives a snapshot
// (EVT-2), a position older than the kept journal (a gap event, then the oldest kept event),
// progress replayed from the journal after a crash (no final snapshot), and a reader that
// keeps reading while its queue reopens after a storage fault.
import assert from "node:assert/strict";
import { cpSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { StorageError } from "../src/errors.js";
import type { QueueEvent } from "../src/queues/types.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { messageLogStart, retainedJournalStart } from "../src/store/disk/queues/journal-retention.js";
import { iter, nextJob, openManager, tempDir, waitFor } from "./fixtures/queue-helpers.js";

/** Reads events until the reader has nothing more for 0 ms (one page at a time). */
async function drain(it: AsyncIterator<QueueEvent>, n: number): Promise<QueueEvent[]> {
  const out: QueueEvent[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

test("journal retention keeps the newest keepBytes of segments below the snapshot; the message log keeps its floor's segment", () => {
  const segs = [
    { baseOffset: 0, size: 100 },
    { baseOffset: 10, size: 100 },
    { baseOffset: 20, size: 100 },
    { baseOffset: 30, size: 40 },
  ];
  assert.equal(retainedJournalStart(segs, 35, 100), 20, "the active segment plus one sealed one");
  assert.equal(retainedJournalStart(segs, 35, 150), 10);
  assert.equal(retainedJournalStart(segs, 35, 250), 0);
  assert.equal(retainedJournalStart(segs, 15, 100), 15, "never above the snapshot's offset");
  assert.equal(retainedJournalStart(segs, 35, 10_000), 0, "a journal smaller than keepBytes keeps everything");
  assert.equal(retainedJournalStart([], 7, 100), 7);
  assert.equal(messageLogStart(segs, 25), 20);
  assert.equal(messageLogStart(segs, 30), 30);
  assert.equal(messageLogStart(segs, 0), 0);
});

test("a position older than the kept journal resumes at the oldest kept event after a gap event", async () => {
  const { dir, cleanup } = tempDir();
  try {
    let m = await openManager(dir);
    const config = { segmentBytes: 64 * 1024, deadLetter: null }; // journal segments of 16 KiB
    let q = m.queue<number>("old", config);
    const n = 1500;
    await q.enqueueBatch(Array.from({ length: n }, (_, i) => ({ data: i })));
    const first = (await drain(q.events({ from: "earliest" })[Symbol.asyncIterator](), 1))[0];
    assert.equal(first.type, "enqueued");
    let done = 0;
    const ac = new AbortController();
    await q.process(() => void (++done === n && ac.abort()), { concurrency: 32, signal: ac.signal });
    await m.close(); // a snapshot: the journal below it goes, except the newest segments
    m = await openManager(dir);
    q = m.queue<number>("old", config);
    const after = await drain(q.events({ from: first.position })[Symbol.asyncIterator](), 3);
    assert.equal(after[0].type, "gap", "the events after the position were deleted: reported as a gap");
    assert.notEqual(after[1].type, "gap");
    const earliest = await drain(q.events({ from: "earliest" })[Symbol.asyncIterator](), 1);
    assert.notEqual(earliest[0].type, "gap", "earliest starts at the oldest kept event, without a gap");
    // The kept history is bounded: far fewer than the 2 events per job the journal held.
    const all: QueueEvent[] = [];
    const it = q.events({ from: "earliest" })[Symbol.asyncIterator]();
    const { id } = await q.enqueue(-1); // marks the end of the history read below
    for (;;) {
      const e = (await it.next()).value as QueueEvent;
      if (e.type === "enqueued" && e.jobId === id) break;
      all.push(e);
    }
    assert.ok(all.length > 0 && all.length < 2 * n, `${all.length} events kept`);
    await m.close();
  } finally {
    cleanup();
  }
});

test("progress and its event are replayed from the journal after a crash (no final snapshot)", async () => {
  const { dir, cleanup } = tempDir();
  const image = tempDir();
  try {
    const m = await openManager(dir);
    const q = m.queue<string>("crash-progress");
    const { id } = await q.enqueue("x");
    const w = q.work({ prefetch: 1 });
    const job = await nextJob(iter(w));
    await job.progress({ pct: 40 });
    // The crash image: what is on disk once the progress is durable (no close, no snapshot).
    cpSync(join(dir, "queues"), join(image.dir, "queues"), { recursive: true });
    await w.close();
    await m.close();
    const m2 = await openManager(image.dir);
    const q2 = m2.queue<string>("crash-progress");
    assert.deepEqual((await q2.getJob(id))?.progress, { pct: 40 });
    const evs = await drain(q2.events({ from: "earliest" })[Symbol.asyncIterator](), 3);
    assert.deepEqual(
      evs.map((e) => e.type),
      ["enqueued", "active", "progress"],
    );
    await m2.close();
  } finally {
    cleanup();
    image.cleanup();
  }
});

test("an events reader keeps reading across a storage fault (the queue reopens itself, Q-7)", async () => {
  const { dir, cleanup } = tempDir();
  const fs = new FaultyFileSystem();
  const m = await openManager(dir, undefined, fs);
  try {
    const q = m.queue<string>("faulty");
    const { id } = await q.enqueue("before");
    const ac = new AbortController();
    const it = q.events({ from: "earliest", signal: ac.signal })[Symbol.asyncIterator]();
    assert.deepEqual((await drain(it, 1)).map((e) => e.type), ["enqueued"]);
    const next = it.next(); // waiting on the logs when the fault comes
    fs.failAlways("write", "EIO", "/msgs/");
    await assert.rejects(q.enqueue("lost"), (e: unknown) => e instanceof StorageError);
    fs.clearFaults();
    const after = await waitFor(() => q.enqueue("after").catch(() => null), "the queue is back", 20_000);
    const e = (await next).value as QueueEvent;
    assert.ok(e.type === "enqueued" && e.jobId === after!.id && e.jobId !== id, `got ${JSON.stringify(e)}`);
    ac.abort();
    assert.equal((await it.next()).done, true);
  } finally {
    fs.clearFaults();
    await m.close();
    cleanup();
  }
});

test("a position from before the queue was deleted and re-created resumes at the new queue's oldest event after a gap", async () => {
  const { dir, cleanup } = tempDir();
  const m = await openManager(dir);
  try {
    const q = m.queue<string>("again", { deadLetter: null });
    await q.enqueueBatch([{ data: "a" }, { data: "b" }]);
    const [first] = await drain(q.events({ from: "earliest" })[Symbol.asyncIterator](), 1);
    await m.deleteQueue("again");
    const q2 = m.queue<string>("again", { deadLetter: null });
    const { id } = await q2.enqueue("new");
    const evs = await drain(q2.events({ from: first.position })[Symbol.asyncIterator](), 2);
    assert.equal(evs[0].type, "gap");
    assert.ok(evs[1].type === "enqueued" && evs[1].jobId === id);
    assert.notEqual(evs[1].position, first.position);
  } finally {
    await m.close();
    cleanup();
  }
});

test("a page of events is bounded in bytes (large results), and the next page goes on from it", async () => {
  const { dir, cleanup } = tempDir();
  const m = await openManager(dir);
  try {
    const q = m.queue<number>("big", { resultRetentionMs: 60_000, deadLetter: null });
    const n = 40;
    await q.enqueueBatch(Array.from({ length: n }, (_, i) => ({ data: i })));
    const big = "r".repeat(60 * 1024);
    let done = 0;
    const ac = new AbortController();
    await q.process(() => (++done === n && ac.abort(), big), { concurrency: 4, signal: ac.signal });
    let from = "earliest";
    let completed = 0;
    let pages = 0;
    for (;;) {
      const page = await q.readEvents(from, 1000, 0);
      if (page.events.length === 0) break;
      pages++;
      assert.ok(JSON.stringify(page.events).length < 1.5 * 1024 * 1024, `page ${pages}: ${JSON.stringify(page.events).length} bytes`);
      completed += page.events.filter((e) => e.type === "completed").length;
      from = page.position;
    }
    assert.equal(completed, n);
    assert.ok(pages >= 2, `${pages} pages`);
  } finally {
    await m.close();
    cleanup();
  }
});
