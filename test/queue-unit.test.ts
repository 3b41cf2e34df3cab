// SPDX-License-Identifier: Apache-2.0
// Unit tests of the pure queue parts: heaps, job table, key chains, backoff, journal codec, config.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ValidationError } from "../src/errors.js";
import { retryDelayMs } from "../src/queues/backoff.js";
import { KeyChains } from "../src/store/disk/queues/chains.js";
import { decodeEvents, encodeEvent, Ev } from "../src/store/disk/queues/events.js";
import { OffsetHeap } from "../src/store/disk/queues/heap.js";
import { resolveQueueConfig } from "../src/queues/config.js";
import { JobTable, ROW_BYTES, St } from "../src/store/disk/queues/table.js";
import { rng } from "./fixtures/queue-helpers.js";

describe("OffsetHeap", () => {
  test("pops in (priority, offset) order for random input, and shrinks after a burst", () => {
    const r = rng(7);
    const h = new OffsetHeap(4);
    const ref: [number, number][] = [];
    for (let i = 0; i < 20_000; i++) {
      const p = Math.floor(r() * 1000);
      h.push(p, i);
      ref.push([p, i]);
    }
    ref.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    for (const [p, o] of ref) {
      assert.equal(h.peekPriority(), p);
      assert.equal(h.pop(), o);
    }
    assert.equal(h.pop(), -1);
    assert.ok(h.capacityBytes <= 16 * 4096, "memory returned after the burst");
  });
});

describe("JobTable", () => {
  test("rows are contiguous; floor advances past terminal rows; encode/decode round trip", () => {
    const t = new JobTable(100, 4);
    for (let o = 100; o < 110; o++) t.add(o, St.READY, o * 10, o, o % 2 ? 3 : -1, o);
    assert.throws(() => t.add(200, St.READY, 0, 0, -1, 0));
    t.status[t.idx(100)] = St.DONE;
    t.status[t.idx(101)] = St.DEAD;
    t.status[t.idx(103)] = St.DONE;
    assert.equal(t.advanceFloor(), 102);
    const copy = JobTable.decode(t.floor, t.rows, t.encode());
    assert.equal(copy.floor, 102);
    assert.equal(copy.end, 110);
    for (let o = 102; o < 110; o++) {
      const i = t.idx(o);
      const j = copy.idx(o);
      assert.equal(copy.status[j], t.status[i]);
      assert.equal(copy.visibleAt[j], o * 10);
      assert.equal(copy.chain[j], o % 2 ? 3 : -1);
      assert.equal(copy.size[j], o);
    }
    assert.equal(ROW_BYTES, 27);
  });

  test("memory stays proportional to live rows under a moving window", () => {
    const t = new JobTable(0);
    for (let o = 0; o < 200_000; o++) {
      t.add(o, St.READY, 0, 0, -1, 1);
      if (o >= 100) {
        t.status[t.idx(o - 100)] = St.DONE;
        t.advanceFloor();
      }
    }
    assert.equal(t.rows, 100);
    assert.ok(t.capacityBytes < 1024 * 1024, `capacity ${t.capacityBytes}`);
  });
});

describe("KeyChains", () => {
  test("only the head is exposed; removal promotes the successor; empty chains vanish", () => {
    const c = new KeyChains();
    const [a, headA] = c.push("k", 1);
    const [b, headB] = c.push("k", 5);
    assert.equal(a, b);
    assert.equal(headA, true);
    assert.equal(headB, false);
    assert.equal(c.head(a), 1);
    assert.equal(c.remove(a, 1), 5);
    assert.equal(c.head(a), 5);
    assert.equal(c.remove(a, 5), -1);
    assert.equal(c.size, 0);
    const [x] = c.push("other", 9);
    assert.equal(c.head(x), 9);
  });
});

describe("backoff", () => {
  test("exponential with full jitter between minDelayMs and the capped step", () => {
    const cfg = { type: "exponential" as const, minDelayMs: 100, maxDelayMs: 1000 };
    assert.equal(retryDelayMs(cfg, 1, () => 0.99), 100);
    assert.equal(retryDelayMs(cfg, 3, () => 1), 400);
    assert.equal(retryDelayMs(cfg, 3, () => 0), 100);
    assert.equal(retryDelayMs(cfg, 30, () => 1), 1000);
    const r = rng(3);
    for (let a = 1; a < 20; a++) {
      const d = retryDelayMs(cfg, a, r);
      assert.ok(d >= 100 && d <= Math.min(1000, 100 * 2 ** (a - 1)));
    }
    assert.equal(retryDelayMs({ ...cfg, type: "fixed" }, 9, r), 100);
  });
});

describe("journal events", () => {
  test("round trip, and malformed input raises instead of being misread", () => {
    const buf = Buffer.concat([
      encodeEvent(Ev.DELIVER, 12, 3, 1e12),
      encodeEvent(Ev.NACK, 2 ** 40, 1, 5, { errorClass: "E", error: "ü" }),
      encodeEvent(Ev.ACK, 0, 0, 0),
    ]);
    const ev = decodeEvents(buf);
    assert.deepEqual(
      ev.map((e) => [e.type, e.offset, e.attempt, e.time]),
      [
        [Ev.DELIVER, 12, 3, 1e12],
        [Ev.NACK, 2 ** 40, 1, 5],
        [Ev.ACK, 0, 0, 0],
      ],
    );
    assert.deepEqual(ev[1].data, { errorClass: "E", error: "ü" });
    assert.throws(() => decodeEvents(buf.subarray(0, buf.length - 3)));
    const bad = Buffer.from(buf);
    bad.writeUInt32LE(0xffffffff, 25 + 21);
    assert.throws(() => decodeEvents(bad));
  });
});

describe("config", () => {
  test("defaults and validation", () => {
    const c = resolveQueueConfig("emails");
    assert.equal(c.deadLetter, "emails.dlq");
    assert.equal(resolveQueueConfig("emails.dlq").deadLetter, null);
    assert.equal(c.visibilityTimeoutMs, 30_000);
    assert.equal(c.maxAttempts, 5);
    assert.throws(() => resolveQueueConfig("q", { deadLetter: "q" }), ValidationError);
    assert.throws(() => resolveQueueConfig("q", { overflow: "drop" as never }), ValidationError);
    assert.throws(() => resolveQueueConfig("q", { backoff: { minDelayMs: 10, maxDelayMs: 5 } }), ValidationError);
    assert.throws(() => resolveQueueConfig("q", { deadLetter: "../x" }), ValidationError);
    assert.equal(c.resultRetentionMs, 0, "results are not kept by default");
    assert.equal(resolveQueueConfig("q", { resultRetentionMs: 30 * 86_400_000 }).resultRetentionMs, 30 * 86_400_000);
    for (const bad of [-1, 1.5, 30 * 86_400_000 + 1, Number.NaN, "1000" as never])
      assert.throws(() => resolveQueueConfig("q", { resultRetentionMs: bad }), ValidationError, `resultRetentionMs ${String(bad)}`);
  });
});
