// SPDX-License-Identifier: Apache-2.0
/**
 * The queue half of the storage engine contract (`StorageEngine.queues`): what a work queue
 * needs from storage, in neutral types, so that the queue policy above it (src/queues: config
 * validation, backoff, the dead-letter decision, job and worker handles, prefetch,
 * `process()`) runs unchanged on any engine.
 *
 * The disk engine implements it in src/store/disk/queues/ (a message log and a state journal
 * per queue). A PostgreSQL engine would keep a jobs table: `enqueue` an INSERT (dedupe and
 * admission in the same transaction), `grant` a `SELECT ... FOR UPDATE SKIP LOCKED` that
 * writes the new attempt and deadline, each settlement one transaction, the dead-letter move an
 * INSERT into the dead-letter queue and an UPDATE of the source in one transaction.
 *
 * Contract (every engine; the invariants are in docs/ARCHITECTURE.md):
 *  - Q-1 a job is granted only once its enqueue is durable, and a grant resolves only once the
 *    new attempt number is durable, so attempts never go backwards across crashes.
 *  - Q-2 a settlement (`ack`, `retry`, `deadLetter`, `extend`) resolves only once durable.
 *  - Q-3 a settlement names the current lease of its job (the object `grant` returned); a
 *    stale one throws LeaseExpiredError and changes nothing.
 *  - Q-4 a dead-letter move leaves the job in the source or in the dead-letter queue after any
 *    crash, never in neither; Q-5 a redrive removes the dead-letter entry only once the copy
 *    in the target is durable.
 *  - KEY-1 jobs sharing a key are granted in enqueue order, at most one in flight.
 *  - LEASE-1..3 lease clocks, expiry and lease loss (see `Lease`, `LeaseConsumer`).
 * Errors known at once (a stale lease, a bad argument, a closed or failed queue) are thrown
 * synchronously by the settlement methods; their promise reports the write. Settlements made
 * durable together may share one promise (callers group on identity).
 */
import { ENVELOPE_HEADERS } from "../contracts/envelope.js";
import type { PreparedRecord, ValueKind } from "../log/record-batch.js";
import type { ScheduleStore } from "./schedule-store.js";
import type { SqlTransaction } from "../types.js";
import type {
  AttemptRecord,
  DeadLetterInfo,
  EnqueueResult,
  JobStatus,
  QueueConfig,
  QueueEvent,
  QueueStats,
  RedriveOptions,
  RedriveResult,
} from "../queues/types.js";

export type { PreparedRecord, ValueKind };

/** Header names starting with this are the engine's; the policy refuses them in user input. */
export const RESERVED_HEADER_PREFIX = "sluice-";

/** The envelope's headers (src/contracts/envelope.ts) are the application's, not the engine's. */
const ENVELOPE_HEADER_NAMES: ReadonlySet<string> = new Set(Object.values(ENVELOPE_HEADERS));

/** Headers of scheduled jobs (src/queues/schedules/): the schedule, its tick (ms) and how many ticks the job stands for. */
export const SCHEDULE_HEADERS = { schedule: "sluice-schedule", tick: "sluice-schedule-tick", ticks: "sluice-schedule-ticks" } as const;
const SCHEDULE_HEADER_NAMES: ReadonlySet<string> = new Set(Object.values(SCHEDULE_HEADERS));

/** A header name of the engine's own (refused in user input, not handed back to users). */
export function isSystemHeader(name: string): boolean {
  return name.startsWith(RESERVED_HEADER_PREFIX) && !ENVELOPE_HEADER_NAMES.has(name) && !SCHEDULE_HEADER_NAMES.has(name);
}
/**
 * Dedupe ids of schedule ticks: `sys:sch:<schedule>:<tickMs>`. An engine remembers at least
 * the latest such id per schedule for the system window (7 days) even with `dedupeWindowMs` 0
 * (SCHED-2), and may forget older ticks of the same schedule (ticks only move forward).
 */
export const SCHEDULE_DEDUPE_PREFIX = "sys:sch:";
/** Dedupe ids starting with this are the broker's own (dead-letter moves, redrives: 7-day window). */
export const SYSTEM_DEDUPE_PREFIX = "sys:";

/** Identity of an idempotent enqueue request: the network client's producer id and the
 * request's sequence number for this queue (src/queues/idempotence.ts, IDEM-1). */
export interface EnqueueIdentity {
  producerId: number;
  sequence: number;
}

/**
 * A queue's configuration with every default filled in, as the policy layer resolved it from
 * the stored `QueueConfig` (src/queues/config.ts). The engine enforces the storage-side limits
 * (depth, bytes, dedupe, in-flight) and applies the dead-letter rules that run without a caller
 * (lease expiry at `maxAttempts`, redaction, the redrive `repeat` mark).
 */
export interface QueueSettings {
  visibilityTimeoutMs: number;
  maxAttempts: number;
  backoff: { type: "exponential" | "fixed"; minDelayMs: number; maxDelayMs: number };
  deadLetter: string | null;
  maxDepth: number;
  maxBytes: number;
  overflow: "reject" | "block";
  blockTimeoutMs: number;
  dedupeWindowMs: number;
  maxDedupeEntries: number;
  redactHeaders: string[];
  maxRedrives: number;
  maxMessageBytes: number;
  durability: "always" | "interval" | "never";
  maxInFlight: number;
  segmentBytes: number;
  /** Completed and dead-lettered jobs stay readable (`getJob`) this long; 0 keeps none. */
  resultRetentionMs: number;
  /** What happens to a job whose `expiresAt` passed before it was started (absent: dead-letter). */
  onExpire?: "dead-letter" | "drop";
  /** At most `max` leases granted in any `durationMs` window (absent or null: no limit). */
  rateLimit?: { max: number; durationMs: number } | null;
  /** Leases per job group at once (absent or 0: no cap; GRP-Q1). */
  groupConcurrency?: number;
  /** At most `max` leases per job group in any `durationMs` window (absent or null: no limit). */
  groupRateLimit?: { max: number; durationMs: number } | null;
  /** Encryption at rest of both logs and the snapshot (absent: false; ENC-1). */
  encrypted?: boolean;
}

/** Where a job came from when it is a copy made by the broker (a dead-letter move, a redrive). */
export interface JobOrigin {
  /** Redrives so far (a redriven job carries its count + 1). */
  redriveCount: number;
  /** First enqueue of the original job (kept across moves). */
  firstEnqueuedAt: number;
  /** Set on a job in a dead-letter queue. */
  deadLetter: (DeadLetterInfo & { key: string | null }) | null;
}

/**
 * A job validated and encoded by the policy layer, not yet stored. Its payload travels as a
 * neutral record (as topics' records do, src/store/engine.ts): key bytes, value bytes and
 * kind, enqueue time, user headers (names never start with `sluice-`: reserved for the
 * engine). The engine may keep the record object as it is.
 */
export interface NewJob {
  record: PreparedRecord;
  /** `record.key` as text: the per-key FIFO key, or null. */
  key: string | null;
  /** Deliverable from this wall-clock time; `<= record.timestamp` means at once. */
  deliverAt: number;
  /** `sys:`-prefixed ids are the broker's own (dead-letter moves, redrives): 7-day window. */
  dedupeId: string | null;
  /** Counted against `maxBytes` (the policy checked `recordSize(record)` against `maxMessageBytes`). */
  size: number;
  origin: JobOrigin | null;
  /** 0 .. MAX_PRIORITY, higher first (absent or 0: the default, lowest). */
  priority?: number;
  /** Wall-clock ms: a job not granted by then is expired (`QueueSettings.onExpire`); absent or 0: never. */
  expiresAt?: number;
  /** Singleton / debounce / throttle key (absent: none). */
  singleton?: SingletonSpec | null;
  /** The job's group (GRP-Q1/GRP-Q2; absent or null: none). */
  group?: string | null;
  /** Its place in a flow (absent: none; FLOW-1). */
  flow?: FlowLink | null;
}

/** What a child does to its parent when it fails (dead-lettered): fail it too, or count as finished. */
export type ChildFailurePolicy = "fail" | "continue";

/**
 * A job's place in a flow (parent/child jobs enqueued together, FLOW-1). Positions are relative
 * within one enqueue call, so a flow's records need no offsets before they are stored.
 */
export interface FlowLink {
  /** How many jobs back (in the same call) its parent is; 0: it has none (a root). */
  parentDelta: number;
  /** Children it waits for (0: none, runnable at once). */
  children: number;
  /** Set on parents: what a failed child does to it. */
  onChildFailure: ChildFailurePolicy;
}

export type SingletonMode = "singleton" | "debounce" | "throttle";

/**
 * A job's singleton key. `singleton`: at most one waiting-or-active job per key (another enqueue
 * is a duplicate of it); `debounce`: at most one waiting job per key (another enqueue replaces
 * it); `throttle`: one job per key per `windowMs` from the first (others are duplicates of it).
 */
export interface SingletonSpec {
  key: string;
  mode: SingletonMode;
  /** throttle: the window; debounce: the new job's delay (the quiet period); singleton: unused. */
  windowMs: number;
}

/** A stored job as handed to a consumer. */
export interface StoredJob {
  /** Engine-assigned, unique within the queue's incarnation. */
  readonly id: string;
  readonly key: string | null;
  readonly value: Buffer | null;
  readonly valueKind: ValueKind;
  /** User headers only. */
  readonly headers: [string, Buffer][] | null;
  readonly enqueuedAt: number;
  readonly redriveCount: number;
  readonly deadLetter: DeadLetterInfo | null;
}

/**
 * One delivery of a job. The object `grant` returned is the lease's identity: settlements take
 * it back. LEASE-1: the lease runs from the hand-out, for the consumer's `leaseMs`, on a
 * monotonic clock; its wall-clock deadline is stored, and after a restart an unexpired lease
 * stays in force until it.
 */
export interface Lease {
  readonly jobId: string;
  /** 1 on first delivery; every grant of the job raises it (durably, Q-1). */
  readonly attempt: number;
  /** `<jobId>.<attempt>`: unique per delivery. */
  readonly receipt: string;
  /** Wall-clock ms when the lease ends (informational; expiry uses a monotonic clock). */
  readonly deadline: number;
}

/**
 * Who leases jobs: the policy's worker. LEASE-2: the engine calls `leaseLost` synchronously
 * when a lease granted to this consumer ends other than by a settlement through it: expiry,
 * purge, the queue failing or closing, or a release the engine made.
 */
export interface LeaseConsumer {
  readonly consumerId: string;
  readonly codeVersion: string | undefined;
  /** Lease length for this consumer's grants. */
  readonly leaseMs: number;
  leaseLost(lease: Lease, reason: Error): void;
}

/** Grant to `consumer` until it holds `upTo` leases of this queue (granted, not yet ended). */
export interface GrantRequest {
  consumer: LeaseConsumer;
  upTo: number;
}

export interface GrantedJob extends StoredJob {
  readonly lease: Lease;
}

export interface EnqueueRequestOptions {
  /** Aborts a wait for room (overflow "block"); nothing is stored then (AbortedError). */
  signal?: AbortSignal;
  /**
   * An idempotent request of the network client: one already stored is answered with its
   * original ids (IDEM-1, src/queues/idempotence.ts).
   */
  identity?: EnqueueIdentity;
  /** Answer `{ first, count }` (ids `first .. first + count - 1`) when every job is new. */
  compact?: boolean;
}

export type EnqueueOutcome = EnqueueResult[] | { first: number; count: number };

/** A job as `getJob` reports it (the policy decodes the payload and the result). */
export interface StoredJobInfo {
  id: string;
  state: JobStatus;
  attempts: number;
  /** The stored payload, for jobs not yet completed or dead-lettered. */
  record?: { value: Buffer | null; valueKind: ValueKind };
  /** The result as JSON text (completed jobs acked with one). */
  result?: string;
  lastError?: string;
  completedAt?: number;
  /** The last progress as JSON text (jobs not yet completed or dead-lettered). */
  progress?: string;
  /** The job's group (jobs not yet completed or dead-lettered, enqueued with one). */
  group?: string;
  /** A flow's parent not yet finished: its children's outcomes (results as JSON text), by child id. */
  children?: Record<string, StoredChildOutcome>;
  /** The parent of a child job still waiting for it. */
  parentId?: string;
}

/** A child's outcome as its parent sees it (FLOW-2). */
export interface StoredChildOutcome {
  state: "pending" | "completed" | "failed" | "removed";
  /** Result as JSON text (completed with one). */
  result?: string;
  /** Why it failed. */
  error?: string;
}

/** What `readEvents` reads (the policy validated and bounded it). */
export interface StoredEventsRequest {
  /** `"now"`, `"earliest"`, or a `position` this store issued (ValidationError otherwise). */
  from: string;
  /** At most this many events (at least 1). */
  max: number;
  /** With no event at `from` yet, wait up to this long for one (0: answer at once). */
  maxWaitMs: number;
  signal?: AbortSignal;
}

export interface StoredEventsPage {
  /** In the order they were stored; each with the position after it. */
  events: QueueEvent[];
  /** Where the next read starts (after the last event, or `from` resolved when there is none). */
  position: string;
}

/** What `browse` lists (the policy validated and bounded it). */
export interface StoredBrowseRequest {
  /** List jobs with ids after this one (a previous page's `next`); null: from the oldest. */
  after: string | null;
  /** At most this many jobs. */
  limit: number;
  /** At most about this many payload bytes (at least one job). */
  maxBytes: number;
  state: "waiting" | "delayed" | "all";
}

/** A job as `browse` reports it: its stored record, undecoded, and where it is. */
export interface StoredBrowsedJob {
  id: string;
  state: JobStatus;
  attempts: number;
  key: string | null;
  value: Buffer | null;
  valueKind: ValueKind;
  /** User headers only. */
  headers: [string, Buffer][] | null;
  enqueuedAt: number;
  redriveCount: number;
  deadLetter: DeadLetterInfo | null;
  /** The job's group (absent: none). */
  group?: string;
}

export interface StoredBrowsePage {
  jobs: StoredBrowsedJob[];
  /** Cursor for the next page, or null at the end. */
  next: string | null;
}

/** Notifications from a stored queue to the policy layer. */
export interface QueueListener {
  /** Jobs may have become grantable (enqueued, due, unblocked, released, queue recovered). */
  available(): void;
  /**
   * Optional: the engine is about to write the state events gathered so far (settlements of
   * this turn). A listener with grants pending may issue them now: their DELIVER events then
   * share that write (one fdatasync for the ACKs and the next hand-outs, instead of two writes).
   */
  beforeWrite?(): void;
}

/** One open queue (its current incarnation). */
export interface StoredQueue {
  readonly name: string;
  /** Changes when the queue is deleted and re-created: old jobs never come back. */
  readonly incarnation: string;
  readonly settings: QueueSettings;
  /** Whether live flows wait for results: acks keep theirs even without `resultRetentionMs` (FLOW-2). */
  readonly hasFlows: boolean;

  /** Stores jobs (dedupe, admission, Q-1); results in job order. */
  enqueue(jobs: readonly NewJob[], opts?: EnqueueRequestOptions): Promise<EnqueueOutcome>;
  /**
   * Grants leases on grantable jobs, round-robin over the requests, at most `maxInFlight` in
   * the queue; resolves (one array per request) once the grants are durable. Jobs whose
   * lease ended meanwhile are left out.
   */
  grant(requests: readonly GrantRequest[]): Promise<GrantedJob[][]>;
  /**
   * Completes the job. `result` (JSON text the policy validated, at most MAX_RESULT_BYTES) is
   * kept with the completion, in the same durable write, when `resultRetentionMs` > 0 (Q-9:
   * an acked job's result is never lost, and no result exists for a job not acked).
   */
  ack(lease: Lease, result?: string): Promise<void>;
  /** A failed attempt: visible again at `visibleAt` (`failure` joins the job's history). */
  retry(lease: Lease, visibleAt: number, failure: AttemptRecord): Promise<void>;
  /**
   * Gives the delivery back (the job was rate limited downstream): visible again at
   * `visibleAt`, and this delivery is not an attempt (the count goes back by one), durably.
   */
  giveBack(lease: Lease, visibleAt: number): Promise<void>;
  /** Moves the job to the dead-letter queue (or drops it without one), Q-4. */
  deadLetter(lease: Lease, failure: AttemptRecord): Promise<void>;
  /** Pushes the deadline out to `ms` from now. */
  extend(lease: Lease, ms: number): Promise<void>;
  /**
   * Records the job's progress (`json`: JSON text the policy validated, at most
   * MAX_PROGRESS_BYTES); resolves once durable, LeaseExpiredError for a stale lease.
   * Kept while the job is live (getJob), dropped when it completes or dead-letters.
   */
  progress(lease: Lease, json: string): Promise<void>;
  /**
   * Gives an unsettled job back, visible at once, without a failure record. `counted` false:
   * it never reached application code, so this delivery is not an attempt. Not awaited: if the
   * record is lost in a crash, the lease simply expires. No-op for a lease that already ended.
   */
  release(lease: Lease, counted: boolean): void;
  /** Restarts the lease clock (same length) at a later hand-out; not durable (LEASE-1). */
  restartLease(lease: Lease): void;

  stats(): Promise<QueueStats>;
  /**
   * The job `id` as far as the store knows it: live jobs, and completed or dead-lettered ones
   * while `resultRetentionMs` runs (Q-10: never once it has passed, also after a restart).
   * Null for an id it does not know.
   */
  getJob(id: string): Promise<StoredJobInfo | null>;
  /**
   * lists live jobs in id order after `after`, without leasing or changing anything (no
   * attempt counted, no event written). Memory is bounded by the request (`limit`, `maxBytes`):
   * the engine reads only the records it returns. ValidationError for a cursor it never issued.
   */
  browse(req: StoredBrowseRequest): Promise<StoredBrowsePage>;
  /**
   * EVT-1: the queue's lifecycle events from durable storage, in stored order, each with a
   * position to resume after it; reads only (memory bounded by `max`), and costs the queue
   * nothing while nobody reads.
   */
  readEvents(req: StoredEventsRequest): Promise<StoredEventsPage>;
  /** Durably drops every job enqueued before the call; returns how many. */
  purge(): Promise<number>;
  /**
   * JOB-4: durably removes a waiting, delayed or key-blocked job; true once that is durable,
   * false for an id the queue does not know as a live job (never stored, finished, being
   * dead-lettered). JobActiveError (nothing changed) for a job leased to a worker.
   */
  remove(id: string): Promise<boolean>;
  /** Treats this queue as a dead-letter queue and moves matching entries back. */
  redrive(opts: RedriveOptions): Promise<RedriveResult>;
  listen(listener: QueueListener): () => void;
  /** Resolves when background work (resumed moves and redrives) has finished. */
  whenIdle(): Promise<void>;
}

export interface OpenQueueRequest {
  /** The user's config to store (replacing a different stored one). Absent: keep the stored
   * one; a new queue stores `{}` (or `{ deadLetter: null }` when `implicit`). */
  config?: QueueConfig;
  /** Created by the broker itself (a dead-letter queue on first use). */
  implicit?: boolean;
  /** With `implicit`: create it encrypted (the dead-letter queue of an encrypted queue, ENC-1). */
  encrypted?: boolean;
  /** The policy's validation and defaults for a stored config (ValidationError when bad). */
  settings(config: QueueConfig): QueueSettings;
  /**
   * Other queues (dead-letter and redrive targets), opened through the policy layer, so the
   * engine's moves go through the same `StoredQueue` objects (and any wrapper around them).
   */
  peer(name: string): Promise<StoredQueue>;
  /**
   * Told, once the manifest holding it is durable, that this open created the queue or
   * replaced its stored config (the broker audits both, AUD-1). Engines without it audit
   * nothing for queue creation.
   */
  changed?(kind: "create" | "alter"): void;
}

/**
 * Optional capability of a queue store: enqueues inside the caller's open SQL transaction
 * (`queue.enqueue(data, { transaction })`). The jobs take their ids, dedupe entries and
 * admission room at once and become grantable only when the caller commits; a rollback undoes
 * all of it (ids, counters, dedupe and singleton keys, events). The queue stays locked for the
 * queue's other state changes (enqueues, grants, settlements, on every node) until the
 * caller's transaction ends. A call that fails leaves the caller's transaction as it was. It
 * never waits for room: a full queue rejects with QueueFullError at once.
 */
export interface TransactionalEnqueues {
  /** Stores `jobs` in `queue` (a queue this store opened) inside `tx`; results in job order. */
  enqueue(tx: SqlTransaction, queue: StoredQueue, jobs: readonly NewJob[]): Promise<EnqueueOutcome>;
}

export interface QueueStore {
  /** Opens (creating if needed) the current incarnation of `name`, recovered. */
  open(name: string, req: OpenQueueRequest): Promise<StoredQueue>;
  /** Existing queues, sorted by name. */
  list(): Promise<string[]>;
  /**
   * Durably deletes the queue and its jobs (NotFoundError `QUEUE_NOT_FOUND` when absent). Its
   * open `StoredQueue` stops working (BrokerClosedError); the next `open` creates a new
   * incarnation.
   */
  delete(name: string): Promise<void>;
  /** Job schedules (src/store/schedule-store.ts); an engine without them refuses schedule calls. */
  readonly schedules?: ScheduleStore;
  /** Present when the store can enqueue inside an application's transaction (see TransactionalEnqueues). */
  readonly transactional?: TransactionalEnqueues;
}
