// SPDX-License-Identifier: Apache-2.0
/**
 * sluice's topic cases, for the embedded broker and for a client of `sluice serve`, in the
 * shapes of bench/shapes.ts (the peers' cases in bench/peers/* run the same shapes).
 */
import type { Broker, PublishValue } from "../src/types.js";
import { backlogFor, cpuPerMessage, Meter, nextEstimate, type BenchCase, type Limits } from "./harness.js";
import { pumpWindow, runAtFixedRate, stampedPayload, waitUntil } from "./peers/common.js";
import { summarizeLatencies } from "./report.js";
import {
  CONSUME_BATCH,
  CONSUME_PARTITIONS,
  CONSUME_WINDOW,
  fmt,
  ORDER,
  ORDER_TEXT,
  PUBLISH_WINDOW,
  RECORD_BYTES,
  SHAPE,
  stampedOrder,
} from "./shapes.js";

export interface SluiceTarget {
  system: string;
  durability: string;
  embedded: boolean;
  /** A broker for one run: the shared embedded broker, or a new client connection. */
  open(): Promise<Broker>;
  release(b: Broker): Promise<void>;
  /** The server process (for its CPU time). */
  pid?: number;
}

export const SLUICE_DURABILITY = "fdatasync before every ack and commit (group commit)";

let seq = 0;
const uniq = (what: string) => `bench-${what}-${process.pid}-${Date.now().toString(36)}-${seq++}`;

async function using<T>(t: SluiceTarget, fn: (b: Broker) => Promise<T>): Promise<T> {
  const b = await t.open();
  try {
    return await fn(b);
  } finally {
    await t.release(b);
  }
}

/** Appends `n` records of `value` with publishBatch (1000 x 8 in flight): untimed backlog fill. */
async function fill(b: Broker, topic: string, n: number, value: PublishValue): Promise<void> {
  const records = Array.from({ length: 1000 }, () => ({ value }));
  let issued = 0;
  await pumpWindow(8, () => {
    if (issued >= n) return null;
    const k = Math.min(1000, n - issued);
    issued += k;
    return b.publishBatch(topic, k === 1000 ? records : records.slice(0, k));
  });
}

/** publish() per message with PUBLISH_WINDOW calls awaiting their ack, 1 partition. */
export function publishPerMessage(t: SluiceTarget): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `publish() per message, ${SHAPE.publishPerMessage}, 1 partition${t.embedded ? "" : " (the client coalesces calls of one tick; linger 0)"}`,
    run: (limits) =>
      using(t, async (b) => {
        const topic = uniq("pubm");
        await b.createTopic(topic, { partitions: 1 });
        try {
          const m = new Meter(limits);
          await pumpWindow(PUBLISH_WINDOW, () => (m.done ? null : b.publish(topic, ORDER).then(() => void m.add(1))));
          return { values: { rate: m.rate() }, note: m.describe() };
        } finally {
          await b.deleteTopic(topic).catch(() => {});
        }
      }),
  };
}

/** publishBatch of `batch` records with `window` calls in flight, 1 partition, 256 B. */
export function publishBatches(t: SluiceTarget, batch: number, window: number): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `publishBatch x${fmt(batch)}, ${window} in flight (${fmt(batch * window)} records), ${RECORD_BYTES} B, 1 partition`,
    run: (limits) =>
      using(t, async (b) => {
        const topic = uniq("pubb");
        await b.createTopic(topic, { partitions: 1 });
        const records = Array.from({ length: batch }, () => ({ value: stampedPayload(RECORD_BYTES, 0) }));
        try {
          const m = new Meter(limits);
          await pumpWindow(window, () => (m.done ? null : b.publishBatch(topic, records).then((r) => void m.add(r.length))));
          return { values: { rate: m.rate() }, note: m.describe() };
        } finally {
          await b.deleteTopic(topic).catch(() => {});
        }
      }),
  };
}

/**
 * A backlog topic kept across repetitions (each repetition reads it with a new group from
 * earliest) and topped up when an earlier repetition showed it too short.
 */
class Backlog {
  topic = uniq("backlog");
  filled = 0;
  est: number;
  constructor(
    readonly value: PublishValue,
    guess: number,
  ) {
    this.est = guess;
  }
  async ensure(b: Broker, limits: Limits): Promise<void> {
    if (this.filled === 0) await b.createTopic(this.topic, { partitions: CONSUME_PARTITIONS });
    const need = backlogFor(limits, this.est);
    if (this.filled < need) {
      await fill(b, this.topic, need - this.filled, this.value);
      this.filled = need;
    }
  }
}

type CommitForm = "readme" | "awaited";

/**
 * The README consume loop from a pre-filled backlog, 4 partitions: `for await (const msg of
 * sub) { ...; msg.commit(); }` (or `await msg.commit()`), the last commit awaited before the
 * clock stops.
 */
export function consumePerMessage(t: SluiceTarget, form: CommitForm): BenchCase {
  const backlog = new Backlog(ORDER, form === "awaited" ? 5_000 : t.embedded ? 1_000_000 : 400_000);
  const window = t.embedded ? "pull, one fetch of <= 1 MiB per partition buffered (~15,000 records)" : `window ${fmt(CONSUME_WINDOW)} (client default)`;
  const commit = form === "readme" ? "msg.commit() per message, not awaited (README)" : "await msg.commit() per message";
  let system = t.system;
  if (form === "awaited") system += " (await commit)";
  return {
    system,
    durability: t.durability,
    shape: `for await (msg of sub): ${commit}; last commit awaited; ${window}; ${ORDER_TEXT}; ${CONSUME_PARTITIONS} partitions`,
    run: (limits, rep) =>
      using(t, async (b) => {
        await backlog.ensure(b, limits);
        const sub = b.subscribe<typeof ORDER>(backlog.topic, { group: `g${rep}-${form}-${seq++}`, start: "earliest" });
        const m = new Meter(limits);
        let seen = 0;
        let sum = 0;
        let exhausted = false;
        for await (const msg of sub) {
          sum += msg.value.total;
          seen++;
          exhausted = seen >= backlog.filled;
          if (m.add(1) || exhausted) {
            await msg.commit(); // durable through the last message before the clock stops
            m.finish();
            break;
          }
          if (form === "awaited") await msg.commit();
          else msg.commit();
        }
        if (sum === 0) throw new Error("no values read");
        backlog.est = nextEstimate(backlog.est, m, exhausted);
        return { values: { rate: m.rate() }, note: `${m.describe()}${exhausted ? `; backlog of ${fmt(backlog.filled)} exhausted` : ""}` };
      }),
  };
}

/**
 * Batch consumption from a backlog: `sub.batches({ maxMessages: 1000 })`, `batch.commit()`
 * of each batch with one commit in flight (awaited before the next one is sent).
 */
export function consumeBatches(t: SluiceTarget): BenchCase {
  const backlog = new Backlog(stampedPayload(RECORD_BYTES, 0), 1_000_000);
  // Embedded reads one fetch of maxBytes at a time: ~CONSUME_WINDOW records of 256 B, as the server's window.
  const maxBytes = CONSUME_WINDOW * RECORD_BYTES;
  const window = t.embedded ? `one fetch of <= ${fmt(maxBytes)} B buffered (~${fmt(CONSUME_WINDOW)} records)` : `window ${fmt(CONSUME_WINDOW)} (batches() raises the client's window to 2 batches)`;
  return {
    system: t.system,
    durability: t.durability,
    shape: `sub.batches({ maxMessages: ${CONSUME_BATCH} }), batch.commit() per batch, one in flight; ${window}; ${RECORD_BYTES} B; ${CONSUME_PARTITIONS} partitions`,
    run: (limits, rep) =>
      using(t, async (b) => {
        await backlog.ensure(b, limits);
        const sub = b.subscribe<Uint8Array>(backlog.topic, { group: `gb${rep}-${seq++}`, start: "earliest", ...(t.embedded ? { maxBytes } : {}) });
        const m = new Meter(limits);
        let seen = 0;
        let pending: Promise<void> | null = null;
        let exhausted = false;
        try {
          for await (const batch of sub.batches({ maxMessages: CONSUME_BATCH })) {
            seen += batch.messages.length;
            exhausted = seen >= backlog.filled;
            const last = m.add(batch.messages.length) || exhausted;
            if (pending) await pending;
            pending = batch.commit();
            if (last) {
              await pending; // durable through the last batch before the clock stops (and before the loop closes the subscription)
              break;
            }
          }
          m.finish();
        } finally {
          await sub.close();
        }
        backlog.est = nextEstimate(backlog.est, m, exhausted);
        return { values: { rate: m.rate() }, note: `${m.describe()}${exhausted ? `; backlog of ${fmt(backlog.filled)} exhausted` : ""}` };
      }),
  };
}

/**
 * End-to-end latency at a fixed rate with publish() per message, the consumer running the README
 * loop (msg.commit() per message, as the peers ack per message), and the server's CPU time per
 * message over the paced run.
 */
export function latency(t: SluiceTarget, rate: number): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `publish() per message at ${fmt(rate)}/s; consumer: for await (msg of sub) { msg.commit() } (README); ${ORDER_TEXT} + send time; 1 partition`,
    run: (limits) =>
      using(t, async (b) => {
        const topic = uniq("lat");
        await b.createTopic(topic, { partitions: 1 });
        try {
          return await paced(b, topic, rate, limits, t.pid);
        } finally {
          await b.deleteTopic(topic).catch(() => {});
        }
      }),
  };
}

async function paced(b: Broker, topic: string, rate: number, limits: Limits, pid: number | undefined) {
  const sub = b.subscribe<{ t: number; total: number }>(topic, { group: "lat", start: "latest" });
  const samples: number[] = [];
  let measureFrom = Number.POSITIVE_INFINITY; // warm-up messages are not sampled
  let warm = false;
  const consumer = (async () => {
    for await (const msg of sub) {
      const v = msg.value;
      if (v.t < 0) warm = true;
      else if (v.t >= measureFrom) samples.push(performance.now() - v.t);
      msg.commit();
    }
  })();
  // The member must be assigned and reading from the live end before the paced run.
  await waitUntil(async () => (await b.publish(topic, stampedOrder(-1)), warm), 10_000, "sluice latency consumer", 20);
  let pubErr: unknown;
  const send = () => {
    b.publish(topic, stampedOrder(performance.now())).catch((e) => (pubErr ??= e));
  };
  await runAtFixedRate(rate, limits.warmupMs, send); // warm-up at the same rate, not sampled
  measureFrom = performance.now();
  const { usPerMsg, result: pacer } = await cpuPerMessage(pid, async () => {
    const p = await runAtFixedRate(rate, limits.maxMs, send);
    await waitUntil(() => samples.length >= p.sent || pubErr !== undefined, 5000, "sluice latency deliveries", 5);
    return { messages: p.sent, result: p };
  });
  await sub.close();
  await consumer.catch(() => {});
  if (pubErr) throw pubErr;
  const s = summarizeLatencies(samples);
  return {
    values: { p50: s.p50Ms, p99: s.p99Ms, cpu: usPerMsg },
    note: `${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}`,
  };
}
