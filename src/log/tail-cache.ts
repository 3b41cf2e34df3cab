// SPDX-License-Identifier: Apache-2.0
/**
 * The most recently published batches of every partition, kept in memory under one byte
 * budget for the whole process, so that consumers at the live end (the common case: a
 * subscriber waiting at the high watermark) are served without a file read. A file read costs
 * a thread-pool round trip, and on a busy machine every thread hand-off adds to the latency
 * tail; this removes one from the publish -> deliver path.
 *
 * Invariants:
 *  TAIL-1 only published batches are added (durable with durability "always": publish() runs
 *         after the covering fdatasync), in offset order, so the cache never shows a consumer
 *         anything the log would not.
 *  TAIL-2 entries of one partition are contiguous in offsets: a gap (e.g. a batch the cache
 *         did not see) clears that partition's entries first.
 *  TAIL-3 memory is bounded by TAIL_CACHE_BYTES for the whole process, whatever the number of
 *         partitions: the oldest entries, across all partitions, are dropped first.
 */

/** Budget for all partitions together. */
export const TAIL_CACHE_BYTES = 32 * 1024 * 1024;
/** Batches larger than this are not cached (they would evict everything for one reader). */
const MAX_CACHED_BATCH_BYTES = 1024 * 1024;

interface Entry {
  base: number;
  count: number;
  buf: Buffer;
  owner: PartitionTail;
  evicted: boolean;
}

const EMPTY = Buffer.alloc(0);

/** Process-wide FIFO of every cached entry, for eviction across partitions (TAIL-3). */
const fifo: Entry[] = [];
let fifoHead = 0;
let totalBytes = 0;

function evictOver(budget: number): void {
  while (totalBytes > budget && fifoHead < fifo.length) {
    const e = fifo[fifoHead];
    fifo[fifoHead++] = undefined as unknown as Entry;
    if (!e.evicted) {
      e.evicted = true;
      totalBytes -= e.buf.length;
      e.owner.dropEvicted();
    }
  }
  // Compact the FIFO array now and then so its length stays proportional to live entries.
  if (fifoHead > 4096 && fifoHead * 2 > fifo.length) {
    fifo.splice(0, fifoHead);
    fifoHead = 0;
  }
}

/** Bytes held by the tail cache of the whole process (metrics, tests). */
export function tailCacheBytes(): number {
  return totalBytes;
}

export interface TailHit {
  bufs: Buffer[];
  /** Offset after the last returned batch. */
  nextOffset: number;
  /** Records at or after the requested offset. */
  records: number;
  bytes: number;
}

/** One partition's view of the cache. */
export class PartitionTail {
  private entries: Entry[] = [];
  private head = 0;

  /** Adds published batches, in offset order (TAIL-1). */
  add(batches: readonly { baseOffset: number; count: number; buf: Buffer }[]): void {
    for (const b of batches) {
      if (b.buf.length > MAX_CACHED_BATCH_BYTES) {
        this.clear();
        continue;
      }
      const last = this.entries.length > this.head ? this.entries[this.entries.length - 1] : null;
      if (last !== null && last.base + last.count !== b.baseOffset) this.clear(); // TAIL-2
      const e: Entry = { base: b.baseOffset, count: b.count, buf: b.buf, owner: this, evicted: false };
      this.entries.push(e);
      fifo.push(e);
      totalBytes += b.buf.length;
    }
    evictOver(TAIL_CACHE_BYTES);
    // Entries cleared by their partition stay in the FIFO until popped; they hold no bytes
    // (clear() drops them), and this keeps their number bounded too.
    if (fifo.length - fifoHead > 200_000) {
      const live = fifo.slice(fifoHead).filter((e) => !e.evicted);
      fifo.length = 0;
      fifoHead = 0;
      for (const e of live) fifo.push(e);
    }
  }

  /** Called by eviction: entries leave a partition oldest first, as they entered the FIFO. */
  dropEvicted(): void {
    while (this.head < this.entries.length && this.entries[this.head].evicted) this.head++;
    if (this.head > 256 && this.head * 2 > this.entries.length) {
      this.entries.splice(0, this.head);
      this.head = 0;
    }
  }

  clear(): void {
    for (let i = this.head; i < this.entries.length; i++) {
      const e = this.entries[i];
      if (!e.evicted) {
        e.evicted = true;
        totalBytes -= e.buf.length;
      }
      e.buf = EMPTY;
    }
    this.entries = [];
    this.head = 0;
  }

  /**
   * Whole batches from the one holding `offset`, at least one, then more while within
   * `maxBytes` and `maxRecords`. Null when `offset` is not cached (read the file).
   */
  lookup(offset: number, maxBytes: number, maxRecords = Infinity): TailHit | null {
    const n = this.entries.length;
    if (this.head >= n) return null;
    const first = this.entries[this.head];
    const lastE = this.entries[n - 1];
    if (offset < first.base || offset >= lastE.base + lastE.count) return null;
    // Binary search for the entry holding `offset` (entries are contiguous, TAIL-2).
    let lo = this.head;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.entries[mid].base <= offset) lo = mid;
      else hi = mid - 1;
    }
    const bufs: Buffer[] = [];
    let bytes = 0;
    let records = 0;
    let next = offset;
    for (let i = lo; i < n; i++) {
      const e = this.entries[i];
      if (bufs.length > 0 && (bytes + e.buf.length > maxBytes || records >= maxRecords)) break;
      bufs.push(e.buf);
      bytes += e.buf.length;
      records += e.base + e.count - Math.max(e.base, offset);
      next = e.base + e.count;
    }
    return { bufs, nextOffset: next, records, bytes };
  }
}
