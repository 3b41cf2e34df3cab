// SPDX-License-Identifier: Apache-2.0
/**
 * RabbitMQ as a peer for sluice's topic rows, in the shapes of bench/shapes.ts: a durable
 * classic queue, persistent messages (delivery mode 2) and publisher confirms. RabbitMQ confirms
 * a persistent message routed to a durable queue only after it is written and fsynced to the
 * message store (fsyncs batched across publishers), the same promise as sluice's ack. Consumer
 * acks are not confirmed by AMQP and not fsynced one by one.
 */
import amqp from "amqplib";
import type { Channel, ChannelModel, ConfirmChannel, ConsumeMessage } from "amqplib";
import { backlogFor, cpuPerMessage, findPid, Meter, nextEstimate, type BenchCase, type Limits } from "../harness.js";
import { summarizeLatencies } from "../report.js";
import { CONSUME_BATCH, CONSUME_WINDOW, fmt, ORDER_JSON, ORDER_TEXT, PUBLISH_WINDOW, RECORD_BYTES, SHAPE, stampedOrderJson } from "../shapes.js";
import { runAtFixedRate, runId, stampedPayload, waitUntil } from "./common.js";

export const RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672";
export const RABBITMQ_SYSTEM = "rabbitmq";
export const RABBITMQ_DURABILITY = "durable classic queue, persistent messages, publisher confirms (confirm after fsync); acks not synced";

async function open(): Promise<ChannelModel> {
  // noDelay: amqplib leaves Nagle on by default, which adds ~40 ms stalls to a request/confirm pattern.
  const conn = await amqp.connect(RABBITMQ_URL, { timeout: 2000, noDelay: true });
  conn.on("error", () => {
    // Surfaced through the failing call; the listener prevents an unhandled 'error' event.
  });
  return conn;
}

async function withConn<T>(fn: (conn: ChannelModel) => Promise<T>): Promise<T> {
  const conn = await open();
  try {
    return await fn(conn);
  } finally {
    await conn.close().catch(() => {});
  }
}

const queueArgs = { durable: true, arguments: { "x-queue-type": "classic" } };

/**
 * Publishes while `more()` says so with up to `window` unconfirmed, respecting the channel's
 * write buffer ('drain'); calls `onConfirmed()` per confirmed message.
 */
async function publishConfirmed(ch: ConfirmChannel, queue: string, window: number, more: () => boolean, payload: () => Buffer, onConfirmed: () => void): Promise<void> {
  let inflight = 0;
  let failure: unknown;
  let wake: (() => void) | undefined;
  const onConfirm = (err: unknown) => {
    inflight--;
    if (err) failure ??= err;
    else onConfirmed();
    const w = wake;
    wake = undefined;
    w?.();
  };
  while (more()) {
    if (failure) throw failure;
    if (inflight >= window) {
      await new Promise<void>((r) => (wake = r));
      continue;
    }
    inflight++;
    if (!ch.sendToQueue(queue, payload(), { persistent: true }, onConfirm)) await new Promise<void>((r) => ch.once("drain", () => r()));
  }
  while (inflight > 0) await new Promise<void>((r) => (wake = r));
  if (failure) throw failure;
}

function publishCase(shape: string, window: number, payload: Buffer): BenchCase {
  return {
    system: RABBITMQ_SYSTEM,
    durability: RABBITMQ_DURABILITY,
    shape,
    run: (limits) =>
      withConn(async (conn) => {
        const ch = await conn.createConfirmChannel();
        const queue = `sluice-bench-${runId()}`;
        await ch.assertQueue(queue, queueArgs);
        try {
          const m = new Meter(limits);
          await publishConfirmed(ch, queue, window, () => !m.done, () => payload, () => void m.add(1));
          return { values: { rate: m.rate() }, note: m.describe() };
        } finally {
          await ch.deleteQueue(queue).catch(() => {});
        }
      }),
  };
}

export function rabbitPublishPerMessage(): BenchCase {
  return publishCase(`sendToQueue + confirm per message, ${SHAPE.publishPerMessage}`, PUBLISH_WINDOW, ORDER_JSON);
}

/** AMQP has no batch publish: the same records in flight, one sendToQueue each. */
export function rabbitPublishBatches(batch: number, window: number): BenchCase {
  return publishCase(
    `sendToQueue per message (AMQP has no batch publish), confirm window ${fmt(batch * window)} (= ${fmt(batch)} x ${window}), ${RECORD_BYTES} B`,
    batch * window,
    stampedPayload(RECORD_BYTES, 0),
  );
}

/**
 * Consume from a backlog with prefetch 2000: per message `ch.ack(m)` of every message, or (batch
 * shape) `ch.ack(m, true)` of each 1000th. A queue is consumed destructively, so it is topped
 * up before each repetition. AMQP acks have no reply: a `checkQueue` round trip on the same
 * channel after the last ack (the channel handles frames in order) stops the clock.
 */
export function rabbitConsume(perMessage: boolean): BenchCase {
  const queue = `sluice-bench-backlog-${runId()}`;
  const payload = perMessage ? ORDER_JSON : stampedPayload(RECORD_BYTES, 0);
  let est = perMessage ? 30_000 : 40_000; // msgs/s guessed for the first repetition; then measured
  return {
    system: RABBITMQ_SYSTEM,
    durability: RABBITMQ_DURABILITY,
    shape: perMessage
      ? `prefetch ${fmt(CONSUME_WINDOW)}, ch.ack(msg) per message; ${SHAPE.perMessageConsume}`
      : `prefetch ${fmt(CONSUME_WINDOW)}, ch.ack(msg, multiple) of each ${fmt(CONSUME_BATCH)}th message; ${SHAPE.batchConsume} (acks unconfirmed)`,
    run: (limits) =>
      withConn(async (conn) => {
        const pubCh = await conn.createConfirmChannel();
        const depth = (await pubCh.assertQueue(queue, queueArgs)).messageCount;
        const need = backlogFor(limits, est);
        let sent = depth;
        await publishConfirmed(pubCh, queue, 2000, () => sent++ < need, () => payload, () => {});
        const backlog = Math.max(depth, need);
        const ch: Channel = await conn.createChannel();
        try {
          await ch.prefetch(CONSUME_WINDOW);
          const m = new Meter(limits);
          let seen = 0;
          let sum = 0;
          await new Promise<void>((resolve, reject) => {
            const stall = setTimeout(() => resolve(), limits.warmupMs + limits.maxMs * 3 + 10_000);
            ch.consume(
              queue,
              (msg: ConsumeMessage | null) => {
                if (!msg || m.done) return;
                seen++;
                const stop = m.add(1) || seen >= backlog;
                if (perMessage) {
                  sum += (JSON.parse(msg.content.toString()) as { total: number }).total;
                  ch.ack(msg);
                } else {
                  sum++;
                  if (seen % CONSUME_BATCH === 0 || stop) ch.ack(msg, true);
                }
                if (stop) {
                  clearTimeout(stall);
                  // Barrier: the reply comes after the channel handled every ack before it.
                  ch.checkQueue(queue).then(() => resolve(), reject);
                }
              },
              { noAck: false },
            ).catch(reject);
          });
          m.finish();
          const exhausted = seen >= backlog;
          if (sum === 0) throw new Error("no values read");
          est = nextEstimate(est, m, exhausted);
          return { values: { rate: m.rate() }, note: `${m.describe()}${exhausted ? `; backlog of ${fmt(backlog)} exhausted` : ""}` };
        } finally {
          await ch.close().catch(() => {});
        }
      }),
    close: () => withConn(async (conn) => void (await (await conn.createChannel()).deleteQueue(queue).catch(() => {}))),
  };
}

/** The RabbitMQ node (Erlang VM) for its CPU time. */
export function rabbitPid(): number | undefined {
  return findPid("beam.smp", (cmd) => cmd.includes("rabbit"));
}

export function rabbitLatency(rate: number): BenchCase {
  return {
    system: RABBITMQ_SYSTEM,
    durability: RABBITMQ_DURABILITY,
    shape: `sendToQueue + confirm per message at ${fmt(rate)}/s; consumer: prefetch ${fmt(CONSUME_WINDOW)}, ch.ack(msg) per message; ${ORDER_TEXT} + send time`,
    run: (limits) =>
      withConn(async (conn) => {
        const pubCh = await conn.createConfirmChannel();
        const queue = `sluice-bench-lat-${runId()}`;
        await pubCh.assertQueue(queue, queueArgs);
        const ch = await conn.createChannel();
        try {
          await ch.prefetch(CONSUME_WINDOW);
          const samples: number[] = [];
          let measureFrom = Number.POSITIVE_INFINITY;
          await ch.consume(
            queue,
            (msg) => {
              if (!msg) return;
              const v = JSON.parse(msg.content.toString()) as { t: number };
              if (v.t >= measureFrom) samples.push(performance.now() - v.t);
              ch.ack(msg);
            },
            { noAck: false },
          );
          let pubErr: unknown;
          const send = () => {
            pubCh.sendToQueue(queue, stampedOrderJson(performance.now()), { persistent: true }, (err) => {
              if (err) pubErr ??= err;
            });
          };
          await runAtFixedRate(rate, limits.warmupMs, send);
          measureFrom = performance.now();
          const { usPerMsg, result: pacer } = await cpuPerMessage(rabbitPid(), async () => {
            const p = await runAtFixedRate(rate, limits.maxMs, send);
            await waitUntil(() => samples.length >= p.sent || pubErr !== undefined, 5000, "rabbitmq latency deliveries", 5);
            return { messages: p.sent, result: p };
          });
          if (pubErr) throw pubErr;
          const s = summarizeLatencies(samples);
          return { values: { p50: s.p50Ms, p99: s.p99Ms, cpu: usPerMsg }, note: `${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}` };
        } finally {
          await ch.close().catch(() => {});
          await pubCh.deleteQueue(queue).catch(() => {});
        }
      }),
  };
}
