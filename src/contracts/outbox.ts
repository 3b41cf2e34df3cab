// SPDX-License-Identifier: Apache-2.0
/**
 * The transactional outbox: the application inserts the messages it means to publish into
 * `message_outbox` in the same transaction as its business change; a relay (outbox-relay.ts)
 * publishes unpublished rows, keyed by aggregate id, and marks them published.
 *
 * This file holds the store interface (the relay's view of the database) and the row types;
 * stores/sqlite-outbox.ts and stores/pg-outbox.ts implement it.
 *
 * Exactly-once publication of each row (OUTBOX-1 in docs/ARCHITECTURE.md) rests on the
 * idempotent producer: the relay's producer id, epoch and next sequence per partition live in
 * the database (`outbox_relay`), and a batch is *planned* durably (`outbox_relay_pending`: its
 * partition, base sequence and row ids) before it is published. A relay killed after the publish
 * and before marking the rows published re-publishes exactly that batch, which the broker
 * recognises as a duplicate, so no row is ever published twice and none is lost.
 */
import { randomUUID } from "node:crypto";
import { ValidationError } from "../errors.js";

/** What an application writes (inside its own transaction). */
export interface OutboxMessage {
  aggregateType: string;
  aggregateId: string;
  /** The message type (envelope `sluice-type`). */
  type: string;
  /** JSON-serialisable payload: the record's value. */
  payload: unknown;
  /** Default: a random UUID; it becomes the envelope's message id. */
  messageId?: string;
}

/** A stored row, as the relay reads it. */
export interface OutboxRow {
  position: number;
  messageId: string;
  aggregateType: string;
  aggregateId: string;
  type: string;
  /** The payload as stored (JSON text). */
  payloadJson: string;
  createdAt: number;
}

/** One planned publish: rows of one topic partition with the idempotent producer's base sequence. */
export interface PlannedBatch {
  topic: string;
  partition: number;
  baseSequence: number;
  rows: OutboxRow[];
}

export interface RelayIdentity {
  producerId: number;
  producerEpoch: number;
}

export interface OutboxStore {
  ensureSchema(): Promise<void>;
  /** The relay's persisted producer identity, or null before its first start. */
  loadIdentity(relay: string): Promise<RelayIdentity | null>;
  /** Persists the identity (only if none is stored yet); returns the stored one. */
  saveIdentity(relay: string, id: RelayIdentity): Promise<RelayIdentity>;
  /**
   * In one transaction: the relay's pending batches if any (a previous round that did not
   * complete), else up to `limit` unpublished rows planned into batches by `place` (topic and
   * partition per row), with their base sequences taken from (and advanced in) the relay state.
   */
  plan(relay: string, limit: number, place: (row: OutboxRow) => { topic: string; partition: number }): Promise<PlannedBatch[]>;
  /** In one transaction: marks the batches' rows published and forgets them as pending. */
  complete(relay: string, batches: PlannedBatch[], publishedAt: number): Promise<void>;
  /** Rows not yet published, and the age of the oldest (ms), for monitoring. */
  backlog(now: number): Promise<{ rows: number; oldestAgeMs: number }>;
  /**
   * Resolves when rows may have been added (PostgreSQL: a NOTIFY; SQLite: the poll interval),
   * after `maxWaitMs` at the latest, or when `signal` aborts.
   */
  waitForRows(maxWaitMs: number, signal: AbortSignal): Promise<void>;
  close(): Promise<void>;
}

export const MAX_OUTBOX_TEXT = 256;

/** Checks and completes an application's message before it is inserted. */
export function outboxRow(m: OutboxMessage): { messageId: string; aggregateType: string; aggregateId: string; type: string; payloadJson: string } {
  const text = (v: unknown, what: string) => {
    if (typeof v !== "string" || v.length === 0 || v.length > MAX_OUTBOX_TEXT) throw new ValidationError(`outbox ${what} must be a string of 1-${MAX_OUTBOX_TEXT} characters`);
    return v;
  };
  const payloadJson = JSON.stringify(m.payload);
  if (payloadJson === undefined) throw new ValidationError("outbox payload must be JSON-serialisable");
  return { messageId: text(m.messageId ?? randomUUID(), "messageId"), aggregateType: text(m.aggregateType, "aggregateType"), aggregateId: text(m.aggregateId, "aggregateId"), type: text(m.type, "type"), payloadJson };
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
export function sleepUnlessAborted(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Groups rows (in position order) into one batch per topic partition, keeping their order. */
export function groupRows(rows: OutboxRow[], place: (row: OutboxRow) => { topic: string; partition: number }, nextSeq: (topic: string, partition: number) => number): PlannedBatch[] {
  const byPart = new Map<string, PlannedBatch>();
  for (const row of rows) {
    const { topic, partition } = place(row);
    const id = `${partition}@${topic}`;
    let b = byPart.get(id);
    if (!b) byPart.set(id, (b = { topic, partition, baseSequence: nextSeq(topic, partition), rows: [] }));
    b.rows.push(row);
  }
  return [...byPart.values()];
}
