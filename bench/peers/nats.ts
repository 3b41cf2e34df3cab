// SPDX-License-Identifier: Apache-2.0
/**
 * NATS JetStream (file storage) as a peer for sluice's topic rows, in the shapes of
 * bench/shapes.ts. The client connects with `noAsyncTraces: true` (nats.js otherwise captures
 * a stack trace per request: 33.7k vs 52.5k publishes/s measured on this machine).
 *
 * Durability: by default JetStream acknowledges a publish once the message is written to the
 * stream's file (the page cache) and fsyncs only every `sync_interval` (2 minutes by default), so
 * a power loss can drop up to two minutes of acknowledged messages; consumer acks are not synced
 * either. The label says so. nats-server >= 2.10 accepts `jetstream { sync_interval: always }`;
 * the machine has 2.9.10, so JetStream is measured with a weaker setting than sluice (a ratio
 * above 1 is a stronger result than it looks).
 */
import { AckPolicy, connect, StorageType, type ConsumerMessages, type JsMsg, type NatsConnection } from "nats";
import { backlogFor, cpuPerMessage, findPid, Meter, nextEstimate, type BenchCase, type Limits } from "../harness.js";
import { summarizeLatencies } from "../report.js";
import { CONSUME_BATCH, CONSUME_WINDOW, fmt, ORDER_JSON, ORDER_TEXT, PUBLISH_WINDOW, RECORD_BYTES, SHAPE, stampedOrderJson } from "../shapes.js";
import { pumpWindow, runAtFixedRate, runId, stampedPayload, waitUntil } from "./common.js";

export const NATS_URL = "127.0.0.1:4222";
export const NATS_SYSTEM = "nats-jetstream";
export const NATS_DURABILITY = "file storage, default sync_interval (fsync every 2 min): ack before fsync; consumer acks not synced";

async function open(): Promise<NatsConnection> {
  return connect({ servers: NATS_URL, timeout: 2000, reconnect: false, maxReconnectAttempts: 0, noAsyncTraces: true });
}

async function withNats<T>(fn: (nc: NatsConnection) => Promise<T>): Promise<T> {
  const nc = await open();
  try {
    return await fn(nc);
  } finally {
    await nc.close().catch(() => {});
  }
}

const streamName = () => `sluice_bench_${runId().replace(/[^a-zA-Z0-9_]/g, "_")}`;

async function withStream<T>(nc: NatsConnection, fn: (subject: string) => Promise<T>): Promise<T> {
  const jsm = await nc.jetstreamManager();
  const stream = streamName();
  await jsm.streams.add({ name: stream, subjects: [`${stream}.data`], storage: StorageType.File });
  try {
    return await fn(`${stream}.data`);
  } finally {
    await jsm.streams.delete(stream).catch(() => {});
  }
}

/** js.publish with `window` PubAcks awaited at once. */
function publishCase(shape: string, window: number, payload: Buffer): BenchCase {
  return {
    system: NATS_SYSTEM,
    durability: NATS_DURABILITY,
    shape,
    run: (limits) =>
      withNats((nc) =>
        withStream(nc, async (subject) => {
          const js = nc.jetstream();
          const m = new Meter(limits);
          await pumpWindow(window, () => (m.done ? null : js.publish(subject, payload).then(() => void m.add(1))));
          return { values: { rate: m.rate() }, note: m.describe() };
        }),
      ),
  };
}

export function natsPublishPerMessage(): BenchCase {
  return publishCase(`js.publish per message, ${SHAPE.publishPerMessage}`, PUBLISH_WINDOW, ORDER_JSON);
}

/** No batch publish in nats.js 2.x / nats-server 2.9: the same records in flight, one call each. */
export function natsPublishBatches(batch: number, window: number): BenchCase {
  return publishCase(
    `js.publish per message (no batch publish in nats.js 2 / server 2.9), ${fmt(batch * window)} awaiting their PubAck at once (= ${fmt(batch)} x ${window}), ${RECORD_BYTES} B`,
    batch * window,
    stampedPayload(RECORD_BYTES, 0),
  );
}

/** A stream kept across repetitions (and its connection), read by a new durable consumer each time. */
class NatsBacklog {
  stream = streamName();
  filled = 0;
  constructor(
    readonly payload: Buffer,
    public est: number,
  ) {}
  async ensure(nc: NatsConnection, limits: Limits): Promise<void> {
    const need = backlogFor(limits, this.est);
    if (this.filled === 0) await (await nc.jetstreamManager()).streams.add({ name: this.stream, subjects: [`${this.stream}.data`], storage: StorageType.File });
    if (this.filled >= need) return;
    const js = nc.jetstream();
    let issued = this.filled;
    await pumpWindow(2000, () => (issued >= need ? null : (issued++, js.publish(`${this.stream}.data`, this.payload))));
    this.filled = need;
  }
}

/**
 * Consume from a backlog with a durable pull consumer (`consume({ max_messages: 2000 })`):
 * per message, AckPolicy.Explicit and `m.ack()` of every message (max_ack_pending 2000);
 * batch shape, AckPolicy.All and `ackAck()` of the last message of each 1000 (one in flight).
 * The last ack is confirmed (`ackAck()`) before the clock stops.
 */
export function natsConsume(perMessage: boolean): BenchCase {
  const backlog = new NatsBacklog(perMessage ? ORDER_JSON : stampedPayload(RECORD_BYTES, 0), perMessage ? 40_000 : 80_000);
  return {
    system: NATS_SYSTEM,
    durability: NATS_DURABILITY,
    shape: perMessage
      ? `pull consume max_messages ${fmt(CONSUME_WINDOW)}, AckPolicy.Explicit, m.ack() per message, max_ack_pending ${fmt(CONSUME_WINDOW)}; ${SHAPE.perMessageConsume}`
      : `pull consume max_messages ${fmt(CONSUME_WINDOW)}, AckPolicy.All, ackAck() of each ${fmt(CONSUME_BATCH)}th message (one in flight); ${SHAPE.batchConsume}`,
    run: (limits, rep) =>
      withNats(async (nc) => {
        await backlog.ensure(nc, limits);
        const jsm = await nc.jetstreamManager();
        const name = `c${rep}`;
        await jsm.consumers.add(backlog.stream, {
          durable_name: name,
          ack_policy: perMessage ? AckPolicy.Explicit : AckPolicy.All,
          max_ack_pending: perMessage ? CONSUME_WINDOW : CONSUME_WINDOW * 10,
        });
        let iter: ConsumerMessages | undefined;
        try {
          iter = await (await nc.jetstream().consumers.get(backlog.stream, name)).consume({ max_messages: CONSUME_WINDOW });
          const m = new Meter(limits);
          let seen = 0;
          let sum = 0;
          let pending: Promise<boolean> | null = null;
          let last: JsMsg | undefined;
          const stall = setTimeout(() => void iter?.stop(), limits.warmupMs + limits.maxMs * 3 + 10_000);
          for await (const msg of iter) {
            seen++;
            last = msg;
            const stop = m.add(1) || seen >= backlog.filled;
            if (perMessage) {
              sum += (JSON.parse(msg.string()) as { total: number }).total;
              if (stop) break;
              msg.ack();
            } else {
              sum++;
              if (seen % CONSUME_BATCH === 0 || stop) {
                if (pending) await pending;
                pending = msg.ackAck();
              }
              if (stop) break;
            }
          }
          clearTimeout(stall);
          if (last) await (perMessage ? last.ackAck() : pending);
          m.finish();
          const exhausted = seen >= backlog.filled;
          if (sum === 0) throw new Error("no values read");
          backlog.est = nextEstimate(backlog.est, m, exhausted);
          return { values: { rate: m.rate() }, note: `${m.describe()}${exhausted ? `; backlog of ${fmt(backlog.filled)} exhausted` : ""}` };
        } finally {
          await iter?.stop();
          await jsm.consumers.delete(backlog.stream, name).catch(() => {});
        }
      }),
    close: () => withNats(async (nc) => void (await (await nc.jetstreamManager()).streams.delete(backlog.stream).catch(() => {}))),
  };
}

/** The machine's nats-server (for its CPU time). */
export function natsPid(): number | undefined {
  return findPid("nats-server", (cmd) => cmd.includes("4222"));
}

/** Fixed-rate js.publish (acked) with a pull consumer acking each message; latency = delivery - send. */
export function natsLatency(rate: number): BenchCase {
  return {
    system: NATS_SYSTEM,
    durability: NATS_DURABILITY,
    shape: `js.publish per message at ${fmt(rate)}/s; consumer: pull consume, m.ack() per message (AckPolicy.Explicit); ${ORDER_TEXT} + send time`,
    run: (limits) =>
      withNats((nc) =>
        withStream(nc, async (subject) => {
          const stream = subject.slice(0, -".data".length);
          const js = nc.jetstream();
          await (await nc.jetstreamManager()).consumers.add(stream, { durable_name: "lat", ack_policy: AckPolicy.Explicit });
          const iter = await (await js.consumers.get(stream, "lat")).consume({ max_messages: 500 });
          const samples: number[] = [];
          let measureFrom = Number.POSITIVE_INFINITY;
          const reader = (async () => {
            for await (const msg of iter) {
              const v = JSON.parse(msg.string()) as { t: number };
              if (v.t >= measureFrom) samples.push(performance.now() - v.t);
              msg.ack();
            }
          })();
          let pubErr: unknown;
          const send = () => {
            js.publish(subject, stampedOrderJson(performance.now())).catch((e) => (pubErr ??= e));
          };
          await runAtFixedRate(rate, limits.warmupMs, send);
          measureFrom = performance.now();
          const { usPerMsg, result: pacer } = await cpuPerMessage(natsPid(), async () => {
            const p = await runAtFixedRate(rate, limits.maxMs, send);
            await waitUntil(() => samples.length >= p.sent || pubErr !== undefined, 5000, "jetstream latency deliveries", 5);
            return { messages: p.sent, result: p };
          });
          await iter.stop();
          await reader;
          if (pubErr) throw pubErr;
          const s = summarizeLatencies(samples);
          return { values: { p50: s.p50Ms, p99: s.p99Ms, cpu: usPerMsg }, note: `${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}` };
        }),
      ),
  };
}
