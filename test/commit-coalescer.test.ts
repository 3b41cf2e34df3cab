// SPDX-License-Identifier: Apache-2.0
/** CommitCoalescer (COMMIT-1): shared writes, the pending bound, retries, refusals. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { CommitCoalescer, type CommitMark } from "../src/streams/commit-coalescer.js";
import { NotAssignedError, StorageError } from "../src/errors.js";
import { waitUntil } from "../src/testing/helpers.js";

/** A writer whose writes the test completes one by one. */
function gatedWriter() {
  const calls: Map<number, CommitMark>[] = [];
  const gates: { resolve: (v?: Map<number, Error>) => void; reject: (e: Error) => void }[] = [];
  const write = (marks: Map<number, CommitMark>): Promise<Map<number, Error> | void> => {
    calls.push(new Map(marks));
    return new Promise((resolve, reject) => gates.push({ resolve, reject }));
  };
  return { calls, gates, write };
}

const period = new AbortController();
const mark = (offset: number, signal = period.signal): CommitMark => ({ offset, generation: 1, signal });

test("marks made while a write is in flight share the next write; the last mark per partition wins", async () => {
  const w = gatedWriter();
  const c = new CommitCoalescer(w.write, 10_000);
  const first = c.mark(0, mark(0));
  const rest: Promise<void>[] = [];
  for (let i = 1; i < 1000; i++) rest.push(c.mark(i % 2, mark(i)));
  assert.equal(w.calls.length, 1, "one write in flight");
  assert.deepEqual([...w.calls[0]].map(([p, m]) => [p, m.offset]), [[0, 0]]);
  assert.equal(c.pendingMarks, 1000);
  w.gates[0].resolve();
  await first;
  await waitUntil(() => w.calls.length === 2, "second write");
  assert.deepEqual([...w.calls[1]].map(([p, m]) => [p, m.offset]).sort(), [[0, 998], [1, 999]]);
  w.gates[1].resolve();
  await Promise.all(rest);
  assert.equal(c.pendingMarks, 0);
});

test("room() holds the consumer while maxPending marks are not durable", async () => {
  const w = gatedWriter();
  const c = new CommitCoalescer(w.write, 10);
  for (let i = 0; i < 9; i++) void c.mark(0, mark(i));
  assert.equal(c.room(), null);
  void c.mark(0, mark(9));
  const room = c.room();
  assert.ok(room !== null, "no room at the bound");
  let released = false;
  void room.then(() => (released = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(released, false);
  w.gates[0].resolve(); // the first write (offset 0) is durable: 9 left
  await room;
  assert.equal(c.pendingMarks, 9);
  await waitUntil(() => w.calls.length === 2, "second write");
  w.gates[1].resolve();
  await waitUntil(() => c.pendingMarks === 0, "all durable");
});

test("a retriable failure rejects the callers and is retried until durable; marks keep counting meanwhile", async () => {
  const w = gatedWriter();
  const c = new CommitCoalescer(w.write, 100);
  const p = c.mark(3, mark(41));
  w.gates[0].reject(new StorageError("disk hiccup"));
  await assert.rejects(p, (e: unknown) => e instanceof StorageError);
  assert.equal(c.pendingMarks, 1, "still not durable");
  await waitUntil(() => w.calls.length === 2, "retried after a backoff", 5_000);
  assert.deepEqual([...w.calls[1]].map(([q, m]) => [q, m.offset]), [[3, 41]]);
  w.gates[1].resolve();
  await waitUntil(() => c.pendingMarks === 0, "durable");
});

test("refusals are per partition; marks of an ended ownership period are refused and never unhandled", async () => {
  const unhandled: unknown[] = [];
  const on = (e: unknown): void => void unhandled.push(e);
  process.on("unhandledRejection", on);
  try {
    const w = gatedWriter();
    const c = new CommitCoalescer(w.write, 100);
    const old = new AbortController();
    void c.mark(0, mark(1, old.signal)); // in flight
    const a = c.mark(1, mark(5));
    const b = c.mark(2, mark(6, old.signal));
    old.abort();
    void c.mark(2, mark(7, old.signal)); // refused at once: its period ended
    w.gates[0].resolve();
    await waitUntil(() => w.calls.length === 2, "second write");
    assert.deepEqual([...w.calls[1].keys()], [1], "the ended period's mark is not written");
    await assert.rejects(b, (e: unknown) => e instanceof NotAssignedError);
    w.gates[1].resolve(new Map());
    await a;
    const d = c.mark(4, mark(9));
    await waitUntil(() => w.calls.length === 3, "third write");
    w.gates[2].resolve(new Map([[4, new NotAssignedError("moved")]]));
    await assert.rejects(d, (e: unknown) => e instanceof NotAssignedError);
    c.abandon(new NotAssignedError("ended"));
    await new Promise((r) => setImmediate(r));
    assert.equal(c.pendingMarks, 0);
  } finally {
    process.off("unhandledRejection", on);
  }
  assert.deepEqual(unhandled, []);
});

test("with a linger, marks nobody waits for share a later write; awaiting one, running out of room or flush() writes at once", async () => {
  const w = gatedWriter();
  const c = new CommitCoalescer(w.write, 3, 60_000);
  void c.mark(0, mark(1));
  void c.mark(0, mark(2));
  await new Promise((r) => setImmediate(r));
  assert.equal(w.calls.length, 0, "lingering: nobody waits");
  const awaited = (async () => {
    await c.mark(1, mark(3));
  })();
  await waitUntil(() => w.calls.length === 1, "awaiting a mark starts the write");
  assert.deepEqual([...w.calls[0]].map(([p, m]) => [p, m.offset]).sort(), [[0, 2], [1, 3]]);
  w.gates[0].resolve();
  await awaited;
  assert.equal(c.pendingMarks, 0);

  for (let i = 4; i < 7; i++) void c.mark(0, mark(i));
  assert.equal(w.calls.length, 1);
  const room = c.room();
  assert.ok(room !== null, "no room at the bound");
  assert.equal(w.calls.length, 2, "waiting for room starts the write");
  w.gates[1].resolve();
  await room;

  void c.mark(0, mark(7));
  const flushed = c.flush();
  await waitUntil(() => w.calls.length === 3, "flush() writes without lingering");
  w.gates[2].resolve();
  await flushed;
  assert.equal(c.pendingMarks, 0);
});

test("with a short linger, a mark nobody waits for is written once the linger ends", async () => {
  const w = gatedWriter();
  const c = new CommitCoalescer(w.write, 100, 5);
  const p = c.mark(2, mark(9));
  assert.equal(w.calls.length, 0);
  await waitUntil(() => w.calls.length === 1, "written after the linger");
  w.gates[0].resolve();
  await p;
  assert.equal(c.pendingMarks, 0);
});
