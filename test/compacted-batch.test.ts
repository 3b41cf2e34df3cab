// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's building blocks: the key hash (MurmurHash3 x86_128 reference vectors), the
 * offset map (bounded, latest offset wins, refuses past capacity), and sparse batches (CMP-2):
 * for random subsets of a batch's records the sparse batch verifies, and the broker's decoder,
 * the cleaner's span walk and the client's push scanner all read exactly the kept records at
 * their offsets; damaged run tables and unknown attribute bits are refused with typed errors.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { InvalidBatchError, ProtocolError } from "../src/errors.js";
import { scanPushedBatches, readRecordInto, type RecordFields } from "../src/client/record-batches.js";
import { forEachRecordSpan, SparseBatchBuilder } from "../src/log/compacted-batch.js";
import { keyHash128 } from "../src/log/key-hash.js";
import { OffsetMap, OFFSET_MAP_BYTES_PER_KEY, OFFSET_MAP_SLOT_BYTES } from "../src/log/offset-map.js";
import { BATCH_ATTR_SPARSE, decodeRecords, encodeBatch, HEADER_SIZE, readHeader, stampBatch, verifyBatch, type PreparedRecord } from "../src/log/record-batch.js";
import { prng } from "../src/testing/helpers.js";

test("keyHash128 is MurmurHash3_x86_128 with seed 0 (reference vectors), over any byte range", () => {
  const vectors: [string | number[], number[]][] = [
    ["", [0, 0, 0, 0]],
    ["a", [2811532092, 1431744539, 1431744539, 1431744539]],
    ["hello", [723797152, 3683770103, 2598056374, 2598056374]],
    ["k000000001", [71371301, 2645806699, 674247358, 3885053731]],
    ["The quick brown fox jumps over the lazy dog", [789939139, 3975031911, 1568405100, 3857259820]],
    [Array.from({ length: 31 }, (_, i) => i), [615224046, 2887616970, 1173732376, 2597707171]],
  ];
  const out = new Uint32Array(4);
  for (const [input, want] of vectors) {
    const b = typeof input === "string" ? Buffer.from(input) : Buffer.from(input);
    keyHash128(b, 0, b.length, out);
    assert.deepEqual([...out], want, `hash of ${JSON.stringify(input)}`);
    const framed = Buffer.concat([Buffer.from("xyz"), b, Buffer.from("!")]);
    keyHash128(framed, 3, 3 + b.length, out);
    assert.deepEqual([...out], want, "the same bytes inside a larger buffer");
  }
});

test("OffsetMap: latest offset per key, a fixed memory, new keys refused once full, offsets relative to the pass", () => {
  const keys = 1000;
  const map = new OffsetMap(Math.ceil(keys * OFFSET_MAP_BYTES_PER_KEY), 5_000_000);
  assert.ok(map.capacity >= keys - 1 && map.capacity <= keys, `capacity ${map.capacity}`);
  assert.ok(OFFSET_MAP_SLOT_BYTES === 16);
  const k = (i: number): Buffer => Buffer.from(`key-${i}`);
  for (let i = 0; i < map.capacity; i++) assert.equal(map.put(k(i), 0, k(i).length, 5_000_000 + i), true);
  assert.equal(map.put(k(999_999), 0, k(999_999).length, 5_000_001), false, "a new key once full");
  assert.equal(map.put(k(3), 0, k(3).length, 5_900_000), true, "a known key is updated when full");
  assert.equal(map.get(k(3), 0, k(3).length), 5_900_000);
  assert.equal(map.get(k(4), 0, k(4).length), 5_000_004);
  assert.equal(map.get(k(999_999), 0, k(999_999).length), -1);
  assert.equal(map.put(k(5), 0, k(5).length, 4_999_999), false, "below the pass's base");
  assert.equal(map.size, map.capacity);
});

function records(n: number, rnd: () => number): PreparedRecord[] {
  return Array.from({ length: n }, (_, i) => ({
    key: rnd() < 0.1 ? null : Buffer.from(`k${i % 7}`),
    value: rnd() < 0.15 ? null : Buffer.from(`value-${i}-${"x".repeat(Math.floor(rnd() * 300))}`),
    valueKind: 0,
    timestamp: 1_700_000_000_000 + Math.floor(rnd() * 5000),
    headers: rnd() < 0.2 ? [["h", Buffer.from(`hv${i}`)]] : null,
  }));
}

test("sparse batches: random kept subsets read back at their offsets through every reader", () => {
  const rnd = prng(7);
  for (let iter = 0; iter < 300; iter++) {
    const n = 1 + Math.floor(rnd() * 400);
    const recs = records(n, rnd);
    const base = Math.floor(rnd() * 1e9);
    const src = encodeBatch(recs, { producerId: 4, producerEpoch: 1, baseSequence: 100 });
    stampBatch(src, base);
    const h = verifyBatch(src, 0, src.length);
    const keepP = rnd();
    const b = new SparseBatchBuilder();
    const kept: number[] = [];
    forEachRecordSpan(src, 0, h, (r) => {
      if (rnd() < keepP) {
        b.add(r);
        kept.push(r.offset);
      }
    });
    if (kept.length === 0) continue;
    const sparse = b.build(src, 0, h);
    const sh = verifyBatch(sparse, 0, sparse.length);
    assert.equal(sh.baseOffset, base);
    assert.equal(sh.count, n, "the span is unchanged");
    assert.equal(sh.baseSequence, 100);
    assert.equal(sh.producerId, 4);
    assert.ok((sh.attributes & BATCH_ATTR_SPARSE) !== 0);
    const all = decodeRecords(src, 0, h);
    const want = kept.map((o) => all[o - base]);
    assert.equal(sh.maxTimestamp, Math.max(h.firstTimestamp, ...want.map((r) => r.timestamp)));
    assert.ok(sparse.length < src.length || kept.length === n, "a sparse batch is never larger than its source");
    // The broker's decoder, also from an offset inside the batch.
    assert.deepEqual(decodeRecords(sparse, 0, sh), want);
    const from = base + Math.floor(rnd() * n);
    assert.deepEqual(decodeRecords(sparse, 0, sh, from), want.filter((r) => r.offset >= from));
    // The cleaner's own walk (a second compaction of a sparse batch).
    const spans: number[] = [];
    forEachRecordSpan(sparse, 0, sh, (r) => void spans.push(r.offset));
    assert.deepEqual(spans, kept);
    // The client's push scanner, after a dense batch that precedes it.
    const before = encodeBatch(records(3, rnd));
    stampBatch(before, base - 3);
    const t = scanPushedBatches(Buffer.concat([before, sparse]), base);
    assert.deepEqual([...t.offset.subarray(0, t.count)], kept);
    const f: RecordFields = { key: null, value: null, headers: {} };
    for (let i = 0; i < t.count; i++) {
      readRecordInto(f, t.buf, t.pos[i]);
      assert.deepEqual(f.value === null ? null : Buffer.from(f.value as Uint8Array), want[i].value);
      assert.equal(t.timestamp[i], want[i].timestamp);
    }
  }
});

test("sparse batches: a run leaving the span, an unfinished run or an unknown attribute bit is refused", () => {
  const recs = records(10, prng(3));
  const src = encodeBatch(recs);
  stampBatch(src, 50);
  const h = verifyBatch(src, 0, src.length);
  const b = new SparseBatchBuilder();
  forEachRecordSpan(src, 0, h, (r) => {
    if (r.offset % 3 === 0) b.add(r);
  });
  const good = b.build(src, 0, h);
  // Header count shrunk to 5: the run at offset 6 and 9 now leaves the span.
  const short = Buffer.from(good);
  short.writeUInt32BE(5, 12);
  stampBatch(short, 50);
  const sh = verifyBatch(short, 0, short.length);
  assert.throws(() => decodeRecords(short, 0, sh), InvalidBatchError);
  assert.throws(() => forEachRecordSpan(short, 0, sh, () => {}), InvalidBatchError);
  assert.throws(() => scanPushedBatches(short, 0), ProtocolError);
  // A run claiming more records than follow it.
  const long = Buffer.from(good);
  long[HEADER_SIZE + 1] = 9; // the first run's length
  stampBatch(long, 50);
  const lh = verifyBatch(long, 0, long.length);
  assert.throws(() => decodeRecords(long, 0, lh), InvalidBatchError);
  assert.throws(() => scanPushedBatches(long, 0), ProtocolError);
  // An attribute bit this version does not know.
  const odd = Buffer.from(good);
  odd[9] |= 0x10;
  stampBatch(odd, 50);
  assert.throws(() => verifyBatch(odd, 0, odd.length), (e: unknown) => e instanceof InvalidBatchError && /unknown batch attributes/.test(e.message));
  assert.throws(() => scanPushedBatches(odd, 0), ProtocolError);
  assert.equal(readHeader(good, 0).count, 10);
});

test("OffsetMap against a Map model: random puts and lookups of present and absent keys, up to a full map", () => {
  const rnd = prng(11);
  for (const keys of [1, 7, 100, 5000]) {
    const map = new OffsetMap(Math.ceil(keys * OFFSET_MAP_BYTES_PER_KEY), 1000);
    const model = new Map<string, number>();
    for (let step = 0; step < keys * 6; step++) {
      const k = `key-${Math.floor(rnd() * keys * 1.5)}`;
      const b = Buffer.from(`..${k}`);
      const off = 1000 + step;
      const ok = map.put(b, 2, b.length, off);
      if (model.has(k) || model.size < map.capacity) {
        assert.equal(ok, true, `put ${k}`);
        model.set(k, off);
      } else assert.equal(ok, false, `a new key once full (${k})`);
      const q = `key-${Math.floor(rnd() * keys * 3)}`;
      const qb = Buffer.from(q);
      assert.equal(map.get(qb, 0, qb.length), model.get(q) ?? -1, `get ${q}`);
    }
    assert.equal(map.size, model.size);
    for (const [k, off] of model) assert.equal(map.get(Buffer.from(k), 0, k.length), off);
  }
});
