// SPDX-License-Identifier: Apache-2.0
/**
 * Batched work-queue frames (docs/protocol.md §7): QUEUE_SETTLE_BATCH answers each delivery
 * tag on its own (a stale one fails alone), PUSH_JOB_BATCH carries jobs in binary, older
 * clients still get PUSH_JOBS / QUEUE_SETTLE, the codecs reject hostile bytes with
 * ProtocolError only, and the server's lookahead (parked jobs) never costs a job an attempt
 * nor keeps it from other workers when a client stalls.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect as netConnect, type Socket } from "node:net";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { LeaseExpiredError, ProtocolError } from "../src/errors.js";
import { startServer } from "../src/server/index.js";
import {
  FLAG_ERROR,
  FLAG_PUSH,
  FrameReader,
  Op,
  decodeFrame,
  decodePublishRecords,
  encodeFrame,
  encodePreamble,
  encodePublishRecords,
  type Frame,
} from "../src/wire/index.js";
import {
  decodeEnqueueRecords,
  decodeJobBatch,
  decodeSettleItems,
  encodeJobBatchFrame,
  encodeSettleItems,
  type SettleItem,
  type WireJob,
} from "../src/wire/index.js";
import type { Broker } from "../src/types.js";
import type { Job } from "../src/queues/types.js";
import { maxLookahead } from "../src/queues/lookahead.js";

async function withQueueServer(fn: (url: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-qbatch-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  try {
    await fn(srv.url);
  } finally {
    await srv.close({ graceMs: 200 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function waitUntil(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A bare protocol client: frames in, frames out, pushes and responses in one list. */
class RawClient {
  private readonly reader = new FrameReader(64 * 1024 * 1024);
  private readonly frames: Frame[] = [];
  private waiters: (() => void)[] = [];
  private nextId = 1;
  private constructor(private readonly socket: Socket) {
    socket.on("data", (c: Buffer) => {
      this.reader.push(c);
      for (let raw = this.reader.next(); raw; raw = this.reader.next()) this.frames.push(decodeFrame(raw));
      for (const w of this.waiters.splice(0)) w();
    });
  }
  static async open(url: string): Promise<RawClient> {
    const u = new URL(url);
    const socket = netConnect({ host: u.hostname, port: Number(u.port) });
    await new Promise<void>((resolve, reject) => socket.once("connect", resolve).once("error", reject));
    const c = new RawClient(socket);
    socket.write(encodePreamble());
    await c.request(Op.Hello, { client: "raw-test", version: 1 });
    return c;
  }
  /** Waits for (and removes) the first frame matching `pred`. */
  async take(pred: (f: Frame) => boolean, what: string, timeoutMs = 10_000): Promise<Frame> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.frames.findIndex(pred);
      if (i >= 0) return this.frames.splice(i, 1)[0];
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
  }
  /** Frames received and not taken that match `pred`. */
  pending(pred: (f: Frame) => boolean): number {
    return this.frames.filter(pred).length;
  }
  async request(op: number, meta: unknown, body: Buffer | null = null): Promise<Frame> {
    const id = this.nextId++;
    this.socket.write(encodeFrame(op, 0, id, meta, body));
    const f = await this.take((x) => !(x.flags & FLAG_PUSH) && x.correlationId === id, `response to op ${op}`);
    if (f.flags & FLAG_ERROR) throw new Error(`op ${op} failed: ${JSON.stringify(f.meta)}`);
    return f;
  }
  close(): void {
    this.socket.destroy();
  }
}

test("batched settle: a stale receipt fails with LeaseExpiredError alone; the rest of the frame settles", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const client = await connect({ url });
    try {
      const q = client.queue<string>("mixed", { visibilityTimeoutMs: 60_000 });
      await q.enqueueBatch([{ data: "a" }, { data: "b" }, { data: "c" }]);
      const w = q.work({ prefetch: 3 });
      const it = w[Symbol.asyncIterator]();
      const jobs = new Map<string, Job<string>>();
      while (jobs.size < 3) {
        const j = (await it.next()).value!;
        jobs.set(j.data, j);
      }
      const [a, b, c] = ["a", "b", "c"].map((k) => jobs.get(k)!);
      // Same event-loop turn: one QUEUE_SETTLE_BATCH frame. The second ack of `a` names a
      // delivery the first one already ended: stale on the server, in the middle of the frame.
      const results = await Promise.allSettled([a.ack(), a.ack(), b.ack(), c.nack({ delayMs: 0, reason: "again" })]);
      assert.equal(results[0].status, "fulfilled");
      assert.equal(results[1].status, "rejected");
      assert.ok((results[1] as PromiseRejectedResult).reason instanceof LeaseExpiredError, "the stale settle gets LeaseExpiredError");
      assert.equal(results[2].status, "fulfilled");
      assert.equal(results[3].status, "fulfilled");
      // Only `c` comes back, as attempt 2.
      const again = (await it.next()).value!;
      assert.equal(again.data, "c");
      assert.equal(again.attempt, 2);
      await again.ack();
      const st = await q.stats();
      assert.equal(st.completed, 3);
      assert.equal(st.depth, 0);
      await w.close();
    } finally {
      await client.close();
    }
  });
});

test("ack with a result on the wire: PUSH_JOB_BATCH says results, an oversized result fails its item with VALIDATION and keeps the lease", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const producer = await connect({ url });
    const raw = await RawClient.open(url);
    try {
      const q = producer.queue<string>("wire-results", { resultRetentionMs: 60_000 });
      const { id } = await q.enqueue("a");
      await raw.request(Op.QueueWork, { queue: "wire-results", worker: 3, prefetch: 1, batch: true });
      const f = await raw.take((x) => x.op === Op.PushJobBatch && x.meta.worker === 3, "the job");
      assert.equal(f.meta.results, true, "the queue keeps results");
      const [job] = decodeJobBatch(f.body, 10);
      // A client that skips the check: the server checks before spending the tag.
      const big = JSON.stringify("x".repeat(64 * 1024));
      const bad = await raw.request(Op.QueueSettleBatch, { worker: 3 }, encodeSettleItems([{ tag: job.tag, action: "ack", arg: { result: big } }]));
      assert.deepEqual((bad.meta.errors as [number, { code: string }][]).map(([i, e]) => [i, e.code]), [[0, "VALIDATION"]]);
      const notJson = await raw.request(Op.QueueSettleBatch, { worker: 3 }, encodeSettleItems([{ tag: job.tag, action: "ack", arg: { result: "{nope" } }]));
      assert.deepEqual((notJson.meta.errors as [number, { code: string }][]).map(([i, e]) => [i, e.code]), [[0, "VALIDATION"]]);
      assert.equal((await q.getJob(id))?.state, "active", "still leased");
      const ok = await raw.request(Op.QueueSettleBatch, { worker: 3 }, encodeSettleItems([{ tag: job.tag, action: "ack", arg: { result: '{"n":1}' } }]));
      assert.equal((ok.meta as { errors?: unknown } | null)?.errors, undefined, "the same tag acks");
      assert.deepEqual((await q.getJob(id))?.result, { n: 1 });
      const got = await raw.request(Op.QueueGetJob, { queue: "wire-results", id });
      assert.deepEqual(got.meta.job, { id, state: "completed", attempts: 1, result: { n: 1 }, completedAt: (got.meta.job as { completedAt: number }).completedAt });
      assert.deepEqual((await raw.request(Op.QueueGetJob, { queue: "no-such-queue", id: "0" })).meta, { job: null });
    } finally {
      raw.close();
      await producer.close();
    }
  });
});

test("QUEUE_SETTLE_BATCH on the wire: per-tag results, PUSH_JOB_BATCH jobs, lease-lost by tag", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const producer = await connect({ url });
    const raw = await RawClient.open(url);
    try {
      const q = producer.queue<unknown>("wire");
      await q.enqueueBatch([
        { data: Buffer.from([1, 2, 3]), headers: { h: "v" } },
        { data: "text", key: "k1" },
        { data: { n: 3 } },
      ]);
      const reg = await raw.request(Op.QueueWork, { queue: "wire", worker: 7, prefetch: 10, batch: true });
      assert.equal(reg.meta.batch, true, "the server says it takes QUEUE_SETTLE_BATCH");
      const got: ReturnType<typeof decodeJobBatch> = [];
      while (got.length < 3) {
        const f = await raw.take((x) => x.op === Op.PushJobBatch, "PUSH_JOB_BATCH");
        assert.equal(f.meta.worker, 7);
        got.push(...decodeJobBatch(f.body, 100));
      }
      const byData = (pred: (d: unknown) => boolean) => got.find((j) => pred(j.data))!;
      const bytes = byData((d) => Buffer.isBuffer(d));
      assert.deepEqual([...(bytes.data as Buffer)], [1, 2, 3]);
      assert.deepEqual(Buffer.from(bytes.headers.h).toString(), "v");
      assert.deepEqual(Object.keys(bytes.headers), ["h"], "the broker's own sluice-* headers stay on the server");
      const text = byData((d) => d === "text");
      assert.equal(text.key, "k1");
      const json = byData((d) => typeof d === "object" && d !== null && !Buffer.isBuffer(d));
      assert.deepEqual(json.data, { n: 3 });
      for (const j of got) {
        assert.equal(j.attempt, 1);
        assert.ok(j.leaseExpiresAt > Date.now());
      }
      // Tags are distinct; a made-up one in the middle fails alone.
      assert.equal(new Set(got.map((j) => j.tag)).size, 3);
      const items: SettleItem[] = [
        { tag: bytes.tag, action: "ack", arg: {} },
        { tag: 0xfffffff0, action: "ack", arg: {} },
        { tag: text.tag, action: "ack", arg: {} },
        { tag: json.tag, action: "extend", arg: { ms: 30_000 } },
      ];
      const res = await raw.request(Op.QueueSettleBatch, { worker: 7 }, encodeSettleItems(items));
      const errors = res.meta.errors as [number, { code: string }][];
      assert.deepEqual(
        errors.map(([i, e]) => [i, e.code]),
        [[1, "LEASE_EXPIRED"]],
      );
      // Settling the same tags again: all stale except the extended one, which acks.
      const res2 = await raw.request(
        Op.QueueSettleBatch,
        { worker: 7 },
        encodeSettleItems([
          { tag: bytes.tag, action: "ack", arg: {} },
          { tag: json.tag, action: "ack", arg: {} },
        ]),
      );
      assert.deepEqual((res2.meta.errors as [number, { code: string }][]).map(([i, e]) => [i, e.code]), [[0, "LEASE_EXPIRED"]]);
      assert.equal((await q.stats()).depth, 0);
      // A worker id the connection does not have: every item fails, nothing else happens.
      const res3 = await raw.request(Op.QueueSettleBatch, { worker: 99 }, encodeSettleItems([{ tag: 1, action: "ack", arg: {} }]));
      assert.deepEqual((res3.meta.errors as [number, { code: string }][]).map(([i, e]) => [i, e.code]), [[0, "LEASE_EXPIRED"]]);
      // Lease loss is pushed with the tag.
      await q.enqueue("short");
      await raw.request(Op.QueueStop, { worker: 7 });
      await raw.request(Op.QueueWork, { queue: "wire", worker: 8, prefetch: 1, batch: true, visibilityTimeoutMs: 200 });
      const f = await raw.take((x) => x.op === Op.PushJobBatch && x.meta.worker === 8, "the short job");
      const [short] = decodeJobBatch(f.body, 10);
      const lost = await raw.take((x) => x.op === Op.PushLeaseLost && x.meta.worker === 8, "PUSH_LEASE_LOST");
      assert.equal(lost.meta.tag, short.tag);
      assert.equal(lost.meta.receipt, short.receipt);
    } finally {
      raw.close();
      await producer.close();
    }
  });
});

test("a client without batch frames still gets PUSH_JOBS and settles with QUEUE_SETTLE", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const raw = await RawClient.open(url);
    try {
      const enq = await raw.request(Op.QueueEnqueue, { queue: "old", opts: [{}, { key: "k" }] }, encodePublishRecords([{ value: "x" }, { value: { y: 1 } }]));
      const results = enq.meta.results as { id: string; duplicate: boolean }[];
      assert.equal(results.length, 2, "no compact flag: one result per job");
      const reg = await raw.request(Op.QueueWork, { queue: "old", worker: 1, prefetch: 5 });
      assert.equal(reg.meta.batch, undefined);
      const metas: { receipt: string }[] = [];
      while (metas.length < 2) {
        const f = await raw.take((x) => x.op === Op.PushJobs, "PUSH_JOBS");
        metas.push(...(f.meta.jobs as { receipt: string }[]));
        assert.equal(decodePublishRecords(f.body, 10).length, (f.meta.jobs as unknown[]).length);
      }
      const res = await raw.request(Op.QueueSettle, {
        worker: 1,
        items: [
          { receipt: metas[0].receipt, action: "ack" },
          { receipt: "no-such-receipt", action: "ack" },
          { receipt: metas[1].receipt, action: "nack", arg: { requeue: false, reason: "bad" } },
        ],
      });
      const r = res.meta.results as ({ code: string } | null)[];
      assert.equal(r[0], null);
      assert.equal(r[1]?.code, "LEASE_EXPIRED");
      assert.equal(r[2], null);
    } finally {
      raw.close();
    }
  });
});

test("enqueue over the network keeps value kinds, headers and per-job options; compact ids", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const client = await connect({ url });
    try {
      const q = client.queue<unknown>("kinds", { dedupeWindowMs: 60_000 });
      const first = await q.enqueueBatch([
        { data: Buffer.from("raw") },
        { data: "str", headers: { a: "1", b: new Uint8Array([7]) } },
        { data: { deep: [1, { x: null }] } },
        { data: null },
        { data: 42 },
      ]);
      assert.deepEqual(first.map((r) => r.duplicate), [false, false, false, false, false]);
      const ids = first.map((r) => Number(r.id));
      assert.deepEqual(ids, ids.map((_, k) => ids[0] + k), "consecutive ids from the compact answer");
      const dup = await q.enqueueBatch([{ data: "d", dedupeId: "once" }, { data: "d", dedupeId: "once" }]);
      assert.equal(dup[0].duplicate, false);
      assert.equal(dup[1].duplicate, true);
      assert.equal(dup[1].id, dup[0].id);
      const w = q.work({ prefetch: 10 });
      const it = w[Symbol.asyncIterator]();
      const seen = new Map<string, Job<unknown>>();
      while (seen.size < 6) {
        const j = (await it.next()).value!;
        seen.set(j.id, j);
      }
      const data = first.map((r) => seen.get(r.id)!.data);
      assert.ok(Buffer.isBuffer(data[0]) && (data[0] as Buffer).toString() === "raw");
      assert.equal(data[1], "str");
      assert.deepEqual(data[2], { deep: [1, { x: null }] });
      assert.equal(data[3], null);
      assert.equal(data[4], 42);
      const h = seen.get(first[1].id)!.headers;
      assert.equal(Buffer.from(h.a).toString(), "1");
      assert.deepEqual([...h.b], [7]);
      for (const j of seen.values()) await j.ack();
      await w.close();
    } finally {
      await client.close();
    }
  });
});

test("lookahead: parked jobs never cost an attempt, and a stalled client gives them back", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const a = await connect({ url });
    const b = await connect({ url });
    try {
      const TOTAL = 3000;
      const qa = a.queue<number>("park", { visibilityTimeoutMs: 60_000 });
      for (let i = 0; i < TOTAL; i += 500) await qa.enqueueBatch(Array.from({ length: 500 }, (_, k) => ({ data: i + k })));
      // Fast handlers build up a settle rate (and so a lookahead), then the client stalls.
      let handled = 0;
      let release!: () => void;
      const stalled = new Promise<void>((r) => (release = r));
      const attempts = new Map<number, number>();
      const ac = new AbortController();
      const running = qa.process(
        async (job) => {
          attempts.set(job.data, job.attempt);
          if (++handled > 1000) await stalled;
        },
        { concurrency: 4, signal: ac.signal },
      );
      await waitUntil(() => handled > 1000, "1000 jobs handled");
      // While A stalls, its parked jobs go back (PARK_MAX_MS) and no new ones are parked for
      // it: only its 4 running jobs stay leased. B can take the others, as attempt 1.
      await waitUntil(async () => (await qa.stats()).inFlight === 4, "parked jobs given back");
      const qb = b.queue<number>("park");
      let fromB = 0;
      const acb = new AbortController();
      // B stops after 20: jobs still arriving then go back unstarted, without an attempt.
      await qb.process(
        (j) => {
          assert.equal(j.attempt, 1, `job ${j.data} was parked, never handed out: still attempt 1`);
          attempts.set(j.data, j.attempt);
          if (++fromB === 20) acb.abort();
        },
        { concurrency: 1, signal: acb.signal },
      );
      release();
      // A finishes everything else; nothing was ever redelivered.
      await waitUntil(async () => (await qa.stats()).depth === 0, "all jobs done", 30_000);
      ac.abort();
      await running;
      const st = await qa.stats();
      assert.equal(st.completed, TOTAL);
      assert.equal(st.redeliveries, 0, "no job was delivered twice");
      assert.equal(attempts.size, TOTAL);
      for (const [n, att] of attempts) assert.equal(att, 1, `job ${n} attempt`);
    } finally {
      await a.close();
      await b.close();
    }
  });
});

test("lookahead: closing a worker returns its parked jobs without counting an attempt", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const client = await connect({ url });
    try {
      const q = client.queue<number>("park-close", { visibilityTimeoutMs: 60_000 });
      for (let i = 0; i < 2000; i += 500) await q.enqueueBatch(Array.from({ length: 500 }, (_, k) => ({ data: i + k })));
      let handled = 0;
      const ac = new AbortController();
      await q.process(
        async () => {
          if (++handled === 1500) ac.abort();
        },
        { concurrency: 8, signal: ac.signal },
      );
      // process() returned: its worker is closed, parked jobs are back in the queue.
      const st = await q.stats();
      assert.equal(st.inFlight, 0);
      assert.equal(st.depth, 2000 - st.completed);
      const w = q.work({ prefetch: 100 });
      const it = w[Symbol.asyncIterator]();
      let left = st.depth;
      while (left > 0) {
        const j = (await it.next()).value!;
        assert.equal(j.attempt, 1, `job ${j.data}: parked or arriving while stopping, never handed out`);
        await j.ack();
        left--;
      }
      await w.close();
      assert.equal((await q.stats()).redeliveries, 0, "stopping released unstarted jobs without an attempt");
    } finally {
      await client.close();
    }
  });
});

test("client lookahead: QUEUE_SETTLE_BATCH's lookahead widens the push window, clamped; released jobs cost no attempt", { timeout: 60_000 }, async () => {
  await withQueueServer(async (url) => {
    const producer = await connect({ url });
    const raw = await RawClient.open(url);
    try {
      const q = producer.queue<number>("client-lookahead", { visibilityTimeoutMs: 60_000 });
      await q.enqueueBatch(Array.from({ length: 1000 }, (_, k) => ({ data: k })));
      await raw.request(Op.QueueWork, { queue: "client-lookahead", worker: 3, prefetch: 4, batch: true });
      const held = new Map<number, number>();
      const collect = async (n: number): Promise<void> => {
        while (held.size < n) {
          const f = await raw.take((x) => x.op === Op.PushJobBatch && x.meta.worker === 3, `push up to ${n}`);
          for (const j of decodeJobBatch(f.body, 1000)) held.set(j.tag, j.data as number);
        }
      };
      const quiet = async (): Promise<void> => {
        await new Promise((r) => setTimeout(r, 100));
        assert.equal(raw.pending((x) => x.op === Op.PushJobBatch), 0, "nothing beyond the window");
      };
      await collect(4);
      await quiet();
      assert.equal(held.size, 4, "without a lookahead the window is prefetch");
      // A hostile lookahead is clamped to maxLookahead(4) (512, below the 1,000 jobs waiting).
      const [first] = held.keys();
      await raw.request(Op.QueueSettleBatch, { worker: 3, lookahead: 1e9 }, encodeSettleItems([{ tag: first, action: "ack", arg: {} }]));
      held.delete(first);
      await collect(4 + maxLookahead(4));
      await quiet();
      assert.equal(held.size, 4 + maxLookahead(4));
      // Back to no lookahead; the jobs beyond prefetch go back unstarted ("release").
      const extra = [...held.keys()].slice(4);
      await raw.request(Op.QueueSettleBatch, { worker: 3, lookahead: 0 }, encodeSettleItems(extra.map((tag) => ({ tag, action: "release" as const, arg: {} }))));
      for (const t of extra) held.delete(t);
      await quiet();
      assert.equal(held.size, 4);
      const st = await q.stats();
      assert.ok(st.inFlight <= 4 + 2 * 4, `released jobs are visible again (in flight: the client's 4, at most 2 x prefetch parked): ${st.inFlight}`);
      // A plain QUEUE_STOP releases the 4 unsettled ones as a failed attempt.
      const stopped = new Set(held.values());
      await raw.request(Op.QueueStop, { worker: 3 });
      // Every other job is still on its first attempt: a released lookahead job never counted one.
      const w = producer.queue<number>("client-lookahead").work({ prefetch: 100 });
      let left = (await q.stats()).depth;
      for await (const j of w) {
        assert.equal(j.attempt, stopped.has(j.data) ? 2 : 1, `job ${j.data}`);
        await j.ack();
        if (--left === 0) break;
      }
      await w.close();
    } finally {
      raw.close();
      await producer.close();
    }
  });
});

// ------------------------------------------------------------------------------ codecs

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sampleJobs: WireJob[] = [
  {
    id: "12",
    receipt: "12.1",
    attempt: 1,
    enqueuedAt: 1_700_000_000_000,
    leaseExpiresAt: 1_700_000_030_000,
    redriveCount: 0,
    key: null,
    deadLetterJson: null,
    valueKind: 0,
    value: Buffer.from([0, 255, 7]),
    headers: [["h", Buffer.from("v")]],
  },
  {
    id: "13",
    receipt: "13.4",
    attempt: 4,
    enqueuedAt: 1,
    leaseExpiresAt: 2,
    redriveCount: 2,
    key: "ключ",
    deadLetterJson: JSON.stringify({ sourceQueue: "q", errorClass: "E" }),
    valueKind: 2,
    value: Buffer.from(JSON.stringify({ a: [1, 2] })),
    headers: null,
  },
  { id: "14", receipt: "14.1", attempt: 1, enqueuedAt: 3, leaseExpiresAt: 4, redriveCount: 0, key: "k", deadLetterJson: null, valueKind: 1, value: Buffer.from("héllo"), headers: [["ü", Buffer.alloc(0)]] },
  { id: "15", receipt: "15.1", attempt: 1, enqueuedAt: 5, leaseExpiresAt: 6, redriveCount: 0, key: null, deadLetterJson: null, valueKind: 0, value: null, headers: null },
];

test("queue-wire codecs round-trip jobs and settle items", () => {
  const frame = encodeJobBatchFrame(Op.PushJobBatch, FLAG_PUSH, { worker: 3 }, 0xfffffffe, sampleJobs);
  const f = decodeFrame(frame.subarray(4));
  assert.equal(frame.readUInt32BE(0), frame.length - 4);
  assert.equal(f.op, Op.PushJobBatch);
  assert.deepEqual(f.meta, { worker: 3 });
  const jobs = decodeJobBatch(f.body, 10);
  assert.deepEqual(
    jobs.map((j) => j.tag),
    [0xfffffffe, 0xffffffff, 0, 1],
    "tags wrap at 2^32",
  );
  assert.deepEqual([...(jobs[0].data as Buffer)], [0, 255, 7]);
  assert.equal(Buffer.from(jobs[0].headers.h).toString(), "v");
  assert.deepEqual(jobs[1].data, { a: [1, 2] });
  assert.equal(jobs[1].key, "ключ");
  assert.equal(jobs[1].attempt, 4);
  assert.equal(jobs[1].redriveCount, 2);
  assert.deepEqual(JSON.parse(jobs[1].deadLetterJson!), { sourceQueue: "q", errorClass: "E" });
  assert.equal(jobs[2].data, "héllo");
  assert.deepEqual(Object.keys(jobs[2].headers), ["ü"]);
  assert.equal(jobs[3].data, null);
  for (const [i, j] of jobs.entries()) {
    assert.equal(j.id, sampleJobs[i].id);
    assert.equal(j.receipt, sampleJobs[i].receipt);
    assert.equal(j.enqueuedAt, sampleJobs[i].enqueuedAt);
    assert.equal(j.leaseExpiresAt, sampleJobs[i].leaseExpiresAt);
  }
  const items: SettleItem[] = [
    { tag: 0, action: "ack", arg: {} },
    { tag: 0xffffffff, action: "extend", arg: { ms: 1500 } },
    { tag: 5, action: "nack", arg: { delayMs: 10, requeue: false, reason: "r", errorClass: "E", errorMessage: "m" } },
    { tag: 6, action: "ack", arg: { result: '{"ok":[1,"é"]}' } },
  ];
  assert.deepEqual(decodeSettleItems(encodeSettleItems(items), 10), items);
  assert.throws(() => decodeSettleItems(encodeSettleItems(items), 2), ProtocolError, "over the item limit");
  const recs = decodeEnqueueRecords(
    encodePublishRecords([{ value: Buffer.from([1]) }, { value: "s", headers: { x: "y", z: Buffer.from([2]) } }, { value: { j: 1 } }, { value: null }]),
    10,
  );
  assert.deepEqual(
    recs.map((r) => [r.valueKind, r.value === null ? null : r.value.toString("hex")]),
    [
      [0, "01"],
      [1, Buffer.from("s").toString("hex")],
      [2, Buffer.from('{"j":1}').toString("hex")],
      [0, null],
    ],
  );
  assert.deepEqual(Object.keys(recs[1].headers!), ["x", "z"]);
  assert.equal(recs[0].headers, undefined);
});

test("queue-wire decoders: truncated, corrupted and oversized input is a ProtocolError, never a crash", () => {
  const seed = Number(process.env.SLUICE_FUZZ_SEED ?? Date.now() % 1e9);
  const rand = rng(seed);
  const jobBody = decodeFrame(encodeJobBatchFrame(Op.PushJobBatch, FLAG_PUSH, { worker: 1 }, 1, sampleJobs).subarray(4)).body;
  const settleBody = encodeSettleItems([
    { tag: 1, action: "ack", arg: {} },
    { tag: 2, action: "nack", arg: { reason: "x" } },
    { tag: 3, action: "extend", arg: { ms: 5 } },
  ]);
  const enqBody = encodePublishRecords([{ value: "a", headers: { h: "v" } }, { value: { b: 2 } }]);
  const cases: [string, Buffer, (b: Buffer) => unknown][] = [
    ["jobs", jobBody, (b) => decodeJobBatch(b, 1000)],
    ["settle", settleBody, (b) => decodeSettleItems(b, 1000)],
    ["enqueue", enqBody, (b) => decodeEnqueueRecords(b, 1000)],
  ];
  for (const [name, body, decode] of cases) {
    for (let cut = 0; cut < body.length; cut++) {
      assert.throws(() => decode(body.subarray(0, cut)), ProtocolError, `${name} truncated at ${cut} (seed ${seed})`);
    }
    for (let n = 0; n < 2000; n++) {
      const b = Buffer.from(body);
      const flips = 1 + Math.floor(rand() * 4);
      for (let k = 0; k < flips; k++) b[Math.floor(rand() * b.length)] = Math.floor(rand() * 256);
      try {
        decode(b);
      } catch (err) {
        assert.ok(err instanceof ProtocolError, `${name}: ${String(err)} (seed ${seed})`);
      }
    }
    // A count far beyond the bytes present is refused before anything is allocated.
    const huge = Buffer.from(body);
    huge.writeUInt32BE(0x7fffffff, 0);
    assert.throws(() => decode(huge), ProtocolError);
  }
});
