// SPDX-License-Identifier: Apache-2.0
/**
 * Columnar per-job state for the offsets [floor, end) of one queue's message log.
 *
 * Invariant TBL-1: every offset in [floor, end) of the message log has exactly one row; rows
 * below `floor` are all terminal (acked, purged or dead-lettered), so the log below `floor`
 * may be deleted. A row costs 27 bytes (status 1, attempts 2, visibleAt 8, enqueuedAt 8,
 * chain 4, size 4) whatever the payload size, instead of one JS object per job.
 */

export const enum St {
  /** Visible and deliverable (in the ready heap). */
  READY = 1,
  /** Waiting for `visibleAt` (in the delay heap). */
  DELAYED = 2,
  /** Leased to a worker. */
  INFLIGHT = 3,
  /** Keyed job held behind an earlier job of the same key. */
  BLOCKED = 4,
  /** Being moved to the dead-letter queue (or redriven out of a DLQ): not deliverable. */
  MOVING = 5,
  /** Acked or purged. Terminal. */
  DONE = 6,
  /** Moved to the dead-letter queue (or dropped after maxAttempts without one). Terminal. */
  DEAD = 7,
  /** A flow's parent waiting for its children (FLOW-2, flows.ts). */
  WAITING = 8,
}

export function isTerminal(s: number): boolean {
  return s === St.DONE || s === St.DEAD;
}

export const ROW_BYTES = 27;

export class JobTable {
  /** Offset stored at index 0 of the arrays. */
  private base = 0;
  /** Index of `floor` in the arrays. */
  private head = 0;
  /** Index one past the last row. */
  private tail = 0;
  status: Uint8Array;
  attempts: Uint16Array;
  visibleAt: Float64Array;
  enqueuedAt: Float64Array;
  chain: Int32Array;
  size: Uint32Array;

  constructor(startOffset: number, capacity = 1024) {
    this.base = startOffset;
    this.status = new Uint8Array(capacity);
    this.attempts = new Uint16Array(capacity);
    this.visibleAt = new Float64Array(capacity);
    this.enqueuedAt = new Float64Array(capacity);
    this.chain = new Int32Array(capacity);
    this.size = new Uint32Array(capacity);
  }

  /** Lowest offset that may still be non-terminal. */
  get floor(): number {
    return this.base + this.head;
  }
  /** One past the highest offset with a row. */
  get end(): number {
    return this.base + this.tail;
  }
  get rows(): number {
    return this.tail - this.head;
  }
  get capacityBytes(): number {
    return this.status.length * ROW_BYTES;
  }

  has(offset: number): boolean {
    return offset >= this.floor && offset < this.end;
  }

  /** Array index of `offset`; caller checks `has` first. */
  idx(offset: number): number {
    return offset - this.base;
  }

  /**
   * Appends a row for `offset`, which must be `end` (offsets are contiguous), or moves an empty
   * table to `offset` (the log start moved past purged data, or an unsynced tail was lost).
   */
  add(offset: number, status: St, visibleAt: number, enqueuedAt: number, chain: number, size: number): number {
    if (offset !== this.end) {
      if (this.rows === 0) {
        this.base = offset;
        this.head = this.tail = 0;
      } else {
        throw new Error(`job table: expected offset ${this.end}, got ${offset}`);
      }
    }
    if (this.tail === this.status.length) this.makeRoom();
    const i = this.tail++;
    this.status[i] = status;
    this.attempts[i] = 0;
    this.visibleAt[i] = visibleAt;
    this.enqueuedAt[i] = enqueuedAt;
    this.chain[i] = chain;
    this.size[i] = size;
    return i;
  }

  /** Drops rows at and above `end` (their jobs were lost from an unsynced log tail). */
  truncate(end: number): void {
    const i = Math.max(this.head, end - this.base);
    if (i < this.tail) this.tail = i;
  }

  /** Moves `floor` past terminal rows; returns the new floor. */
  advanceFloor(): number {
    while (this.head < this.tail && isTerminal(this.status[this.head])) this.head++;
    if (this.head === this.tail && this.head > 0) {
      // Empty: restart at index 0 so memory stays proportional to backlog.
      this.base += this.head;
      this.head = this.tail = 0;
      if (this.status.length > 4096) this.realloc(1024);
    }
    return this.floor;
  }

  /** Marks every row below `end` terminal-DONE (purge); returns how many were non-terminal. */
  forEachLive(fn: (offset: number, i: number) => void): void {
    for (let i = this.head; i < this.tail; i++) {
      if (!isTerminal(this.status[i])) fn(this.base + i, i);
    }
  }

  private makeRoom(): void {
    const live = this.tail - this.head;
    if (this.head > 0 && live <= this.status.length / 2) {
      // Compact in place: shift live rows to index 0.
      this.shift();
      return;
    }
    this.realloc(Math.max(1024, this.status.length * 2));
  }

  private shift(): void {
    const h = this.head;
    const t = this.tail;
    this.status.copyWithin(0, h, t);
    this.attempts.copyWithin(0, h, t);
    this.visibleAt.copyWithin(0, h, t);
    this.enqueuedAt.copyWithin(0, h, t);
    this.chain.copyWithin(0, h, t);
    this.size.copyWithin(0, h, t);
    this.base += h;
    this.tail -= h;
    this.head = 0;
  }

  private realloc(cap: number): void {
    if (this.head > 0) this.shift();
    const t = this.tail;
    const grow = <A extends Uint8Array | Uint16Array | Float64Array | Int32Array | Uint32Array>(
      a: A,
      mk: (n: number) => A,
    ): A => {
      const b = mk(Math.max(cap, t));
      b.set(a.subarray(0, t) as never);
      return b;
    };
    this.status = grow(this.status, (n) => new Uint8Array(n));
    this.attempts = grow(this.attempts, (n) => new Uint16Array(n));
    this.visibleAt = grow(this.visibleAt, (n) => new Float64Array(n));
    this.enqueuedAt = grow(this.enqueuedAt, (n) => new Float64Array(n));
    this.chain = grow(this.chain, (n) => new Int32Array(n));
    this.size = grow(this.size, (n) => new Uint32Array(n));
  }

  /** Serialises rows [floor, end) column by column (snapshot body). */
  encode(): Buffer {
    const n = this.rows;
    const h = this.head;
    const t = this.tail;
    const parts = [
      Buffer.from(this.status.buffer, this.status.byteOffset + h, n),
      Buffer.from(this.attempts.slice(h, t).buffer),
      Buffer.from(this.visibleAt.slice(h, t).buffer),
      Buffer.from(this.enqueuedAt.slice(h, t).buffer),
      Buffer.from(this.chain.slice(h, t).buffer),
      Buffer.from(this.size.slice(h, t).buffer),
    ];
    return Buffer.concat(parts);
  }

  static decode(floor: number, rows: number, buf: Buffer): JobTable {
    if (buf.length !== rows * ROW_BYTES) throw new Error(`snapshot table: expected ${rows * ROW_BYTES} bytes, got ${buf.length}`);
    const t = new JobTable(floor, Math.max(1024, rows));
    let p = 0;
    const take = (bytes: number): ArrayBuffer => {
      // Copy into a fresh aligned ArrayBuffer (typed arrays need aligned offsets).
      const ab = new ArrayBuffer(bytes);
      new Uint8Array(ab).set(buf.subarray(p, p + bytes));
      p += bytes;
      return ab;
    };
    t.status.set(new Uint8Array(take(rows)));
    t.attempts.set(new Uint16Array(take(rows * 2)));
    t.visibleAt.set(new Float64Array(take(rows * 8)));
    t.enqueuedAt.set(new Float64Array(take(rows * 8)));
    t.chain.set(new Int32Array(take(rows * 4)));
    t.size.set(new Uint32Array(take(rows * 4)));
    t.tail = rows;
    return t;
  }
}
