// SPDX-License-Identifier: Apache-2.0
/**
 * Idempotent enqueue requests, the contract shared by the network client and every engine:
 * the client numbers its QUEUE_ENQUEUE requests per queue under a producer id
 * (docs/protocol.md §7); a request re-sent after a lost connection (or a timeout) carries the
 * same `(producerId, sequence)`, and the engine answers one it already stored with its original
 * job ids instead of storing it again. Embedded callers never carry an identity.
 *
 * IDEM-1 (docs/ARCHITECTURE.md): what an engine remembers of a request is exactly as durable as
 * the request's jobs: an entry exists after any crash exactly when its jobs do, and a request
 * that stored nothing leaves no entry (its retry is evaluated afresh). The disk engine keeps
 * the table in src/store/disk/queues/producers.ts.
 */
import { ValidationError } from "../errors.js";
import type { EnqueueIdentity } from "../store/queue-store.js";

export type { EnqueueIdentity };

/**
 * Requests remembered per producer and queue; the client never has a request of sequence
 * `s + ENQUEUE_REQUESTS_KEPT` outstanding while `s` is unanswered (src/client/queue.ts imports
 * this), so every retry it sends falls inside the window. Kafka keeps 5 batches per producer.
 */
export const ENQUEUE_REQUESTS_KEPT = 5;
/** Producers remembered per queue. A retry from an evicted producer would be stored again:
 * eviction needs this many other producers to enqueue between a request and its retry. */
export const MAX_ENQUEUE_PRODUCERS = 10_000;

export function validateIdentity(id: unknown): EnqueueIdentity {
  const o = id as Partial<EnqueueIdentity> | null;
  if (
    o === null ||
    typeof o !== "object" ||
    !Number.isSafeInteger(o.producerId) ||
    (o.producerId as number) < 0 ||
    !Number.isSafeInteger(o.sequence) ||
    (o.sequence as number) < 0
  )
    throw new ValidationError("producerId and sequence must be non-negative safe integers");
  return { producerId: o.producerId as number, sequence: o.sequence as number };
}
