// SPDX-License-Identifier: Apache-2.0
/**
 * The disk engine's table of idempotent enqueue requests (contract: src/queues/idempotence.ts):
 * which `(producerId, sequence)` requests a queue has stored, so that a request re-sent after a
 * lost connection is answered with its original job ids instead of being stored again.
 *
 * What is remembered per producer: the highest sequence seen and the last
 * `ENQUEUE_REQUESTS_KEPT` requests that stored at least one job, each as (sequence, first job
 * offset, number of new jobs). The new jobs of one request are appended together (one group,
 * never split), so they hold the consecutive offsets `first .. first + count - 1`; jobs of the
 * request that were user-dedupe duplicates stored nothing and are rebuilt from the dedupe table
 * (Enqueuer.rebuildAnswer).
 *
 * Durability (IDEM-1): the identity travels in the reserved header `sluice-ip` of the request's
 * first new job in the message log, so it is written by the same append and is never ahead of
 * the jobs; the queue snapshot carries the table for jobs below its end, and recovery re-reads
 * the headers of the jobs after it. A request whose append fails leaves no entry.
 *
 * Memory: at most `MAX_ENQUEUE_PRODUCERS` producers per queue (least recently active evicted)
 * x `ENQUEUE_REQUESTS_KEPT` entries of three numbers.
 */
import { OutOfOrderSequenceError } from "../../../errors.js";
import { ENQUEUE_REQUESTS_KEPT, MAX_ENQUEUE_PRODUCERS, type EnqueueIdentity } from "../../../queues/idempotence.js";

/** Reserved header of a request's first new job: producerId f64 | sequence f64 | count u32. */
export const H_IDEMPOTENCE = "sluice-ip";
const HEADER_BYTES = 20;

export interface IdemEntry {
  seq: number;
  /** Offset of the first new job (-1 while pending). */
  first: number;
  /** Number of new jobs (consecutive offsets from `first`). */
  count: number;
  /** Set while the request is being evaluated or written; settles when it is durable or failed. */
  pending: { promise: Promise<void>; resolve(): void; reject(e: unknown): void } | null;
}

interface ProducerState {
  maxSeq: number;
  /** At most ENQUEUE_REQUESTS_KEPT entries: sequences within (maxSeq - KEPT, maxSeq]. */
  entries: IdemEntry[];
}

/** Snapshot form: [producerId, maxSeq, [sequence, first, count][]], least recently active first. */
export type IdemSnapshot = [number, number, [number, number, number][]][];

export function encodeIdemHeader(id: EnqueueIdentity, count: number): Buffer {
  const b = Buffer.allocUnsafe(HEADER_BYTES);
  b.writeDoubleLE(id.producerId, 0);
  b.writeDoubleLE(id.sequence, 8);
  b.writeUInt32LE(count, 16);
  return b;
}

export function decodeIdemHeader(b: Buffer): { producerId: number; sequence: number; count: number } | null {
  if (b.length !== HEADER_BYTES) return null;
  const producerId = b.readDoubleLE(0);
  const sequence = b.readDoubleLE(8);
  if (!Number.isSafeInteger(producerId) || producerId < 0 || !Number.isSafeInteger(sequence) || sequence < 0) return null;
  return { producerId, sequence, count: b.readUInt32LE(16) };
}

export class EnqueueProducers {
  /** Map order is recency order (least recently active first): touched by delete + set. */
  private readonly producers = new Map<number, ProducerState>();

  get size(): number {
    return this.producers.size;
  }

  /**
   * The remembered entry of `(producerId, sequence)`, or null when the request is new. Throws
   * OutOfOrderSequenceError for a sequence below the window that is not remembered: whether it
   * was stored can no longer be told (the network client never sends one).
   */
  lookup(id: EnqueueIdentity): IdemEntry | null {
    const p = this.producers.get(id.producerId);
    if (p === undefined) return null;
    this.touch(id.producerId, p);
    for (const e of p.entries) if (e.seq === id.sequence) return e;
    if (id.sequence <= p.maxSeq - ENQUEUE_REQUESTS_KEPT)
      throw new OutOfOrderSequenceError(
        `enqueue sequence ${id.sequence} of producer ${id.producerId} is older than the last ${ENQUEUE_REQUESTS_KEPT} requests (latest ${p.maxSeq}); whether it was stored is unknown`,
      );
    return null;
  }

  /** Records a new request as pending (a concurrent retry of it waits for its outcome). */
  begin(id: EnqueueIdentity): IdemEntry {
    let resolve!: () => void;
    let reject!: (e: unknown) => void;
    const promise = new Promise<void>((a, b) => {
      resolve = a;
      reject = b;
    });
    promise.catch(() => {});
    const e: IdemEntry = { seq: id.sequence, first: -1, count: 0, pending: { promise, resolve, reject } };
    this.insert(id.producerId, e);
    return e;
  }

  /** The request's new jobs are durable from `first` (called where their rows are added). */
  complete(e: IdemEntry, first: number, count: number): void {
    e.first = first;
    e.count = count;
    const p = e.pending;
    e.pending = null;
    p?.resolve();
  }

  /** The request stored nothing (failed, or every job was a duplicate): forget it. */
  drop(id: EnqueueIdentity, e: IdemEntry, err?: unknown): void {
    const p = this.producers.get(id.producerId);
    if (p !== undefined) {
      const i = p.entries.indexOf(e);
      if (i >= 0) p.entries.splice(i, 1);
    }
    const d = e.pending;
    e.pending = null;
    if (d !== null) {
      if (err === undefined) d.resolve();
      else d.reject(err);
    }
  }

  /** Recovery: a stored request (from the snapshot or a `sluice-ip` header). */
  restore(producerId: number, seq: number, first: number, count: number): void {
    this.insert(producerId, { seq, first, count, pending: null });
  }

  /** Recovery after the message log lost an unsynced tail: forget requests whose jobs went with it. */
  truncate(end: number): void {
    for (const p of this.producers.values()) p.entries = p.entries.filter((e) => e.pending !== null || e.first + e.count <= end);
  }

  snapshot(): IdemSnapshot {
    const out: IdemSnapshot = [];
    for (const [pid, p] of this.producers) {
      const entries: [number, number, number][] = [];
      for (const e of p.entries) if (e.pending === null) entries.push([e.seq, e.first, e.count]);
      out.push([pid, p.maxSeq, entries]);
    }
    return out;
  }

  load(s: IdemSnapshot): void {
    for (const [pid, maxSeq, entries] of s) {
      for (const [seq, first, count] of entries) this.restore(pid, seq, first, count);
      const p = this.producers.get(pid);
      if (p === undefined) this.producers.set(pid, { maxSeq, entries: [] });
      else p.maxSeq = Math.max(p.maxSeq, maxSeq);
    }
  }

  private touch(pid: number, p: ProducerState): void {
    this.producers.delete(pid);
    this.producers.set(pid, p);
  }

  private insert(pid: number, e: IdemEntry): void {
    let p = this.producers.get(pid);
    if (p === undefined) {
      p = { maxSeq: -1, entries: [] };
      this.evict();
    }
    this.touch(pid, p);
    const same = p.entries.findIndex((x) => x.seq === e.seq);
    if (same >= 0) p.entries.splice(same, 1);
    p.entries.push(e);
    if (e.seq > p.maxSeq) p.maxSeq = e.seq;
    // Only the window can be retried by a well-behaved client; older entries go.
    const floor = p.maxSeq - ENQUEUE_REQUESTS_KEPT;
    if (p.entries.length > 0 && p.entries.some((x) => x.seq <= floor)) p.entries = p.entries.filter((x) => x.seq > floor);
  }

  /** Makes room for one more producer: the least recently active one without a pending request goes. */
  private evict(): void {
    if (this.producers.size < MAX_ENQUEUE_PRODUCERS) return;
    let scanned = 0;
    for (const [pid, p] of this.producers) {
      if (scanned++ > 64) return; // all busy (cannot happen with sane clients): exceed the bound a little
      if (p.entries.some((e) => e.pending !== null)) continue;
      this.producers.delete(pid);
      return;
    }
  }
}
