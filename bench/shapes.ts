// SPDX-License-Identifier: Apache-2.0
/**
 * The client shapes every system runs, in one place, so no system gets a bigger window than
 * another: each constant is used by sluice's case and by every peer's case of the same row.
 */

/** publish() per message: calls awaiting their ack at once (per-message table). */
export const PUBLISH_WINDOW = 1000;
/**
 * Records delivered and not yet committed/acked that a consumer may hold: the network client's
 * default subscription window (`subscriptionWindowMessages`, 2000). Peers: Redis two XREADGROUP
 * COUNT 1000 in flight, JetStream pull `max_messages` 2000 (and `max_ack_pending` 2000 where
 * acks are per message), RabbitMQ prefetch 2000.
 */
export const CONSUME_WINDOW = 2000;
/** Messages per batch in the batch-shape consume row (two batches fit in the window). */
export const CONSUME_BATCH = 1000;
/** Batch-shape publish rows: [records per call, calls in flight]. 100 x 8 was Redis' best pipeline; 4000 x 8 sluice's. */
export const PUBLISH_BATCH_SHAPES: readonly (readonly [number, number])[] = [
  [100, 8],
  [4000, 8],
];
/** Rate of the latency / CPU row. */
export const LATENCY_RATE = 2000;
/** Binary payload of the batch-shape rows. */
export const RECORD_BYTES = 256;
/** Partitions of the consume rows' topics (the README's example topic has 4). */
export const CONSUME_PARTITIONS = 4;

/** The small JSON value of the per-message rows (the README's order, as users publish it). */
export const ORDER = { id: "o-000001", customer: "customer-7", total: 42 } as const;
export const ORDER_JSON = Buffer.from(JSON.stringify(ORDER));
export const ORDER_TEXT = `JSON ${ORDER_JSON.length} B`;

/** The latency rows' value: the order with its send time (performance.now(), ms). */
export function stampedOrder(t: number): { t: number; id: string; customer: string; total: number } {
  return { t, ...ORDER };
}
export function stampedOrderJson(t: number): Buffer {
  return Buffer.from(JSON.stringify(stampedOrder(t)));
}

export const fmt = (n: number): string => n.toLocaleString("en-US");

/** Ack/commit wording used in shapes. */
export const SHAPE = {
  perMessageConsume: `window ${fmt(CONSUME_WINDOW)} in flight, ack/commit every message (not awaited; last one awaited), ${ORDER_TEXT}, JSON-decoded`,
  batchConsume: `window ${fmt(CONSUME_WINDOW)}, batches of ${fmt(CONSUME_BATCH)}, one cumulative commit/ack per batch (one in flight), ${RECORD_BYTES} B`,
  publishPerMessage: `${fmt(PUBLISH_WINDOW)} single-message calls awaiting their ack at once, ${ORDER_TEXT}`,
} as const;

/** Job rows: handlers (or jobs in flight) per system, enqueue batch, bound on waiting + active. */
export const JOB_CONCURRENCY = 50;
export const JOB_ENQUEUE_BATCH = 100;
export const JOB_BACKLOG = 5000;
/**
 * Enqueue calls in flight at once, for every system: one awaited call at a time bounded the
 * sluice rows by the enqueue round trip (about 100 jobs per 3-4 ms through the server) rather
 * than by the workers the rows measure.
 */
export const JOB_ENQUEUE_IN_FLIGHT = 4;
/** The producer of every jobs row, as printed in shapes. */
export const JOB_PRODUCER = `producer: ${JOB_ENQUEUE_IN_FLIGHT} enqueue calls of ${JOB_ENQUEUE_BATCH} jobs in flight while < ${JOB_BACKLOG.toLocaleString("en-US")} waiting or active`;
/** The README's job. */
export const JOB_DATA = { to: "ada@example.com", template: "welcome" } as const;
/** Warm-up of every jobs row (at least): a BullMQ Worker took ~0.5 s to reach steady state here. */
export const JOB_WARMUP_MS = 1000;
