// SPDX-License-Identifier: Apache-2.0
/**
 * The tail cache: records of recently enqueued, immediately visible jobs, so a hot queue hands
 * jobs out from memory instead of reading them back. When it is full, new jobs are not cached
 * (`spill`); reads of the message log then go forward in large chunks (read-ahead) and refill
 * it, until delivery has caught up with the log's end.
 *
 * Memory: at most TAIL_CACHE_BYTES of records (approximate heap cost) per queue, in a
 * direct-mapped ring of CACHE_SLOTS slots (slot = offset mod size): O(1) without hashing, and
 * neighbouring offsets never collide; a slot taken by another live offset is simply not cached.
 */
import { StorageError } from "../../../errors.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import type { PreparedRecord, StoredRecord } from "../../../log/record-batch.js";

export const TAIL_CACHE_BYTES = 32 * 1024 * 1024;
const CACHE_SLOTS = 1 << 17;
/** Bytes per read of the message log when a record is not cached. */
const READ_AHEAD_BYTES = 1024 * 1024;

/** Approximate heap cost of a cached record (object, buffers, header arrays). */
function cacheCost(r: { value: Buffer | null; headers: [string, Buffer][] | null }): number {
  return (r.value?.length ?? 0) + 200 + (r.headers === null ? 0 : r.headers.length * 120);
}

export class PayloadCache {
  private slots: (PreparedRecord | undefined)[] = new Array(CACHE_SLOTS);
  /** Offset held by each slot (the records themselves are stored as enqueued, without a copy). */
  private offs = new Float64Array(CACHE_SLOTS);
  private bytes = 0;
  /** The cache overflowed: new jobs are read back from disk in order until delivery catches up. */
  private spill = false;
  private readLock: Promise<void> = Promise.resolve();

  constructor(
    private readonly log: PartitionLog,
    /** Whether `off` is a job still worth caching (live, not settled). */
    private readonly wanted: (off: number) => boolean,
    /** End of the job table (reads reaching it end the spill). */
    private readonly end: () => number,
  ) {}

  get heldBytes(): number {
    return this.bytes;
  }

  /** Caches the record of a job just stored, unless the cache spilled. */
  add(off: number, rec: PreparedRecord | StoredRecord): void {
    if (this.spill) return;
    this.put(off, rec);
  }

  private put(off: number, rec: PreparedRecord | StoredRecord): void {
    const bytes = cacheCost(rec);
    const slot = off % CACHE_SLOTS;
    if (this.slots[slot] !== undefined) {
      if (this.offs[slot] !== off) this.spill = true;
      return;
    }
    if (this.bytes + bytes > TAIL_CACHE_BYTES) {
      this.spill = true;
      return;
    }
    this.slots[slot] = rec;
    this.offs[slot] = off;
    this.bytes += bytes;
  }

  get(off: number): PreparedRecord | undefined {
    const slot = off % CACHE_SLOTS;
    const r = this.slots[slot];
    return r !== undefined && this.offs[slot] === off ? r : undefined;
  }

  remove(off: number): void {
    const slot = off % CACHE_SLOTS;
    const r = this.slots[slot];
    if (r !== undefined && this.offs[slot] === off) {
      this.slots[slot] = undefined;
      this.bytes -= cacheCost(r);
    }
  }

  clear(): void {
    this.slots = new Array(CACHE_SLOTS);
    this.bytes = 0;
  }

  /** Reads records by offset: the cache first, then the message log (an Error per unreadable job). */
  async fetch(offs: readonly number[]): Promise<Map<number, PreparedRecord | Error>> {
    const out = new Map<number, PreparedRecord | Error>();
    const missing: number[] = [];
    for (const o of offs) {
      const r = this.get(o);
      if (r !== undefined) out.set(o, r);
      else missing.push(o);
    }
    if (missing.length === 0) return out;
    // Reads are serialised: concurrent deliveries of neighbouring jobs then share one read-ahead
    // instead of each decoding the same chunk.
    const prev = this.readLock;
    let release!: () => void;
    this.readLock = new Promise<void>((r) => (release = r));
    await prev;
    try {
      return await this.readMissing(missing, out);
    } finally {
      release();
    }
  }

  private async readMissing(all: number[], out: Map<number, PreparedRecord | Error>): Promise<Map<number, PreparedRecord | Error>> {
    const missing: number[] = [];
    for (const o of all) {
      const r = this.get(o);
      if (r !== undefined) out.set(o, r);
      else missing.push(o);
    }
    missing.sort((a, b) => a - b);
    const lost = (o: number): StorageError => new StorageError(`job ${o} missing from the message log`);
    let k = 0;
    while (k < missing.length) {
      const o = missing[k];
      try {
        const { records, nextOffset } = await this.log.read(o, READ_AHEAD_BYTES);
        let found = false;
        if (nextOffset >= this.end() && this.bytes < TAIL_CACHE_BYTES / 2) this.spill = false;
        for (const r of records) {
          if (r.offset > o && this.wanted(r.offset)) this.put(r.offset, r);
          while (k < missing.length && missing[k] < r.offset) {
            if (!out.has(missing[k])) out.set(missing[k], lost(missing[k]));
            k++;
          }
          if (k < missing.length && missing[k] === r.offset) {
            out.set(r.offset, r);
            found = true;
            k++;
          }
        }
        if (!found && k < missing.length && missing[k] === o) {
          out.set(o, lost(o));
          k++;
        }
      } catch (e) {
        out.set(o, e instanceof Error ? e : new StorageError(String(e)));
        k++;
      }
    }
    return out;
  }
}
