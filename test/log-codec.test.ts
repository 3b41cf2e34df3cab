// SPDX-License-Identifier: Apache-2.0
/**
 * Codec tests: CRC-32C vectors, Kafka-compatible murmur2, the record batch round trip and a
 * fuzz of the batch decoder (invariant LOG-5: only InvalidBatchError, never a crash, never an
 * allocation sized from untrusted input).
 *
 * SLUICE_FUZZ_ITERATIONS=<n> runs the fuzz loops longer (default keeps this file to a few seconds).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { crc32c, crc32cPatch } from "../src/log/crc32c.js";
import {
  decodeRecords,
  decodeValue,
  encodeBatch,
  HEADER_SIZE,
  MAX_BATCH_BYTES,
  prepareValue,
  readHeader,
  recordSize,
  restampBatch,
  stampBatch,
  validateEncodedBatch,
  verifyBatch,
  type PreparedRecord,
  type StoredRecord,
} from "../src/log/record-batch.js";
import { murmur2, partitionForKey } from "../src/streams/murmur2.js";
import { InvalidBatchError, RecordTooLargeError } from "../src/errors.js";
import { prng } from "../src/testing/helpers.js";

const FUZZ = Math.max(1, Number(process.env.SLUICE_FUZZ_ITERATIONS ?? "20000") | 0);

/** Deterministic PRNG (mulberry32) so a failing case can be replayed from its seed. */
const rng = prng;

// ───────────────────────────── CRC-32C ─────────────────────────────

/** Bit-at-a-time reference implementation to check the slicing-by-8 table version against. */
function crcRef(buf: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

test("crc32c: known vectors (RFC 3720 B.4 and the check value)", () => {
  assert.equal(crc32c(Buffer.from("123456789")), 0xe3069283);
  assert.equal(crc32c(Buffer.alloc(32, 0)), 0x8a9136aa);
  assert.equal(crc32c(Buffer.alloc(32, 0xff)), 0x62a8ab43);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => i)), 0x46dd794e);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => 31 - i)), 0x113fdb5c);
  assert.equal(crc32c(new Uint8Array(0)), 0);
  assert.equal(crc32c(Buffer.from("a")), 0xc1d04330);
});

test("crc32c: ranges, continuation and agreement with a bitwise reference", () => {
  const r = rng(1);
  for (let n = 0; n < 300; n++) {
    const len = Math.floor(r() * 100);
    const buf = Buffer.alloc(len);
    for (let i = 0; i < len; i++) buf[i] = Math.floor(r() * 256);
    const whole = crc32c(buf);
    assert.equal(whole, crcRef(buf), `len ${len}`);
    const cut = Math.floor(r() * (len + 1));
    assert.equal(crc32c(buf, cut, len, crc32c(buf, 0, cut)), whole, `continuation at ${cut} of ${len}`);
    const s = Math.floor(r() * (len + 1));
    const e = s + Math.floor(r() * (len - s + 1));
    assert.equal(crc32c(buf, s, e), crcRef(buf.subarray(s, e)));
  }
});

// ───────────────────────────── murmur2 ─────────────────────────────

test("murmur2: identical to Kafka's Utils.murmur2 (UtilsTest vectors)", () => {
  // org.apache.kafka.common.utils.UtilsTest#testMurmur2, plus librdkafka's "kafka" and Akka's digits.
  const cases: [string | number[], number][] = [
    ["21", -973932308],
    ["foobar", -790332482],
    ["a-little-bit-long-string", -985981536],
    ["a-little-bit-longer-string", -1486304829],
    ["lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971],
    [[0x61, 0x62, 0x63], 479470107],
    ["kafka", -798503068],
    ["1", -1993445489],
    ["12", 126087238],
    ["123", -267702483],
    ["1234", -1614185708],
    ["12345", -1188365604],
  ];
  for (const [input, expected] of cases) {
    const bytes = typeof input === "string" ? Buffer.from(input, "utf8") : Uint8Array.from(input);
    assert.equal(murmur2(bytes), expected, `murmur2(${JSON.stringify(input)})`);
  }
});

test("murmur2: partitionForKey is (murmur2(key) & 0x7fffffff) % n, in range, and stable", () => {
  const r = rng(7);
  for (let i = 0; i < 2000; i++) {
    const len = Math.floor(r() * 40);
    const key = new Uint8Array(len);
    for (let j = 0; j < len; j++) key[j] = Math.floor(r() * 256);
    const n = 1 + Math.floor(r() * 100);
    const p = partitionForKey(key, n);
    assert.equal(p, (murmur2(key) & 0x7fffffff) % n);
    assert.ok(Number.isInteger(p) && p >= 0 && p < n);
    // A view into a larger buffer hashes the same as a copy.
    const big = new Uint8Array(len + 8);
    big.set(key, 3);
    assert.equal(murmur2(big.subarray(3, 3 + len)), murmur2(key));
  }
  // Kafka: toPositive(-973932308) % 10 for "21".
  assert.equal(partitionForKey(Buffer.from("21"), 10), (-973932308 & 0x7fffffff) % 10);
});

// ─────────────────────────── batch round trip ───────────────────────────

function rec(p: Partial<Omit<PreparedRecord, "value">> & { value?: unknown }): PreparedRecord {
  const { value, valueKind } = prepareValue("value" in p ? p.value : "v");
  return { key: p.key ?? null, value, valueKind, timestamp: p.timestamp ?? 1_700_000_000_000, headers: p.headers ?? null };
}

function roundTrip(records: PreparedRecord[], base: number, producer?: { producerId: number; producerEpoch: number; baseSequence: number }): { h: ReturnType<typeof verifyBatch>; out: StoredRecord[]; buf: Buffer } {
  const buf = encodeBatch(records, producer);
  stampBatch(buf, base);
  const h = verifyBatch(buf, 0, buf.length);
  const out = decodeRecords(buf, 0, h);
  return { h, out, buf };
}

test("batch: encode/stamp/verify/decode round trip with keys, null keys, tombstones, headers and all value kinds", () => {
  const obj = { a: 1, b: [true, null, "x"], nested: { ü: "é" } };
  const records: PreparedRecord[] = [
    rec({ key: Buffer.from("k1"), value: Buffer.from([0, 1, 2, 255]), timestamp: 5000 }),
    rec({ key: null, value: "hello wörld ☃", timestamp: 3000 }), // older than the first
    rec({ key: Buffer.alloc(0), value: obj, timestamp: 9000 }),
    rec({ key: Buffer.from("tomb"), value: null, timestamp: 1000 }), // tombstone, oldest
    rec({ key: null, value: 42, timestamp: 5000, headers: [["h1", Buffer.from("v1")], ["", Buffer.alloc(0)], ["ключ", Buffer.from([9, 9])]] }),
    rec({ key: null, value: "", timestamp: 7000, headers: [] }),
    rec({ key: null, value: Buffer.alloc(0), timestamp: 7000 }),
    rec({ key: null, value: false, timestamp: 7001 }),
    rec({ key: null, value: Buffer.alloc(3000, 7), timestamp: 7002 }), // multi-byte varint lengths
  ];
  const { h, out, buf } = roundTrip(records, 123_456_789_012, { producerId: 77, producerEpoch: 3, baseSequence: 41 });
  assert.equal(h.count, records.length);
  assert.equal(h.length, buf.length);
  assert.equal(h.baseOffset, 123_456_789_012);
  assert.equal(h.firstTimestamp, 5000);
  assert.equal(h.maxTimestamp, 9000);
  assert.equal(h.producerId, 77);
  assert.equal(h.producerEpoch, 3);
  assert.equal(h.baseSequence, 41);
  assert.equal(out.length, records.length);
  for (let i = 0; i < records.length; i++) {
    const a = records[i];
    const b = out[i];
    assert.equal(b.offset, 123_456_789_012 + i);
    assert.equal(b.timestamp, a.timestamp, `timestamp of record ${i}`);
    assert.deepEqual(b.key === null ? null : Buffer.from(b.key), a.key === null ? null : Buffer.from(a.key));
    assert.deepEqual(b.value === null ? null : Buffer.from(b.value), a.value === null ? null : Buffer.from(a.value));
    assert.equal(b.valueKind, a.valueKind);
    const ah = a.headers && a.headers.length > 0 ? a.headers.map(([k, v]) => [k, Buffer.from(v)]) : null;
    const bh = b.headers ? b.headers.map(([k, v]) => [k, Buffer.from(v)]) : null;
    assert.deepEqual(bh, ah, `headers of record ${i}`);
  }
  assert.deepEqual(decodeValue(out[0].value, out[0].valueKind), Buffer.from([0, 1, 2, 255]));
  assert.equal(decodeValue(out[1].value, out[1].valueKind), "hello wörld ☃");
  assert.deepEqual(decodeValue(out[2].value, out[2].valueKind), obj);
  assert.equal(decodeValue(out[3].value, out[3].valueKind), null);
  assert.equal(decodeValue(out[4].value, out[4].valueKind), 42);
  assert.equal(decodeValue(out[5].value, out[5].valueKind), "");
  assert.deepEqual(decodeValue(out[6].value, out[6].valueKind), Buffer.alloc(0));
  assert.equal(decodeValue(out[7].value, out[7].valueKind), false);
  // Empty key survives as an empty key, not as null.
  assert.ok(out[2].key !== null && out[2].key.length === 0);
});

test("batch: no producer encodes -1s; minOffset skips earlier records; recordSize is positive and grows with the value", () => {
  const { h, buf } = roundTrip([rec({ value: "a" }), rec({ value: "b" }), rec({ value: "c" })], 10);
  assert.equal(h.producerId, -1);
  assert.equal(h.producerEpoch, -1);
  assert.equal(h.baseSequence, -1);
  const tail = decodeRecords(buf, 0, h, 12);
  assert.deepEqual(tail.map((r) => [r.offset, r.value?.toString()]), [[12, "c"]]);
  assert.equal(decodeRecords(buf, 0, h, 13).length, 0);
  // Appends to a caller-provided array.
  const acc: StoredRecord[] = [];
  decodeRecords(buf, 0, h, 0, acc);
  decodeRecords(buf, 0, h, 11, acc);
  assert.deepEqual(acc.map((r) => r.offset), [10, 11, 12, 11, 12]);
  assert.ok(recordSize(rec({ value: "x" })) < recordSize(rec({ value: "x".repeat(1000) })));
  assert.throws(() => encodeBatch([]));
});

test("batch: verifies at a position inside a larger buffer", () => {
  const a = encodeBatch([rec({ value: "first" })]);
  stampBatch(a, 0);
  const b = encodeBatch([rec({ value: "second" }), rec({ value: "third" })]);
  stampBatch(b, 1);
  const both = Buffer.concat([a, b]);
  const h1 = verifyBatch(both, 0, both.length);
  const h2 = verifyBatch(both, h1.length, both.length);
  assert.deepEqual(decodeRecords(both, h1.length, h2).map((r) => r.value?.toString()), ["second", "third"]);
  assert.equal(h2.baseOffset, 1);
  // Truncating the outer range by one byte is a typed error.
  assert.throws(() => verifyBatch(both, h1.length, both.length - 1), InvalidBatchError);
  // maxBytes bounds the accepted length.
  assert.throws(() => verifyBatch(both, 0, both.length, h1.length - 1), InvalidBatchError);
});

test("batch: the CRC covers the base offset (a batch stamped elsewhere without a new CRC fails)", () => {
  const buf = encodeBatch([rec({ value: "x" }), rec({ value: "y" })]);
  stampBatch(buf, 1000);
  verifyBatch(buf, 0, buf.length);
  // Rewrite the base offset (bytes 16..24) without recomputing the checksum.
  for (const other of [1001, 999, 0, 2 ** 40]) {
    const moved = Buffer.from(buf);
    moved.writeInt32BE(Math.floor(other / 2 ** 32), 16);
    moved.writeUInt32BE(other % 2 ** 32, 20);
    assert.throws(() => verifyBatch(moved, 0, moved.length), InvalidBatchError, `offset ${other}`);
    // Re-stamping (new CRC) makes it valid again, at the new offset.
    stampBatch(moved, other);
    assert.equal(verifyBatch(moved, 0, moved.length).baseOffset, other);
  }
  // Every single-bit flip anywhere (header, CRC field, records) is detected.
  for (let i = 0; i < buf.length; i++) {
    for (let bit = 0; bit < 8; bit++) {
      const m = Buffer.from(buf);
      m[i] ^= 1 << bit;
      assert.throws(() => verifyBatch(m, 0, m.length), InvalidBatchError, `flip byte ${i} bit ${bit}`);
    }
  }
});

test("batch: many random batches round trip", () => {
  const r = rng(99);
  const bytes = (n: number): Buffer => {
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = Math.floor(r() * 256);
    return b;
  };
  for (let n = 0; n < 300; n++) {
    const count = 1 + Math.floor(r() * 10);
    const records: PreparedRecord[] = [];
    for (let i = 0; i < count; i++) {
      const kind = Math.floor(r() * 4);
      const value = kind === 0 ? null : kind === 1 ? bytes(Math.floor(r() * 300)) : kind === 2 ? "s".repeat(Math.floor(r() * 200)) : { n: r() };
      const headers: [string, Buffer][] | null = r() < 0.5 ? null : Array.from({ length: Math.floor(r() * 4) }, (_, j) => [`h${j}`, bytes(Math.floor(r() * 20))]);
      records.push(rec({ key: r() < 0.3 ? null : bytes(Math.floor(r() * 30)), value, headers, timestamp: Math.floor(r() * 2 ** 41) }));
    }
    const base = Math.floor(r() * 2 ** 45);
    const { h, out } = roundTrip(records, base);
    assert.equal(h.maxTimestamp, Math.max(...records.map((x) => x.timestamp)));
    assert.deepEqual(
      out.map((x) => [x.offset, x.timestamp, x.key && Buffer.from(x.key), x.value && Buffer.from(x.value), x.valueKind]),
      records.map((x, i) => [base + i, x.timestamp, x.key, x.value, x.valueKind]),
    );
  }
});

// ─────────────────────────────── fuzz ───────────────────────────────

/** Recomputes the CRC of whatever the length field claims (bounded by the buffer) so mutations reach decodeRecords. */
function reCrc(buf: Buffer): void {
  if (buf.length < 8) return;
  const len = Math.min(buf.readUInt32BE(0), buf.length);
  if (len < 8) return;
  const c = crc32c(buf, 0, 4);
  buf.writeUInt32BE(crc32c(buf, 8, len, c), 4);
}

interface FuzzStats {
  cases: number;
  decoded: number;
  /** Cases that passed verifyBatch, i.e. reached decodeRecords' structure checks. */
  verified: number;
  rejected: number;
  maxCaseMs: number;
}

/** Feeds `buf` to the decoder: it must decode or throw InvalidBatchError, nothing else. */
function feed(buf: Buffer, stats: FuzzStats, label: () => string): void {
  const t0 = performance.now();
  try {
    const h = verifyBatch(buf, 0, buf.length);
    stats.verified++;
    const out = decodeRecords(buf, 0, h);
    // Whatever decodes must be self-consistent and bounded by the input.
    assert.equal(out.length, h.count);
    assert.ok(h.count <= buf.length, "record count bounded by bytes present");
    for (const r of out) {
      if (r.key) assert.ok(r.key.length <= buf.length);
      if (r.value) assert.ok(r.value.length <= buf.length);
    }
    stats.decoded++;
  } catch (e) {
    if (!(e instanceof InvalidBatchError)) {
      assert.fail(`${label()}: decoder threw ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}\ninput: ${buf.subarray(0, 200).toString("hex")}`);
    }
    assert.equal(e.code, "INVALID_BATCH");
    stats.rejected++;
  }
  const ms = performance.now() - t0;
  if (ms > stats.maxCaseMs) stats.maxCaseMs = ms;
  stats.cases++;
}

function sampleBatches(r: () => number): Buffer[] {
  const out: Buffer[] = [];
  for (let n = 0; n < 24; n++) {
    const count = 1 + Math.floor(r() * 6);
    const records: PreparedRecord[] = [];
    for (let i = 0; i < count; i++) {
      const vlen = Math.floor(r() * (n % 4 === 0 ? 400 : 40));
      records.push(
        rec({
          key: r() < 0.5 ? null : Buffer.alloc(Math.floor(r() * 10), 0x6b),
          value: r() < 0.2 ? null : r() < 0.5 ? Buffer.alloc(vlen, 0x76) : r() < 0.5 ? "s".repeat(vlen) : { v: vlen },
          headers: r() < 0.5 ? null : [["hk", Buffer.from("hv")], ["x", Buffer.alloc(Math.floor(r() * 5))]],
          timestamp: 1_700_000_000_000 + Math.floor(r() * 100_000),
        }),
      );
    }
    const b = encodeBatch(records, r() < 0.5 ? { producerId: 5, producerEpoch: 1, baseSequence: n } : undefined);
    stampBatch(b, Math.floor(r() * 1e9));
    out.push(b);
  }
  return out;
}

/** Header fields worth rewriting: [byte offset, width]. */
const FIELDS: [number, number][] = [
  [0, 4], // length
  [12, 4], // record count
  [16, 8], // base offset
  [24, 8], // first timestamp
  [32, 8], // max timestamp
  [8, 1], // magic
  [9, 1], // attributes
];
const HUGE = [0xffffffff, 0x7fffffff, 0x80000000, 2 ** 31 + 1, 2 ** 28, MAX_BATCH_BYTES + 1, 0, 1, HEADER_SIZE, HEADER_SIZE + 3];

function mutate(src: Buffer, r: () => number): Buffer {
  // Header rewrites need a header; a buffer already truncated below that gets a flip instead.
  const pick = src.length < HEADER_SIZE ? 1 + Math.floor(r() * 2) : Math.floor(r() * 10);
  let b = Buffer.from(src);
  switch (pick) {
    case 0: {
      // bit flips
      const flips = 1 + Math.floor(r() * 4);
      for (let i = 0; i < flips; i++) b[Math.floor(r() * b.length)] ^= 1 << Math.floor(r() * 8);
      break;
    }
    case 1:
      // truncation
      b = b.subarray(0, Math.floor(r() * b.length));
      break;
    case 2: {
      // byte insertion
      const at = Math.floor(r() * (b.length + 1));
      const ins = Buffer.alloc(1 + Math.floor(r() * 8));
      for (let i = 0; i < ins.length; i++) ins[i] = Math.floor(r() * 256);
      b = Buffer.concat([b.subarray(0, at), ins, b.subarray(at)]);
      break;
    }
    case 3: {
      // header field rewritten to a huge / boundary value
      const [off, width] = FIELDS[Math.floor(r() * FIELDS.length)];
      const v = HUGE[Math.floor(r() * HUGE.length)];
      if (width === 4) b.writeUInt32BE(v >>> 0, off);
      else if (width === 1) b[off] = v & 0xff;
      else {
        b.writeUInt32BE(r() < 0.5 ? 0xffffffff : 0x7fffffff, off);
        b.writeUInt32BE(v >>> 0, off + 4);
      }
      break;
    }
    case 4: {
      // a varint inside the records area rewritten to a huge multi-byte value
      const at = HEADER_SIZE + Math.floor(r() * Math.max(1, b.length - HEADER_SIZE));
      const huge = [0xff, 0xff, 0xff, 0xff, 0x0f];
      for (let i = 0; i < huge.length && at + i < b.length; i++) b[at + i] = i === huge.length - 1 && r() < 0.5 ? 0xff : huge[i];
      break;
    }
    case 5: {
      // byte deletion
      const at = Math.floor(r() * b.length);
      const n = 1 + Math.floor(r() * 4);
      b = Buffer.concat([b.subarray(0, at), b.subarray(at + n)]);
      break;
    }
    case 6: {
      // random overwrite of a run
      const at = Math.floor(r() * b.length);
      const n = 1 + Math.floor(r() * 16);
      for (let i = at; i < Math.min(b.length, at + n); i++) b[i] = Math.floor(r() * 256);
      break;
    }
    case 7: {
      // length field consistent with an extension of garbage
      const extra = Buffer.alloc(Math.floor(r() * 64));
      for (let i = 0; i < extra.length; i++) extra[i] = Math.floor(r() * 256);
      b = Buffer.concat([b, extra]);
      b.writeUInt32BE(b.length, 0);
      break;
    }
    case 8: {
      // record count / length set to every huge value in turn is covered by case 3; here: count = actual+k
      b.writeUInt32BE((b.readUInt32BE(12) + 1 + Math.floor(r() * 1000)) >>> 0, 12);
      break;
    }
    default: {
      // set a single byte in the records area to 0x80 | x (continuation bit) so varints run on
      const at = HEADER_SIZE + Math.floor(r() * Math.max(1, b.length - HEADER_SIZE));
      if (at < b.length) b[at] |= 0x80;
    }
  }
  return b;
}

test("fuzz: random byte strings only ever raise InvalidBatchError", () => {
  const r = rng(0xdecade);
  const stats: FuzzStats = { cases: 0, decoded: 0, verified: 0, rejected: 0, maxCaseMs: 0 };
  const before = process.memoryUsage().arrayBuffers;
  for (let n = 0; n < FUZZ; n++) {
    const len = Math.floor(r() * (n % 10 === 0 ? 2000 : 120));
    const b = Buffer.alloc(len);
    for (let i = 0; i < len; i++) b[i] = Math.floor(r() * 256);
    if (len >= HEADER_SIZE && r() < 0.7) {
      // Make it look like a batch so the checks past the magic byte are reached.
      b[8] = 1;
      if (r() < 0.7) b.writeUInt32BE(r() < 0.5 ? len : HUGE[Math.floor(r() * HUGE.length)] >>> 0, 0);
      if (r() < 0.5) b.writeUInt32BE(HUGE[Math.floor(r() * HUGE.length)] >>> 0, 12);
      if (r() < 0.8) reCrc(b);
    }
    feed(b, stats, () => `random case ${n}`);
  }
  const grown = process.memoryUsage().arrayBuffers - before;
  assert.equal(stats.cases, FUZZ);
  assert.ok(stats.rejected > 0);
  assert.ok(grown < 8 * 1024 * 1024, `arrayBuffers grew by ${grown} bytes during the fuzz loop`);
  assert.ok(stats.maxCaseMs < 250, `slowest case took ${stats.maxCaseMs.toFixed(1)} ms`);
});

test("fuzz: mutated valid batches (bit flips, truncation, insertion, huge length fields) only raise InvalidBatchError", () => {
  const r = rng(0x5eed);
  const seeds = sampleBatches(r);
  const stats: FuzzStats = { cases: 0, decoded: 0, verified: 0, rejected: 0, maxCaseMs: 0 };
  const before = process.memoryUsage().arrayBuffers;
  let fixedCrc = 0;
  for (let n = 0; n < FUZZ * 2; n++) {
    const src = seeds[n % seeds.length];
    let m = mutate(src, r);
    if (r() < 0.3) m = mutate(m, r); // stacked mutations
    // Half the time fix up the CRC so the structure checks in decodeRecords are exercised,
    // not just the checksum.
    if (n % 2 === 0) {
      reCrc(m);
      fixedCrc++;
    }
    feed(m, stats, () => `mutation case ${n} of seed ${n % seeds.length}`);
  }
  const grown = process.memoryUsage().arrayBuffers - before;
  assert.ok(fixedCrc > 0 && stats.rejected > 0);
  // The CRC-fixed half must get past verifyBatch often enough to test the record decoder itself.
  assert.ok(stats.verified > stats.cases / 20, `only ${stats.verified} of ${stats.cases} mutations reached decodeRecords`);
  assert.ok(stats.verified > stats.decoded, "some verified batches were rejected by decodeRecords");
  assert.ok(grown < 8 * 1024 * 1024, `arrayBuffers grew by ${grown} bytes during the fuzz loop`);
  assert.ok(stats.maxCaseMs < 250, `slowest case took ${stats.maxCaseMs.toFixed(1)} ms`);
});

test("fuzz: headers claiming 2^32-1 bytes or records fail fast without allocating", () => {
  const base = encodeBatch([rec({ value: "abc" }), rec({ value: "def" })]);
  stampBatch(base, 5);
  const before = process.memoryUsage().arrayBuffers;
  const t0 = performance.now();
  for (const [off, v] of [
    [0, 0xffffffff], // length
    [0, MAX_BATCH_BYTES + 1],
    [12, 0xffffffff], // record count
    [12, 0x7fffffff],
    [12, 0],
  ] as const) {
    const b = Buffer.from(base);
    b.writeUInt32BE(v, off);
    // With a stale CRC and with a matching CRC: both are typed rejections.
    assert.throws(() => verifyBatch(b, 0, b.length), InvalidBatchError, `field @${off} = ${v}`);
    reCrc(b);
    assert.throws(
      () => {
        const h = verifyBatch(b, 0, b.length);
        decodeRecords(b, 0, h);
      },
      InvalidBatchError,
      `field @${off} = ${v} with valid CRC`,
    );
  }
  // A record whose length varint claims ~2^35 bytes, CRC fixed: typed error.
  const rv = Buffer.from(base);
  rv.set([0xff, 0xff, 0xff, 0xff, 0x7f], HEADER_SIZE);
  reCrc(rv);
  assert.throws(() => decodeRecords(rv, 0, verifyBatch(rv, 0, rv.length)), InvalidBatchError);
  // A varint with too many continuation bytes: typed error.
  const long = Buffer.concat([base.subarray(0, HEADER_SIZE), Buffer.alloc(20, 0x80)]);
  long.writeUInt32BE(long.length, 0);
  long.writeUInt32BE(1, 12);
  reCrc(long);
  assert.throws(() => decodeRecords(long, 0, verifyBatch(long, 0, long.length)), InvalidBatchError);
  const ms = performance.now() - t0;
  assert.ok(ms < 200, `rejections took ${ms.toFixed(1)} ms`);
  assert.ok(process.memoryUsage().arrayBuffers - before < 4 * 1024 * 1024);
  // readHeader itself never reads past HEADER_SIZE.
  assert.equal(readHeader(base, 0).count, 2);
});

// ─────────────────────── client-encoded batches (PUBLISH_ENCODED) ───────────────────────

test("crc32cPatch equals recomputing the CRC after changing any range", () => {
  const r = rng(0xc0ffee);
  for (let n = 0; n < 3000; n++) {
    const len = 1 + Math.floor(r() * 3000);
    const b = Buffer.alloc(len);
    for (let i = 0; i < len; i++) b[i] = Math.floor(r() * 256);
    const pos = Math.floor(r() * len);
    const width = Math.min(len - pos, 1 + Math.floor(r() * 12));
    const before = crc32c(b);
    const old = Buffer.from(b.subarray(pos, pos + width));
    for (let i = 0; i < width; i++) b[pos + i] = Math.floor(r() * 256);
    assert.equal(crc32cPatch(before, old, b.subarray(pos, pos + width), len - pos - width), crc32c(b), `case ${n}`);
  }
});

test("restampBatch gives exactly stampBatch's bytes, for any base offset", () => {
  const r = rng(0xba5e);
  for (const b of sampleBatches(r)) {
    for (const base of [0, 1, 255, 2 ** 31 + 7, Math.floor(r() * 2 ** 48), Number.MAX_SAFE_INTEGER - 10]) {
      const full = Buffer.from(b);
      stampBatch(full, base);
      const patched = Buffer.from(b); // valid CRC at its current base offset
      restampBatch(patched, base);
      assert.deepEqual(patched, full);
      assert.equal(verifyBatch(patched, 0, patched.length).baseOffset, base);
    }
  }
});

test("validateEncodedBatch accepts what the client encodes and refuses what a reader could not decode", () => {
  const recs = [rec({ key: Buffer.from("k"), value: Buffer.alloc(100, 1), timestamp: 1000 }), rec({ value: "v", timestamp: 5000, headers: [["h", Buffer.from("x")]] }), rec({ value: null, timestamp: 3000 })];
  const b = encodeBatch(recs, { producerId: 3, producerEpoch: 0, baseSequence: 7 });
  stampBatch(b, 0);
  const info = validateEncodedBatch(b, 1000);
  assert.equal(info.header.count, 3);
  assert.equal(info.header.producerId, 3);
  assert.equal(info.maxRecordBytes, Math.max(...recs.map(recordSize)));
  // Each record's size is checked against maxMessageBytes.
  assert.throws(() => validateEncodedBatch(b, info.maxRecordBytes - 1), RecordTooLargeError);
  // Base offset must be 0 (the broker assigns offsets).
  const based = Buffer.from(b);
  stampBatch(based, 5);
  assert.throws(() => validateEncodedBatch(based, 1000), /base offset 0/);
  // Trailing bytes after the batch.
  const trailing = Buffer.concat([b, Buffer.alloc(3)]);
  assert.throws(() => validateEncodedBatch(trailing, 1000), InvalidBatchError);
  // A header maxTimestamp that is not the records' maximum (time index would lie).
  const ts = Buffer.from(b);
  ts.writeUInt32BE(4999, 36);
  stampBatch(ts, 0);
  assert.throws(() => validateEncodedBatch(ts, 1000), /maxTimestamp/);
  // Producer fields that are half set.
  const half = encodeBatch(recs);
  half.writeInt16BE(2, 48);
  stampBatch(half, 0);
  assert.throws(() => validateEncodedBatch(half, 1000), /producer fields/);
  // A flipped bit anywhere is caught by the CRC.
  const flipped = Buffer.from(b);
  flipped[HEADER_SIZE + 10] ^= 4;
  assert.throws(() => validateEncodedBatch(flipped, 1000), /checksum/);
});

test("fuzz: validateEncodedBatch only raises InvalidBatchError or RecordTooLargeError, and what it accepts decodes", () => {
  const r = rng(0xe4c0);
  const seeds = sampleBatches(r).map((b) => {
    const z = Buffer.from(b);
    stampBatch(z, 0);
    return z;
  });
  let accepted = 0;
  let rejected = 0;
  for (let n = 0; n < FUZZ; n++) {
    const m = mutate(seeds[n % seeds.length], r);
    // Keep base offset 0 and fix the CRC most of the time, so the record walk is what is tested.
    if (m.length >= HEADER_SIZE && r() < 0.8) m.fill(0, 16, 24);
    if (r() < 0.8) reCrc(m);
    try {
      const { header } = validateEncodedBatch(m, 1000);
      const out = decodeRecords(m, 0, header);
      assert.equal(out.length, header.count);
      accepted++;
    } catch (e) {
      if (!(e instanceof InvalidBatchError) && !(e instanceof RecordTooLargeError)) {
        assert.fail(`case ${n}: threw ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}`);
      }
      rejected++;
    }
  }
  assert.ok(rejected > 0 && accepted > 0, `accepted ${accepted}, rejected ${rejected}`);
});
