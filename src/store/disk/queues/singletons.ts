// SPDX-License-Identifier: Apache-2.0
/**
 * Singleton keys of a queue (pg-boss `singletonKey`, BullMQ deduplication modes), one table
 * per mode (a key means something only within its mode):
 *
 *  - singleton: the key's entry is its waiting-or-active job while that job is live (JOB-2);
 *  - debounce:  the key's entry is its latest job; a new one replaces it while it waits (JOB-3);
 *  - throttle:  the key's entry is the first job of its window, until the window ends.
 *
 * Durable through the job records (`sluice-sk`, records.ts) and the snapshot; the enqueuer
 * claims an entry synchronously with its decision (`wait` holds the group's promise until the
 * append is durable), so two enqueues never both take a key. Costs one map entry per key with a
 * live job (or an open throttle window); nothing for queues that do not use it.
 */
import type { SingletonMode } from "../../queue-store.js";
import type { Deferred } from "./journal.js";

export interface SingletonEntry {
  mode: SingletonMode;
  /** The job's offset; -1 while its append is in flight. */
  off: number;
  /** Throttle: end of the window (wall-clock ms); other modes: Infinity. */
  exp: number;
  /** While the append is in flight: its group's base-offset promise and the job's index in it. */
  wait: Deferred<number> | null;
  idx: number;
}

/** A snapshot row: [key, mode, offset, window end (throttle) or -1]. */
export type SingletonRow = [string, SingletonMode, number, number];

export class Singletons {
  private readonly byKey = new Map<string, SingletonEntry>();
  /** Live singleton and debounce jobs -> their table key (so a finishing job frees its key). */
  private readonly byOff = new Map<number, string>();

  get size(): number {
    return this.byKey.size;
  }

  /** Whether any live job holds a key (checked on every terminal transition: keep it cheap). */
  get tracking(): boolean {
    return this.byOff.size > 0;
  }

  private static id(mode: SingletonMode, key: string): string {
    return `${mode[0]}:${key}`;
  }

  /** The key's entry in its mode (an ended throttle window is dropped here). */
  get(mode: SingletonMode, key: string, now: number): SingletonEntry | undefined {
    const id = Singletons.id(mode, key);
    const e = this.byKey.get(id);
    if (e !== undefined && e.wait === null && e.exp <= now) {
      this.byKey.delete(id);
      return undefined;
    }
    return e;
  }

  /** Takes the key for a job whose append is in flight (or, on recovery, a stored job). */
  set(mode: SingletonMode, key: string, e: SingletonEntry): void {
    const id = Singletons.id(mode, key);
    this.byKey.set(id, e);
    if (e.off >= 0 && mode !== "throttle") this.byOff.set(e.off, id);
  }

  /** Gives a key back to `prev` (an enqueue that claimed it stored nothing). */
  restoreEntry(mode: SingletonMode, key: string, claim: SingletonEntry, prev: SingletonEntry | undefined): void {
    const id = Singletons.id(mode, key);
    if (this.byKey.get(id) !== claim) return;
    if (prev === undefined) this.byKey.delete(id);
    else this.byKey.set(id, prev);
  }

  /** The claiming job's append is durable at `off`. */
  stored(mode: SingletonMode, key: string, e: SingletonEntry, off: number): void {
    e.off = off;
    e.wait = null;
    if (mode !== "throttle") this.byOff.set(off, Singletons.id(mode, key));
  }

  /** A job reached a terminal state: its singleton or debounce key is free again. */
  finished(off: number): void {
    const id = this.byOff.get(off);
    if (id === undefined) return;
    this.byOff.delete(off);
    const e = this.byKey.get(id);
    if (e !== undefined && e.off === off) this.byKey.delete(id);
  }

  /** Drops entries whose job is no longer live (recovery, after the journal replay). */
  retainLive(isLive: (off: number) => boolean): void {
    for (const [off, id] of this.byOff) {
      if (isLive(off)) continue;
      this.byOff.delete(off);
      const e = this.byKey.get(id);
      if (e !== undefined && e.off === off) this.byKey.delete(id);
    }
  }

  clear(): void {
    for (const [id, e] of this.byKey) if (e.mode !== "throttle" && e.wait === null) this.byKey.delete(id);
    this.byOff.clear();
  }

  /** Stored entries still in force (snapshot). */
  rows(now: number): SingletonRow[] {
    const out: SingletonRow[] = [];
    for (const [id, e] of this.byKey) if (e.off >= 0 && e.exp > now) out.push([id.slice(2), e.mode, e.off, e.exp === Infinity ? -1 : e.exp]);
    return out;
  }

  load(rows: readonly SingletonRow[], now: number): void {
    for (const [key, mode, off, exp] of rows) {
      const end = exp < 0 ? Infinity : exp;
      if (end > now) this.set(mode, key, { mode, off, exp: end, wait: null, idx: 0 });
    }
  }
}
