// SPDX-License-Identifier: Apache-2.0
/**
 * Idempotent-producer state of one partition, as Kafka's ProducerStateManager: per producer
 * id its epoch, last sequence and its last few batches (first sequence, count, base offset),
 * so a retried batch is recognised and answered with its original offsets instead of being
 * stored twice.
 *
 * Two layers (invariant PROD-1: state written beside the log never claims more than the log
 * holds):
 *  - `published`: the state of exactly the batches below the high watermark. Only this layer
 *    is ever written to `producers.json`, and a snapshot names the offset it is complete up
 *    to, so after any crash it describes batches the log really holds.
 *  - `inflight`: copy-on-write entries of producers with batches assigned offsets but not yet
 *    published (queued, being written or being synced). A retry of such a batch waits for the
 *    original's outcome: its offsets if it is stored, its error if it is not. When an append
 *    fails, every unpublished batch fails with it (the log rolls back to the high watermark),
 *    so the whole layer is dropped at once.
 *
 * PROD-2: the idempotent client never has more than PRODUCER_BATCHES_KEPT batches of one
 * partition in flight, so the batch a retry names is always among the ones remembered.
 */
import { OutOfOrderSequenceError, ProducerFencedError, ValidationError } from "../errors.js";
import type { ProducerInfo } from "./record-batch.js";

/**
 * Batches remembered per producer and partition for duplicate detection of retries (Kafka
 * keeps 5). The idempotent client never has more than this many batches of one partition in
 * flight (src/client/partition-window.ts imports it), so a retry of any stored batch is recognised and
 * answered with its original offsets (invariant PROD-2).
 */
export const PRODUCER_BATCHES_KEPT = 5;
/** Bound on producers remembered per partition; the least recently active are forgotten first. */
export const MAX_PRODUCERS = 10_000;
/** Producers silent this long are left out of snapshots (as Kafka's producer id expiration). */
export const PRODUCER_EXPIRY_MS = 7 * 86_400_000;
/** Largest epoch (16-bit signed field of the batch header, as Kafka). */
export const MAX_PRODUCER_EPOCH = 32767;

export interface ProducerBatch {
  firstSeq: number;
  count: number;
  baseOffset: number;
  /** While the batch is not yet published: settles with the original append's outcome. */
  outcome?: Promise<unknown>;
}

export interface ProducerEntry {
  epoch: number;
  lastSeq: number;
  lastTimestamp: number;
  /** The last PRODUCER_BATCHES_KEPT batches, oldest first. */
  batches: ProducerBatch[];
}

/** `producers.json`: the published state, complete for every batch below `offset`. */
export interface ProducerSnapshot {
  offset: number;
  producers: [number, ProducerEntry][];
}

/** What a batch of one producer is, against the state: new (store it) or a retry of `batch`. */
export type SequenceCheck = { duplicate: false } | { duplicate: true; batch: ProducerBatch };

const NEW: SequenceCheck = { duplicate: false };

function copyEntry(e: ProducerEntry): ProducerEntry {
  return { epoch: e.epoch, lastSeq: e.lastSeq, lastTimestamp: e.lastTimestamp, batches: e.batches.slice() };
}

/** Applies one batch to an entry map (shared by both layers and by recovery's replay). */
function applyBatch(map: Map<number, ProducerEntry>, pid: number, epoch: number, seq: number, count: number, baseOffset: number, ts: number, outcome?: Promise<unknown>): void {
  let st = map.get(pid);
  if (!st || epoch !== st.epoch) st = { epoch, lastSeq: -1, lastTimestamp: ts, batches: [] };
  map.delete(pid); // re-insert: Map order doubles as LRU order
  map.set(pid, st);
  st.lastSeq = seq + count - 1;
  st.lastTimestamp = Math.max(st.lastTimestamp, ts);
  const b: ProducerBatch = { firstSeq: seq, count, baseOffset };
  if (outcome !== undefined) b.outcome = outcome;
  st.batches.push(b);
  if (st.batches.length > PRODUCER_BATCHES_KEPT) st.batches.shift();
  if (map.size > MAX_PRODUCERS) map.delete(map.keys().next().value as number);
}

export class ProducerStateManager {
  private published = new Map<number, ProducerEntry>();
  private inflight = new Map<number, ProducerEntry>();
  /** Per producer in `inflight`: end offset of its newest unpublished batch. */
  private inflightEnd = new Map<number, number>();

  /** Validates producer fields; throws before anything is encoded or stored. */
  static validate(p: ProducerInfo, count: number): void {
    if (!Number.isSafeInteger(p.producerId) || p.producerId < 0 || !Number.isInteger(p.producerEpoch) || p.producerEpoch < 0 || p.producerEpoch > MAX_PRODUCER_EPOCH)
      throw new ValidationError("invalid producer id or epoch");
    if (!Number.isInteger(p.baseSequence) || p.baseSequence < 0 || p.baseSequence + count > 2 ** 31 - 1) throw new ValidationError("invalid base sequence");
  }

  /**
   * Checks a batch against the state (unpublished batches included): a retry of a remembered
   * batch, or the next batch in sequence. Anything else is refused (fenced epoch, gap, a
   * retry whose record count differs), and nothing is stored.
   */
  check(p: ProducerInfo, count: number): SequenceCheck {
    ProducerStateManager.validate(p, count);
    const st = this.inflight.get(p.producerId) ?? this.published.get(p.producerId);
    if (!st) return NEW;
    if (p.producerEpoch < st.epoch) throw new ProducerFencedError(`producer ${p.producerId} epoch ${p.producerEpoch} is fenced by epoch ${st.epoch}`);
    if (p.producerEpoch > st.epoch) {
      if (p.baseSequence !== 0) throw new OutOfOrderSequenceError(`new epoch ${p.producerEpoch} of producer ${p.producerId} must start at sequence 0`);
      return NEW;
    }
    for (const b of st.batches) {
      if (b.firstSeq === p.baseSequence) {
        if (b.count !== count) throw new OutOfOrderSequenceError(`retry of sequence ${p.baseSequence} has ${count} records, original had ${b.count}`);
        return { duplicate: true, batch: b };
      }
    }
    if (p.baseSequence !== st.lastSeq + 1) throw new OutOfOrderSequenceError(`producer ${p.producerId}: expected sequence ${st.lastSeq + 1}, got ${p.baseSequence}`);
    return NEW;
  }

  /** A batch was given offsets (not yet written): retries of it now wait for `outcome`. */
  assign(p: ProducerInfo, count: number, baseOffset: number, ts: number, outcome: Promise<unknown>): void {
    if (!this.inflight.has(p.producerId)) {
      const pub = this.published.get(p.producerId);
      if (pub) this.inflight.set(p.producerId, copyEntry(pub));
    }
    applyBatch(this.inflight, p.producerId, p.producerEpoch, p.baseSequence, count, baseOffset, ts, outcome);
    this.inflightEnd.set(p.producerId, baseOffset + count);
  }

  /**
   * A batch became readable (the high watermark passed it): it joins the published state.
   * Called in offset order. `hwm` is the new high watermark.
   */
  publish(p: ProducerInfo, count: number, baseOffset: number, ts: number, hwm: number): void {
    applyBatch(this.published, p.producerId, p.producerEpoch, p.baseSequence, count, baseOffset, ts);
    const end = this.inflightEnd.get(p.producerId);
    if (end !== undefined && end <= hwm) {
      // Every batch of this producer is published: both layers agree again.
      this.inflight.delete(p.producerId);
      this.inflightEnd.delete(p.producerId);
    }
  }

  /** Every unpublished batch failed (the log rolled back to its high watermark). */
  dropUnpublished(): void {
    this.inflight.clear();
    this.inflightEnd.clear();
  }

  get hasUnpublished(): boolean {
    return this.inflight.size > 0;
  }

  /** Recovery: the batches of a stored record batch header, replayed in offset order. */
  replay(pid: number, epoch: number, seq: number, count: number, baseOffset: number, ts: number): void {
    applyBatch(this.published, pid, epoch, seq, count, baseOffset, ts);
  }

  /** Recovery: state loaded from a snapshot (taken as published). */
  load(snap: ProducerSnapshot): void {
    this.published.clear();
    for (const [pid, e] of snap.producers) this.published.set(pid, copyEntry(e));
  }

  /** The published state as a snapshot complete up to `offset` (the high watermark). */
  snapshot(offset: number, now = Date.now()): ProducerSnapshot {
    const producers: [number, ProducerEntry][] = [];
    for (const [pid, e] of this.published) {
      if (now - e.lastTimestamp >= PRODUCER_EXPIRY_MS) continue;
      producers.push([pid, { epoch: e.epoch, lastSeq: e.lastSeq, lastTimestamp: e.lastTimestamp, batches: e.batches.map((b) => ({ firstSeq: b.firstSeq, count: b.count, baseOffset: b.baseOffset })) }]);
    }
    return { offset, producers };
  }
}
