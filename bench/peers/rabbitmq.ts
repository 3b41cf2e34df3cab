/**
 * RabbitMQ as a peer: a durable classic queue, persistent messages (delivery mode 2) and
 * publisher confirms. RabbitMQ confirms a persistent message routed to a durable queue only
 * after it is written and fsynced to the message store (fsyncs are batched across publishers),
 * so a confirm means "on disk", the same promise as sluice's `durability: "always"` ack.
 */
import amqp from "amqplib";
import type { Channel, ChannelModel, ConfirmChannel, ConsumeMessage } from "amqplib";
import { METRIC, summarizeLatencies, unavailableRow, type BenchRow } from "../report.js";
import {
  DEFAULT_LATENCY_RATE,
  DEFAULT_RECORD_BYTES,
  durationOf,
  warmupOf,
  runAtFixedRate,
  runId,
  sentAtOf,
  stampedPayload,
  waitUntil,
  type PeerOptions,
} from "./common.js";

export const RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672";
export const RABBITMQ_SYSTEM = "rabbitmq";
export const RABBITMQ_DURABILITY = "durable classic queue, persistent msgs, publisher confirms (confirm after fsync)";

/** Unconfirmed publishes allowed in flight from the single producer. */
const CONFIRM_WINDOW = 1000;
const PREFETCH = 1000;
const ACK_EVERY = 100;
const MAX_BACKLOG = 300_000;

export type RabbitOptions = PeerOptions & { url?: string };

async function open(url: string): Promise<ChannelModel> {
  // noDelay: amqplib leaves Nagle on by default, which adds ~40 ms stalls to a request/confirm pattern.
  const conn = await amqp.connect(url, { timeout: 2000, noDelay: true });
  conn.on("error", () => {
    // Surfaced through the failing call; the listener prevents an unhandled 'error' event.
  });
  return conn;
}

/**
 * Publishes with a window of unconfirmed messages, respecting the channel's write buffer
 * ('drain'), and counts only confirmed messages.
 */
async function publishConfirmed(
  ch: ConfirmChannel,
  queue: string,
  untilStop: () => boolean,
  makePayload: () => Buffer,
  maxCount: number,
): Promise<number> {
  let inflight = 0;
  let confirmed = 0;
  let failure: unknown;
  let wake: (() => void) | undefined;
  const onConfirm = (err: unknown) => {
    inflight--;
    if (err) failure ??= err;
    else confirmed++;
    const w = wake;
    wake = undefined;
    w?.();
  };
  let sent = 0;
  while (!untilStop() && sent < maxCount) {
    if (failure) throw failure;
    if (inflight >= CONFIRM_WINDOW) {
      await new Promise<void>((r) => (wake = r));
      continue;
    }
    inflight++;
    sent++;
    const ok = ch.sendToQueue(queue, makePayload(), { persistent: true }, onConfirm);
    if (!ok) await new Promise<void>((r) => ch.once("drain", () => r()));
  }
  while (inflight > 0) await new Promise<void>((r) => (wake = r));
  if (failure) throw failure;
  return confirmed;
}

async function withQueue<T>(conn: ChannelModel, fn: (queue: string, ch: ConfirmChannel) => Promise<T>): Promise<T> {
  const ch = await conn.createConfirmChannel();
  const queue = `sluice-bench-${runId()}`;
  await ch.assertQueue(queue, { durable: true, arguments: { "x-queue-type": "classic" } });
  try {
    return await fn(queue, ch);
  } finally {
    await ch.deleteQueue(queue).catch(() => {});
    await ch.close().catch(() => {});
  }
}

export async function rabbitPublishThroughput(opts: RabbitOptions = {}): Promise<BenchRow> {
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let conn: ChannelModel | undefined;
  try {
    conn = await open(opts.url ?? RABBITMQ_URL);
    return await withQueue(conn, async (queue, ch) => {
      const payload = stampedPayload(bytes, 0);
      const durationMs = durationOf(opts);
      const warm = performance.now();
      await publishConfirmed(ch, queue, () => performance.now() - warm >= warmupOf(opts), () => payload, MAX_BACKLOG);
      const start = performance.now();
      const confirmed = await publishConfirmed(ch, queue, () => performance.now() - start >= durationMs, () => payload, MAX_BACKLOG * 4);
      const secs = (performance.now() - start) / 1000;
      return {
        name: METRIC.publish,
        system: RABBITMQ_SYSTEM,
        durability: RABBITMQ_DURABILITY,
        value: confirmed / secs,
        unit: "msg/s",
        note: `confirm window ${CONFIRM_WINDOW}`,
      };
    });
  } catch (err) {
    return unavailableRow(METRIC.publish, RABBITMQ_SYSTEM, RABBITMQ_DURABILITY, "msg/s", err);
  } finally {
    await conn?.close().catch(() => {});
  }
}

/** Drains a backlog with prefetch 1000 and cumulative acks (multiple=true) every 100 messages. */
export async function rabbitConsumeThroughput(opts: RabbitOptions = {}): Promise<BenchRow> {
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let conn: ChannelModel | undefined;
  try {
    conn = await open(opts.url ?? RABBITMQ_URL);
    return await withQueue(conn, async (queue, pubCh) => {
      const payload = stampedPayload(bytes, 0);
      const durationMs = durationOf(opts);
      const fillStart = performance.now();
      const backlog = await publishConfirmed(
        pubCh,
        queue,
        () => performance.now() - fillStart >= durationMs * 2,
        () => payload,
        opts.quick ? 50_000 : MAX_BACKLOG,
      );
      const ch: Channel = await conn!.createChannel();
      try {
        await ch.prefetch(PREFETCH);
        let consumed = 0;
        let counted = 0;
        let end = 0;
        const start = performance.now();
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => {
            end = performance.now();
            counted = consumed;
            resolve();
          }, durationMs + 2000);
          ch.consume(
            queue,
            (m: ConsumeMessage | null) => {
              if (!m || end !== 0) return;
              consumed++;
              const done = consumed >= backlog || performance.now() - start >= durationMs;
              if (consumed % ACK_EVERY === 0 || done) ch.ack(m, true);
              if (done) {
                end = performance.now();
                counted = consumed;
                clearTimeout(timer);
                resolve();
              }
            },
            { noAck: false },
          ).catch(reject);
        });
        const secs = (end - start) / 1000;
        return {
          name: METRIC.consume,
          system: RABBITMQ_SYSTEM,
          durability: RABBITMQ_DURABILITY,
          value: counted / secs,
          unit: "msg/s",
          note: `prefetch ${PREFETCH}, ack multiple every ${ACK_EVERY}, backlog ${backlog}`,
        };
      } finally {
        await ch.close().catch(() => {});
      }
    });
  } catch (err) {
    return unavailableRow(METRIC.consume, RABBITMQ_SYSTEM, RABBITMQ_DURABILITY, "msg/s", err);
  } finally {
    await conn?.close().catch(() => {});
  }
}

export async function rabbitLatency(opts: RabbitOptions = {}): Promise<BenchRow[]> {
  const rate = opts.latencyRatePerSec ?? DEFAULT_LATENCY_RATE;
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let conn: ChannelModel | undefined;
  try {
    conn = await open(opts.url ?? RABBITMQ_URL);
    return await withQueue(conn, async (queue, pubCh) => {
      const ch = await conn!.createChannel();
      try {
        await ch.prefetch(PREFETCH);
        const samples: number[] = [];
        await ch.consume(
          queue,
          (m) => {
            if (!m) return;
            samples.push(performance.now() - sentAtOf(m.content));
            ch.ack(m);
          },
          { noAck: false },
        );
        const template = stampedPayload(bytes, 0);
        let pubErr: unknown;
        const pacer = await runAtFixedRate(rate, durationOf(opts), () => {
          pubCh.sendToQueue(queue, stampedPayload(bytes, performance.now(), template), { persistent: true }, (err) => {
            if (err) pubErr ??= err;
          });
        });
        await waitUntil(() => samples.length >= pacer.sent || pubErr !== undefined, 5000, "rabbitmq latency deliveries", 5);
        if (pubErr) throw pubErr;
        const s = summarizeLatencies(samples);
        const note = `${rate}/s target, ${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}`;
        return [
          { name: METRIC.latencyP50, system: RABBITMQ_SYSTEM, durability: RABBITMQ_DURABILITY, value: s.p50Ms, unit: "ms", note },
          { name: METRIC.latencyP99, system: RABBITMQ_SYSTEM, durability: RABBITMQ_DURABILITY, value: s.p99Ms, unit: "ms", note },
        ];
      } finally {
        await ch.close().catch(() => {});
      }
    });
  } catch (err) {
    return [
      unavailableRow(METRIC.latencyP50, RABBITMQ_SYSTEM, RABBITMQ_DURABILITY, "ms", err),
      unavailableRow(METRIC.latencyP99, RABBITMQ_SYSTEM, RABBITMQ_DURABILITY, "ms", err),
    ];
  } finally {
    await conn?.close().catch(() => {});
  }
}

export async function runRabbitPeer(opts: RabbitOptions = {}): Promise<BenchRow[]> {
  opts.log?.(`rabbitmq (${RABBITMQ_DURABILITY})`);
  return [await rabbitPublishThroughput(opts), await rabbitConsumeThroughput(opts), ...(await rabbitLatency(opts))];
}
