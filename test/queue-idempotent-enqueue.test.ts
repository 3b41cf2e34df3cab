// SPDX-License-Identifier: Apache-2.0
/**
 * Idempotent enqueue requests at the queue (src/queues/idempotence.ts): a request that carries
 * `(producerId, sequence)` and is sent again (the network client re-sends after a lost
 * connection or a timeout) is answered with its original ids and stored once; a retry of a
 * request still being written waits for it; a request that stored nothing leaves no entry, so
 * its retry is evaluated afresh; the table survives close/reopen and power loss (IDEM-1).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AbortedError, OutOfOrderSequenceError, QueueFullError, StorageError, ValidationError } from "../src/errors.js";
import { NodeFileSystem, type FileHandle, type FileSystem, type OpenMode } from "../src/log/io.js";
import type { EmbeddedQueue, QueueManager } from "../src/queues/manager.js";
import { ENQUEUE_REQUESTS_KEPT, MAX_ENQUEUE_PRODUCERS } from "../src/queues/idempotence.js";
import type { EnqueueItem, EnqueueResult, Job, QueueConfig } from "../src/queues/types.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { openManager } from "./fixtures/queue-helpers.js";

type RawItem = { value: Buffer | null; valueKind: 0 | 1 | 2; opts: Omit<EnqueueItem, "data"> };
const item = (s: string, opts: Omit<EnqueueItem, "data"> = {}): RawItem => ({ value: Buffer.from(s), valueKind: 1, opts });

function handle(m: QueueManager, name: string, config?: QueueConfig): EmbeddedQueue<string> {
  return m.queue<string>(name, config);
}

/** One idempotent request, answered as one result per job. */
async function send(q: EmbeddedQueue<string>, items: RawItem[], producerId: number, sequence: number, signal?: AbortSignal): Promise<EnqueueResult[]> {
  const r = await q.enqueueCalls(items, undefined, { identity: { producerId, sequence }, signal });
  if ("first" in r) return Array.from({ length: r.count }, (_, k) => ({ id: String(r.first + k), duplicate: false }));
  assert.equal(r.errors.length, 0);
  return r.results.map((x) => x!);
}

/** Every job currently deliverable, acked, as their string payloads by id. */
async function drain(q: EmbeddedQueue<string>, expected: number): Promise<Map<string, string>> {
  const got = new Map<string, string>();
  const stop = new AbortController();
  const seen: Job<string>[] = [];
  const w = q.work({ prefetch: 256, signal: stop.signal });
  const run = (async () => {
    for await (const j of w) {
      seen.push(j);
      got.set(j.id, j.data);
      await j.ack();
      if (got.size >= expected) stop.abort();
    }
  })();
  if (expected === 0) stop.abort();
  await waitUntil(() => got.size >= expected || stop.signal.aborted, `${expected} jobs delivered`, 10_000);
  stop.abort();
  await run;
  assert.equal((await q.stats()).depth, 0, "nothing else is stored");
  return got;
}

/** fdatasyncs of a queue's message-log segments wait until released (the append is "being written"). */
class HeldSyncFs extends NodeFileSystem {
  hold = false;
  held: (() => void)[] = [];
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
        if (!fs.hold || !path.includes("/msgs/") || !path.endsWith(".log")) return h.datasync();
        await new Promise<void>((r) => fs.held.push(r));
        return h.datasync();
      },
      truncate: (n) => h.truncate(n),
      size: () => h.size(),
      close: () => h.close(),
    };
  }
  release(): void {
    this.hold = false;
    for (const r of this.held.splice(0)) r();
  }
}

function open(dir: string, fs: FileSystem = new NodeFileSystem()): Promise<QueueManager> {
  return openManager(dir, undefined, fs);
}

test("a retried request is answered with its original ids and stored once (compact and per-job answers)", async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q");
    const first = await send(q, [item("a"), item("b")], 7, 0);
    assert.deepEqual(first, [
      { id: "0", duplicate: false },
      { id: "1", duplicate: false },
    ]);
    const later = await send(q, [item("c")], 7, 1);
    assert.deepEqual(await send(q, [item("a"), item("b")], 7, 0), first, "retry of sequence 0");
    assert.deepEqual(await q.enqueueCalls([item("a"), item("b")], undefined, { identity: { producerId: 7, sequence: 0 } }), { first: 0, count: 2 });
    assert.deepEqual(await send(q, [item("c")], 7, 1), later);
    // The same sequence of another producer is another request.
    assert.deepEqual(await send(q, [item("d")], 8, 0), [{ id: "3", duplicate: false }]);
    const got = await drain(q, 4);
    assert.deepEqual([...got.values()].sort(), ["a", "b", "c", "d"]);
  } finally {
    await m.close();
  }
});

test("a retry of a request whose append is still being written waits for it and gets its ids", async () => {
  using tmp = tempDir();
  const fs = new HeldSyncFs();
  const m = await open(tmp.dir, fs);
  try {
    const q = handle(m, "q");
    await q.enqueue("warm-up"); // the queue is open: the next append's fdatasync is the one held
    fs.hold = true;
    let originalDone = false;
    let retryDone = false;
    const original = send(q, [item("x"), item("y")], 1, 0).then((r) => ((originalDone = true), r));
    await waitUntil(() => fs.held.length > 0, "the original's fdatasync started", 5000);
    const retry = send(q, [item("x"), item("y")], 1, 0).then((r) => ((retryDone = true), r));
    // Both wait for the same fdatasync: neither may answer before the jobs are durable.
    await new Promise((r) => setImmediate(r));
    assert.equal(originalDone || retryDone, false, "no answer before the append is durable");
    fs.release();
    const [a, b] = await Promise.all([original, retry]);
    assert.deepEqual(a, [
      { id: "1", duplicate: false },
      { id: "2", duplicate: false },
    ]);
    assert.deepEqual(b, a);
    assert.deepEqual([...(await drain(q, 3)).values()].sort(), ["warm-up", "x", "y"]);
  } finally {
    fs.release();
    await m.close();
  }
});

test("a retry of a request waiting for room waits too; when the original fails with QUEUE_FULL the retry fails the same way", async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q", { maxDepth: 1, overflow: "block", blockTimeoutMs: 300 });
    await q.enqueue("occupant");
    const original = send(q, [item("late")], 3, 0);
    const retry = send(q, [item("late")], 3, 0);
    await assert.rejects(original, QueueFullError);
    await assert.rejects(retry, QueueFullError, "the retry shares the original's outcome");
    // Nothing was stored and no entry remains: with room, the same request is stored afresh.
    await drain(q, 1);
    assert.deepEqual(await send(q, [item("late")], 3, 0), [{ id: "1", duplicate: false }]);
    assert.deepEqual(await send(q, [item("late")], 3, 0), [{ id: "1", duplicate: false }]);
    assert.deepEqual([...(await drain(q, 1)).values()], ["late"]);
  } finally {
    await m.close();
  }
});

test("a failed original (QUEUE_FULL, overflow reject) leaves nothing behind: its retry is evaluated afresh", async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q", { maxDepth: 2, overflow: "reject" });
    await q.enqueueBatch([{ data: "a" }, { data: "b" }]);
    await assert.rejects(send(q, [item("c")], 4, 0), QueueFullError);
    await assert.rejects(send(q, [item("c")], 4, 0), QueueFullError, "still full: evaluated again, not remembered");
    await drain(q, 2);
    const stored = await send(q, [item("c")], 4, 0);
    assert.deepEqual(stored, [{ id: "2", duplicate: false }]);
    assert.deepEqual(await send(q, [item("c")], 4, 0), stored);
    assert.deepEqual([...(await drain(q, 1)).values()], ["c"]);
  } finally {
    await m.close();
  }
});

test("an original cut short by its connection (aborted while blocked) lets a waiting retry stand in for it", async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q", { maxDepth: 1, overflow: "block", blockTimeoutMs: 10_000 });
    await q.enqueue("occupant");
    const conn = new AbortController();
    const original = send(q, [item("job")], 5, 0, conn.signal);
    const retry = send(q, [item("job")], 5, 0);
    conn.abort();
    await assert.rejects(original, AbortedError);
    // The retry now blocks on its own; room lets it through, and it is stored once.
    const worker = q.work({ prefetch: 1 });
    const it = worker[Symbol.asyncIterator]();
    const occupant = (await it.next()).value as Job<string>;
    assert.equal(occupant.data, "occupant");
    await occupant.ack();
    assert.deepEqual(await retry, [{ id: "1", duplicate: false }]);
    const next = (await it.next()).value as Job<string>;
    assert.equal(next.data, "job");
    await next.ack();
    await worker.close();
    assert.equal((await q.stats()).depth, 0);
  } finally {
    await m.close();
  }
});

test(`only the last ${ENQUEUE_REQUESTS_KEPT} sequences of a producer are remembered; older ones fail with OutOfOrderSequenceError`, async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q");
    const answers: EnqueueResult[][] = [];
    for (let s = 0; s <= ENQUEUE_REQUESTS_KEPT; s++) answers.push(await send(q, [item(`j${s}`)], 9, s));
    for (let s = 1; s <= ENQUEUE_REQUESTS_KEPT; s++) assert.deepEqual(await send(q, [item(`j${s}`)], 9, s), answers[s], `sequence ${s} is in the window`);
    await assert.rejects(send(q, [item("j0")], 9, 0), OutOfOrderSequenceError, "sequence 0 fell out of the window");
    // Sequences may skip (a failed request leaves no entry and is not resent with its number).
    assert.deepEqual(await send(q, [item("j20")], 9, 20), [{ id: String(ENQUEUE_REQUESTS_KEPT + 1), duplicate: false }]);
    await assert.rejects(q.enqueueCalls([item("x")], undefined, { identity: { producerId: -1, sequence: 0 } }), ValidationError);
    await assert.rejects(q.enqueueCalls([item("x")], undefined, { identity: { producerId: 1, sequence: 1.5 } }), ValidationError);
    assert.equal((await drain(q, ENQUEUE_REQUESTS_KEPT + 2)).size, ENQUEUE_REQUESTS_KEPT + 2);
  } finally {
    await m.close();
  }
});

test("dedupe ids and new jobs in one request: the retry rebuilds the original answer, also after reopen; all-duplicate requests store nothing", async () => {
  using tmp = tempDir();
  const cfg: QueueConfig = { dedupeWindowMs: 3_600_000 };
  const mixed = (): RawItem[] => [
    item("dup-of-a", { dedupeId: "a" }),
    item("plain-1"),
    item("b", { dedupeId: "b" }),
    item("b-again", { dedupeId: "b" }),
    item("plain-2"),
    item("c", { dedupeId: "c" }),
  ];
  let m = await open(tmp.dir);
  let expected: EnqueueResult[];
  try {
    const q = handle(m, "q", cfg);
    assert.deepEqual(await q.enqueue("a", { dedupeId: "a" }), { id: "0", duplicate: false });
    expected = await send(q, mixed(), 11, 0);
    assert.deepEqual(expected, [
      { id: "0", duplicate: true },
      { id: "1", duplicate: false },
      { id: "2", duplicate: false },
      { id: "2", duplicate: true },
      { id: "3", duplicate: false },
      { id: "4", duplicate: false },
    ]);
    assert.deepEqual(await send(q, mixed(), 11, 0), expected, "retry");
    // Every job a duplicate: nothing stored, nothing remembered; the retry is answered alike.
    const allDup = [item("a2", { dedupeId: "a" }), item("c2", { dedupeId: "c" })];
    const dupAnswer = [
      { id: "0", duplicate: true },
      { id: "4", duplicate: true },
    ];
    assert.deepEqual(await send(q, allDup, 11, 1), dupAnswer);
    assert.deepEqual(await send(q, allDup, 11, 1), dupAnswer);
    assert.equal((await q.stats()).depth, 5);
  } finally {
    await m.close();
  }
  m = await open(tmp.dir);
  try {
    const q = handle(m, "q", cfg);
    assert.deepEqual(await send(q, mixed(), 11, 0), expected, "retry after reopen");
    assert.equal((await drain(q, 5)).size, 5);
  } finally {
    await m.close();
  }
});

test("remembered requests survive close/reopen (snapshot) and power loss (headers of the jobs after the snapshot)", async () => {
  using tmp = tempDir();
  let fs = new FaultyFileSystem();
  let m = await open(tmp.dir, fs);
  const answers = new Map<string, EnqueueResult[]>();
  const key = (p: number, s: number): string => `${p}/${s}`;
  try {
    const q = handle(m, "q", { segmentBytes: 16 * 1024 });
    for (let s = 0; s < 3; s++) answers.set(key(1, s), await send(q, [item(`p1-${s}`), item(`p1-${s}b`)], 1, s));
  } finally {
    await m.close(); // clean close: a snapshot holds the table
  }
  fs = new FaultyFileSystem();
  m = await open(tmp.dir, fs);
  {
    const q = handle(m, "q", { segmentBytes: 16 * 1024 });
    assert.deepEqual(await send(q, [item("p1-1"), item("p1-1b")], 1, 1), answers.get(key(1, 1)), "from the snapshot");
    // More requests after the snapshot, then power loss without a close: only the message log
    // (their headers) can tell.
    for (let s = 0; s < 3; s++) answers.set(key(2, s), await send(q, [item(`p2-${s}`)], 2, s));
    answers.set(key(1, 3), await send(q, [item("p1-3")], 1, 3));
  }
  await fs.powerLoss();
  m = await open(tmp.dir);
  try {
    const q = handle(m, "q", { segmentBytes: 16 * 1024 });
    for (const [k, want] of answers) {
      const [p, s] = k.split("/").map(Number);
      const items = want.map((_r, i) => item(`x${i}`));
      assert.deepEqual(await send(q, items, p, s), want, `request ${k} after power loss`);
    }
    assert.equal((await drain(q, 10)).size, 10, "each job stored once");
  } finally {
    await m.close();
  }
});

test("a failed append leaves no entry behind: after reopen the same request is stored afresh", async () => {
  using tmp = tempDir();
  const fs = new FaultyFileSystem();
  let m = await open(tmp.dir, fs);
  let stored: EnqueueResult[];
  {
    const q = handle(m, "q");
    stored = await send(q, [item("ok")], 6, 0);
    fs.failNext("write", "EIO", { pathIncludes: "/msgs/" });
    await assert.rejects(send(q, [item("lost")], 6, 1), StorageError);
    // The queue refuses work until reopened; the failed request is not remembered meanwhile.
    await assert.rejects(send(q, [item("lost")], 6, 1), StorageError);
  }
  await fs.powerLoss();
  m = await open(tmp.dir);
  try {
    const q = handle(m, "q");
    assert.deepEqual(await send(q, [item("ok")], 6, 0), stored);
    const again = await send(q, [item("lost")], 6, 1);
    assert.deepEqual(again, [{ id: "1", duplicate: false }], "evaluated afresh");
    assert.deepEqual([...(await drain(q, 2)).values()].sort(), ["lost", "ok"]);
  } finally {
    await m.close();
  }
});

test("calls sharing a request succeed or fail on their own, and its retry answers each the same way", async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    const q = handle(m, "q");
    const items = [item("a1"), item("a2"), item("bad", { key: "k".repeat(2000) }), item("b2"), item("c1")];
    const r1 = await q.enqueueCalls(items, [2, 2, 1], { identity: { producerId: 12, sequence: 0 } });
    assert.ok("results" in r1);
    assert.deepEqual(r1.results, [{ id: "0", duplicate: false }, { id: "1", duplicate: false }, null, null, { id: "2", duplicate: false }]);
    assert.equal(r1.errors.length, 1);
    assert.equal(r1.errors[0][0], 1);
    assert.ok(r1.errors[0][1] instanceof ValidationError);
    const r2 = await q.enqueueCalls(items, [2, 2, 1], { identity: { producerId: 12, sequence: 0 } });
    assert.deepEqual(r2, r1);
    assert.deepEqual(await q.enqueueCalls([item("d"), item("e")], [1, 1], { identity: { producerId: 12, sequence: 1 } }), { first: 3, count: 2 });
    await assert.rejects(q.enqueueCalls([item("d")], [2], {}), ValidationError, "calls must add up to the jobs");
    assert.deepEqual([...(await drain(q, 5)).values()].sort(), ["a1", "a2", "c1", "d", "e"]);
  } finally {
    await m.close();
  }
});

test(`at most ${MAX_ENQUEUE_PRODUCERS} producers per queue: the least recently active one is forgotten`, async () => {
  using tmp = tempDir();
  const m = await open(tmp.dir);
  try {
    // durability "never": 10,001 requests without 10,001 fdatasyncs.
    const q = handle(m, "q", { durability: "never" });
    const first = await send(q, [item("p0")], 0, 0);
    const kept = await send(q, [item("p1")], 1, 0);
    const all: Promise<EnqueueResult[]>[] = [];
    for (let p = 2; p <= MAX_ENQUEUE_PRODUCERS; p++) all.push(send(q, [item(`p${p}`)], p, 0));
    await Promise.all(all);
    assert.deepEqual(await send(q, [item("p1")], 1, 0), kept, "touched: still known");
    // Producer 0 was the least recently active when producer 10,000 arrived: a retry from it
    // is no longer recognised and is stored again (the documented meaning of eviction).
    const again = await send(q, [item("p0")], 0, 0);
    assert.notDeepEqual(again, first);
    assert.equal((await q.stats()).depth, MAX_ENQUEUE_PRODUCERS + 2);
  } finally {
    await m.close();
  }
});

for (const torn of [0, 7, 300, 5000]) {
  test(`a crash mid-stream (writes stop, power loss keeping ${torn} torn bytes): acknowledged requests keep their ids, nothing is stored twice`, async () => {
    using tmp = tempDir();
    const fs = new FaultyFileSystem();
    const m = await open(tmp.dir, fs);
    const q = handle(m, "q", { segmentBytes: 16 * 1024 });
    const payload = (s: number): RawItem => item(`j${s}`.padEnd(300, "."));
    const acked = new Map<number, string>();
    const inflight: Promise<unknown>[] = [];
    const N = 200;
    for (let s = 0; s < N; s++) {
      inflight.push(send(q, [payload(s)], 1, s).then((r) => acked.set(s, r[0].id), () => {}));
      // Up to the client's window outstanding, like the network client.
      if (inflight.length >= ENQUEUE_REQUESTS_KEPT) await Promise.race(inflight.splice(0, 1));
    }
    // The crash: from here nothing reaches the disk; then what was not synced is lost.
    for (const op of ["write", "datasync", "truncate", "rename", "fsyncDir", "open"] as const) fs.failAlways(op, "EIO");
    await Promise.allSettled(inflight);
    await fs.powerLoss(torn);
    const m2 = await open(tmp.dir);
    try {
      const q2 = handle(m2, "q", { segmentBytes: 16 * 1024 });
      // The client re-sends what it has unanswered: at most the last window of sequences.
      for (let s = N - ENQUEUE_REQUESTS_KEPT; s < N; s++) {
        const r = await send(q2, [payload(s)], 1, s);
        if (acked.has(s)) assert.deepEqual(r, [{ id: acked.get(s)!, duplicate: false }], `acknowledged sequence ${s}`);
        else acked.set(s, r[0].id);
      }
      const stored = await drain(q2, acked.size);
      assert.equal(stored.size, acked.size, "each request stored once");
      for (const [s, id] of acked) assert.equal(stored.get(id)?.trim(), `j${s}`.padEnd(300, ".").trim(), `sequence ${s} under id ${id}`);
    } finally {
      await m2.close();
    }
  });
}
