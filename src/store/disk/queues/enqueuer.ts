// SPDX-License-Identifier: Apache-2.0
/**
 * The enqueue path of a disk queue: idempotent requests (producers.ts, IDEM-1), dedupe
 * (dedupe.ts), admission (maxDepth / maxBytes, overflow reject or block) and the append loop
 * that writes admitted jobs to the message log in groups (one append per round, one fdatasync
 * for many enqueue calls) and adds their rows only once the append is durable.
 */
import { AbortedError, QueueFullError, RecordTooLargeError, ValidationError } from "../../../errors.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import { HEADER_SIZE, MAX_BATCH_BYTES, type PreparedRecord } from "../../../log/record-batch.js";
import { validateIdentity, type EnqueueIdentity } from "../../../queues/idempotence.js";
import type { EnqueueResult } from "../../../queues/types.js";
import type { EnqueueOutcome, EnqueueRequestOptions, NewJob, QueueSettings } from "../../queue-store.js";
import { DedupeTable, isSystemDedupeId } from "./dedupe.js";
import { deferred, type Deferred } from "./journal.js";
import { encodeIdemHeader, EnqueueProducers, H_IDEMPOTENCE, type IdemEntry } from "./producers.js";
import { encodedSize, encodeJob, RESERVED_HEADER_ROOM, withHeader } from "./records.js";
import type { JobState } from "./job-state.js";
import { SingletonRound } from "./singletons.js";

/** Bytes of one enqueue call's records: they must fit one record batch (room for its header). */
const MAX_CALL_BYTES = MAX_BATCH_BYTES - HEADER_SIZE;
/** Records and bytes per message-log append (a single group may exceed them). */
const MAX_APPEND_RECORDS = 8192;
const MAX_APPEND_BYTES = 8 * 1024 * 1024;

/** One enqueue call's new jobs: appended together (never split), one promise for the group. */
interface PendingGroup {
  jobs: readonly NewJob[];
  /** Their records as stored (encodeJob). */
  recs: PreparedRecord[];
  bytes: number;
  d: Deferred<number>;
  /** The request's idempotency entry, completed where the rows are added (IDEM-1). */
  idem: { id: EnqueueIdentity; entry: IdemEntry } | null;
  /** Waiting jobs its debounce jobs replace (frozen until the append is durable). */
  replaced: number[] | null;
}

/** Bytes a job counts against `maxBytes`: the policy measured the user's record; a copy made
 * by a move (dead letter, redrive) is measured with its reserved headers. */
export function storedJobSize(job: NewJob, rec: PreparedRecord): number {
  return job.origin === null ? job.size : encodedSize(rec);
}

/** What the enqueue path needs from its queue. */
export interface EnqueueHost {
  readonly name: string;
  settings(): QueueSettings;
  /** Throws when the queue cannot take work (closed, failed). */
  check(): void;
  /** Jobs and bytes stored and not settled. */
  depth(): { jobs: number; bytes: number };
  /** The append of `groups` failed: the queue must be reopened; returns the error to report. */
  failed(err: unknown): Error;
  /** Rows for jobs just made durable (in offset order from `base`). */
  stored(base: number, jobs: readonly NewJob[], recs: readonly PreparedRecord[]): void;
  /** The queue's state (singleton keys, and the jobs a debounce enqueue replaces). */
  state(): JobState;
  /** A debounce job is durable: the waiting job it replaced leaves the queue. */
  replaced(off: number): void;
  /** Message-log bytes appended (snapshot pacing). */
  appended(bytes: number): void;
  now(): number;
  monoNow(): number;
}

export class Enqueuer {
  private pending: PendingGroup[] = [];
  private running = false;
  private idleWaiter: Deferred | null = null;
  private reservedDepth = 0;
  private reservedBytes = 0;
  private roomWaiters = new Set<() => void>();

  constructor(
    private readonly host: EnqueueHost,
    private readonly msgs: PartitionLog,
    readonly dedupe: DedupeTable,
    readonly producers: EnqueueProducers,
  ) {}

  /** Wakes enqueues blocked for room (the backlog shrank). */
  room(): void {
    if (this.roomWaiters.size === 0) return;
    for (const w of [...this.roomWaiters]) w();
  }

  /** Resolves once no append is pending or running. */
  async drained(): Promise<void> {
    if (!this.running && this.pending.length === 0) return;
    if (!this.idleWaiter) this.idleWaiter = deferred();
    await this.idleWaiter.promise;
  }

  /** Stores a request's jobs; resolves after the append is durable. */
  async enqueue(jobs: readonly NewJob[], opts: EnqueueRequestOptions = {}): Promise<EnqueueOutcome> {
    this.host.check();
    const recs = this.encode(jobs);
    const compact = opts.compact === true;
    if (opts.identity === undefined) return this.evaluate(jobs, recs, opts.signal, null, compact);
    const id = validateIdentity(opts.identity);
    for (;;) {
      const e = this.producers.lookup(id);
      if (e === null) break;
      if (e.pending !== null) {
        // The original is still being evaluated or written (e.g. its connection dropped and the
        // client re-sent it on a new one): its outcome is this request's outcome.
        try {
          await e.pending.promise;
        } catch (err) {
          // The original stored nothing. Cut short because its connection went away (a blocked
          // enqueue aborted): this retry stands in for it. Any other failure (QUEUE_FULL,
          // storage...) is the request's own answer.
          if (!(err instanceof AbortedError)) throw err;
        }
        this.host.check();
        continue;
      }
      return this.rebuildAnswer(jobs, e.first, e.count, compact);
    }
    // New request: pending from now on, so a concurrent retry waits for this outcome.
    const entry = this.producers.begin(id);
    let r: EnqueueOutcome;
    try {
      r = await this.evaluate(jobs, recs, opts.signal, { id, entry }, compact);
    } catch (err) {
      // Nothing stored (IDEM-1: an entry whose jobs are durable is never dropped; a failed
      // append already dropped it in the loop).
      if (entry.pending !== null) this.producers.drop(id, entry, err);
      throw err;
    }
    // Every job was a duplicate (or none was given): nothing stored, no entry; a retry gets
    // the same answer from the dedupe table again.
    if (entry.pending !== null) this.producers.drop(id, entry);
    return r;
  }

  /** The records, checked against the message log's limits before anything is queued. */
  private encode(jobs: readonly NewJob[]): PreparedRecord[] {
    const limit = this.host.settings().maxMessageBytes + RESERVED_HEADER_ROOM;
    const out = new Array<PreparedRecord>(jobs.length);
    let userBytes = 0;
    for (let i = 0; i < jobs.length; i++) {
      const job = jobs[i];
      const rec = encodeJob(job);
      // The policy checked the user's part; a copy made by a move carries more headers.
      if (job.origin !== null) {
        const size = encodedSize(rec);
        if (size > limit) throw new RecordTooLargeError(size, limit);
      }
      userBytes += job.size;
      out[i] = rec;
    }
    // One call is one append, one record batch (FLOW-1): a call the batch limit cannot hold is
    // refused here, as bad input, not failed by the log (which would stop the queue). Measured
    // exactly only when the users' bytes plus the reserved headers' room could reach the limit.
    if (userBytes + jobs.length * RESERVED_HEADER_ROOM > MAX_CALL_BYTES) {
      let total = 0;
      for (const rec of out) total += encodedSize(rec);
      if (total > MAX_CALL_BYTES) throw new ValidationError(`an enqueue of ${jobs.length} jobs takes ${total} bytes stored, above the ${MAX_CALL_BYTES} one write can hold: send them in smaller batches`);
    }
    return out;
  }

  private freshResults(first: number, n: number): EnqueueResult[] {
    const out = new Array<EnqueueResult>(n);
    for (let k = 0; k < n; k++) out[k] = { id: String(first + k), duplicate: false };
    return out;
  }

  /** Dedupe, admission and append of one request. */
  private async evaluate(jobs: readonly NewJob[], recs: PreparedRecord[], signal: AbortSignal | undefined, idem: PendingGroup["idem"], compact: boolean): Promise<EnqueueOutcome> {
    let now = this.host.now();
    if (jobs.length > 0 && jobs.every((j) => j.dedupeId === null && !j.singleton)) {
      // The common case: every job is new, one group, no per-job bookkeeping.
      if (this.dedupe.size > 0) this.dedupe.sweep(now);
      const first = await this.appendGroup(jobs, recs, signal, idem);
      return compact ? { first, count: jobs.length } : this.freshResults(first, jobs.length);
    }
    const sg = jobs.some((j) => j.singleton) ? new SingletonRound(this.host.state(), jobs, () => this.full()) : null;
    if (sg !== null) {
      // Decisions on a key are taken only while no enqueue of it is in flight, and taken and
      // claimed in one synchronous step below (no two enqueues both take a key).
      await sg.settle();
      this.host.check();
      now = this.host.now();
    }
    const results: (EnqueueResult | Promise<EnqueueResult>)[] = new Array(jobs.length);
    const fresh: number[] = [];
    this.dedupe.sweep(now);
    const seenInBatch = new Map<string, number>();
    const dupOf: [number, number][] = [];
    try {
      for (let i = 0; i < jobs.length; i++) {
        const id = jobs[i].dedupeId;
        if (id !== null) {
          const window = this.dedupe.window(id);
          const e = window > 0 ? this.dedupe.get(id) : undefined;
          if (e !== undefined && e.exp > now) {
            const idx = e.idx;
            results[i] = e.wait !== null ? e.wait.promise.then((base) => ({ id: String(base + idx), duplicate: true })) : { id: String(e.off), duplicate: true };
            continue;
          }
          if (window > 0 && seenInBatch.has(id)) {
            dupOf.push([i, seenInBatch.get(id)!]);
            results[i] = { id: "", duplicate: true };
            continue;
          }
          if (window > 0 && !isSystemDedupeId(id) && this.dedupe.userSize >= this.host.settings().maxDedupeEntries) throw this.full();
          if (window > 0) seenInBatch.set(id, i);
        }
        if (sg !== null && jobs[i].singleton) {
          const r = sg.decide(i, fresh.length, now, recs, this.host.settings().maxDedupeEntries);
          if (r !== null) {
            results[i] = r;
            continue;
          }
        }
        fresh.push(i);
      }
      if (fresh.length > 0) {
        const group = fresh.map((i) => jobs[i]);
        const claim = (d: Deferred<number>): void => {
          // Claimed now so a concurrent duplicate waits for this job's id (the window survives a
          // restart via the record's header).
          for (let k = 0; k < group.length; k++) {
            const id = group[k].dedupeId;
            if (id !== null && this.dedupe.window(id) > 0) this.dedupe.set(id, { off: -1, exp: now + this.dedupe.window(id), wait: d, idx: k });
          }
        };
        const base = await this.appendGroup(group, fresh.map((i) => recs[i]), signal, idem, claim, sg?.d, sg?.replaced());
        for (let k = 0; k < fresh.length; k++) {
          const r: EnqueueResult = { id: String(base + k), duplicate: false };
          const rp = sg?.replacedBy.get(fresh[k]);
          if (rp !== undefined) r.replaced = String(rp);
          results[fresh[k]] = r;
        }
      }
    } catch (e) {
      // Nothing of the request was stored: singleton keys and replaced jobs go back (JOB-2).
      sg?.undo(e, now);
      throw e;
    }
    const out = await Promise.all(results);
    for (const [i, first] of dupOf) out[i] = { id: out[first].id, duplicate: true };
    if (sg !== null) for (const [i, other] of sg.dupOf) out[i] = { id: out[other].id, duplicate: true };
    return out;
  }

  /** Admits and queues one group; resolves with its first offset once durable. */
  private async appendGroup(
    jobs: readonly NewJob[],
    recs: PreparedRecord[],
    signal: AbortSignal | undefined,
    idem: PendingGroup["idem"],
    claim?: (d: Deferred<number>) => void,
    pre?: Deferred<number>,
    replaced: number[] | null = null,
  ): Promise<number> {
    let bytes = 0;
    for (let i = 0; i < jobs.length; i++) bytes += storedJobSize(jobs[i], recs[i]);
    await this.admit(jobs.length, bytes, signal);
    const d = pre ?? deferred<number>();
    claim?.(d);
    this.push({ jobs, recs, bytes, d, idem, replaced });
    return d.promise;
  }

  /** Queues an admitted group for the append loop (after `admit`, with no await in between). */
  private push(g: PendingGroup): void {
    this.reservedDepth += g.jobs.length;
    this.reservedBytes += g.bytes;
    // IDEM-1: the request's identity rides on its first new job, in the same append.
    if (g.idem !== null) g.recs[0] = withHeader(g.recs[0], H_IDEMPOTENCE, encodeIdemHeader(g.idem.id, g.jobs.length));
    this.pending.push(g);
    if (!this.running) {
      this.running = true;
      queueMicrotask(() => void this.loop());
    }
  }

  private full(): QueueFullError {
    const d = this.host.depth();
    return new QueueFullError(this.host.name, d.jobs + this.reservedDepth, d.bytes + this.reservedBytes);
  }

  /** Overflow policy (maxDepth / maxBytes): reject with QueueFullError or block up to blockTimeoutMs. */
  private async admit(n: number, bytes: number, signal?: AbortSignal): Promise<void> {
    const s = this.host.settings();
    const fits = (): boolean => {
      const d = this.host.depth();
      return d.jobs + this.reservedDepth + n <= s.maxDepth && d.bytes + this.reservedBytes + bytes <= s.maxBytes;
    };
    if (fits()) return;
    if (n > s.maxDepth || bytes > s.maxBytes || s.overflow === "reject") throw this.full();
    const aborted = (): AbortedError => new AbortedError("enqueue aborted while waiting for room; nothing was stored", signal?.reason);
    const deadline = this.host.monoNow() + s.blockTimeoutMs;
    while (!fits()) {
      this.host.check();
      // Checked on every round: a listener added to an already aborted signal never fires.
      if (signal?.aborted) throw aborted();
      const left = deadline - this.host.monoNow();
      if (left <= 0) throw this.full();
      await new Promise<void>((resolve, reject) => {
        const cleanup = (): void => {
          clearTimeout(timer);
          this.roomWaiters.delete(done);
          signal?.removeEventListener("abort", onAbort);
        };
        const done = (): void => {
          cleanup();
          resolve();
        };
        // Not via done(): a promise resolved first would ignore the rejection and keep waiting.
        const onAbort = (): void => {
          cleanup();
          reject(aborted());
        };
        const timer = setTimeout(done, left);
        this.roomWaiters.add(done);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
  }

  /** Ends every blocked wait (the queue closes or fails: they re-check and throw). */
  wakeAll(): void {
    for (const w of [...this.roomWaiters]) w();
  }

  private async loop(): Promise<void> {
    try {
      while (this.pending.length > 0) {
        const groups = this.takeRound();
        let recs = 0;
        let bytes = 0;
        for (const g of groups) {
          recs += g.jobs.length;
          bytes += g.bytes;
        }
        const records: PreparedRecord[] = new Array(recs);
        let r = 0;
        for (const g of groups) for (const rec of g.recs) records[r++] = rec;
        let base: number;
        try {
          base = (await this.msgs.append(records)).baseOffset;
        } catch (e) {
          this.failRound([...groups, ...this.pending.splice(0)], e);
          break;
        }
        this.reservedDepth -= recs;
        this.reservedBytes -= bytes;
        this.host.appended(bytes);
        let off = base;
        for (const g of groups) {
          const gBase = off;
          this.host.stored(gBase, g.jobs, g.recs);
          if (g.jobs.some((j) => j.singleton)) this.storedSingletons(g, gBase);
          for (const job of g.jobs) {
            const id = job.dedupeId;
            if (id !== null) {
              const e = this.dedupe.get(id);
              if (e !== undefined && e.wait === g.d) {
                e.off = off;
                e.wait = null;
              }
            }
            off++;
          }
          // Together with the rows (no await in between): a snapshot sees both or neither.
          if (g.idem !== null) this.producers.complete(g.idem.entry, gBase, g.jobs.length);
          g.d.resolve(gBase);
        }
      }
    } finally {
      this.running = false;
      if (this.pending.length === 0 && this.idleWaiter) {
        this.idleWaiter.resolve();
        this.idleWaiter = null;
      }
    }
  }

  /** A group's singleton claims are durable (JOB-2); the jobs its debounce jobs replace go. */
  private storedSingletons(g: PendingGroup, base: number): void {
    const st = this.host.state();
    const now = this.host.now();
    for (let k = 0; k < g.jobs.length; k++) {
      const sk = g.jobs[k].singleton;
      if (!sk) continue;
      const e = st.singletons.get(sk.mode, sk.key, now);
      if (e !== undefined && e.wait === g.d && e.idx === k) st.singletons.stored(sk.mode, sk.key, e, base + k);
    }
    if (g.replaced !== null) for (const off of g.replaced) this.host.replaced(off);
  }

  /** Whole groups per append, up to MAX_APPEND_RECORDS / MAX_APPEND_BYTES (one group alone may exceed them). */
  private takeRound(): PendingGroup[] {
    let n = 0;
    let recs = 0;
    let bytes = 0;
    const p = this.pending;
    while (n < p.length && (n === 0 || (recs + p[n].jobs.length <= MAX_APPEND_RECORDS && bytes + p[n].bytes <= MAX_APPEND_BYTES))) {
      recs += p[n].jobs.length;
      bytes += p[n].bytes;
      n++;
    }
    return p.splice(0, n);
  }

  /** Nothing of a failed append is acknowledged; the log refuses writes until reopened, so does the queue. */
  private failRound(groups: PendingGroup[], e: unknown): void {
    const err = this.host.failed(e);
    for (const g of groups) {
      for (const job of g.jobs) {
        const id = job.dedupeId;
        if (id !== null && this.dedupe.get(id)?.wait === g.d) this.dedupe.delete(id);
      }
      this.reservedDepth -= g.jobs.length;
      this.reservedBytes -= g.bytes;
      // IDEM-1: nothing of it is stored, so nothing may claim it is.
      if (g.idem !== null) this.producers.drop(g.idem.id, g.idem.entry, err);
      g.d.reject(err);
    }
  }

  /**
   * The original answer of a stored request, for a retry of it: its new jobs hold the offsets
   * `first .. first + count - 1` in job order, and the jobs that were duplicates are found in the
   * dedupe table again (their originals were stored before the request). A dedupe id whose
   * window has ended since (and was swept) can no longer be told apart: such a job is taken as
   * new while the request has unassigned new offsets, else it is answered as a duplicate whose
   * original is unknown (empty id).
   */
  private rebuildAnswer(jobs: readonly NewJob[], first: number, count: number, compact: boolean): EnqueueOutcome {
    const n = jobs.length;
    let plain = true;
    for (const j of jobs) if ((j.dedupeId !== null && this.dedupe.window(j.dedupeId) > 0) || j.singleton) plain = false;
    if (plain) return compact ? { first, count: n } : this.freshResults(first, n);
    const end = first + count;
    // Kinds: 0 new (no dedupe id: the next new offset), 1 new at a known offset, 2 duplicate of a
    // job stored before the request, 3 duplicate of an earlier job of this request, 4 unknown.
    const kind = new Uint8Array(n);
    const at = new Float64Array(n);
    const out: EnqueueResult[] = new Array(n);
    const firstIdx = new Map<string, number>();
    const st = this.host.state();
    const now = this.host.now();
    const lastDebounce = new Map<string, number>();
    for (let i = 0; i < n; i++) if (jobs[i].singleton?.mode === "debounce") lastDebounce.set(jobs[i].singleton!.key, i);
    /** Job i carries identity `id` (a dedupe id or a singleton key) whose table entry `entry()` gives. */
    const classify = (i: number, id: string, entry: () => { off: number; wait: unknown } | undefined): void => {
      const prev = firstIdx.get(id);
      if (prev !== undefined) {
        kind[i] = 3;
        at[i] = prev;
        return;
      }
      firstIdx.set(id, i);
      const e = entry();
      // A claim still in flight, or an offset past the request, belongs to a later job with this
      // id (the window ended and the id was used again): the original entry is gone.
      if (e === undefined || e.wait !== null || e.off >= end) kind[i] = 4;
      else if (e.off >= first) {
        kind[i] = 1;
        at[i] = e.off;
      } else {
        kind[i] = 2;
        out[i] = { id: String(e.off), duplicate: true };
      }
    };
    for (let i = 0; i < n; i++) {
      const sk = jobs[i].singleton;
      if (sk?.mode === "debounce") {
        // Replaced within the request before it was stored: answered as the later job.
        const last = lastDebounce.get(sk.key)!;
        if (last !== i) {
          kind[i] = 3;
          at[i] = last;
        }
        continue;
      }
      if (sk) {
        // As a dedupe id: the key's entry names the job that took it.
        classify(i, `\u0000${sk.mode}:${sk.key}`, () => st.singletons.get(sk.mode, sk.key, now));
        continue;
      }
      const d = jobs[i].dedupeId;
      if (d === null || this.dedupe.window(d) <= 0) continue;
      classify(i, d, () => this.dedupe.get(d));
    }
    // Assign new offsets in job order, segment by segment between jobs of known offset.
    let cursor = first;
    for (let i = 0; i < n; ) {
      let j = i;
      while (j < n && kind[j] !== 1) j++;
      const segEnd = j < n ? at[j] : end;
      let must = 0;
      let unknown = 0;
      for (let k = i; k < j; k++) {
        if (kind[k] === 0) must++;
        else if (kind[k] === 4) unknown++;
      }
      let unknownNew = Math.max(0, Math.min(unknown, segEnd - cursor - must));
      for (let k = i; k < j; k++) {
        if (kind[k] === 0 || (kind[k] === 4 && unknownNew-- > 0)) out[k] = { id: String(cursor++), duplicate: false };
        else if (kind[k] === 4) out[k] = { id: "", duplicate: true };
      }
      if (j < n) {
        out[j] = { id: String(at[j]), duplicate: false };
        cursor = at[j] + 1;
      }
      i = j + 1;
    }
    for (let i = 0; i < n; i++) if (kind[i] === 3) out[i] = { id: out[at[i]].id, duplicate: true };
    return out;
  }
}
