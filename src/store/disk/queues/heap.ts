// SPDX-License-Identifier: Apache-2.0
/**
 * Binary min-heap of (priority, offset) pairs stored in two Float64Arrays, so a million delayed
 * jobs cost 16 bytes each here instead of a JS object each. Entries are never removed from the
 * middle: callers use lazy deletion (validate an entry against the state table when popped).
 */
export class OffsetHeap {
  private prio: Float64Array;
  private off: Float64Array;
  private n = 0;

  constructor(initialCapacity = 1024) {
    this.prio = new Float64Array(initialCapacity);
    this.off = new Float64Array(initialCapacity);
  }

  get size(): number {
    return this.n;
  }

  /** Bytes held by the backing arrays (for memory accounting in docs/tests). */
  get capacityBytes(): number {
    return this.prio.byteLength + this.off.byteLength;
  }

  push(priority: number, offset: number): void {
    if (this.n === this.prio.length) this.grow();
    let i = this.n++;
    // Sift up.
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.less(priority, offset, this.prio[parent], this.off[parent])) break;
      this.prio[i] = this.prio[parent];
      this.off[i] = this.off[parent];
      i = parent;
    }
    this.prio[i] = priority;
    this.off[i] = offset;
  }

  peekPriority(): number {
    return this.n === 0 ? Infinity : this.prio[0];
  }

  peekOffset(): number {
    return this.n === 0 ? -1 : this.off[0];
  }

  /** Removes the top entry; returns its offset (or -1 when empty). */
  pop(): number {
    if (this.n === 0) return -1;
    const top = this.off[0];
    const last = --this.n;
    if (last > 0) {
      const p = this.prio[last];
      const o = this.off[last];
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= last) break;
        const r = l + 1;
        let c = l;
        if (r < last && this.less(this.prio[r], this.off[r], this.prio[l], this.off[l])) c = r;
        if (!this.less(this.prio[c], this.off[c], p, o)) break;
        this.prio[i] = this.prio[c];
        this.off[i] = this.off[c];
        i = c;
      }
      this.prio[i] = p;
      this.off[i] = o;
    }
    this.maybeShrink();
    return top;
  }

  clear(): void {
    this.n = 0;
    this.maybeShrink();
  }

  private less(p1: number, o1: number, p2: number, o2: number): boolean {
    return p1 < p2 || (p1 === p2 && o1 < o2);
  }

  private grow(): void {
    const cap = this.prio.length * 2;
    const p = new Float64Array(cap);
    p.set(this.prio);
    const o = new Float64Array(cap);
    o.set(this.off);
    this.prio = p;
    this.off = o;
  }

  /** Give memory back after a burst (e.g. a million delayed jobs became due). */
  private maybeShrink(): void {
    const cap = this.prio.length;
    if (cap > 4096 && this.n < cap / 8) {
      const nc = Math.max(1024, cap >> 2);
      this.prio = this.prio.slice(0, nc);
      this.off = this.off.slice(0, nc);
    }
  }
}
