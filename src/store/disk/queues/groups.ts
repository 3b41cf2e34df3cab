// SPDX-License-Identifier: Apache-2.0
/**
 * Groups of a work queue (`EnqueueOptions.group`, `QueueConfig.groupConcurrency` /
 * `groupRateLimit`): the READY jobs of each group in a heap of their own, served round-robin
 * across groups (GRP-Q2), each group capped in leases (GRP-Q1) and in starts per window.
 *
 * Pure like job-state.ts (no I/O, no timers, clocks passed in). `JobState.groups` is null until
 * the queue sees its first grouped job, so a queue that never uses groups pays one null check
 * per ready push and pop. From then on ungrouped jobs are one more member of the rotation (their
 * heap is the queue's main ready heap), never capped.
 *
 * A group is in exactly one place: the ring (READY entries, room to be served), parked at its
 * concurrency cap (back in the ring when one of its leases ends), parked out of rate-limit room
 * (back when its window opens: `nextOpening` tells the queue when to wake the workers), or idle
 * (no READY entries). Heaps use lazy deletion as the main one does: an entry is checked against
 * the table when popped, so parking a group pops nothing and loses nothing.
 *
 * Memory: per live grouped job one map entry; per group an object and its heap, dropped once it
 * has no live job, no lease and (with `groupRateLimit`) an empty window.
 */
import { OffsetHeap } from "./heap.js";
import { RateLimiter } from "./rate-limit.js";

/** `QueueSettings.groupConcurrency` (0: no cap) and `groupRateLimit` (null: none). */
export interface GroupLimits {
  concurrency: number;
  rate: { max: number; durationMs: number } | null;
}

export const NO_GROUP_LIMITS: GroupLimits = { concurrency: 0, rate: null };

/** Pops a heap's best READY offset with the queue's checks (JobState.popFrom), -1 when only stale entries are left. */
export interface ReadyTaker {
  popFrom(h: OffsetHeap, now: number): number;
}

const enum Where {
  IDLE,
  RING,
  CAPPED,
  RATED,
}

class Group {
  /** READY offsets of the group by (rank, offset); stale entries are skipped when popped. */
  readonly heap: OffsetHeap;
  /** Leases held (granted or restored, not ended): GRP-Q1 caps it. */
  inFlight = 0;
  /** Live jobs of the group (any non-terminal status). */
  live = 0;
  where = Where.IDLE;
  limiter: RateLimiter | null = null;
  /** Monotonic ms of the group's last counted start (its window is empty `durationMs` later). */
  lastStart = -Infinity;
  /** An entry of it waits in `idle` (at most one). */
  idleQueued = false;
  constructor(
    readonly id: string,
    readonly num: number,
    /** The ungrouped jobs' member: never capped, never dropped. */
    readonly free: boolean,
    heap: OffsetHeap | null,
  ) {
    this.heap = heap ?? new OffsetHeap(16);
  }
}

export class GroupReady {
  /** Groups of live jobs (or of a window not yet empty), by id and by number. */
  private readonly byId = new Map<string, Group>();
  private readonly byNum = new Map<number, Group>();
  /** Group of each live grouped job. */
  private readonly groupOf = new Map<number, Group>();
  /** Groups with READY entries and room, served in turn from `head`. */
  private ring: Group[] = [];
  private head = 0;
  /** (monotonic ms its window opens, num) of groups parked out of rate-limit room. */
  private readonly rated = new OffsetHeap(16);
  /** (monotonic ms its window is empty, num) of groups without jobs whose window still counts. */
  private readonly idle = new OffsetHeap(16);
  private readonly ungrouped: Group;
  private nextNum = 1;
  private limits: GroupLimits;

  /** `main`: the queue's ready heap, which keeps holding ungrouped jobs. */
  constructor(main: OffsetHeap, limits: GroupLimits) {
    this.limits = limits;
    this.ungrouped = new Group("", 0, true, main);
    if (main.size > 0) this.enter(this.ungrouped);
  }

  /** Groups known (with live jobs, leases or a window that still counts); for tests and stats. */
  get size(): number {
    return this.byId.size;
  }

  /** Live grouped jobs. */
  get jobs(): number {
    return this.groupOf.size;
  }

  /** The group of a live job, or null. */
  groupName(off: number): string | null {
    return this.groupOf.get(off)?.id ?? null;
  }

  /** [offset, group] of every live grouped job (the snapshot's `groups`). */
  entries(): [number, string][] {
    const out: [number, string][] = [];
    for (const [off, g] of this.groupOf) out.push([off, g.id]);
    return out;
  }

  /** Job `off` belongs to `id` (before its first ready push; again on recovery: idempotent). */
  assign(off: number, id: string): void {
    if (this.groupOf.has(off)) return;
    let g = this.byId.get(id);
    if (g === undefined) {
      g = new Group(id, this.nextNum++, false, null);
      if (this.limits.rate !== null) g.limiter = new RateLimiter(this.limits.rate.max, this.limits.rate.durationMs);
      this.byId.set(id, g);
      this.byNum.set(g.num, g);
    }
    g.live++;
    this.groupOf.set(off, g);
  }

  /** Job `off` became READY with heap rank `rank`. */
  push(off: number, rank: number): void {
    const g = this.groupOf.get(off) ?? this.ungrouped;
    g.heap.push(rank, off);
    if (g.where !== Where.IDLE) return;
    if (this.atCap(g)) g.where = Where.CAPPED;
    else this.enter(g);
  }

  /** Whether some group may have a READY job to serve now (after `begin`). */
  hasReady(): boolean {
    return this.head < this.ring.length;
  }

  /**
   * Starts a grant round at `mono`: groups whose rate window opened rejoin the ring, and groups
   * without jobs whose window emptied are dropped (memory).
   */
  begin(mono: number): void {
    while (this.rated.size > 0 && this.rated.peekPriority() <= mono) {
      const g = this.byNum.get(this.rated.pop());
      if (g === undefined || g.where !== Where.RATED) continue;
      if (g.limiter !== null && g.limiter.room(mono) <= 0) this.rated.push(g.limiter.nextOpening(), g.num);
      else this.enter(g);
    }
    while (this.idle.size > 0 && this.idle.peekPriority() <= mono) {
      const g = this.byNum.get(this.idle.pop());
      if (g === undefined) continue;
      g.idleQueued = false;
      this.maybeDrop(g, mono);
    }
  }

  /**
   * The next READY offset, round-robin across groups (GRP-Q2): the ring's first group gives its
   * best job (`take.popFrom` pops its heap with the queue's checks) and goes to the back. A
   * group at its cap or out of window room leaves the ring with its entries kept (GRP-Q1).
   * -1 when no group can serve.
   */
  pop(mono: number, take: ReadyTaker, now: number): number {
    while (this.head < this.ring.length) {
      const g = this.ring[this.head++];
      if (this.head > 1024 && this.head * 2 > this.ring.length) {
        this.ring = this.ring.slice(this.head);
        this.head = 0;
      }
      if (g.where !== Where.RING) continue;
      if (this.atCap(g)) {
        g.where = Where.CAPPED;
        continue;
      }
      if (g.limiter !== null && g.limiter.room(mono) <= 0) {
        g.where = Where.RATED;
        this.rated.push(g.limiter.nextOpening(), g.num);
        continue;
      }
      const off = g.heap.size > 0 ? take.popFrom(g.heap, now) : -1;
      if (off < 0) {
        g.where = Where.IDLE;
        continue;
      }
      if (!g.free) {
        g.inFlight++;
        if (g.limiter !== null) {
          g.limiter.take(1, mono);
          g.lastStart = mono;
        }
      }
      if (g.heap.size > 0) this.ring.push(g);
      else g.where = Where.IDLE;
      return off;
    }
    return -1;
  }

  /** A lease of `off` restored on recovery counts against its group (GRP-Q1). */
  restored(off: number): void {
    const g = this.groupOf.get(off);
    if (g !== undefined) g.inFlight++;
  }

  /**
   * A lease of `off` ended. Returns true when its group was parked at its cap with READY
   * entries and is served again (the queue wakes its workers).
   */
  leaseEnded(off: number): boolean {
    const g = this.groupOf.get(off);
    if (g === undefined || g.inFlight === 0) return false;
    g.inFlight--;
    if (g.where === Where.CAPPED && !this.atCap(g)) {
      this.enter(g);
      return true;
    }
    if (g.live === 0) this.maybeDrop(g, -Infinity);
    return false;
  }

  /** Job `off` is terminal (or gone): it leaves its group. */
  finished(off: number): void {
    const g = this.groupOf.get(off);
    if (g === undefined) return;
    this.groupOf.delete(off);
    g.live--;
    this.maybeDrop(g, -Infinity);
  }

  /** Every job left (purge): leases were ended before; windows keep counting. */
  purge(): void {
    this.groupOf.clear();
    this.ring = [];
    this.head = 0;
    if (this.ungrouped.heap.size > 0) this.ungrouped.heap.clear();
    this.ungrouped.where = Where.IDLE;
    for (const g of [...this.byId.values()]) {
      g.heap.clear();
      g.live = 0;
      g.where = Where.IDLE;
      this.maybeDrop(g, -Infinity);
    }
  }

  /** After recovery: keeps only live jobs' entries (`live(off)`), drops empty groups. */
  retainLive(live: (off: number) => boolean): void {
    for (const [off, g] of [...this.groupOf]) {
      if (live(off)) continue;
      this.groupOf.delete(off);
      g.live--;
    }
    for (const g of [...this.byId.values()]) this.maybeDrop(g, -Infinity);
  }

  /**
   * Changed limits apply to the next grant: groups parked at a cap they are now under, or for a
   * limit that was lifted, rejoin the ring. Returns true when any did.
   */
  configure(limits: GroupLimits): boolean {
    const r = limits.rate;
    this.limits = limits;
    let woke = false;
    for (const g of this.byId.values()) {
      if (r === null) g.limiter = null;
      else if (g.limiter === null) g.limiter = new RateLimiter(r.max, r.durationMs);
      else g.limiter.configure(r);
      // A rated group rejoins at once: `pop` parks it again if its window is still full.
      if ((g.where === Where.CAPPED && !this.atCap(g)) || g.where === Where.RATED) {
        this.enter(g);
        woke = true;
      }
    }
    return woke;
  }

  /** Monotonic ms when the earliest rate-parked group's window opens (Infinity: none). */
  nextOpening(): number {
    while (this.rated.size > 0) {
      const g = this.byNum.get(this.rated.peekOffset());
      if (g !== undefined && g.where === Where.RATED) return this.rated.peekPriority();
      this.rated.pop();
    }
    return Infinity;
  }

  /** Age of the oldest READY job across the groups (`ageOf` checks a heap's top, 0 when none). */
  oldestAge(ageOf: (h: OffsetHeap) => number): number {
    let age = 0;
    for (const g of this.byId.values()) if (g.heap.size > 0) age = Math.max(age, ageOf(g.heap));
    return age;
  }

  /** Bytes held by the group heaps (memoryBytes). */
  get capacityBytes(): number {
    let n = this.rated.capacityBytes + this.idle.capacityBytes;
    for (const g of this.byId.values()) n += g.heap.capacityBytes;
    return n;
  }

  private atCap(g: Group): boolean {
    return !g.free && this.limits.concurrency > 0 && g.inFlight >= this.limits.concurrency;
  }

  private enter(g: Group): void {
    g.where = Where.RING;
    this.ring.push(g);
  }

  /**
   * Drops a group with no job and no lease once its rate window (if any) is empty: a group
   * forgotten earlier would start its next job with a fresh window. `mono` -Infinity (unknown):
   * a group with a window is checked again in `begin`.
   */
  private maybeDrop(g: Group, mono: number): void {
    if (g.free || g.live > 0 || g.inFlight > 0 || this.byId.get(g.id) !== g) return;
    if (g.limiter !== null && g.lastStart > -Infinity) {
      const empty = g.lastStart + (this.limits.rate?.durationMs ?? 0);
      if (empty > mono) {
        if (!g.idleQueued) {
          g.idleQueued = true;
          this.idle.push(empty, g.num);
        }
        return;
      }
    }
    g.heap.clear();
    g.where = Where.IDLE;
    this.byId.delete(g.id);
    this.byNum.delete(g.num);
  }
}
