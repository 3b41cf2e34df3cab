// SPDX-License-Identifier: Apache-2.0
/**
 * Dedupe ids seen within their window: the user's (`dedupeWindowMs`, bounded by
 * `maxDedupeEntries`) and the broker's own `sys:` ids of dead-letter moves and redrives (7 days,
 * what makes a resumed move idempotent, Q-4). Durable through the job records (`sluice-dd`)
 * and the snapshot. One window per class, so insertion order is expiry order.
 */
import { SCHEDULE_DEDUPE_PREFIX, SYSTEM_DEDUPE_PREFIX } from "../../queue-store.js";
import type { Deferred } from "./journal.js";

/** Dedupe window for the broker's own ids (dead-letter moves, redrives): 7 days. */
export const SYSTEM_DEDUPE_WINDOW_MS = 7 * 86_400_000;
/** Expired entries dropped per sweep at most (sweeps run on every enqueue with dedupe ids). */
const SWEEP_MAX = 1000;

export interface DedupeEntry {
  off: number;
  exp: number;
  /** While the claiming job's append is in flight: its group's base-offset promise and index. */
  wait: Deferred<number> | null;
  idx: number;
}

export function isSystemDedupeId(id: string): boolean {
  return id.startsWith(SYSTEM_DEDUPE_PREFIX);
}

export class DedupeTable {
  private readonly user = new Map<string, DedupeEntry>();
  private readonly system = new Map<string, DedupeEntry>();
  /** Per schedule (`sys:sch:<name>`), its latest tick's id: older ticks are forgotten (SCHED-2). */
  private readonly latestTick = new Map<string, string>();

  constructor(private windowMs: number) {}

  setWindow(ms: number): void {
    this.windowMs = ms;
  }

  get size(): number {
    return this.user.size + this.system.size;
  }

  get userSize(): number {
    return this.user.size;
  }

  /** Window of an id (0: dedupe off for it). */
  window(id: string): number {
    return isSystemDedupeId(id) ? SYSTEM_DEDUPE_WINDOW_MS : this.windowMs;
  }

  private map(id: string): Map<string, DedupeEntry> {
    return isSystemDedupeId(id) ? this.system : this.user;
  }

  get(id: string): DedupeEntry | undefined {
    const e = this.map(id).get(id);
    if (e !== undefined || !id.startsWith(SCHEDULE_DEDUPE_PREFIX)) return e;
    // SCHED-2: a schedule's ticks are stored in tick order (the scheduler enqueues them in order
    // and never re-enqueues a tick older than one stored), so a tick older than the schedule's
    // latest stored one was stored: answered as a duplicate of that one.
    const cut = id.lastIndexOf(":");
    const latest = this.latestTick.get(id.slice(0, cut));
    if (latest === undefined || Number(latest.slice(cut + 1)) <= Number(id.slice(cut + 1))) return undefined;
    const le = this.system.get(latest);
    return le !== undefined && le.wait === null ? le : undefined;
  }

  set(id: string, e: DedupeEntry): void {
    this.map(id).set(id, e);
    // SCHED-2: a schedule's ticks only move forward, so only its latest tick id must be
    // remembered; keeping one entry per schedule bounds memory for fast schedules.
    if (id.startsWith(SCHEDULE_DEDUPE_PREFIX)) {
      const cut = id.lastIndexOf(":");
      const sched = id.slice(0, cut);
      const prev = this.latestTick.get(sched);
      if (prev === undefined || Number(id.slice(cut + 1)) >= Number(prev.slice(cut + 1))) {
        if (prev !== undefined && prev !== id) this.system.delete(prev);
        this.latestTick.set(sched, id);
      } else {
        this.system.delete(id); // an older tick (recovery out of order): the later one stands
      }
    }
  }

  delete(id: string): void {
    this.map(id).delete(id);
  }

  /** A stored job's id (recovery): remembered while its window lasts. */
  restore(id: string, off: number, enqueuedAt: number, now: number): void {
    const exp = enqueuedAt + this.window(id);
    if (exp > now) this.set(id, { off, exp, wait: null, idx: 0 });
  }

  sweep(now: number): void {
    // Entries are inserted roughly in expiry order (one window per class); stop at the first live one.
    let n = 0;
    for (const m of [this.user, this.system]) {
      for (const [id, e] of m) {
        if (e.exp > now || n++ > SWEEP_MAX) break;
        if (e.wait === null) m.delete(id);
      }
    }
  }

  /** Stored entries still inside their window: [id, offset, expiry]. */
  snapshot(now: number): [string, number, number][] {
    const out: [string, number, number][] = [];
    for (const m of [this.user, this.system]) for (const [id, e] of m) if (e.off >= 0 && e.exp > now) out.push([id, e.off, e.exp]);
    return out;
  }

  load(entries: [string, number, number][]): void {
    for (const [id, off, exp] of entries) this.set(id, { off, exp, wait: null, idx: 0 });
  }
}
