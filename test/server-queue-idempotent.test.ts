// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueues through the server are idempotent across lost connections and timeouts
 * (docs/protocol.md §7): the client numbers its QUEUE_ENQUEUE requests per queue under a
 * producer id and re-sends an unanswered one with the same identity; the queue answers a
 * request it already stored with the original ids. A loopback proxy drops the server's answers
 * to stored requests (and then the connection), so the retries hit requests that were stored.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, connect as netConnect, type Server, type Socket } from "node:net";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { drainEnqueues, enqueueStats, MAX_WAITING_JOBS } from "../src/client/queue.js";
import { RemoteQueue } from "../src/client/queue-handle.js";
import { QueueFullError, TimeoutError, ValidationError } from "../src/errors.js";
import { ENQUEUE_REQUESTS_KEPT } from "../src/queues/idempotence.js";
import type { EnqueueResult, Queue } from "../src/queues/types.js";
import { encodePublishRecords, Op } from "../src/wire/index.js";
import { startServer } from "../src/server/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { Broker } from "../src/types.js";

const OP_QUEUE_ENQUEUE = Op.QueueEnqueue;

/** Complete frames (with their u32 length prefix) out of a byte stream; test frames are small. */
class Frames {
  private buf: Buffer = Buffer.alloc(0);
  constructor(private preamble: number) {}
  push(chunk: Buffer): Buffer[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const out: Buffer[] = [];
    if (this.preamble > 0) {
      const n = Math.min(this.preamble, this.buf.length);
      out.push(this.buf.subarray(0, n));
      this.buf = this.buf.subarray(n);
      this.preamble -= n;
    }
    while (this.buf.length >= 4 && this.buf.length >= 4 + this.buf.readUInt32BE(0)) {
      const len = 4 + this.buf.readUInt32BE(0);
      out.push(this.buf.subarray(0, len));
      this.buf = this.buf.subarray(len);
    }
    return out;
  }
}

const opOf = (f: Buffer): number => f.readUInt8(4);
const flagsOf = (f: Buffer): number => f.readUInt8(5);
const corrOf = (f: Buffer): number => f.readUInt32BE(6);
const metaOf = (f: Buffer): Record<string, unknown> => {
  const n = f.readUInt32BE(10);
  return n === 0 ? {} : (JSON.parse(f.toString("utf8", 14, 14 + n)) as Record<string, unknown>);
};

/** One client connection and its connection to the server; QUEUE_ENQUEUE requests unanswered on it by correlation id. */
interface Pair {
  client: Socket;
  server: Socket;
  outstanding: Map<number, { queue: string; sequence: number }>;
}

/**
 * Loopback proxy for QUEUE_ENQUEUE: counts the requests a client has outstanding per queue (an
 * outside check of its window), and drops the server's successful answers to the next N of them
 * (the jobs are stored; the client never hears of it), remembering what they said.
 */
class EnqueueProxy {
  private readonly pairs = new Set<Pair>();
  private readonly perQueue = new Map<string, number>();
  private dropLeft = 0;
  /** The dropped answers' metas, by sequence of the request (what the client must get back). */
  readonly droppedAnswers = new Map<number, Record<string, unknown>>();
  maxPerQueue = 0;
  /** Every QUEUE_ENQUEUE request forwarded (each attempt) with its sequence. */
  readonly requests: { sequence: number; producerId: number }[] = [];
  onDrop: (n: number) => void = () => {};
  private constructor(
    private readonly server: Server,
    readonly port: number,
    private readonly target: number,
  ) {}

  static async start(targetPort: number): Promise<EnqueueProxy> {
    let proxy: EnqueueProxy | null = null;
    const server = createServer({ noDelay: true }, (s) => proxy!.accept(s));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    const a = server.address();
    proxy = new EnqueueProxy(server, typeof a === "object" && a ? a.port : 0, targetPort);
    return proxy;
  }
  get url(): string {
    return `sluice://127.0.0.1:${this.port}`;
  }
  dropEnqueueAnswers(n: number): void {
    this.dropLeft = n;
  }
  cut(): void {
    for (const p of [...this.pairs]) this.closePair(p);
  }
  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
  private accept(client: Socket): void {
    const server = netConnect({ host: "127.0.0.1", port: this.target, noDelay: true });
    const pair: Pair = { client, server, outstanding: new Map() };
    this.pairs.add(pair);
    const up = new Frames(8);
    const down = new Frames(0);
    client.on("data", (chunk: Buffer) => {
      for (const f of up.push(chunk)) {
        if (f.length >= 14 && opOf(f) === OP_QUEUE_ENQUEUE) {
          const m = metaOf(f);
          const q = String(m.queue);
          pair.outstanding.set(corrOf(f), { queue: q, sequence: Number(m.sequence) });
          this.requests.push({ sequence: Number(m.sequence), producerId: Number(m.producerId) });
          const n = (this.perQueue.get(q) ?? 0) + 1;
          this.perQueue.set(q, n);
          this.maxPerQueue = Math.max(this.maxPerQueue, n);
        }
        server.write(f);
      }
    });
    server.on("data", (chunk: Buffer) => {
      for (const f of down.push(chunk)) {
        const o = pair.outstanding.get(corrOf(f));
        if (o !== undefined && opOf(f) === OP_QUEUE_ENQUEUE) {
          if ((flagsOf(f) & 2) === 0 && this.dropLeft > 0) {
            // Stored, unanswered: the request stays outstanding on this connection.
            this.dropLeft--;
            this.droppedAnswers.set(o.sequence, metaOf(f));
            this.onDrop(this.droppedAnswers.size);
            continue;
          }
          pair.outstanding.delete(corrOf(f));
          this.perQueue.set(o.queue, this.perQueue.get(o.queue)! - 1);
        }
        client.write(f);
      }
    });
    const close = (): void => this.closePair(pair);
    for (const s of [client, server]) {
      s.on("error", close);
      s.on("close", close);
    }
  }
  private closePair(p: Pair): void {
    if (!this.pairs.delete(p)) return;
    for (const o of p.outstanding.values()) this.perQueue.set(o.queue, this.perQueue.get(o.queue)! - 1);
    p.outstanding.clear();
    p.client.destroy();
    p.server.destroy();
  }
}

async function withServer(fn: (port: number, broker: EmbeddedBroker) => Promise<void>): Promise<void> {
  using tmp = tempDir("sluice-srv-idem-");
  const broker = (await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 }));
  const srv = await startServer({ broker, port: 0, httpPort: null });
  try {
    await fn(Number(new URL(srv.url).port), broker);
  } finally {
    await srv.close({ graceMs: 200 });
    await broker.close();
  }
}

/** Every job of an embedded queue, acked: payload -> ids seen (more than one = stored twice). */
async function storedJobs(q: Queue<string>, expected: number): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  let n = 0;
  const stop = new AbortController();
  const run = (async () => {
    for await (const j of q.work({ prefetch: 512, signal: stop.signal })) {
      out.set(j.data, [...(out.get(j.data) ?? []), j.id]);
      n++;
      await j.ack();
      if (n >= expected) stop.abort();
    }
  })();
  await waitUntil(async () => n >= expected, `${expected} stored jobs delivered`, 20_000);
  await waitUntil(async () => (await q.stats()).depth === 0, "queue empty", 5000);
  stop.abort();
  await run;
  return out;
}

test("the same QUEUE_ENQUEUE request sent twice on one connection is answered with the same ids and stored once", { timeout: 60_000 }, async () => {
  await withServer(async (port, broker) => {
    const client = await connect({ url: `sluice://127.0.0.1:${port}` });
    try {
      const t = client.transport;
      const id = Number((await t.request(Op.InitProducer, {}, null)).meta.producerId);
      const body = encodePublishRecords([{ value: "a" }, { value: "b" }]);
      const meta = { queue: "twice", compact: true, producerId: id, sequence: 0 };
      const [r1, r2] = await Promise.all([t.request(Op.QueueEnqueue, meta, body), t.request(Op.QueueEnqueue, meta, body)]);
      assert.deepEqual(r1.meta, { first: "0", n: 2 });
      assert.deepEqual(r2.meta, r1.meta, "the second copy (concurrent with the first) gets the first one's ids");
      const r3 = await t.request(Op.QueueEnqueue, meta, body);
      assert.deepEqual(r3.meta, r1.meta, "and so does a later one");
      const stored = await storedJobs(broker.queue<string>("twice"), 2);
      assert.deepEqual([...stored.entries()].sort(), [
        ["a", ["0"]],
        ["b", ["1"]],
      ]);
    } finally {
      await client.close();
    }
  });
});

for (const drops of [1, 3, ENQUEUE_REQUESTS_KEPT]) {
  test(`answers to ${drops} stored enqueue request(s) dropped, then the connection: every call gets its original ids, nothing stored twice`, { timeout: 60_000 }, async () => {
    await withServer(async (port, broker) => {
      const proxy = await EnqueueProxy.start(port);
      const client = await connect({ url: proxy.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50 });
      try {
        const q = client.queue<string>("lossy");
        // Warm up (producer id, queue open), so the dropped answers belong to enqueue traffic.
        await q.enqueue("warm-up");
        proxy.dropEnqueueAnswers(drops);
        proxy.onDrop = (n) => {
          if (n === drops) setImmediate(() => proxy.cut());
        };
        const results = new Map<string, EnqueueResult>();
        const calls: Promise<void>[] = [];
        let k = 0;
        // Many calls in flight: singles coalesce into shared requests, batches ride alone or
        // together; the window lets at most ENQUEUE_REQUESTS_KEPT requests out at once.
        for (let round = 0; round < 4 * drops + 4; round++) {
          for (let i = 0; i < 20; i++) {
            const data = `s${k++}`;
            calls.push(q.enqueue(data).then((r) => void results.set(data, r)));
          }
          const batch = Array.from({ length: 30 }, () => `b${k++}`);
          calls.push(q.enqueueBatch(batch.map((data) => ({ data }))).then((rs) => rs.forEach((r, i) => results.set(batch[i], r))));
          await new Promise((r) => setImmediate(r));
        }
        await Promise.all(calls);
        assert.equal(proxy.droppedAnswers.size, drops, "answers were dropped");
        assert.ok(client.transport.reconnects >= 1, "the client reconnected");
        assert.ok(proxy.maxPerQueue <= ENQUEUE_REQUESTS_KEPT, `at most ${ENQUEUE_REQUESTS_KEPT} requests of a queue outstanding (saw ${proxy.maxPerQueue})`);
        // The ids of the dropped answers are exactly what the callers of those requests got.
        const got = new Set([...results.values()].map((r) => r.id));
        for (const meta of proxy.droppedAnswers.values()) {
          const first = Number(meta.first);
          for (let i = 0; i < Number(meta.n); i++) assert.ok(got.has(String(first + i)), `id ${first + i} of a dropped answer reached its caller`);
        }
        const stored = await storedJobs(broker.queue<string>("lossy"), results.size + 1);
        const twice = [...stored].filter(([, ids]) => ids.length > 1);
        assert.deepEqual(twice, [], "nothing stored twice");
        for (const [data, r] of results) assert.deepEqual(stored.get(data), [r.id], `${data} stored once, under the id its caller got`);
        const retried = proxy.requests.length - new Set(proxy.requests.map((r) => `${r.producerId}/${r.sequence}`)).size;
        assert.ok(retried >= drops, `the requests whose answers were dropped were sent again (${retried} retries)`);
      } finally {
        await client.close();
        await proxy.close();
      }
    });
  });
}

test("an enqueue whose answer does not come back in time is re-sent with the same identity and stored once", { timeout: 60_000 }, async () => {
  await withServer(async (port, broker) => {
    const proxy = await EnqueueProxy.start(port);
    const client = await connect({ url: proxy.url, requestTimeoutMs: 400 });
    try {
      const q = client.queue<string>("slow");
      await q.enqueue("warm-up");
      proxy.dropEnqueueAnswers(1); // black-holed, the connection stays up: the client times out
      const r = await q.enqueueBatch([{ data: "x" }, { data: "y" }]);
      assert.equal(proxy.droppedAnswers.size, 1);
      const dropped = [...proxy.droppedAnswers.values()][0];
      assert.deepEqual(r, [
        { id: String(dropped.first), duplicate: false },
        { id: String(Number(dropped.first) + 1), duplicate: false },
      ]);
      assert.equal(client.transport.reconnects, 0, "same connection");
      const stored = await storedJobs(broker.queue<string>("slow"), 3);
      assert.deepEqual([...stored.keys()].sort(), ["warm-up", "x", "y"]);
    } finally {
      await client.close();
      await proxy.close();
    }
  });
});

test("past its delivery timeout an unconfirmed enqueue fails with TimeoutError: the one ambiguous outcome", { timeout: 60_000 }, async () => {
  await withServer(async (port, broker) => {
    const proxy = await EnqueueProxy.start(port);
    const client = (await connect({ url: proxy.url, requestTimeoutMs: 300 })) as RemoteBrokerHandle;
    try {
      const q = new RemoteQueue<string>(client.transport, new Map(), "expiring", undefined, { deliveryTimeoutMs: 1200 });
      await q.enqueue("warm-up");
      proxy.dropEnqueueAnswers(1_000_000);
      const t0 = Date.now();
      await assert.rejects(q.enqueue("maybe"), (e: unknown) => e instanceof TimeoutError && /may or may not have been stored/.test(e.message));
      assert.ok(Date.now() - t0 >= 1000, "retried until the delivery timeout");
      // Here it was stored (the answers were only dropped): exactly once, whatever the retries.
      assert.ok(proxy.requests.length >= 3, "sent more than once");
      const stored = await storedJobs(broker.queue<string>("expiring"), 2);
      assert.deepEqual([...stored.keys()].sort(), ["maybe", "warm-up"]);
    } finally {
      await client.close();
      await proxy.close();
    }
  });
});

test("calls sharing a request fail alone when refused; a full queue fails its callers and stores nothing", { timeout: 60_000 }, async () => {
  await withServer(async (port, broker) => {
    const client = await connect({ url: `sluice://127.0.0.1:${port}` });
    try {
      const q = client.queue<string>("strict", { maxDepth: 3, overflow: "reject" });
      // Same turn: one request with three calls; the middle one has a key the queue refuses.
      const [a, bad, c] = await Promise.allSettled([
        q.enqueue("a"),
        q.enqueueBatch([{ data: "b1" }, { data: "b2", key: "k".repeat(5000) }]),
        q.enqueue("c"),
      ]);
      assert.equal(a.status, "fulfilled");
      assert.equal(c.status, "fulfilled");
      assert.ok(bad.status === "rejected" && bad.reason instanceof ValidationError, "the bad call alone fails");
      assert.deepEqual(
        [(a as PromiseFulfilledResult<EnqueueResult>).value, (c as PromiseFulfilledResult<EnqueueResult>).value],
        [
          { id: "0", duplicate: false },
          { id: "1", duplicate: false },
        ],
      );
      await q.enqueue("d");
      await assert.rejects(q.enqueue("e"), QueueFullError, "not retried: certainly not stored");
      const stored = await storedJobs(broker.queue<string>("strict"), 3);
      assert.deepEqual([...stored.keys()].sort(), ["a", "c", "d"]);
    } finally {
      await client.close();
    }
  });
});

test("an aborted enqueue that was not sent yet stores nothing", { timeout: 60_000 }, async () => {
  await withServer(async (port, broker) => {
    const client = await connect({ url: `sluice://127.0.0.1:${port}` });
    try {
      const q = client.queue<string>("abort");
      const ac = new AbortController();
      const p = q.enqueue("never", { signal: ac.signal });
      ac.abort(); // before the microtask that sends it
      await assert.rejects(p, (e: unknown) => (e as { code?: string }).code === "ABORTED");
      await q.enqueue("kept");
      const stored = await storedJobs(broker.queue<string>("abort"), 1);
      assert.deepEqual([...stored.keys()], ["kept"]);
    } finally {
      await client.close();
    }
  });
});

test("enqueue calls faster than the server stores wait for room: unsent jobs stay bounded", { timeout: 120_000 }, async () => {
  await withServer(async (port, broker) => {
    const client = await connect({ url: `sluice://127.0.0.1:${port}` });
    try {
      const q = client.queue<string>("flood");
      await q.enqueue("warm-up");
      const per = 1000;
      const calls = Math.ceil((MAX_WAITING_JOBS * 1.5) / per);
      const all: Promise<unknown>[] = [];
      for (let c = 0; c < calls; c++) all.push(q.enqueueBatch(Array.from({ length: per }, (_, i) => ({ data: `${c}:${i}` }))));
      // Every call has run up to its room check: the first ones hold the room, the rest wait.
      const waiting = enqueueStats(client.transport).waitingJobs;
      assert.ok(waiting <= MAX_WAITING_JOBS, `${waiting} unsent jobs`);
      assert.ok(waiting > MAX_WAITING_JOBS - per, `the room was used (${waiting})`);
      await Promise.all(all);
      assert.equal(enqueueStats(client.transport).waitingJobs, 0);
      assert.equal((await broker.queue<string>("flood").stats()).depth, calls * per + 1);
    } finally {
      await client.close();
    }
  });
});

test("drainEnqueues waits until every enqueue of the connection is answered (for close)", { timeout: 60_000 }, async () => {
  await withServer(async (port) => {
    const client = await connect({ url: `sluice://127.0.0.1:${port}` });
    try {
      const q = client.queue<string>("drain");
      let answered = 0;
      const all = Array.from({ length: 500 }, (_, i) => q.enqueue(`j${i}`).then(() => void answered++));
      await drainEnqueues(client.transport, 30_000);
      // Drain resolves as the last answer arrives; the callers' continuations run right after.
      await new Promise((r) => setImmediate(r));
      assert.equal(answered, 500, "all answered when drain resolves");
      await Promise.all(all);
      await drainEnqueues(client.transport, 30_000); // nothing open: at once
    } finally {
      await client.close();
    }
  });
});

test("an enqueue answered STORAGE_ERROR is retried under its identity until the queue is back (server restarted)", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-srv-idem-storage-");
  const fs = new FaultyFileSystem();
  let broker = (await openBroker({ dataDir: tmp.dir, fs, retentionCheckIntervalMs: 0 }));
  let srv = await startServer({ broker, port: 0, httpPort: null });
  const port = Number(new URL(srv.url).port);
  const client = await connect({ url: srv.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50 });
  try {
    const q = client.queue<string>("disk");
    await q.enqueue("before");
    fs.failNext("write", "EIO", { pathIncludes: "/msgs/" });
    let settled = false;
    const p = q.enqueue("during").then((r) => ((settled = true), r));
    // The queue refused it (STORAGE_ERROR) and is unusable until reopened: the call keeps retrying.
    await waitUntil(async () => (await broker.queue<string>("disk").stats().catch((e: Error) => e)) instanceof Error, "the queue failed", 10_000);
    assert.equal(settled, false, "no error reaches the caller: the outcome is not final yet");
    await srv.close({ graceMs: 200 });
    await broker.close();
    await fs.powerLoss();
    broker = (await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 }));
    srv = await startServer({ broker, port, httpPort: null });
    assert.deepEqual(await p, { id: "1", duplicate: false });
    const stored = await storedJobs(broker.queue<string>("disk"), 2);
    assert.deepEqual([...stored].sort(), [
      ["before", ["0"]],
      ["during", ["1"]],
    ]);
  } finally {
    await client.close();
    await srv.close({ graceMs: 200 });
    await broker.close();
  }
});
