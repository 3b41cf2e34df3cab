// SPDX-License-Identifier: Apache-2.0
/**
 * Singleton keys of a queue (pg-boss `singletonKey`, BullMQ deduplication modes), one table
 * per mode (a key means something only within its mode):
 *
 *  - singleton: the key's entry is its waiting-or-active job while that job is live (JOB-2);
 *  - debounce:  the key's entry is its latest job; a new one replaces it while it waits (JOB-2);
 *  - throttle:  the key's entry is the first job of its window, until the window ends.
 *
 * Durable through the job records (`sluice-sk`, records.ts) and the snapshot; the enqueuer
 * claims an entry synchronously with its decision (`wait` holds the group's promise until the
 * append is durable), so two enqueues never both take a key. Costs one map entry per key with a
 * live job (or an open throttle window); nothing for queues that do not use it.
 */
import type { EnqueueResult } from "../../../queues/types.js";
import type { NewJob, PreparedRecord, SingletonMode, SingletonSpec } from "../../queue-store.js";
import type { JobState } from "./job-state.js";
import { deferred, type Deferred } from "./journal.js";
import { getHeader, H_SINGLETON } from "./records.js";

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

  /** Drops throttle entries whose window ended; returns the entries left. */
  sweep(now: number): number {
    for (const [id, e] of this.byKey) if (e.wait === null && e.exp <= now) this.byKey.delete(id);
    return this.byKey.size;
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

/**
 * The singleton decisions of one enqueue request (JOB-2): taken and claimed synchronously, with
 * the group's promise created up front so that a claim names it before the admission wait.
 */
export class SingletonRound {
  readonly d = deferred<number>();
  /** Jobs answered as duplicates of another job of the request: [job, the other job]. */
  readonly dupOf: [number, number][] = [];
  /** Job index -> the waiting job it replaces (debounce). */
  readonly replacedBy = new Map<number, number>();
  private readonly claims: { sk: SingletonSpec; claim: SingletonEntry; prev: SingletonEntry | undefined }[] = [];
  private readonly holder = new Map<SingletonEntry, number>();
  /** The last job of each debounce key in the request: earlier ones are replaced before they are stored. */
  private readonly lastDebounce = new Map<string, number>();

  constructor(
    private readonly st: JobState,
    private readonly jobs: readonly NewJob[],
    /** The error for a table at its limit (QueueFullError). */
    private readonly full: () => Error,
  ) {
    // Nobody may wait on a round that stored nothing without a listener: no unhandled rejection.
    this.d.promise.catch(() => {});
    jobs.forEach((j, i) => {
      if (j.singleton?.mode === "debounce") this.lastDebounce.set(j.singleton.key, i);
    });
  }

  /** Waits until no enqueue of this request's keys is in flight. */
  async settle(): Promise<void> {
    for (;;) {
      let wait: Promise<number> | null = null;
      for (const j of this.jobs) {
        const sk = j.singleton;
        const e = sk ? this.st.singletons.get(sk.mode, sk.key, -Infinity) : undefined;
        if (e !== undefined && e.wait !== null) {
          wait = e.wait.promise;
          break;
        }
      }
      if (wait === null) return;
      await wait.catch(() => {});
    }
  }

  /** Job `i` (with a singleton key): null when it is to be stored as fresh job `pos`, else its answer. */
  decide(i: number, pos: number, now: number, recs: PreparedRecord[], maxKeys: number): EnqueueResult | null {
    const sk = this.jobs[i].singleton!;
    const tbl = this.st.singletons;
    if (sk.mode === "debounce" && this.lastDebounce.get(sk.key) !== i) {
      // A later job of the request replaces this one before either is stored.
      this.dupOf.push([i, this.lastDebounce.get(sk.key)!]);
      return { id: "", duplicate: true };
    }
    const prev = tbl.get(sk.mode, sk.key, now);
    if (prev !== undefined && sk.mode !== "debounce") {
      const first = prev.wait === this.d ? this.holder.get(prev) : undefined;
      if (first !== undefined) {
        this.dupOf.push([i, first]);
        return { id: "", duplicate: true };
      }
      return { id: String(prev.off), duplicate: true };
    }
    if (prev !== undefined && prev.off >= 0 && this.st.isWaiting(prev.off)) {
      // JOB-2 (debounce): held back from now on; removed once this job is durable. The record
      // names it, so recovery removes it too if the DEAD event is lost in a crash.
      this.st.freeze(prev.off);
      this.replacedBy.set(i, prev.off);
      getHeader(recs[i].headers, H_SINGLETON)?.writeDoubleLE(prev.off, 9);
    }
    // Bounded as dedupe ids are (maxDedupeEntries): a new key beyond it is refused, nothing changed.
    if (prev === undefined && tbl.size >= maxKeys && tbl.sweep(now) >= maxKeys) throw this.full();
    const claim: SingletonEntry = { mode: sk.mode, off: -1, exp: sk.mode === "throttle" ? now + sk.windowMs : Infinity, wait: this.d, idx: pos };
    tbl.set(sk.mode, sk.key, claim);
    this.holder.set(claim, i);
    this.claims.push({ sk, claim, prev });
    return null;
  }

  replaced(): number[] | null {
    return this.replacedBy.size > 0 ? [...this.replacedBy.values()] : null;
  }

  /** The request stored nothing: keys go back to their previous jobs, replaced jobs wait again. */
  undo(err: unknown, now: number): void {
    for (let k = this.claims.length - 1; k >= 0; k--) {
      const c = this.claims[k];
      this.st.singletons.restoreEntry(c.sk.mode, c.sk.key, c.claim, c.prev);
    }
    for (const off of this.replacedBy.values()) this.st.unfreeze(off, now);
    this.d.reject(err);
  }
}
