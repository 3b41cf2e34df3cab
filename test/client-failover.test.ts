// SPDX-License-Identifier: Apache-2.0
/**
 * Client failover over several servers: two stateless nodes (two servers in front of one
 * embedded broker, the shared storage) and a client given both URLs. The node the client is on
 * dies abruptly mid-traffic; the client moves to the other and nothing acknowledged is lost:
 * publishes are stored exactly once, a group consumer skips nothing and its committed offsets
 * never go back, a queue worker completes every job. Also: the initial connect skips a dead
 * URL, every URL dead is a ConnectionClosedError naming them, mixed schemes are refused.
 *
 * An in-process server cannot be killed, so each node is a server behind a FaultProxy
 * (test/fixtures/fault-proxy.ts): the proxy is the node's network face. Closing it destroys
 * every socket at once (no goodbye frame, answers in flight lost, the server side sees its
 * connections drop) and refuses new connections, as a dead host does.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { openBroker } from "../src/broker/broker.js";
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { ConnectionClosedError, ValidationError } from "../src/errors.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import type { PublishReceipt } from "../src/types.js";
import { FaultProxy } from "./fixtures/fault-proxy.js";

type Broker = Awaited<ReturnType<typeof openBroker>>;

interface Node {
  url: string;
  kill(): Promise<void>;
}

async function startNode(broker: Broker): Promise<Node> {
  const srv: ServerHandle = await startServer({ broker, port: 0, httpPort: null });
  const proxy = await FaultProxy.start({ port: srv.port });
  return {
    url: proxy.url,
    async kill() {
      await proxy.close();
      await srv.close({ graceMs: 0 });
    },
  };
}

/** Two nodes on one broker; the client connects to both URLs. Everything closed afterwards. */
async function withCluster(fn: (c: { broker: Broker; nodes: Node[]; client: RemoteBrokerHandle }) => Promise<void>): Promise<void> {
  const tmp = tempDir("sluice-failover-");
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const nodes = [await startNode(broker), await startNode(broker)];
  const client = await connect({ url: nodes.map((n) => n.url), reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50 });
  try {
    await fn({ broker, nodes, client });
  } finally {
    await client.close();
    for (const n of nodes) await n.kill();
    await broker.close();
    tmp.cleanup();
  }
}

/** Kills the node the client is connected to and waits until it is on the other one. */
async function killCurrent(client: RemoteBrokerHandle, nodes: Node[]): Promise<Node> {
  const current = nodes.find((n) => n.url === client.transport.url);
  assert.ok(current, `the client is on one of the nodes (${client.transport.url})`);
  const other = nodes.find((n) => n !== current)!;
  const reconnects = client.transport.reconnects;
  await current.kill();
  await waitUntil(() => client.transport.reconnects > reconnects && client.transport.isReady, "the client reconnected");
  assert.equal(client.transport.url, other.url, "the client moved to the live node");
  return other;
}

/** A port with nothing listening (bound, then released). */
async function deadPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

test("failover: publishes in flight when the node dies are each stored exactly once", { timeout: 60_000 }, async () => {
  await withCluster(async ({ broker, nodes, client }) => {
    await broker.createTopic("events", { partitions: 4 });
    const acked = new Map<string, PublishReceipt>();
    const failed: string[] = [];
    let sent = 0;
    let stop = false;
    // 200 lanes, each with one publish outstanding at all times: 200 in flight at the kill.
    const lane = async (): Promise<void> => {
      while (!stop) {
        const value = `m${sent++}`;
        try {
          acked.set(value, await client.publish("events", value, { key: `k${sent % 16}` }));
        } catch (err) {
          failed.push(`${value}: ${(err as Error).message}`);
          return; // the test fails; publishing on would only spin
        }
      }
    };
    const lanes = Array.from({ length: 200 }, lane);
    let inFlightAtKill = 0;
    try {
      await waitUntil(() => acked.size >= 1000, () => `1000 acks before the kill (have ${acked.size})`);
      inFlightAtKill = sent - acked.size - failed.length;
      await killCurrent(client, nodes);
      const before = acked.size;
      await waitUntil(() => acked.size >= before + 2000, () => `2000 acks after the failover (have ${acked.size - before})`);
    } finally {
      stop = true;
    }
    await withTimeout(Promise.all(lanes), 30_000, "publishers finish");

    assert.ok(inFlightAtKill > 0, "publishes were in flight when the node died");
    assert.deepEqual(failed, [], "no publish failed");
    assert.equal(acked.size, sent, "every publish resolved");
    // Read the log back through the shared storage: each value once, where its receipt says.
    const where = new Map<string, string[]>();
    const partitionsUsed = new Set<number>();
    for (let p = 0; p < 4; p++) {
      for (let offset = 0; ; ) {
        const r = await broker.fetch("events", p, offset, { maxBytes: 1 << 20 });
        for (const m of r.records) {
          where.set(String(m.value), [...(where.get(String(m.value)) ?? []), `${p}:${m.offset}`]);
          partitionsUsed.add(p);
        }
        offset = r.nextOffset;
        if (offset >= r.highWatermark) break;
      }
    }
    assert.equal(partitionsUsed.size, 4, "keys spread over the 4 partitions");
    const duplicated = [...where].filter(([, at]) => at.length > 1);
    assert.deepEqual(duplicated, [], "no record stored twice");
    for (const [value, receipt] of acked) {
      assert.deepEqual(where.get(value), [`${receipt.partition}:${receipt.offset}`], `${value} stored once at its receipt's offset`);
    }
    assert.equal(where.size, sent, "nothing stored that was not published");
  });
});

test("failover: a group subscription keeps receiving, skips nothing, commits never go back", { timeout: 60_000 }, async () => {
  await withCluster(async ({ broker, nodes, client }) => {
    await broker.createTopic("stream", { partitions: 4 });
    const publish = (from: number, n: number) =>
      broker.publishBatch("stream", Array.from({ length: n }, (_, i) => ({ value: `v${from + i}`, key: `k${(from + i) % 16}` })));
    await publish(0, 400);
    // Committed offsets as the shared storage has them, sampled while messages are consumed.
    const last = new Map<number, number>();
    const backwards: string[] = [];
    let samples = 0;
    const sample = async (): Promise<void> => {
      samples++;
      for (const p of (await broker.groupLag("g", "stream")).partitions) {
        if (p.committedOffset === null) continue;
        const prev = last.get(p.partition) ?? -1;
        if (p.committedOffset < prev) backwards.push(`partition ${p.partition}: ${prev} -> ${p.committedOffset}`);
        last.set(p.partition, p.committedOffset);
      }
    };
    const sub = client.subscribe<string>("stream", { group: "g", start: "earliest" });
    const seen = new Set<string>();
    let received = 0;
    const consumed = (async () => {
      for await (const msg of sub) {
        seen.add(`${msg.partition}:${msg.offset}`);
        // A commit may fail across the failover (its member is gone): the message comes again.
        msg.commit().catch(() => {});
        if (++received % 10 === 0) await sample();
      }
    })();
    try {
      await waitUntil(() => seen.size >= 100, () => `100 messages before the kill (have ${seen.size})`);
      await killCurrent(client, nodes);
      await publish(400, 400);
      const expected: string[] = [];
      for (const d of (await broker.describeTopic("stream")).partitions) {
        for (let o = 0; o < d.highWatermark; o++) expected.push(`${d.partition}:${o}`);
      }
      assert.equal(expected.length, 800);
      await waitUntil(() => expected.every((k) => seen.has(k)), () => `every offset seen (missing ${expected.filter((k) => !seen.has(k)).slice(0, 10).join(", ")})`, 30_000);
      await waitUntil(async () => (await broker.groupLag("g", "stream")).totalRecords === 0, "the group committed everything", 30_000);
      await sample();
    } finally {
      await sub.close();
      await consumed;
    }
    assert.ok(samples >= 80, `committed offsets sampled ${samples} times`);
    assert.equal([...last.values()].reduce((a, b) => a + b, 0), 800, "the last sample has every partition committed to its end");
    assert.deepEqual(backwards, [], "committed offsets never went backwards");
  });
});

test("failover: a queue worker keeps working; every job completed, none lost", { timeout: 60_000 }, async () => {
  await withCluster(async ({ broker, nodes, client }) => {
    const q = client.queue<number>("jobs");
    await q.enqueueBatch(Array.from({ length: 200 }, (_, i) => ({ data: i })));
    const handled = new Set<number>();
    const ac = new AbortController();
    const processing = q.process(
      async (job) => {
        // Some work, so that jobs are leased and running when the node dies.
        await new Promise((r) => setTimeout(r, 1));
        handled.add(job.data);
      },
      { concurrency: 8, signal: ac.signal },
    );
    try {
      await waitUntil(() => handled.size >= 50, () => `50 jobs before the kill (have ${handled.size})`);
      await killCurrent(client, nodes);
      // Enqueues go through the node the client moved to.
      await q.enqueueBatch(Array.from({ length: 200 }, (_, i) => ({ data: 200 + i })));
      await waitUntil(() => handled.size === 400, () => `every job handled (have ${handled.size})`, 30_000);
      // Completed, not just handled: nothing waits, runs or was dead-lettered.
      await waitUntil(
        async () => {
          const s = await broker.queue("jobs").stats();
          return s.waiting === 0 && s.delayed === 0 && s.inFlight === 0 && s.deadLettered === 0;
        },
        "the queue is empty",
        30_000,
      );
    } finally {
      ac.abort();
      await processing;
    }
  });
});

test("failover: the initial connect skips a dead URL; every URL dead is a ConnectionClosedError naming them", { timeout: 60_000 }, async () => {
  const tmp = tempDir("sluice-failover-");
  const broker = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  const nodes = [await startNode(broker), await startNode(broker)];
  const dead = [`sluice://127.0.0.1:${await deadPort()}`, `sluice://127.0.0.1:${await deadPort()}`];
  try {
    // The dead URL first, in the order given: the client moves on to the live one.
    const c = await connect({ url: [dead[0], nodes[0].url], randomizeUrls: false });
    assert.equal(c.transport.url, nodes[0].url);
    assert.deepEqual(await c.listTopics(), []);
    await c.close();

    // Nothing listens anywhere: the first connect fails after one pass, naming every URL.
    const started = Date.now();
    await assert.rejects(connect({ url: dead, reconnectTimeoutMs: 300 }), (err: unknown) => {
      assert.ok(err instanceof ConnectionClosedError, String(err));
      assert.ok(err.retriable, "retriable");
      for (const u of dead) assert.ok(err.message.includes(u), `${err.message} names ${u}`);
      return true;
    });
    assert.ok(Date.now() - started < 5000, "one pass, no retry");

    // Connected, then every node dies: pending requests fail once reconnectTimeoutMs passed.
    const reconnectTimeoutMs = 500;
    const client = await connect({ url: nodes.map((n) => n.url), reconnectMinDelayMs: 10, reconnectMaxDelayMs: 50, reconnectTimeoutMs });
    try {
      for (const n of nodes) await n.kill();
      const lost = Date.now();
      await assert.rejects(client.listTopics(), (err: unknown) => {
        assert.ok(err instanceof ConnectionClosedError, String(err));
        for (const n of nodes) assert.ok(err.message.includes(n.url), `${err.message} names ${n.url}`);
        return true;
      });
      const took = Date.now() - lost;
      // The timeout, plus at most one attempt and one jittered wait before it is noticed.
      assert.ok(took >= reconnectTimeoutMs - 50 && took < reconnectTimeoutMs + 1000, `failed after ${took} ms`);
    } finally {
      await client.close();
    }
  } finally {
    for (const n of nodes) await n.kill();
    await broker.close();
    tmp.cleanup();
  }
});

test("failover: URL lists are validated up front; mixed schemes are refused", async () => {
  await assert.rejects(connect({ url: ["sluice://127.0.0.1:7070", "sluice+tls://127.0.0.1:7071"] }), ValidationError);
  await assert.rejects(connect({ url: ["sluice://127.0.0.1:7070", "http://127.0.0.1:7071"] }), ValidationError);
  await assert.rejects(connect({ url: [] }), ValidationError);
});
