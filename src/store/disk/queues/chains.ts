// SPDX-License-Identifier: Apache-2.0
/**
 * Per-key FIFO bookkeeping. Each key with unfinished jobs has a chain: its job offsets in
 * enqueue order. Invariant KEY-1: only the head of a chain is ever deliverable, so jobs that
 * share a key are delivered strictly in order with at most one in flight; a failing head holds
 * back only its own chain. A chain exists only while its key has unfinished jobs; it costs about
 * 100 bytes plus the key string plus 8 bytes per queued offset.
 */

export interface Chain {
  id: number;
  key: string;
  /** Offsets in order; entries before `h` were removed (lazy front trimming). */
  offs: number[];
  h: number;
}

export class KeyChains {
  private byKey = new Map<string, Chain>();
  private byId: (Chain | undefined)[] = [];
  private free: number[] = [];

  get size(): number {
    return this.byKey.size;
  }

  get(id: number): Chain | undefined {
    return id >= 0 ? this.byId[id] : undefined;
  }

  /** Appends `offset` to the chain of `key`; returns [chainId, isHead]. */
  push(key: string, offset: number): [number, boolean] {
    let c = this.byKey.get(key);
    if (c === undefined) {
      const id = this.free.length > 0 ? this.free.pop()! : this.byId.length;
      c = { id, key, offs: [], h: 0 };
      this.byKey.set(key, c);
      this.byId[id] = c;
    }
    c.offs.push(offset);
    return [c.id, c.offs.length - c.h === 1];
  }

  /** Re-creates a chain with a given id (snapshot load). Offsets are pushed afterwards in order. */
  restore(id: number, key: string): void {
    const c: Chain = { id, key, offs: [], h: 0 };
    this.byKey.set(key, c);
    this.byId[id] = c;
  }

  /** Appends during snapshot load (rows visited in offset order). */
  append(id: number, offset: number): void {
    this.byId[id]!.offs.push(offset);
  }

  /** Finishes a snapshot load: drops restored chains without offsets and rebuilds the free list. */
  finishRestore(): void {
    for (let id = 0; id < this.byId.length; id++) {
      const c = this.byId[id];
      if (c !== undefined && c.offs.length === c.h) this.drop(c);
      else if (c === undefined) this.free.push(id);
    }
  }

  head(id: number): number {
    const c = this.byId[id];
    return c === undefined || c.h >= c.offs.length ? -1 : c.offs[c.h];
  }

  /**
   * Removes `offset` from its chain (normally the head). Returns the new head offset when the
   * head changed and a successor exists, else -1.
   */
  remove(id: number, offset: number): number {
    const c = this.byId[id];
    if (c === undefined) return -1;
    let next = -1;
    if (c.offs[c.h] === offset) {
      c.h++;
      if (c.h < c.offs.length) next = c.offs[c.h];
    } else {
      const i = c.offs.indexOf(offset, c.h);
      if (i >= 0) c.offs.splice(i, 1);
    }
    if (c.h >= c.offs.length) {
      this.drop(c);
    } else if (c.h > 1024 && c.h > c.offs.length / 2) {
      c.offs = c.offs.slice(c.h);
      c.h = 0;
    }
    return next;
  }

  clear(): void {
    this.byKey.clear();
    this.byId = [];
    this.free = [];
  }

  entries(): IterableIterator<Chain> {
    return this.byKey.values();
  }

  private drop(c: Chain): void {
    this.byKey.delete(c.key);
    this.byId[c.id] = undefined;
    this.free.push(c.id);
  }
}
