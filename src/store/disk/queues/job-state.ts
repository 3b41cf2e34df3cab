// SPDX-License-Identifier: Apache-2.0
/**
 * The in-memory state of one queue and its transitions: the job table (TBL-1), the ready and
 * delay heaps, the per-key chains (KEY-1), the leases and per-job side maps, and the counters
 * behind `stats()`. Pure: no I/O, no timers, clocks passed in, so it can be driven by a model
 * test (test/queue-state-model.test.ts). The queue (queue-instance.ts) journals what these
 * transitions decide and schedules the timers.
 *
 * Status meaning (table.ts): READY in the ready heap; DELAYED in the delay heap; BLOCKED held
 * behind its key's head; WAITING a flow's parent waiting for its children (FLOW-2); INFLIGHT
 * leased (exactly the rows with an entry in `leases`, lease.ts); MOVING being dead-lettered (an
 * entry in `moving`) or redriven; DONE / DEAD terminal.
 */
import type { AttemptRecord } from "../../../queues/types.js";
import type { FlowLink, GrantRequest, Lease, LeaseConsumer } from "../../queue-store.js";
import { DiskLease, type HeldCount } from "./lease.js";
import { KeyChains } from "./chains.js";
import { Flows, type ChildOutcomeRecord } from "./flows.js";
import { GroupReady, NO_GROUP_LIMITS, type GroupLimits } from "./groups.js";
import { OffsetHeap } from "./heap.js";
import { RetainedJobs } from "./retained.js";
import { Singletons } from "./singletons.js";
import { isTerminal, JobTable, St } from "./table.js";

/** A child's outcome when acked (with the result as JSON text, if any). */
function acked(result: string | undefined): ChildOutcomeRecord {
  return result === undefined ? { state: "completed" } : { state: "completed", result };
}

/** History entries kept per job (the most recent); bounds memory of repeatedly failing jobs. */
export const MAX_HISTORY = 20;
/** Attempts fit the table's u16 column. */
const MAX_ATTEMPT = 65535;

/** What DLQ_INTENT stores: everything about the failure not derivable from the record. */
export interface DlqIntent {
  at: number;
  attempts: number;
  errorClass: string;
  error: string;
  codeVersion?: string;
  history: AttemptRecord[];
}


/** A lease as journaled (restored on recovery before its holder is known). */
export interface LeaseRecord {
  attempt: number;
  deadlineWall: number;
  consumer: string;
}

export class JobState {
  table: JobTable;
  readonly ready = new OffsetHeap();
  readonly delayed = new OffsetHeap();
  readonly chains = new KeyChains();
  readonly leases = new Map<number, DiskLease>();
  readonly history = new Map<number, AttemptRecord[]>();
  readonly moving = new Map<number, DlqIntent>();
  /**
   * Priorities of live jobs enqueued with one (JOB-1), null until the queue sees the first:
   * a queue that never uses priorities pays one null check per ready push and nothing else.
   * The ready heap orders by (-priority, offset), so within a priority it is FIFO.
   */
  prio: Map<number, number> | null = null;
  /** Expiry (wall-clock ms) of live jobs enqueued with one, and a heap of them (JOB-3); null until used. */
  expiry: Map<number, number> | null = null;
  expiring: OffsetHeap | null = null;
  /** READY jobs found expired when popped for a grant: the queue expires them (JOB-3). */
  expiredFound: number[] = [];
  /** Parents and children of flows (FLOW-1, FLOW-2), null until the queue stores the first. */
  flows: Flows | null = null;
  /**
   * Groups (groups.ts, GRP-Q1/GRP-Q2), null until the queue sees its first grouped job: a queue
   * that never uses groups pays one null check per ready push and pop.
   */
  groups: GroupReady | null = null;
  private groupLimits: GroupLimits = NO_GROUP_LIMITS;
  /** Singleton, debounce and throttle keys (singletons.ts). */
  readonly singletons = new Singletons();
  /** Completed and dead-lettered jobs kept for `getJob` (retained.ts; off unless the queue has
   * `resultRetentionMs`). */
  readonly retained = new RetainedJobs();
  /** Leases held per consumer (granted and not ended): `GrantRequest.upTo` caps it. Each lease
   * points at its consumer's counter, so ending one costs no lookup. */
  private readonly held = new Map<LeaseConsumer, HeldCount>();
  /** Rows per status. */
  readonly counts = new Float64Array(9);
  live = 0;
  liveBytes = 0;
  redeliveries = 0;
  retries = 0;
  completed = 0;
  deadLettered = 0;
  /** Jobs whose record could not be read back (damaged storage): never delivered. */
  unreadable = 0;
  private readonly ackBuckets = new Float64Array(10);
  private ackBucketSec = 0;
  private rr = 0;

  constructor(table: JobTable) {
    this.table = table;
  }

  // ─────────────────────────────── rows ───────────────────────────────

  setStatus(i: number, s: St): void {
    this.counts[this.table.status[i]]--;
    this.table.status[i] = s;
    this.counts[s]++;
  }

  /** The ready heap's rank of `off`: -priority (0 for queues that never used priorities). */
  rank(off: number): number {
    return this.prio === null ? 0 : -(this.prio.get(off) ?? 0);
  }

  /** Records a job's priority (before its row is added or rebuilt, so its first push ranks it). */
  setPriority(off: number, p: number): void {
    if (p > 0) (this.prio ??= new Map()).set(off, p);
  }

  /** Records a job's group (before its row is added or rebuilt, as `setPriority`). */
  setGroup(off: number, group: string): void {
    (this.groups ??= new GroupReady(this.ready, this.groupLimits)).assign(off, group);
  }

  /** `groupConcurrency` / `groupRateLimit` changed: true when parked groups may be served now. */
  configureGroups(limits: GroupLimits): boolean {
    this.groupLimits = limits;
    return this.groups !== null && this.groups.configure(limits);
  }

  /** Every READY push goes through here: the main heap, or its group's (GRP-Q2). */
  private pushReady(off: number): void {
    if (this.groups === null) this.ready.push(this.rank(off), off);
    else this.groups.push(off, this.rank(off));
  }

  /** Records a job's expiry (JOB-3). */
  setExpiry(off: number, at: number): void {
    if (at <= 0) return;
    (this.expiry ??= new Map()).set(off, at);
    const h = (this.expiring ??= new OffsetHeap(64));
    h.push(at, off);
    // Entries of jobs that finished before their expiry stay until it; rebuilt when they dominate.
    if (h.size > 2 * this.expiry.size + 1024) {
      h.clear();
      for (const [o, a] of this.expiry) h.push(a, o);
    }
  }

  /** Whether `off` has an expiry that passed at `now` and has not started (attempts 0). */
  isExpired(off: number, now: number): boolean {
    if (this.expiry === null) return false;
    const at = this.expiry.get(off);
    return at !== undefined && at <= now && this.table.attempts[this.table.idx(off)] === 0;
  }

  /** Whether `off` is a live job that no worker holds (waiting, delayed, blocked by its key). */
  isWaiting(off: number): boolean {
    const s = this.statusOf(off);
    return s === St.READY || s === St.DELAYED || s === St.BLOCKED || s === St.WAITING;
  }

  /**
   * Holds a waiting job back while a debounce enqueue that replaces it is being written (JOB-2):
   * MOVING, so it is neither granted, removed nor expired meanwhile.
   */
  freeze(off: number): void {
    this.setStatus(this.table.idx(off), St.MOVING);
  }

  /** The replacing enqueue stored nothing: the job waits again as before. */
  unfreeze(off: number, now: number): void {
    if (this.statusOf(off) === St.MOVING && !this.moving.has(off)) this.makeVisible(off, this.table.visibleAt[this.table.idx(off)], now);
  }

  /** A newly stored job (its offset is the table's end). */
  addJob(off: number, key: string | null, deliverAt: number, enqueuedAt: number, size: number, now: number): void {
    let chain = -1;
    let isHead = true;
    if (key !== null) [chain, isHead] = this.chains.push(key, off);
    // FLOW-2: a parent waits for its children first (its key's turn is checked when it wakes).
    const s = this.flows !== null && this.flows.waits(off) ? St.WAITING : !isHead ? St.BLOCKED : deliverAt <= now ? St.READY : St.DELAYED;
    this.table.add(off, s, deliverAt, enqueuedAt, chain, size);
    this.counts[s]++;
    this.live++;
    this.liveBytes += size;
    if (s === St.READY) this.pushReady(off);
    else if (s === St.DELAYED) this.delayed.push(deliverAt, off);
  }

  /**
   * A job lost to damaged storage (recovery could not read its record): a terminal row keeps
   * the table contiguous (TBL-1) and the floor can pass it.
   */
  addUnreadable(off: number, now: number): void {
    this.table.add(off, St.DEAD, now, now, -1, 0);
    this.counts[St.DEAD]++;
    this.unreadable++;
  }

  /** Makes row `off` visible at `visibleAt` (READY now or DELAYED), respecting KEY-1. */
  makeVisible(off: number, visibleAt: number, now: number): void {
    const t = this.table;
    const i = t.idx(off);
    t.visibleAt[i] = visibleAt;
    const c = t.chain[i];
    if (c >= 0 && this.chains.head(c) !== off) {
      this.setStatus(i, St.BLOCKED);
      return;
    }
    if (visibleAt <= now) {
      this.setStatus(i, St.READY);
      this.pushReady(off);
    } else {
      this.setStatus(i, St.DELAYED);
      this.delayed.push(visibleAt, off);
    }
  }

  /** A flow job's link (before its row is added, so a waiting parent is never READY). */
  linkFlow(off: number, f: FlowLink): void {
    (this.flows ??= new Flows()).link(off, f);
  }

  /**
   * Terminal transition (DONE or DEAD): frees the row and unblocks the key's next job, or a
   * flow's parent whose last child this was (returns true when one became grantable).
   * `outcome`: what a flow's parent sees of it (a DONE without one was removed; a DEAD failed).
   */
  finish(off: number, s: St.DONE | St.DEAD, now: number, outcome?: ChildOutcomeRecord): boolean {
    const t = this.table;
    const i = t.idx(off);
    const c = t.chain[i];
    let unblocked = false;
    if (this.flows !== null) unblocked = this.flowFinished(off, s, now, outcome);
    this.setStatus(i, s);
    this.live--;
    this.liveBytes -= t.size[i];
    this.history.delete(off);
    this.moving.delete(off);
    if (this.prio !== null) this.prio.delete(off);
    if (this.expiry !== null) this.expiry.delete(off);
    if (this.groups !== null) this.groups.finished(off);
    if (this.singletons.tracking) this.singletons.finished(off);
    if (c >= 0) {
      const next = this.chains.remove(c, off);
      if (next >= 0 && t.has(next)) {
        const ni = t.idx(next);
        if (t.status[ni] === St.BLOCKED) {
          this.makeVisible(next, t.visibleAt[ni], now);
          unblocked = true;
        }
      }
    }
    if (off === t.floor) t.advanceFloor();
    return unblocked;
  }

  /** FLOW-2: tells a finished job's parent; wakes it when this was its last child. */
  private flowFinished(off: number, s: St.DONE | St.DEAD, now: number, outcome: ChildOutcomeRecord | undefined): boolean {
    const flows = this.flows!;
    let o = outcome;
    if (o === undefined) {
      const m = this.moving.get(off);
      o = s === St.DONE ? { state: "removed" } : { state: "failed", error: m === undefined ? "unreadable" : m.error || m.errorClass };
    }
    const p = flows.finished(off, o);
    if (p < 0 || this.statusOf(p) !== St.WAITING) return false;
    this.makeVisible(p, Math.max(this.table.visibleAt[this.table.idx(p)], now), now);
    return this.statusOf(p) === St.READY;
  }

  /** Status of `off`, or 0 when it has no row (below the floor or past the end). */
  statusOf(off: number): number {
    const t = this.table;
    return t.has(off) ? t.status[t.idx(off)] : 0;
  }

  pushHistory(off: number, rec: AttemptRecord): void {
    let h = this.history.get(off);
    if (h === undefined) this.history.set(off, (h = []));
    // Replay may repeat an event already reflected in the snapshot (JRN-1): keep history idempotent.
    if (h.some((x) => x.attempt === rec.attempt && x.at === rec.at)) return;
    h.push(rec);
    if (h.length > MAX_HISTORY) h.splice(0, h.length - MAX_HISTORY);
  }

  /** Delayed jobs whose time has come become READY. */
  promoteDue(now: number): void {
    const t = this.table;
    while (this.delayed.size > 0 && this.delayed.peekPriority() <= now) {
      const at = this.delayed.peekPriority();
      const off = this.delayed.pop();
      if (!t.has(off)) continue;
      const i = t.idx(off);
      if (t.status[i] !== St.DELAYED || t.visibleAt[i] !== at) continue;
      this.setStatus(i, St.READY);
      this.pushReady(off);
    }
  }

  /** The next READY offset (lazy deletion of stale heap entries), or -1. Expired jobs are
   * set aside in `expiredFound` (JOB-3: never granted once their expiry passed). */
  private popReady(now: number, mono: number): number {
    return this.groups === null ? this.popFrom(this.ready, now) : this.groups.pop(mono, this, now);
  }

  /** `popReady` from one heap (the main one, or a group's: groups.ts calls it). */
  popFrom(h: OffsetHeap, now: number): number {
    const t = this.table;
    while (h.size > 0) {
      const o = h.pop();
      if (!t.has(o) || t.status[t.idx(o)] !== St.READY) continue;
      if (this.expiry !== null && this.isExpired(o, now)) {
        this.expiredFound.push(o);
        continue;
      }
      return o;
    }
    return -1;
  }

  // ─────────────────────────────── leases ───────────────────────────────

  heldBy(c: LeaseConsumer): number {
    return this.held.get(c)?.n ?? 0;
  }

  private counterOf(c: LeaseConsumer): HeldCount {
    let h = this.held.get(c);
    if (h === undefined) this.held.set(c, (h = { consumer: c, n: 0 }));
    return h;
  }

  /**
   * Leases READY jobs, one per request in turn (round-robin, starting one further each call),
   * until requests are capped, nothing is READY or `maxInFlight` leases exist. Attempts rise by
   * one (the caller journals DELIVER for each before handing them out, Q-1).
   */
  grant(requests: readonly GrantRequest[], maxInFlight: number, wallNow: number, monoNow: number): DiskLease[][] {
    const n = requests.length;
    const out: DiskLease[][] = new Array(n);
    // Room per request, read once.
    const room = new Array<number>(n);
    const counters = new Array<HeldCount>(n);
    let open = 0;
    for (let k = 0; k < n; k++) {
      out[k] = [];
      counters[k] = this.counterOf(requests[k].consumer);
      room[k] = requests[k].upTo - counters[k].n;
      if (room[k] > 0) open++;
    }
    const t = this.table;
    if (this.groups !== null) this.groups.begin(monoNow);
    while (open > 0 && (this.groups === null ? this.ready.size > 0 : this.groups.hasReady()) && this.leases.size < maxInFlight) {
      for (let k = 0; k < n && this.leases.size < maxInFlight; k++) {
        const idx = (this.rr + k) % n;
        if (room[idx] <= 0) continue;
        const off = this.popReady(wallNow, monoNow);
        if (off < 0) break;
        const consumer = requests[idx].consumer;
        const i = t.idx(off);
        const attempt = Math.min(MAX_ATTEMPT, t.attempts[i] + 1);
        t.attempts[i] = attempt;
        if (attempt > 1) this.redeliveries++;
        this.setStatus(i, St.INFLIGHT);
        const ms = consumer.leaseMs;
        const lease = new DiskLease(off, attempt, monoNow + ms, wallNow + ms, monoNow, consumer, consumer.consumerId, consumer.codeVersion);
        lease.held = counters[idx];
        counters[idx].n++;
        this.leases.set(off, lease);
        out[idx].push(lease);
        if (--room[idx] === 0) open--;
      }
      this.rr++;
    }
    for (const h of counters) if (h.n === 0) this.held.delete(h.consumer);
    return out;
  }

  /** A lease restored from the journal (its holder is gone; it runs to its stored deadline). */
  restoreLease(off: number, r: LeaseRecord | undefined, attempts: number, wallNow: number, monoNow: number): void {
    const deadlineWall = r?.deadlineWall ?? wallNow;
    const attempt = r?.attempt ?? attempts;
    const lease = new DiskLease(off, attempt, monoNow + Math.max(0, deadlineWall - wallNow), deadlineWall, monoNow, null, r?.consumer ?? "(before restart)", undefined);
    this.leases.set(off, lease);
    // GRP-Q1: restored leases count against their group's cap.
    if (this.groups !== null) this.groups.restored(off);
  }

  /** The current lease of `lease`'s job if it is `lease` itself (Q-3), else null. */
  current(lease: Lease): DiskLease | null {
    const cur = this.leases.get(Number(lease.jobId));
    return cur !== undefined && cur === lease && !cur.ended ? cur : null;
  }

  /**
   * Ends a lease (every way a lease ends goes through here). Returns true when this made a
   * group parked at its cap grantable again (GRP-Q1: the caller wakes the workers).
   */
  endLease(l: DiskLease): boolean {
    l.ended = true;
    this.leases.delete(l.off);
    const h = l.held;
    if (h !== null && --h.n === 0) this.held.delete(h.consumer);
    return this.groups !== null && this.groups.leaseEnded(l.off);
  }

  /** Returns true when the ack made the key's next job grantable (KEY-1), or its group's
   * (GRP-Q1). `result`: JSON text kept with the completion (when the queue retains results). */
  ack(l: DiskLease, now: number, mono: number, result?: string): boolean {
    const freed = this.endLease(l);
    this.keepCompleted(l.off, now, l.attempt, result);
    const unblocked = this.finish(l.off, St.DONE, now, acked(result));
    this.countAck(mono);
    return unblocked || freed;
  }

  /** Retains the outcome of an ack (before `finish` drops the job's history). */
  keepCompleted(off: number, at: number, attempts: number, result: string | undefined): void {
    if (this.retained.retentionMs <= 0) return;
    // Expired outcomes leave from the front as new ones arrive (memory, Q-10).
    this.retained.prune(at);
    const last = this.history.get(off)?.at(-1);
    this.retained.record(off, {
      state: "completed",
      at,
      attempts,
      ...(result !== undefined ? { result } : {}),
      ...(last !== undefined ? { lastError: last.error || last.errorClass } : {}),
    });
  }

  /** Retains the outcome of a finished dead-letter move (before `finish` drops its intent). */
  keepDead(off: number, at: number): void {
    const intent = this.moving.get(off);
    if (this.retained.retentionMs <= 0 || intent === undefined) return;
    this.retained.record(off, { state: "dead", at, attempts: intent.attempts, lastError: intent.error || intent.errorClass });
  }

  /** A failed attempt: history, then visible again at `visibleAt`. */
  retry(l: DiskLease, visibleAt: number, rec: AttemptRecord, now: number): void {
    this.endLease(l);
    this.pushHistory(l.off, rec);
    this.retries++;
    this.makeVisible(l.off, visibleAt, now);
  }

  /** Gives the job back at once; `counted` false undoes this delivery's attempt. */
  release(l: DiskLease, counted: boolean, now: number): void {
    this.endLease(l);
    // Never handed to any consumer: this delivery is not an attempt. (Replay may still see
    // its DELIVER and count it; attempts can skip after a restart, never go back.)
    if (!counted) this.uncount(l);
    this.makeVisible(l.off, now, now);
  }

  /**
   * Gives the delivery back (RATE-2, `job.retryAfter`): visible again at `visibleAt`, and this
   * delivery is not an attempt (no history, the count goes back by one).
   */
  giveBack(l: DiskLease, visibleAt: number, now: number): void {
    this.endLease(l);
    this.uncount(l);
    this.makeVisible(l.off, visibleAt, now);
  }

  /** Undoes the attempt `l` counted, if it is still the job's latest. */
  private uncount(l: DiskLease): void {
    const i = this.table.idx(l.off);
    if (this.table.attempts[i] === l.attempt && l.attempt > 0) {
      this.table.attempts[i] = l.attempt - 1;
      if (l.attempt > 1) this.redeliveries--;
    }
  }

  /**
   * The lease ran out (LEASE-3): the attempt is recorded; at `maxAttempts` the job is to be
   * dead-lettered (returns true, the caller starts the move), else it is visible again at once.
   */
  expire(l: DiskLease, rec: AttemptRecord, maxAttempts: number, now: number): boolean {
    this.endLease(l);
    this.pushHistory(l.off, rec);
    if (l.attempt >= maxAttempts) return true;
    this.makeVisible(l.off, now, now);
    return false;
  }

  /** Dead-letter move started: not deliverable until the move lands. */
  startMove(off: number, intent: DlqIntent): void {
    this.setStatus(this.table.idx(off), St.MOVING);
    this.moving.set(off, intent);
  }

  /** The move landed (or the job is dropped without a dead-letter queue). */
  finishMove(off: number, now: number): boolean {
    if (this.statusOf(off) !== St.MOVING) return false;
    this.keepDead(off, now);
    this.finish(off, St.DEAD, now);
    this.deadLettered++;
    return true;
  }

  /** Every live row below `end` becomes DONE; returns the leases that ended (to be told). */
  purge(): { purged: number; leases: DiskLease[] } {
    const t = this.table;
    const ended: DiskLease[] = [];
    let n = 0;
    t.forEachLive((o, i) => {
      const l = this.leases.get(o);
      if (l) {
        this.endLease(l);
        ended.push(l);
      }
      this.counts[t.status[i]]--;
      t.status[i] = St.DONE;
      this.counts[St.DONE]++;
      n++;
    });
    this.live = 0;
    this.liveBytes = 0;
    this.history.clear();
    this.moving.clear();
    this.prio?.clear();
    this.expiry?.clear();
    this.expiring?.clear();
    this.groups?.purge();
    this.singletons.clear();
    this.flows?.clear();
    this.chains.clear();
    this.ready.clear();
    this.delayed.clear();
    t.advanceFloor();
    return { purged: n, leases: ended };
  }

  /** Earliest monotonic lease deadline, or Infinity. */
  nextLeaseDeadline(): number {
    let next = Infinity;
    for (const l of this.leases.values()) if (l.deadlineMono < next) next = l.deadlineMono;
    return next;
  }

  /** Leases whose monotonic deadline has passed. */
  expiredLeases(mono: number): DiskLease[] {
    const out: DiskLease[] = [];
    for (const l of this.leases.values()) if (l.deadlineMono <= mono) out.push(l);
    return out;
  }

  // ─────────────────────────────── counters ───────────────────────────────

  private countAck(mono: number): void {
    this.completed++;
    const sec = Math.floor(mono / 1000);
    if (sec !== this.ackBucketSec) {
      for (let s = this.ackBucketSec + 1; s <= sec && s <= this.ackBucketSec + 10; s++) this.ackBuckets[s % 10] = 0;
      this.ackBucketSec = sec;
    }
    this.ackBuckets[sec % 10]++;
  }

  /** Acks over the last ~10 s (per second). */
  completionRate(mono: number): number {
    const sec = Math.floor(mono / 1000);
    let acks = 0;
    for (let s = sec - 9; s <= sec; s++) if (s <= this.ackBucketSec && s > this.ackBucketSec - 10) acks += this.ackBuckets[((s % 10) + 10) % 10];
    return acks / 10;
  }

  /** Age of the oldest READY job (lazily dropping stale heap tops; each group's too). */
  oldestWaitingAge(now: number): number {
    const age = this.heapAge(this.ready, now);
    return this.groups === null ? age : Math.max(age, this.groups.oldestAge((h) => this.heapAge(h, now)));
  }

  private heapAge(h: OffsetHeap, now: number): number {
    const t = this.table;
    while (h.size > 0) {
      const o = h.peekOffset();
      if (t.has(o) && t.status[t.idx(o)] === St.READY) {
        const i = t.idx(o);
        return Math.max(0, now - Math.max(t.enqueuedAt[i], t.visibleAt[i]));
      }
      h.pop();
    }
    return 0;
  }

  /** FLOW-2 after recovery: parents with unfinished children wait; the others are visible. */
  private rebuildFlows(): void {
    const t = this.table;
    const live = (o: number): boolean => t.has(o) && !isTerminal(t.status[t.idx(o)]);
    const waits = this.flows!.recover(live, (o) => t.status[t.idx(o)] === St.MOVING);
    for (const [p, wait] of waits) {
      const i = t.idx(p);
      const s = t.status[i];
      if (s === St.INFLIGHT || s === St.MOVING) continue;
      if (wait) t.status[i] = St.WAITING;
      else if (s === St.WAITING) t.status[i] = St.READY;
    }
  }

  /**
   * After recovery filled the table (snapshot rows, rows rebuilt from the message log, journal
   * replayed): rebuilds counts, chains (KEY-1: only a chain's head is deliverable), heaps and
   * leases (restored ones run to their stored wall-clock deadline, LEASE-1), and drops side
   * entries of settled jobs.
   */
  rebuild(keyIds: Map<string, number>, restored: Map<number, LeaseRecord>, wallNow: number, monoNow: number): void {
    for (const [key, id] of keyIds) this.chains.restore(id, key);
    const t = this.table;
    if (this.flows !== null) this.rebuildFlows();
    t.forEachLive((o, i) => {
      this.live++;
      this.liveBytes += t.size[i];
      const c = t.chain[i];
      let s = t.status[i] as St;
      if (c >= 0) {
        const isHead = this.chains.head(c) === -1;
        this.chains.append(c, o);
        if (!isHead && (s === St.READY || s === St.DELAYED || s === St.BLOCKED)) s = St.BLOCKED;
        else if (s === St.BLOCKED) s = St.READY;
      } else if (s === St.BLOCKED) s = St.READY;
      if (s === St.READY || s === St.DELAYED) s = t.visibleAt[i] <= wallNow ? St.READY : St.DELAYED;
      if (s === St.INFLIGHT) this.restoreLease(o, restored.get(o), t.attempts[i], wallNow, monoNow);
      if (s === St.MOVING && !this.moving.has(o)) s = St.READY; // redrive marks are in-memory only
      t.status[i] = s;
      this.counts[s]++;
      if (s === St.READY) this.pushReady(o);
      else if (s === St.DELAYED) this.delayed.push(t.visibleAt[i], o);
    });
    this.chains.finishRestore();
    for (const o of [...this.history.keys()]) if (!t.has(o) || isTerminal(t.status[t.idx(o)])) this.history.delete(o);
    for (const o of [...this.moving.keys()]) if (!t.has(o) || t.status[t.idx(o)] !== St.MOVING) this.moving.delete(o);
    const live = (o: number): boolean => t.has(o) && !isTerminal(t.status[t.idx(o)]);
    if (this.prio !== null) for (const o of [...this.prio.keys()]) if (!live(o)) this.prio.delete(o);
    if (this.groups !== null) this.groups.retainLive(live);
    if (this.expiry !== null) {
      this.expiring = new OffsetHeap(64);
      for (const [o, at] of this.expiry) {
        if (live(o) && t.attempts[t.idx(o)] === 0) this.expiring.push(at, o);
        else this.expiry.delete(o);
      }
    }
    this.singletons.retainLive(live);
    t.advanceFloor();
  }
}
