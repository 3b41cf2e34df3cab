// SPDX-License-Identifier: Apache-2.0
/**
 * Wire protocol robustness: codec round trips, fuzzed decoders, and a live server fed random,
 * truncated, oversized and byte-by-byte frames. The server must answer with typed errors,
 * close only the offending connection, keep serving a healthy client, and never allocate from
 * an untrusted length.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect as netConnect, type Socket } from "node:net";
import { randomBytes } from "node:crypto";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { connect } from "../src/client/index.js";
import {
  FLAG_ERROR,
  FrameReader,
  Op,
  decodeConsumedRecords,
  decodeFrame,
  decodePublishRecords,
  encodeConsumedRecords,
  encodeFrame,
  encodePreamble,
  encodePublishRecords,
  type Frame,
} from "../src/wire/index.js";
import { ProtocolError, UnsupportedVersionError, RecordTooLargeError, TopicNotFoundError } from "../src/errors.js";
import { fakeBroker } from "./fixtures/server-fake-broker.js";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/index.js";
import { encodeBatch, stampBatch } from "../src/log/record-batch.js";
import { prng } from "../src/testing/helpers.js";
import { waitUntil as waitUntilShared } from "../src/testing/helpers.js";

// Deterministic PRNG so a failure can be replayed (seed printed on failure).
const rng = prng;
const SEED = Number(process.env.SLUICE_FUZZ_SEED ?? Date.now() % 1e9);

test("frames survive being split at every byte", () => {
  const frames = [
    encodeFrame(Op.Ping, 0, 1, {}),
    encodeFrame(Op.Publish, 0, 2, { topic: "t" }, encodePublishRecords([{ value: "x" }, { value: { a: 1 }, key: "k" }])),
    encodeFrame(Op.ListTopics, 0, 3, null),
  ];
  const all = Buffer.concat(frames);
  for (let cut = 0; cut <= all.length; cut++) {
    for (const step of [1, 3, 7]) {
      const r = new FrameReader(1 << 20);
      const out: Frame[] = [];
      const feed = (b: Buffer): void => {
        r.push(b);
        for (let f = r.next(); f; f = r.next()) out.push(decodeFrame(f));
      };
      feed(all.subarray(0, cut));
      for (let i = cut; i < all.length; i += step) feed(all.subarray(i, Math.min(all.length, i + step)));
      assert.deepEqual(
        out.map((f) => [f.op, f.correlationId]),
        [
          [Op.Ping, 1],
          [Op.Publish, 2],
          [Op.ListTopics, 3],
        ],
      );
      assert.equal(r.bufferedBytes, 0);
    }
  }
});

test("record codecs round-trip every value kind", () => {
  const recs = decodePublishRecords(
    encodePublishRecords([
      { value: Buffer.from([1, 2, 3]), key: "k1", headers: { a: "x", b: Buffer.from([9]) }, partition: 2, timestamp: 1234 },
      { value: "text" },
      { value: { nested: [1, "two", null] } },
      { value: 42 },
      { value: null },
      { value: true },
    ]),
    1000,
  );
  assert.deepEqual(recs[0].value, Buffer.from([1, 2, 3]));
  assert.deepEqual(recs[0].key, Buffer.from("k1"));
  assert.equal(recs[0].headers!.a, "x");
  assert.equal(recs[0].partition, 2);
  assert.equal(recs[0].timestamp, 1234);
  assert.equal(recs[1].value, "text");
  assert.deepEqual(recs[2].value, { nested: [1, "two", null] });
  assert.equal(recs[3].value, 42);
  assert.equal(recs[4].value, null);
  assert.equal(recs[5].value, true);
  const consumed = decodeConsumedRecords(
    "t",
    encodeConsumedRecords([
      { topic: "t", partition: 1, offset: 7, timestamp: 9, key: null, value: "v", headers: { h: Buffer.from("y") } },
    ]),
  );
  assert.equal(consumed[0].offset, 7);
  assert.deepEqual(consumed[0].headers.h, Buffer.from("y"));
});

test("decoders reject random and mutated bytes with ProtocolError only", () => {
  const rand = rng(SEED);
  const valid = encodePublishRecords([
    { value: "hello", key: "k", headers: { a: "b" } },
    { value: { x: 1 } },
    { value: Buffer.alloc(10) },
  ]);
  const validConsumed = encodeConsumedRecords([
    { topic: "t", partition: 0, offset: 1, timestamp: 2, key: Buffer.from("k"), value: { z: 1 }, headers: {} },
  ]);
  for (let i = 0; i < 20_000; i++) {
    let buf: Buffer;
    const mode = i % 3;
    if (mode === 0) buf = Buffer.from(Array.from({ length: Math.floor(rand() * 64) }, () => Math.floor(rand() * 256)));
    else {
      buf = Buffer.from(mode === 1 ? valid : validConsumed);
      const flips = 1 + Math.floor(rand() * 4);
      for (let k = 0; k < flips; k++) buf[Math.floor(rand() * buf.length)] = Math.floor(rand() * 256);
      if (rand() < 0.3) buf = buf.subarray(0, Math.floor(rand() * buf.length));
    }
    for (const decode of [() => decodePublishRecords(buf, 100_000), () => decodeConsumedRecords("t", buf), () => decodeFrame(buf)]) {
      try {
        decode();
      } catch (err) {
        assert.ok(err instanceof ProtocolError, `seed ${SEED} iteration ${i}: ${String(err)}`);
      }
    }
  }
});

test("a huge announced count or length allocates nothing", () => {
  const b = Buffer.alloc(8);
  b.writeUInt32BE(0xffffffff, 0);
  assert.throws(() => decodePublishRecords(b, 100_000), ProtocolError);
  const r = new FrameReader(1024);
  const hdr = Buffer.alloc(4);
  hdr.writeUInt32BE(0x7fffffff, 0);
  r.push(hdr);
  assert.throws(() => r.next(), (e: unknown) => e instanceof ProtocolError && e.code === "FRAME_TOO_LARGE");
});

// ---------------------------------------------------------------------------------------------
// Live server

function rawConnect(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = netConnect({ port, host: "127.0.0.1" }, () => resolve(s));
    s.on("error", reject);
  });
}

/** Collects frames from a raw socket; resolves `closed` when the server closes it. */
function collect(s: Socket): { frames: Frame[]; closed: Promise<void> } {
  const r = new FrameReader(1 << 24);
  const frames: Frame[] = [];
  s.on("data", (c: Buffer) => {
    r.push(c);
    try {
      for (let f = r.next(); f; f = r.next()) frames.push(decodeFrame(f));
    } catch {
      /* ignore */
    }
  });
  s.on("error", () => {});
  const closed = new Promise<void>((resolve) => s.on("close", () => resolve()));
  return { frames, closed };
}

async function handshake(port: number): Promise<{ s: Socket; frames: Frame[]; closed: Promise<void> }> {
  const s = await rawConnect(port);
  const c = collect(s);
  s.write(encodePreamble());
  s.write(encodeFrame(Op.Hello, 0, 1, {}));
  await waitFor(() => c.frames.length >= 1, "hello reply");
  assert.equal(c.frames[0].flags & FLAG_ERROR, 0);
  return { s, ...c };
}

const waitFor = (cond: () => boolean, what: string, timeoutMs = 5000): Promise<unknown> => waitUntilShared(cond, what, timeoutMs, 2);

async function withServer(fn: (srv: ServerHandle) => Promise<void>): Promise<void> {
  const broker = fakeBroker();
  await broker.createTopic("t", { partitions: 2, maxMessageBytes: 1000 });
  const srv = await startServer({ broker, port: 0, httpPort: null, limits: { maxFrameBytes: 64 * 1024 } });
  try {
    await fn(srv);
  } finally {
    await srv.close({ graceMs: 100 });
  }
}

test("server: garbage, truncation and oversized frames close only the offending connection", async () => {
  await withServer(async (srv) => {
    const good = await connect({ url: srv.url });
    try {
      const rand = rng(SEED + 1);
      const rssBefore = process.memoryUsage().rss;
      const closes: Promise<void>[] = [];
      for (let i = 0; i < 120; i++) {
        const kind = i % 6;
        const s = await rawConnect(srv.port);
        const c = collect(s);
        if (kind === 0) {
          // random bytes before the handshake
          s.write(randomBytes(1 + Math.floor(rand() * 200)));
        } else if (kind === 1) {
          // valid preamble, then a pre-handshake frame announcing 1 GiB
          s.write(encodePreamble());
          const b = Buffer.alloc(4);
          b.writeUInt32BE(1 << 30, 0);
          s.write(b);
        } else if (kind === 2) {
          // after the handshake: a frame announcing more than maxFrameBytes
          s.write(encodePreamble());
          s.write(encodeFrame(Op.Hello, 0, 1, {}));
          const b = Buffer.alloc(4);
          b.writeUInt32BE(0xfffffff0, 0);
          s.write(b);
        } else if (kind === 3) {
          // after the handshake: random frames with valid lengths
          s.write(encodePreamble());
          s.write(encodeFrame(Op.Hello, 0, 1, {}));
          for (let k = 0; k < 5; k++) {
            const body = randomBytes(Math.floor(rand() * 100));
            const f = Buffer.alloc(4 + 10 + body.length);
            f.writeUInt32BE(10 + body.length, 0);
            f[4] = Math.floor(rand() * 60);
            f.writeUInt32BE(body.length > 0 ? Math.floor(rand() * body.length) : 0, 10);
            body.copy(f, 14);
            s.write(f);
          }
        } else if (kind === 4) {
          // truncated frame, then the client hangs up
          s.write(encodePreamble());
          s.write(encodeFrame(Op.Hello, 0, 1, {}));
          s.write(encodeFrame(Op.Publish, 0, 2, { topic: "t" }, encodePublishRecords([{ value: "x" }])).subarray(0, 20));
          s.end();
        } else {
          // a valid publish whose records section is corrupt
          s.write(encodePreamble());
          s.write(encodeFrame(Op.Hello, 0, 1, {}));
          const body = encodePublishRecords([{ value: "abc" }]);
          body.writeUInt32BE(1_000_000, 0);
          s.write(encodeFrame(Op.Publish, 0, 2, { topic: "t" }, body));
        }
        closes.push(c.closed.then(() => {}));
        if (kind === 1 || kind === 2) {
          await c.closed;
          const err = c.frames.find((f) => f.flags & FLAG_ERROR);
          assert.ok(err, "an error frame precedes the close");
          assert.match(String(err!.meta.code), /FRAME_TOO_LARGE/);
        }
        if (kind === 5) {
          await waitFor(() => c.frames.length >= 2, "error reply");
          assert.equal(c.frames[1].flags & FLAG_ERROR, FLAG_ERROR);
          assert.equal(c.frames[1].meta.code, "PROTOCOL");
          s.destroy();
        }
        if (kind === 3) s.destroy();
        // the healthy client keeps working throughout
        if (i % 10 === 0) assert.deepEqual(await good.listTopics(), ["t"]);
      }
      await Promise.all(closes);
      await good.publish("t", "still alive", { partition: 0 });
      const r = await good.fetch("t", 0, 0);
      assert.equal(r.records.at(-1)!.value, "still alive");
      await waitFor(() => srv.connectionCount() === 1, "bad connections to be gone");
      // No frame buffer was ever sized from an announced length: growth stays small.
      assert.ok(process.memoryUsage().rss - rssBefore < 200 * 1024 * 1024);
    } finally {
      await good.close();
    }
  });
});

test("server: a valid request sent one byte at a time is answered", async () => {
  await withServer(async (srv) => {
    const s = await rawConnect(srv.port);
    const c = collect(s);
    const bytes = Buffer.concat([
      encodePreamble(),
      encodeFrame(Op.Hello, 0, 1, {}),
      encodeFrame(Op.Publish, 0, 2, { topic: "t" }, encodePublishRecords([{ value: "one", partition: 1 }])),
      encodeFrame(Op.ListTopics, 0, 3, {}),
    ]);
    for (let i = 0; i < bytes.length; i++) {
      s.write(bytes.subarray(i, i + 1));
      if (i % 16 === 0) await new Promise((r) => setImmediate(r));
    }
    await waitFor(() => c.frames.length >= 3, "three replies");
    assert.deepEqual(
      c.frames.map((f) => [f.op, f.correlationId, f.flags & FLAG_ERROR]),
      [
        [Op.Hello, 1, 0],
        [Op.Publish, 2, 0],
        [Op.ListTopics, 3, 0],
      ],
    );
    s.destroy();
  });
});

test("server: pipelined requests are answered by correlation id; errors are typed", async () => {
  await withServer(async (srv) => {
    const { s, frames } = await handshake(srv.port);
    const reqs: Buffer[] = [];
    for (let i = 0; i < 200; i++) {
      reqs.push(encodeFrame(Op.Publish, 0, 100 + i, { topic: "t" }, encodePublishRecords([{ value: i, partition: i % 2 }])));
    }
    reqs.push(encodeFrame(Op.DescribeTopic, 0, 999, { name: "missing" }));
    s.write(Buffer.concat(reqs));
    await waitFor(() => frames.length >= 202, "all replies");
    const ids = new Set(frames.slice(1).map((f) => f.correlationId));
    assert.equal(ids.size, 201);
    const miss = frames.find((f) => f.correlationId === 999)!;
    assert.equal(miss.meta.code, "TOPIC_NOT_FOUND");
    s.destroy();

    const client = await connect({ url: srv.url });
    await assert.rejects(client.describeTopic("missing"), TopicNotFoundError);
    await assert.rejects(client.publish("t", "x".repeat(2000), { partition: 0 }), RecordTooLargeError);
    // After a batch refused for good the producer renumbers what follows and keeps publishing.
    const ok = await client.publish("t", "fine", { partition: 0 });
    assert.equal(ok.partition, 0);
    await client.close();
  });
});

test("server: an unknown protocol version gets a clear error", async () => {
  await withServer(async (srv) => {
    await assert.rejects(
      connect({ url: srv.url, protocolVersions: { min: 7, max: 9 } }),
      (err: unknown) =>
        err instanceof UnsupportedVersionError && /client speaks protocol versions 7\.\.9; this server speaks 1\.\.1/.test(err.message),
    );
    // A request before HELLO is refused.
    const s = await rawConnect(srv.port);
    const c = collect(s);
    s.write(encodePreamble());
    s.write(encodeFrame(Op.ListTopics, 0, 5, {}));
    await c.closed;
    assert.match(String(c.frames[0].meta.message), /expected HELLO/);
  });
});

test("server: a client disconnect mid-request and reconnect retries idempotent publishes", async () => {
  await withServer(async (srv) => {
    const client = await connect({ url: srv.url, reconnectMinDelayMs: 10 });
    const pending = Array.from({ length: 50 }, (_, i) => client.publish("t", `m${i}`, { partition: 1 }));
    client.transport.destroySocketForTest();
    const receipts = await Promise.all(pending);
    assert.equal(receipts.length, 50);
    assert.ok(client.transport.reconnects >= 1);
    await client.close();
  });
});

test("server: credit-based flow control; a slow consumer never makes the server pull ahead", async () => {
  const broker = fakeBroker();
  await broker.createTopic("flow", { partitions: 1 });
  await broker.publishBatch("flow", Array.from({ length: 5000 }, (_, i) => ({ value: i })));
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const client = await connect({ url: srv.url, subscriptionWindowMessages: 100 });
  try {
    const sub = client.subscribe<number>("flow", { group: "slow", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.value!.value, 0);
    // Several request/response round trips give the server every chance to push more.
    for (let i = 0; i < 20; i++) await client.listTopics();
    // The server pulled at most the window plus one chunk read ahead of the credit (at most
    // one grant: here the initial 100), held in the server, never pushed beyond the window.
    assert.ok(broker.stats.delivered <= 100 + 100, `server pulled ${broker.stats.delivered} messages for a window of 100`);
    // Consuming returns credit: the rest flows, in order.
    let expect = 1;
    while (expect < 5000) {
      const r = await it.next();
      assert.equal(r.value!.value, expect++);
    }
    await sub.close();
  } finally {
    await client.close();
    await srv.close({ graceMs: 100 });
  }
});

test("server: tiny in-flight budgets throttle pipelining without deadlock", async () => {
  const broker = fakeBroker();
  await broker.createTopic("t", { partitions: 2 });
  const srv = await startServer({
    broker,
    port: 0,
    httpPort: null,
    limits: { maxInFlight: 4, maxInFlightBytes: 2048, maxInFlightBytesTotal: 4096 },
  });
  const clients = await Promise.all([0, 1, 2].map(() => connect({ url: srv.url, idempotent: false })));
  try {
    const all = clients.flatMap((c, k) =>
      Array.from({ length: 300 }, (_, i) => c.publishBatch("t", [{ value: "x".repeat(200) + `${k}-${i}`, partition: i % 2 }])),
    );
    const receipts = await Promise.all(all);
    assert.equal(receipts.length, 900);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    await srv.close({ graceMs: 100 });
  }
});

test("client: lingerMs gathers concurrent publish() calls into batches; close() waits for them", async () => {
  await withServer(async (srv) => {
    const client = await connect({ url: srv.url, lingerMs: 5, maxBatchRecords: 64 });
    let frames = 0;
    const orig = client.transport.request.bind(client.transport);
    client.transport.request = ((op: Op, ...rest: unknown[]) => {
      if (op === Op.PublishEncoded) frames++;
      return (orig as (...a: unknown[]) => Promise<Frame>)(op, ...rest);
    }) as typeof client.transport.request;
    const receipts = await Promise.all(Array.from({ length: 200 }, (_, i) => client.publish("t", i, { partition: 1 })));
    assert.deepEqual(
      receipts.map((r) => r.offset),
      receipts.map((_, i) => receipts[0].offset + i),
      "one partition, contiguous offsets in call order",
    );
    assert.ok(frames >= 4 && frames <= 8, `200 records in batches of <= 64: ${frames} frames`);
    const last = client.publish("t", "last", { partition: 0 });
    await client.close();
    assert.equal((await last).partition, 0, "close() sends and awaits accepted publishes");
  });
});

test("server: PUBLISH_ENCODED stores a client-encoded batch as is and refuses malformed ones without storing anything", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-encoded-"));
  const broker = await openBroker({ dataDir: dir });
  await broker.createTopic("e", { partitions: 2, maxMessageBytes: 500 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  try {
    const { s, frames } = await handshake(srv.port);
    const enc = (values: Buffer[], producer?: { producerId: number; producerEpoch: number; baseSequence: number }) => {
      const b = encodeBatch(values.map((v) => ({ key: null, value: v, valueKind: 0 as const, timestamp: 1000, headers: null })), producer);
      stampBatch(b, 0);
      return b;
    };
    const good = enc([Buffer.from("a"), Buffer.from("b")]);
    const badCrc = enc([Buffer.from("c")]);
    badCrc[badCrc.length - 3] ^= 1;
    const tooBig = enc([Buffer.alloc(600)]);
    const truncated = enc([Buffer.from("d")]).subarray(0, 60);
    let id = 10;
    const send = (meta: object, body: Buffer) => s.write(encodeFrame(Op.PublishEncoded, 0, ++id, meta, body));
    send({ topic: "e", partition: 1 }, good);
    send({ topic: "e", partition: 1 }, badCrc);
    send({ topic: "e", partition: 1 }, tooBig);
    send({ topic: "e", partition: 1 }, truncated);
    send({ topic: "e", partition: 7 }, enc([Buffer.from("x")]));
    send({ topic: "e", partition: 1 }, enc([Buffer.from("z")]));
    await waitFor(() => frames.length >= 7, "six replies");
    const by = (cid: number) => frames.find((f) => f.correlationId === cid)!;
    assert.deepEqual(by(11).meta, { baseOffset: 0, count: 2, duplicate: false, synced: true });
    assert.equal(by(12).meta.code, "INVALID_BATCH");
    assert.equal(by(13).meta.code, "RECORD_TOO_LARGE");
    assert.equal(by(14).meta.code, "INVALID_BATCH");
    assert.equal(by(15).meta.code, "VALIDATION");
    // The connection kept working after the refusals, and nothing refused was stored.
    assert.deepEqual(by(16).meta, { baseOffset: 2, count: 1, duplicate: false, synced: true });
    s.destroy();
    const res = await broker.fetch("e", 1, 0);
    assert.deepEqual(res.records.map((r) => Buffer.from(r.value as Uint8Array).toString()), ["a", "b", "z"]);
    assert.deepEqual(res.records.map((r) => r.offset), [0, 1, 2]);
  } finally {
    await srv.close({ graceMs: 100 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
