// SPDX-License-Identifier: Apache-2.0
/**
 * One open incarnation of a disk queue, from open to close or to a storage fault:
 *
 *   msgs/        a PartitionLog of the jobs (records.ts: payload, key, headers, delivery time)
 *   journal/     a PartitionLog of state events (events.ts), group-committed (journal.ts)
 *   snapshot.bin the state at a journal offset (snapshot.ts); what it covers is then deleted
 *   redrive.json a redrive in progress (dead-letters.ts)
 *
 * Its parts: job-state.ts (the transitions), enqueuer.ts (the enqueue path), payload-cache.ts
 * (records for hand-outs), dead-letters.ts (moves), recovery.ts (open). This file grants,
 * settles, runs the lease and delay timers, and reports faults: a failed write leaves memory
 * ahead of disk, so the instance stops (every lease is lost, LEASE-2) and its owner
 * (disk-queue.ts) reopens the queue from disk.
 */
import { BrokerClosedError, EncryptionKeyMissingError, LeaseExpiredError, StorageError } from "../../../errors.js";
import type { FileSystem } from "../../../log/io.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import type { Clock, Telemetry } from "../../../observability/telemetry.js";
import type { AttemptRecord, QueueStats, RedriveOptions, RedriveResult } from "../../../queues/types.js";
import type { EnqueueOutcome, EnqueueRequestOptions, GrantedJob, GrantRequest, Lease, NewJob, PreparedRecord, QueueSettings, StoredBrowsePage, StoredBrowseRequest, StoredJobInfo, StoredQueue } from "../../queue-store.js";
import type { EventSource } from "./event-reader.js";
import { messageLogStart, retainedJournalStart } from "./journal-retention.js";
import { JobProgress } from "./progress.js";
import { Mover } from "./dead-letters.js";
import { Removals } from "./removals.js";
import { encodeEvent, encodeRawEvent, Ev } from "./events.js";
import { Enqueuer, storedJobSize } from "./enqueuer.js";
import type { GroupLimits } from "./groups.js";
import { JobState } from "./job-state.js";
import type { DiskLease } from "./lease.js";
import { Journal } from "./journal.js";
import { openQueueLogs } from "./queue-logs.js";
import { BlobSealer } from "../../../log/batch-crypto.js";
import type { Keyring } from "../../../log/keyring.js";
import { browseJobs } from "./browse.js";
import { lookupJob, offsetOfId } from "./lookup.js";
import { PayloadCache } from "./payload-cache.js";
import { RateLimiter } from "./rate-limit.js";
import { recoverQueue } from "./recovery.js";
import { MAX_ERROR_CHARS } from "../../../queues/config.js";
import { encodeSnapshot, writeSnapshot } from "./snapshot.js";
import { EarliestTimer } from "./earliest-timer.js";
import { queueStats } from "./stats.js";
import { isTerminal, St } from "./table.js";

/** A job whose encryption key is missing is tried again after this long (keyMissing). */
const KEY_MISSING_RETRY_MS = 30_000;
/** Snapshot after this many message-log bytes (or twice the last snapshot's size, whichever is larger). */
const SNAPSHOT_EVERY_MSG_BYTES = 64 * 1024 * 1024;

/** Where a queue lives and what it works with. */
export interface QueueFiles {
  name: string;
  incarnation: string;
  dir: string;
  fs: FileSystem;
  settings: QueueSettings;
  telemetry: Telemetry;
  /** Other queues (dead-letter and redrive targets), through the policy layer. */
  peer(name: string): Promise<StoredQueue>;
  /** The engine's keyring, for an encrypted queue's logs and snapshot (ENC-1); null: none. */
  keyring: Keyring | null;
}

export interface InstanceOptions extends QueueFiles {  /** Grantable jobs may exist. */
  available(): void;
  /** A write failed: the owner reopens the queue from disk. */
  onFault(err: StorageError): void;
  /** The journal is about to write its batch (QueueListener.beforeWrite). */
  beforeWrite(): void;
}

/** The group limits of `s` (GRP-Q1). */
function groupLimits(s: QueueSettings): GroupLimits {
  return { concurrency: s.groupConcurrency ?? 0, rate: s.groupRateLimit ?? null };
}

export class QueueInstance {
  readonly name: string;
  readonly incarnation: string;
  private _settings: QueueSettings;
  private readonly o: InstanceOptions;
  private readonly clock: Clock;
  private st!: JobState;
  private msgs!: PartitionLog;
  private journal!: Journal;
  private enqueuer!: Enqueuer;
  private cache!: PayloadCache;
  private mover!: Mover;
  private removals!: Removals;
  private progressOf = new JobProgress();
  private msgBytesSinceSnapshot = 0;
  private lastSnapshotBytes = 0;
  /** Promotes due delayed jobs. */
  private readonly delayTimer = new EarliestTimer(
    () => this.now(),
    () => {
      if (this.closed || this.broken) return;
      this.st.promoteDue(this.now());
      this.scheduleDelayTimer();
      this.o.available();
    },
  );
  /** Expires leases past their monotonic deadline (LEASE-3). */
  private readonly leaseTimer = new EarliestTimer(
    () => this.mono(),
    () => this.checkLeases(),
  );
  /** `settings.rateLimit` (RATE-1), or null: a queue without one pays one branch per grant. */
  private limiter: RateLimiter | null = null;
  /** Wakes the workers when the earliest group parked out of `groupRateLimit` room may start again. */
  /** GRP-Q1: the earliest opening of a group's rate window (as RateLimiter's own timer). */
  private readonly groupTimer = new EarliestTimer(
    () => this.mono(),
    () => {
      if (!this.closed && !this.broken) this.o.available();
    },
  );
  private closed = false;
  private broken: StorageError | null = null;
  private background = new Set<Promise<unknown>>();

  private constructor(o: InstanceOptions) {
    this.o = o;
    this.clock = o.telemetry.clock;
    this.name = o.name;
    this.incarnation = o.incarnation;
    this._settings = o.settings;
    this.configureLimit(o.settings);
  }

  get settings(): QueueSettings {
    return this._settings;
  }
  /** The stored config changed: retention and the dedupe window apply at once, log sizes on reopen. */
  set settings(s: QueueSettings) {
    this._settings = s;
    if (this.st !== undefined) this.st.retained.retentionMs = s.resultRetentionMs;
    // A window set on an open queue must dedupe the very next enqueue, as it would after a reopen.
    if (this.enqueuer !== undefined) this.enqueuer.dedupe.setWindow(s.dedupeWindowMs);
    this.configureLimit(s);
  }

  /** A rate limit set, changed or lifted on an open queue applies to the next grant. */
  private configureLimit(s: QueueSettings): void {
    const r = s.rateLimit;
    if (r == null) {
      this.limiter?.close();
      this.limiter = null;
    } else if (this.limiter === null) {
      this.limiter = new RateLimiter(r.max, r.durationMs, () => {
        if (!this.closed && !this.broken) this.o.available();
      });
    } else this.limiter.configure(r);
    if (this.st !== undefined) this.st.configureGroups(groupLimits(s));
    // Workers may have waited for a window (or a group cap) that is now lifted or wider.
    if (this.st !== undefined) this.o.available();
  }

  static async open(o: InstanceOptions): Promise<QueueInstance> {
    const q = new QueueInstance(o);
    await q.recover();
    return q;
  }

  private get logger() {
    return this.o.telemetry.logger;
  }
  private now(): number {
    return this.clock.now();
  }
  private mono(): number {
    return this.clock.monotonicMs();
  }

  // ─────────────────────────────── open ───────────────────────────────

  private async recover(): Promise<void> {
    const s = this.settings;
    const logs = await openQueueLogs({ name: this.name, incarnation: this.incarnation, dir: this.o.dir, fs: this.o.fs, telemetry: this.o.telemetry, settings: s, keyring: this.o.keyring, onFault: (e) => this.failed(e) });
    this.msgs = logs.msgs;
    const journalLog = logs.journal;
    try {
      const r = await recoverQueue({ fs: this.o.fs, dir: this.o.dir, queue: this.name, sealer: this.sealer(), msgs: this.msgs, journal: journalLog, dedupeWindowMs: s.dedupeWindowMs, resultRetentionMs: s.resultRetentionMs, logger: this.logger, now: this.now(), monoNow: this.mono() });
      this.st = r.state;
      this.st.configureGroups(groupLimits(s));
      this.progressOf = new JobProgress(r.progress);
      this.journal = new Journal(journalLog, {
        check: () => this.check(),
        failed: (e) => this.failed(e),
        snapshot: (end) => this.snapshot(end),
        beforeWrite: () => this.o.beforeWrite(),
        logger: this.logger,
        queue: this.name,
        now: () => this.now(),
      });
      this.enqueuer = new Enqueuer(this.enqueueHost(), this.msgs, r.dedupe, r.producers);
      this.cache = new PayloadCache(this.msgs, (off) => this.st.table.has(off) && !isTerminal(this.st.table.status[this.st.table.idx(off)]), () => this.st.table.end);
    } catch (e) {
      await Promise.allSettled([this.msgs.close(), journalLog.close()]);
      throw e;
    }
    this.mover = new Mover(this.moveHost());
    this.scheduleDelayTimer();
    this.scheduleLeaseTimer(0);
    this.removals = new Removals(this.moveHost(), this.mover);
    this.removals.schedule();
    // Interrupted dead-letter moves and redrives continue in the background (they may need
    // other queues, which may need this one: never awaited inside open).
    this.mover.resume();
    if (this.st.flows !== null && this.st.flows.failing.length > 0) this.failParents();
    await this.mover.resumeRedrive();
  }

  private enqueueHost() {
    return {
      name: this.name,
      settings: () => this.settings,
      check: () => this.check(),
      depth: () => ({ jobs: this.st.live, bytes: this.st.liveBytes }),
      failed: (e: unknown) => this.failed(e),
      stored: (base: number, jobs: readonly NewJob[], recs: readonly PreparedRecord[]) => this.stored(base, jobs, recs),
      state: () => this.st,
      replaced: (off: number) => this.removals.replaced(off),
      appended: (bytes: number) => {
        this.msgBytesSinceSnapshot += bytes;
        if (this.msgBytesSinceSnapshot > Math.max(SNAPSHOT_EVERY_MSG_BYTES, 2 * this.lastSnapshotBytes)) this.journal.requestSnapshot();
      },
      now: () => this.now(),
      monoNow: () => this.mono(),
    };
  }

  private moveHost() {
    return {
      name: this.name,
      incarnation: this.incarnation,
      dir: this.o.dir,
      fs: this.o.fs,
      logger: this.logger,
      settings: () => this.settings,
      state: () => this.st,
      journal: () => this.journal,
      cache: () => this.cache,
      peer: (n: string) => this.o.peer(n),
      check: () => this.check(),
      alive: () => !this.closed && this.broken === null,
      track: (p: Promise<unknown>) => this.track(p),
      settled: (off: number) => this.settled(off),
      available: () => this.o.available(),
      enqueueDrained: () => this.enqueuer.drained(),
      now: () => this.now(),
    };
  }

  private track(p: Promise<unknown>): void {
    this.background.add(p);
    void p.finally(() => this.background.delete(p));
  }

  async whenIdle(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  // ─────────────────────────────── health ───────────────────────────────

  /** Throws when the queue cannot take work. */
  check(): void {
    if (this.broken) throw new StorageError(`queue ${this.name} is recovering from a storage failure (${this.broken.message})`, this.broken);
    if (this.closed) throw new BrokerClosedError(`queue ${this.name} is closed`);
  }

  get faulted(): StorageError | null {
    return this.broken;
  }

  /**
   * A failed write: memory is ahead of disk. Every lease is lost (LEASE-2), blocked
   * enqueues wake (and throw), and the owner reopens the queue from disk. Logged once.
   */
  private failed(e: unknown): StorageError {
    if (this.broken) return this.broken;
    const err = e instanceof StorageError ? e : new StorageError(`queue ${this.name}: storage failed: ${(e as Error)?.message ?? String(e)}`, e);
    this.broken = err;
    this.logger.error({ err: e, queue: this.name }, "queue storage failed; reopening it from disk");
    this.loseLeases(err);
    this.enqueuer?.wakeAll();
    this.o.onFault(err);
    return err;
  }

  private loseLeases(reason: Error): void {
    if (this.st === undefined) return; // failed while recovering: no lease was granted yet
    for (const l of [...this.st.leases.values()]) {
      this.st.endLease(l);
      l.consumer?.leaseLost(l, reason);
    }
  }

  // ─────────────────────────────── enqueue ───────────────────────────────

  enqueue(jobs: readonly NewJob[], opts?: EnqueueRequestOptions): Promise<EnqueueOutcome> {
    return this.enqueuer.enqueue(jobs, opts);
  }

  /** Rows for jobs whose append is durable; they may be granted from now on. */
  private stored(base: number, jobs: readonly NewJob[], recs: readonly PreparedRecord[]): void {
    if (this.closed) return;
    const now = this.now();
    for (let i = 0; i < jobs.length; i++) {
      const job = jobs[i];
      const rec = recs[i];
      // JOB-1 / JOB-3: known before the row is added, so its first ready push ranks it.
      if (job.priority) this.st.setPriority(base + i, job.priority);
      if (job.expiresAt) this.st.setExpiry(base + i, job.expiresAt);
      // FLOW-1: linked before the row is added (a parent comes first in its group).
      if (job.flow) this.st.linkFlow(base + i, job.flow);
      if (job.group) this.st.setGroup(base + i, job.group);
      this.st.addJob(base + i, job.key, job.deliverAt, rec.timestamp, storedJobSize(job, rec), now);
      // Delayed jobs are not cached: they are delivered much later (read back in order then).
      if (job.deliverAt <= rec.timestamp) this.cache.add(base + i, rec);
    }
    this.scheduleDelayTimer();
    this.removals.schedule();
    this.o.available();
  }

  // ─────────────────────────────── grants ───────────────────────────────

  grant(requests: readonly GrantRequest[]): Promise<GrantedJob[][]> {
    this.check();
    const now = this.now();
    this.st.promoteDue(now);
    const mono = this.mono();
    const lim = this.limiter;
    // RATE-1: the window's room caps this round (counted at grant, before any lookahead).
    const cap = lim === null ? this.settings.maxInFlight : Math.min(this.settings.maxInFlight, this.st.leases.size + lim.room(mono));
    const leases = this.st.grant(requests, cap, now, mono);
    if (this.st.groups !== null) this.scheduleGroupTimer();
    if (this.st.expiredFound.length > 0) this.removals.expire(this.st.expiredFound.splice(0), now);
    let durable: Promise<void> | null = null;
    let first = Infinity;
    let n = 0;
    for (const list of leases)
      for (const l of list) {
        durable = this.journal.fixed(Ev.DELIVER, l.off, l.attempt, l.deadlineWall);
        if (l.deadlineMono < first) first = l.deadlineMono;
        n++;
      }
    if (lim !== null) lim.counted(n, mono, () => this.mono());
    if (durable === null) return Promise.resolve(leases.map(() => []));
    this.scheduleLeaseTimer(first);
    return this.handOut(leases, durable);
  }

  /** jobs reach consumers only once their DELIVER events are durable. */
  private async handOut(leases: DiskLease[][], durable: Promise<void>): Promise<GrantedJob[][]> {
    const offs: number[] = [];
    for (const list of leases) for (const l of list) offs.push(l.off);
    let recs: Awaited<ReturnType<PayloadCache["fetch"]>>;
    try {
      [, recs] = await Promise.all([durable, this.cache.fetch(offs)]);
    } catch {
      // The journal failed: those leases were lost with it (LEASE-2).
      return leases.map(() => []);
    }
    // LEASE-1: the lease runs from the hand-out, not from the grant: the consumer gets the
    // whole lease even when the DELIVER fdatasync was slow.
    const handoff = this.mono();
    const now = this.now();
    return leases.map((list) => {
      const out: GrantedJob[] = [];
      for (const l of list) {
        if (l.ended) continue;
        const r = recs.get(l.off);
        l.deadlineMono += handoff - l.startedMono;
        l.startedMono = handoff;
        if (r instanceof EncryptionKeyMissingError) {
          this.keyMissing(l, r, now);
          continue;
        }
        if (r === undefined || r instanceof Error) {
          this.unreadable(l, r, now);
          continue;
        }
        this.cache.remove(l.off);
        l.rec = r;
        out.push(l);
      }
      return out;
    });
  }

  /**
   * ENC-1: a job encrypted with a key the keyring lacks is not damaged: it is given back
   * without an attempt (RATE-2) and tried again later, so restoring the key serves it.
   */
  private keyMissing(l: DiskLease, err: EncryptionKeyMissingError, now: number): void {
    this.logger.error({ err, queue: this.name, offset: l.off }, "job not delivered: its encryption key is missing from the keyring");
    const visibleAt = now + KEY_MISSING_RETRY_MS;
    this.st.giveBack(l, visibleAt, now);
    this.afterVisible();
    void this.journal.fixed(Ev.GIVE_BACK, l.off, l.attempt - 1, visibleAt).catch(() => {});
  }

  /**
   * A job whose record cannot be read back (damaged storage, REC-1): it can be neither
   * delivered nor copied, so it is parked as dead, counted in `stats().unreadable` and logged.
   */
  private unreadable(l: DiskLease, err: Error | undefined, now: number): void {
    this.logger.error({ err, queue: this.name, offset: l.off }, "job unreadable (damaged message log); it is counted in stats().unreadable and never delivered");
    const freed = this.st.endLease(l);
    if (this.st.finish(l.off, St.DEAD, now) || freed) this.o.available();
    this.st.unreadable++;
    this.settled(l.off);
    void this.journal.fixed(Ev.DEAD, l.off, l.attempt, now).catch(() => {});
  }

  // ─────────────────────────────── settlement ───────────────────────────────

  /** the lease must be current and its monotonic deadline (checked at `mono`) not passed. */
  private leaseOf(lease: Lease, mono: number): DiskLease {
    this.check();
    const l = this.st.current(lease);
    if (l === null) throw new LeaseExpiredError();
    if (mono >= l.deadlineMono) {
      this.expire(l);
      throw new LeaseExpiredError();
    }
    return l;
  }

  /** A terminal transition happened: free the cache slot, wake blocked enqueues. */
  private settled(off: number): void {
    this.cache.remove(off);
    this.progressOf.drop(off);
    this.enqueuer.room();
    if (this.st.flows !== null && this.st.flows.failing.length > 0) this.failParents();
  }

  /** Whether acks' results are needed by flows' parents (FLOW-2). */
  get hasFlows(): boolean {
    return this.st.flows !== null && this.st.flows.size > 0;
  }

  /** FLOW-2: parents whose child failed under `onChildFailure: "fail"` are dead-lettered. */
  private failParents(): void {
    const now = this.now();
    for (const { parent, child, error } of this.st.flows!.failing.splice(0)) {
      if (!this.st.isWaiting(parent)) continue;
      const rec: AttemptRecord = { at: now, attempt: 0, consumer: "(flow)", errorClass: "ChildFailedError", error: `child ${child} failed: ${error}`.slice(0, MAX_ERROR_CHARS) };
      this.track(this.mover.deadLetter(parent, rec).catch((e) => this.logger.error({ err: e, queue: this.name }, "dead-letter move failed")));
    }
  }

  ack(lease: Lease, result?: string): Promise<void> {
    const mono = this.mono();
    const l = this.leaseOf(lease, mono);
    const now = this.now();
    // FLOW-2: a flow's child keeps its result for its parent whatever the retention.
    const kept = this.settings.resultRetentionMs > 0 || this.st.flows?.isChild(l.off) === true ? result : undefined;
    // the result travels in the ACK event (one durable write), encoded before anything changes.
    const ev = kept === undefined ? null : encodeRawEvent(Ev.ACK, l.off, l.attempt, now, kept);
    // The consumer's own room is its worker's business; a key's successor is ours (KEY-1).
    if (this.st.ack(l, now, mono, kept)) this.o.available();
    this.settled(l.off);
    return ev === null ? this.journal.fixed(Ev.ACK, l.off, l.attempt, now) : this.journal.event(ev);
  }

  retry(lease: Lease, visibleAt: number, failure: AttemptRecord): Promise<void> {
    const l = this.leaseOf(lease, this.mono());
    const now = this.now();
    this.st.retry(l, visibleAt, failure, now);
    this.afterVisible();
    return this.journal.event(encodeEvent(Ev.NACK, l.off, l.attempt, visibleAt, failure));
  }

  /**
   * RATE-2: the holder gives the delivery back (rate limited downstream): visible at
   * `visibleAt`, and the attempt it counted is undone, durably (GIVE_BACK, Q-2).
   */
  giveBack(lease: Lease, visibleAt: number): Promise<void> {
    const l = this.leaseOf(lease, this.mono());
    this.st.giveBack(l, visibleAt, this.now());
    this.afterVisible();
    return this.journal.fixed(Ev.GIVE_BACK, l.off, l.attempt - 1, visibleAt);
  }

  deadLetter(lease: Lease, failure: AttemptRecord): Promise<void> {
    const l = this.leaseOf(lease, this.mono());
    // GRP-Q1: a group parked at its cap may be served again.
    if (this.st.endLease(l)) this.o.available();
    this.st.pushHistory(l.off, failure);
    return this.mover.deadLetter(l.off, failure);
  }

  extend(lease: Lease, ms: number): Promise<void> {
    const mono = this.mono();
    const l = this.leaseOf(lease, mono);
    l.deadlineMono = mono + ms;
    l.deadlineWall = this.now() + ms;
    this.scheduleLeaseTimer(l.deadlineMono);
    return this.journal.fixed(Ev.EXTEND, l.off, l.attempt, l.deadlineWall);
  }

  /** as `extend`: a leased job's progress, durable when this resolves (JRN-2). */
  progress(lease: Lease, json: string): Promise<void> {
    const l = this.leaseOf(lease, this.mono());
    const ev = encodeRawEvent(Ev.PROGRESS, l.off, l.attempt, this.now(), json);
    this.progressOf.set(l.off, json);
    return this.journal.event(ev);
  }

  release(lease: Lease, counted: boolean): void {
    if (this.closed || this.broken) return;
    const l = this.st.current(lease);
    if (l === null) return;
    const now = this.now();
    this.st.release(l, counted, now);
    this.afterVisible();
    void this.journal.event(encodeEvent(Ev.NACK, l.off, l.attempt, now)).catch(() => {});
  }

  restartLease(lease: Lease): void {
    const l = this.st.current(lease);
    if (l === null) return;
    const ttl = l.deadlineMono - l.startedMono;
    const mono = this.mono();
    l.startedMono = mono;
    l.deadlineMono = mono + ttl;
    l.deadlineWall = this.now() + ttl;
  }

  /** A job became visible (now or later): timers and listeners. */
  private afterVisible(): void {
    this.scheduleDelayTimer();
    this.o.available();
  }

  // ─────────────────────────────── timers ───────────────────────────────

  private scheduleDelayTimer(): void {
    if (!this.closed) this.delayTimer.arm(this.st.delayed.peekPriority());
  }

  /** GRP-Q1: one timer, for the earliest opening of a group's rate window. */
  private scheduleGroupTimer(): void {
    if (!this.closed) this.groupTimer.arm(this.st.groups!.nextOpening());
  }

  private scheduleLeaseTimer(atMono: number): void {
    if (!this.closed && this.st.leases.size > 0) this.leaseTimer.arm(atMono);
  }

  private checkLeases(): void {
    if (this.closed || this.broken) return;
    for (const l of this.st.expiredLeases(this.mono())) this.expire(l);
    const next = this.st.nextLeaseDeadline();
    if (next < Infinity) this.scheduleLeaseTimer(next);
  }

  /** LEASE-3: the lease ran out; its holder is told, the attempt recorded, the job visible again or dead-lettered. */
  private expire(l: DiskLease): void {
    const rec: AttemptRecord = {
      at: this.now(),
      attempt: l.attempt,
      consumer: l.consumerId,
      errorClass: "LeaseExpiredError",
      error: "lease expired before the job was settled",
      ...(l.codeVersion !== undefined ? { codeVersion: l.codeVersion } : {}),
    };
    const dead = this.st.expire(l, rec, this.settings.maxAttempts, rec.at);
    l.consumer?.leaseLost(l, new LeaseExpiredError());
    if (dead) {
      // GRP-Q1: the lease's group may have been parked at its cap.
      if (this.st.groups !== null) this.o.available();
      this.track(this.mover.deadLetter(l.off, rec).catch((e) => this.logger.error({ err: e, queue: this.name }, "dead-letter move failed")));
      return;
    }
    this.afterVisible();
    void this.journal.event(encodeEvent(Ev.EXPIRE, l.off, l.attempt, rec.at, rec)).catch(() => {});
  }

  // ─────────────────────────────── admin ───────────────────────────────

  /** JOB-4 (removals.ts). */
  remove(id: string): Promise<boolean> {
    this.check();
    return this.removals.remove(id);
  }

  async purge(): Promise<number> {
    this.check();
    await this.enqueuer.drained();
    const end = this.st.table.end;
    const { purged, leases } = this.st.purge();
    for (const l of leases) l.consumer?.leaseLost(l, new LeaseExpiredError("job was purged"));
    this.cache.clear();
    this.progressOf.dropBelow(end);
    this.enqueuer.room();
    await this.journal.fixed(Ev.PURGE, end, 0, this.now());
    await this.journal.compact();
    return purged;
  }

  redrive(opts: RedriveOptions): Promise<RedriveResult> {
    return this.mover.redrive(opts);
  }

  async getJob(id: string): Promise<StoredJobInfo | null> {
    this.check();
    const info = await lookupJob(this.st, this.cache, id, this.now());
    const p = info === null || info.state === "completed" || info.state === "dead" ? undefined : this.progressOf.get(offsetOfId(id));
    if (p !== undefined) info!.progress = p;
    const g = info === null || this.st.groups === null ? null : this.st.groups.groupName(offsetOfId(id));
    if (g !== null) info!.group = g;
    return info;
  }

  /** The logs `readEvents` reads (event-reader.ts); they change when the queue is reopened. */
  eventSource(): EventSource {
    this.check();
    return { journal: this.journal.log, msgs: this.msgs, incarnation: this.incarnation };
  }

  browse(req: StoredBrowseRequest): Promise<StoredBrowsePage> {
    this.check();
    return browseJobs(this.st, this.cache, this.msgs, req);
  }

  stats(): QueueStats {
    this.check();
    return queueStats(this.name, this.st, this.now(), this.mono());
  }

  /** Memory held by the job table, heaps and tail cache (docs and the memory benchmark). */
  memoryBytes(): number {
    return this.st.table.capacityBytes + this.st.ready.capacityBytes + this.st.delayed.capacityBytes + this.cache.heldBytes + this.st.retained.heldBytes + (this.st.groups?.capacityBytes ?? 0);
  }

  // ─────────────────────────────── snapshots ───────────────────────────────

  /** ENC-1: an encrypted queue's snapshot is sealed with its keyring; null: stored in clear. */
  private sealer(): BlobSealer | null {
    return this.settings.encrypted === true ? new BlobSealer(this.o.keyring, `queue-snapshot:${this.incarnation}`, `queue ${JSON.stringify(this.name)}`) : null;
  }

  /**
   * Writes the state at the journal's end (JRN-3), then deletes what it covers: the journal
   * below that offset and the message log below the table floor.
   */
  private async snapshot(journalEnd: number): Promise<void> {
    const now = this.now();
    const { body, meta } = encodeSnapshot(this.st, {
      incarnation: this.incarnation,
      journalOffset: journalEnd,
      dedupe: this.enqueuer.dedupe.snapshot(now),
      // Completed requests only: their jobs lie below `rows` (completed where rows are added);
      // pending ones append after it and are found by the recovery scan.
      idem: this.enqueuer.producers.snapshot(),
      singletons: this.st.singletons.rows(now),
      now,
      progress: this.progressOf.live(this.st.table),
    });
    this.journal.snapshotTaken();
    this.msgBytesSinceSnapshot = 0;
    this.lastSnapshotBytes = body.length;
    await writeSnapshot(this.o.fs, this.o.dir, body, this.sealer());
    // The snapshot is durable: what it covers may go (storage proportional to backlog), except
    // the newest journal segments, which `queue.events()` readers read (EVT-2).
    const jl = this.journal.log;
    await jl.advanceLogStart(Math.min(retainedJournalStart(jl.describeSegments(), meta.journalOffset, jl.config.segmentBytes), jl.highWatermark));
    await this.msgs.advanceLogStart(messageLogStart(this.msgs.describeSegments(), Math.min(meta.floor, this.msgs.highWatermark)));
  }

  /** Forces a snapshot (after pending events are durable). */
  compact(): Promise<void> {
    return this.journal.compact();
  }

  // ─────────────────────────────── close ───────────────────────────────

  /**
   * Closes the queue. Cleanly (a final snapshot) unless it faulted: then the logs are closed
   * as they are and the next open recovers from what the disk holds.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.enqueuer.drained().catch(() => {});
    await this.whenIdle().catch(() => {});
    if (!this.broken) {
      try {
        await this.journal.compact();
      } catch (e) {
        this.logger.warn({ err: e, queue: this.name }, "final queue snapshot failed");
      }
    }
    await this.journal.idle();
    this.closed = true;
    this.delayTimer.stop();
    this.leaseTimer.stop();
    this.groupTimer.stop();
    this.limiter?.close();
    this.removals.close();
    this.enqueuer.wakeAll();
    this.loseLeases(new BrokerClosedError(`queue ${this.name} is closing`));
    await Promise.allSettled([this.msgs.close(), this.journal.log.close()]);
  }
}
