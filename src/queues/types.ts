// SPDX-License-Identifier: Apache-2.0
/**
 * Public work-queue contract. The embedded implementation (src/queues/queue.ts) and the network
 * client implement the same `Queue<T>` interface, so nothing here may reference storage types.
 */

import type { Durability, Headers, PublishValue } from "../value-types.js";
import type { SqlTransaction } from "../types.js";

export type { Durability, Headers, PublishValue };

/** Retry backoff: exponential growth with full jitter between `minDelayMs` and the capped step. */
export interface BackoffConfig {
  type?: "exponential" | "fixed";
  /** Lower bound of every retry delay (and the first step of the exponential curve). Default 1000. */
  minDelayMs?: number;
  /** Upper bound of every retry delay. Default 300_000. */
  maxDelayMs?: number;
}

export type OverflowPolicy = "reject" | "block";

export interface QueueConfig {
  /** Default lease length for a delivery. Default 30_000. Range 10 .. 12 h. */
  visibilityTimeoutMs?: number;
  /** Deliveries before the job is dead-lettered (1 .. 1000). Default 5. */
  maxAttempts?: number;
  backoff?: BackoffConfig;
  /** Name of the dead-letter queue. Default `${name}.dlq`; `null` drops exhausted jobs (acked). */
  deadLetter?: string | null;
  /** Max jobs in the backlog (waiting + delayed + in flight). Default 10_000_000. */
  maxDepth?: number;
  /** Max payload bytes in the backlog. Default 1 GiB. */
  maxBytes?: number;
  /** What enqueue does when full: `reject` (retriable QueueFullError) or `block` up to `blockTimeoutMs`. */
  overflow?: OverflowPolicy;
  /** For `overflow: "block"`: how long an enqueue waits for room before QueueFullError. Default 5000. */
  blockTimeoutMs?: number;
  /** An enqueue whose `dedupeId` was seen within this window returns the original id. Default 0 (off). */
  dedupeWindowMs?: number;
  /** Max remembered dedupe ids (refuses new dedupe ids beyond this with QueueFullError). Default 1_000_000. */
  maxDedupeEntries?: number;
  /** Header names removed from a job when it moves to the dead-letter queue. */
  redactHeaders?: string[];
  /** A job redriven this many times that dead-letters again stays in the DLQ marked `repeat`. Default 3. */
  maxRedrives?: number;
  /** Largest payload + headers accepted by enqueue. Default 1 MiB. */
  maxMessageBytes?: number;
  /** `always` (default): enqueue/ack/nack resolve after fdatasync (group commit). */
  durability?: Durability;
  /** Max jobs in flight across all workers of this queue (bounds lease memory). Default 100_000. */
  maxInFlight?: number;
  /** Segment size of the queue's message log; settled segments are deleted whole. Default 64 MiB. */
  segmentBytes?: number;
  /**
   * How long a completed job's result (`job.ack(result)`, the return value of a `process()`
   * handler) and a dead-lettered job's outcome stay readable through `getJob(id)`, in ms.
   * Default 0: nothing is kept (results are ignored). At most 30 days.
   */
  resultRetentionMs?: number;
  /**
   * What happens to a job whose `expireInMs` / `expiresAt` passed before it was started:
   * `dead-letter` (default: moved to the dead-letter queue with error class `JobExpiredError`,
   * or dropped when `deadLetter` is null) or `drop` (removed).
   */
  onExpire?: "dead-letter" | "drop";
  /**
   * Queue rate limit (BullMQ's limiter): at most `max` jobs started (leases granted) in any
   * `durationMs` window, across all workers and all client processes (the broker grants every
   * lease). Workers waiting for the limit are woken when the window next has room. The window is
   * kept in memory: after a broker restart it starts empty, so a crash can allow up to `max`
   * extra starts. Default none. `max` 1 .. 1,000,000; `durationMs` 1 .. 24 h.
   */
  rateLimit?: RateLimitConfig | null;
  /**
   * Per-group concurrency (BullMQ Pro groups, pg-boss `groupConcurrency`): at most this many
   * jobs of one `group` (EnqueueOptions.group) are leased at once, across all workers and all
   * client processes. A group at its cap is skipped (its jobs wait, in order) until one of its
   * jobs is acked, failed, released or its lease expires. Default 0: no cap. Ungrouped jobs are
   * never capped. At most 1,000,000.
   */
  groupConcurrency?: number;
  /**
   * Per-group rate limit: at most `max` jobs of one group started in any `durationMs` window
   * (sliding, as `rateLimit`, and like it kept in memory: it starts empty after a restart).
   * Default none. Same bounds as `rateLimit`.
   */
  groupRateLimit?: RateLimitConfig | null;
  /**
   * Encryption at rest (docs/security.md): job payloads, headers, results, progress and
   * failure records are stored AES-256-GCM encrypted (both logs and the snapshot) with the
   * broker's active key. Needs a keyring; its dead-letter queue must be encrypted too (an
   * implicit one is); no job schedules; cannot be changed on an existing queue. Default false.
   */
  encrypted?: boolean;
}

/** `QueueConfig.rateLimit`: at most `max` starts in any `durationMs` window (sliding). */
export interface RateLimitConfig {
  max: number;
  durationMs: number;
}

export interface EnqueueOptions {
  /** Per-key FIFO: jobs sharing a key are delivered in order, at most one in flight per key. */
  key?: string | null;
  /** Make the job visible only after this delay. */
  delayMs?: number;
  /** Absolute visibility time (ms since epoch or Date). Exclusive with delayMs. */
  deliverAt?: number | Date;
  /** Idempotent enqueue within the queue's `dedupeWindowMs`. Max 256 bytes. */
  dedupeId?: string;
  /** User headers. Names starting with `sluice-` are reserved. */
  headers?: Headers;
  /**
   * Priority 0 .. 9 (`MAX_PRIORITY`); higher is served first, FIFO within a priority. Default 0
   * (the lowest). Strict: a waiting job of a higher priority always goes first, so a steady
   * stream of high-priority jobs starves lower ones. Per-key FIFO wins: jobs sharing a `key`
   * run in enqueue order whatever their priorities (only a key's first waiting job competes,
   * with its own priority). Retries keep the job's priority.
   */
  priority?: number;
  /**
   * The job's group (a tenant, a customer, a user): a non-empty string of at most 1024 bytes.
   * Once any job of the queue has a group, waiting jobs are served round-robin across groups
   * (ungrouped jobs take turns as one more group), so one group's backlog cannot starve
   * another's; `priority` orders jobs within a group, and a `key`'s order still wins. The
   * queue's `groupConcurrency` and `groupRateLimit` cap each group. Kept across retries and
   * restarts; a dead-letter copy or a redriven job has no group.
   */
  group?: string;
  /**
   * The job must be started (handed to a worker) within this many ms of the enqueue; if not, it
   * is dead-lettered (error class `JobExpiredError`) or dropped, per the queue's `onExpire`.
   * Exclusive with `expiresAt`. Once started, the job no longer expires.
   */
  expireInMs?: number;
  /** As `expireInMs`, an absolute time (ms since epoch or Date). */
  expiresAt?: number | Date;
  /**
   * A key that limits how many jobs of it the queue holds, per `singletonMode` (keys are
   * separate per mode). At most 256 bytes.
   */
  singletonKey?: string;
  /**
   * With `singletonKey` (default `"singleton"`):
   * - `singleton`: at most one waiting-or-active job per key; another enqueue stores nothing
   *   and returns the existing job's id with `duplicate: true`. The key is free again once the
   *   job completes, is dead-lettered or removed.
   * - `debounce`: at most one waiting job per key; another enqueue stores the new job and
   *   removes the waiting one (the result's `replaced` names it). A job already active is not
   *   touched: the new one waits behind it. With `singletonWindowMs`, each job waits that long
   *   (a quiet period: a burst of enqueues ends as one job with the last data).
   * - `throttle`: one job per key per `singletonWindowMs`, counted from the first; enqueues
   *   within the window store nothing and return the first job's id with `duplicate: true`.
   */
  singletonMode?: "singleton" | "debounce" | "throttle";
  /** The window of `throttle` (required, > 0) and the quiet period of `debounce` (default 0). At most 30 days. */
  singletonWindowMs?: number;
  /** Aborts a blocked enqueue (overflow: block). */
  signal?: AbortSignal;
  /** Enqueue inside the application's own transaction: see `EnqueueBatchOptions.transaction`. Not with `signal`. */
  transaction?: SqlTransaction;
}

/** Options of one `enqueueBatch()` / `enqueueFlow()` call. */
export interface EnqueueBatchOptions {
  /** Aborts a blocked enqueue (overflow: block). */
  signal?: AbortSignal;
  /**
   * Enqueue inside the application's own transaction (a job written with the rows it is about,
   * without an outbox relay): the jobs take their ids now and become visible to workers when
   * the caller commits; a rollback leaves no trace (no id used, no dedupe or singleton key
   * taken, no event). The embedded broker on the PostgreSQL engine only, with `tx` a client of
   * the same database after `BEGIN` (`ValidationError` otherwise). Until the caller commits or
   * rolls back, the queue's other state changes wait: other enqueues, grants and settlements
   * (acks, retries) of that queue, on every node. It never waits for room: a full queue rejects
   * it at once with QueueFullError, whatever `overflow`. Not with `signal` (nothing to abort).
   */
  transaction?: SqlTransaction;
}

export interface EnqueueItem extends Omit<EnqueueOptions, "signal" | "transaction"> {
  data: PublishValue;
}

export interface EnqueueResult {
  /** Stable job id (unique within this incarnation of the queue). */
  id: string;
  /**
   * True when nothing was stored: a `dedupeId` matched, a `singleton` or `throttle` key was
   * taken, or a later job of the same batch replaced this one (`debounce`); `id` is the job that
   * holds it.
   */
  duplicate: boolean;
  /** `debounce`: the id of the waiting job this enqueue replaced (removed), when there was one. */
  replaced?: string;
}

export interface AttemptRecord {
  /** Wall-clock ms of the failure (or lease loss). */
  at: number;
  attempt: number;
  consumer: string;
  errorClass: string;
  error: string;
  codeVersion?: string;
}

/** Present on jobs in a dead-letter queue. */
export interface DeadLetterInfo {
  sourceQueue: string;
  /** Job id in the source queue. */
  sourceId: string;
  /** Incarnation id of the source queue (changes when it is deleted and re-created). */
  sourceIncarnation: string;
  firstEnqueuedAt: number;
  deadLetteredAt: number;
  attempts: number;
  errorClass: string;
  error: string;
  history: AttemptRecord[];
  codeVersion?: string;
  /** How often this job had been redriven before it dead-lettered (again). */
  redriveCount: number;
  /** Dead-lettered again after `maxRedrives` redrives: `redrive()` skips it unless asked. */
  repeat: boolean;
  /** This copy may duplicate another DLQ entry of the same source job (crash during a move). */
  duplicate: boolean;
  /** Header names that were removed by `redactHeaders`. */
  redacted: string[];
}

export interface NackOptions {
  /** Retry after this delay instead of the queue's backoff. */
  delayMs?: number;
  /** `false` sends the job straight to the dead-letter queue. Default true. */
  requeue?: boolean;
  /** Failure description recorded in the attempt history / DLQ metadata. */
  reason?: string;
  /** The error that caused the failure (its class name is recorded). */
  error?: unknown;
}

export interface Job<T = unknown> {
  readonly id: string;
  readonly data: T;
  readonly key: string | null;
  /** 1 on first delivery; rises with every delivery (including lease expiry). */
  readonly attempt: number;
  readonly enqueuedAt: number;
  readonly headers: Record<string, Uint8Array>;
  /** Unique per delivery; settlement with a stale receipt throws LeaseExpiredError. */
  readonly receipt: string;
  /** Wall-clock ms when the current lease ends (informational; expiry uses a monotonic clock). */
  readonly leaseExpiresAt: number;
  /** Number of times this job was redriven from a dead-letter queue. */
  readonly redriveCount: number;
  /** Set on jobs read from a dead-letter queue. */
  readonly deadLetter: DeadLetterInfo | null;
  /** Aborts when the lease is lost or the worker/queue shuts down. */
  readonly signal: AbortSignal;
  /**
   * Completes the job; resolves once durable. May be left un-awaited (the worker bounds how
   * many are pending: `maxPendingSettlements`); its promise never causes an unhandled
   * rejection. A failed ack means the lease was lost: the job is delivered again.
   *
   * `result`: a JSON-serialisable value kept with the completion (the same durable write) when
   * the queue's `resultRetentionMs` is above 0, readable through `queue.getJob(id)`; ignored
   * otherwise. A result that is not JSON-serialisable or larger than 64 KiB as JSON rejects
   * with ValidationError before anything is written: the job stays leased (ack again without
   * it, or nack).
   */
  ack(result?: unknown): Promise<void>;
  /** Fails this attempt: retry with backoff (or `delayMs`), or `requeue: false` to dead-letter. */
  nack(opts?: NackOptions): Promise<void>;
  /** Pushes the lease out to `ms` from now. */
  extend(ms: number): Promise<void>;
  /**
   * Gives the job back without spending an attempt (the work was rate limited downstream, e.g.
   * an HTTP 429): visible again after `ms` (0 .. 1 year), `attempt` unchanged on its next
   * delivery, no entry in its history. Resolves once durable (after a crash the count stays
   * given back). A `process()` handler can throw `RateLimitedError` instead.
   */
  retryAfter(ms: number): Promise<void>;
  /**
   * Records the job's progress: a number or a small JSON value (at most `MAX_PROGRESS_BYTES`,
   * 4 KiB, as JSON; ValidationError beyond, nothing written). Resolves once durable, like
   * `ack`; LeaseExpiredError with a stale lease. Readable through `queue.getJob(id)` while the
   * job is not yet completed, and reported to `queue.events()` readers. Each call replaces the
   * previous value.
   */
  progress(value: unknown): Promise<void>;
  /**
   * A flow's parent: the outcome of each of its children by child id (`result` as the child was
   * acked with). Every child has finished by the time the parent runs. `{}` for a job without
   * children.
   */
  childResults(): Promise<Record<string, ChildOutcome>>;
}

export interface WorkOptions {
  /** Lease length for jobs of this worker. Default: the queue's visibilityTimeoutMs. */
  visibilityTimeoutMs?: number;
  /**
   * Max jobs handed to application code and not yet settled (1 .. 10_000). Default 16. The
   * worker may hold a few more granted jobs it has not handed out yet (its lookahead).
   */
  prefetch?: number;
  /**
   * Max settlements issued and not yet durable (an un-awaited `job.ack()`), 1 .. 100_000.
   * Default 1000. Above it the worker hands out no more jobs until writes complete, which bounds
   * what a crash can deliver again: at most `prefetch` + this many jobs per worker.
   */
  maxPendingSettlements?: number;
  signal?: AbortSignal;
  /** Recorded in attempt history. Default `${pid}-worker-N`. */
  consumerId?: string;
  /** Recorded in attempt history and DLQ metadata. */
  codeVersion?: string;
  /** What happens to jobs still unsettled when the iterator ends. Default "nack" (visible again, no backoff). */
  onUnsettled?: "nack" | "error";
}

export interface ProcessOptions extends WorkOptions {
  /** Handlers running at once. Default 1, max 10_000. */
  concurrency?: number;
}

export interface Worker<T> extends AsyncIterable<Job<T>> {
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export interface BlockedKey {
  key: string;
  /** ms since the key's head job was first enqueued. */
  ageMs: number;
  /** Attempts already made on the head job. */
  attempts: number;
}

export interface QueueStats {
  name: string;
  /** Visible and deliverable now. */
  waiting: number;
  /** Not yet visible (delay or retry backoff). */
  delayed: number;
  inFlight: number;
  /** Keyed jobs held behind an earlier job of the same key. */
  blockedByKey: number;
  /** Flow parents waiting for their children (`enqueueFlow`). */
  waitingChildren: number;
  /** Total jobs this queue has moved to its dead-letter queue. */
  deadLettered: number;
  /** waiting + delayed + inFlight + blockedByKey + waitingChildren (and jobs being dead-lettered). */
  depth: number;
  bytes: number;
  oldestWaitingAgeMs: number;
  oldestLeaseAgeMs: number;
  redeliveries: number;
  retries: number;
  completed: number;
  /** Acks per second over the last ~10 s. */
  completionRatePerSec: number;
  /** Keys whose head job has failed at least once and is held back (at most 100 listed). */
  blockedKeys: BlockedKey[];
  /**
   * Jobs whose stored record could not be read back (damaged storage, found on recovery or at
   * hand-out): they are never delivered. Counted since the queue was opened; each range is also
   * logged at error level.
   */
  unreadable: number;
}

export interface RedriveFilter {
  ids?: string[];
  errorClass?: string;
  /** Dead-lettered at or after (ms since epoch). */
  from?: number;
  /** Dead-lettered before (ms since epoch). */
  to?: number;
}

export interface RedriveOptions {
  /** Move to this queue instead of each job's source queue. */
  target?: string;
  filter?: RedriveFilter;
  /** Also redrive entries marked `repeat`. Default false. */
  includeRepeats?: boolean;
  /** Stop after this many jobs. */
  limit?: number;
}

export interface RedriveResult {
  moved: number;
  skippedRepeats: number;
}

/** Where a job is, as `Queue.getJob` reports it. */
export type JobStatus = "waiting" | "waiting-children" | "delayed" | "active" | "completed" | "dead";

/** A job as `Queue.getJob` reports it. */
export interface JobInfo<T = unknown> {
  id: string;
  /**
   * `waiting` (deliverable, or held behind an earlier job of its key), `delayed` (a delay or
   * retry backoff), `active` (leased to a worker), `completed` (acked; reported only while the
   * queue keeps results, `resultRetentionMs`), `dead` (dead-lettered: while the queue keeps
   * results, or until the queue forgets the job).
   */
  state: JobStatus;
  /** Deliveries so far. */
  attempts: number;
  /** The payload, for jobs not yet completed or dead-lettered. */
  data?: T;
  /** What the job was acked with (completed jobs acked with a result). */
  result?: unknown;
  /** The last failure's message, when an attempt failed. */
  lastError?: string;
  /** Wall-clock ms of the ack (completed) or of the dead-letter move (dead). */
  completedAt?: number;
  /** The last `job.progress(value)` of a job not yet completed or dead-lettered. */
  progress?: unknown;
  /** The job's group (`EnqueueOptions.group`), while it is not yet completed or dead-lettered. */
  group?: string;
  /** A flow's parent not yet finished: each child's outcome so far, by child id. */
  children?: Record<string, ChildOutcome>;
  /** A flow's child whose parent is still waiting for it: the parent's id. */
  parentId?: string;
}

/** A child job's outcome, as its parent sees it (`job.childResults()`, `getJob(parent).children`). */
export interface ChildOutcome {
  /** `pending`: not finished yet; `failed`: dead-lettered (with `onChildFailure: "continue"`); `removed`: removed or expired unstarted. */
  state: "pending" | "completed" | "failed" | "removed";
  /** What the child was acked with (completed with a result). */
  result?: unknown;
  /** Why it failed. */
  error?: string;
}

/**
 * A job of a flow (`queue.enqueueFlow`): a parent becomes runnable only once every one of its
 * `children` finished; children are flows themselves (any depth). Every job of a flow is stored
 * in one durable write: all of them or none.
 */
export interface FlowJob extends Omit<EnqueueItem, "dedupeId" | "singletonKey" | "singletonMode" | "singletonWindowMs"> {
  children?: FlowJob[];
  /**
   * What a child that is dead-lettered does to this job: `"fail"` (default) dead-letters this
   * job at once (it never runs; its own parent sees it failed), `"continue"` counts the child as
   * finished, with `state: "failed"` in `childResults()`.
   */
  onChildFailure?: "fail" | "continue";
}

/** The ids of a stored flow, in the shape of the flow. */
export interface FlowResult {
  id: string;
  children: FlowResult[];
}

/** Which jobs `Queue.browse` lists. */
export type BrowseState = "waiting" | "delayed" | "all";

export interface BrowseOptions {
  /** Jobs per page: 1 .. 1000 (`MAX_BROWSE_LIMIT`). Default 50. */
  limit?: number;
  /** The cursor: list jobs with ids after this one (a page's `next`). Absent: from the oldest. */
  after?: string;
  /**
   * `waiting` (deliverable, or held behind an earlier job of its key), `delayed` (a delay or
   * retry backoff), or `all` (those and the jobs leased to workers, `active`). Default `all`.
   */
  state?: BrowseState;
}

/** A job as `Queue.browse` lists it: `JobInfo` with the payload and the job's metadata. */
export interface BrowsedJob<T = unknown> extends JobInfo<T> {
  data: T;
  key: string | null;
  /** Wall-clock ms of the enqueue (of the copy, for a dead-letter entry). */
  enqueuedAt: number;
  /** User headers: a string when the value is valid UTF-8, else its bytes. */
  headers: Record<string, string | Uint8Array>;
  redriveCount: number;
  /** Set on entries of a dead-letter queue: where the job came from and why it failed. */
  deadLetter: DeadLetterInfo | null;
}

export interface BrowsePage<T = unknown> {
  /** In id order, at most `limit`. */
  jobs: BrowsedJob<T>[];
  /**
   * The cursor for the next page (pass it as `after`), or null when nothing follows. A page may
   * hold fewer than `limit` jobs (a byte bound, or a long run of jobs in other states) and still
   * have a `next`: only `next === null` means the end.
   */
  next: string | null;
}

/** Where `Queue.events` starts: `"now"` (default), `"earliest"` retained, or after an event's `position`. */
export type QueueEventsFrom = "now" | "earliest" | string;

export interface QueueEventsOptions {
  /**
   * `"now"` (default): events from the call on. `"earliest"`: from the oldest event the queue
   * still keeps. An event's `position`: the events after that one. A position older than what
   * the queue keeps starts at the oldest kept event, after a `gap` event.
   */
  from?: QueueEventsFrom;
  /** Aborting ends the iteration cleanly (no throw). */
  signal?: AbortSignal;
}

interface QueueEventBase {
  /** Pass as `from` to resume after this event. Opaque. */
  position: string;
  /** Wall-clock ms the event was stored. */
  at: number;
}

/** A job's lifecycle, as `Queue.events` reports it (docs/queues.md, "Lifecycle events"). */
export type QueueEvent =
  | (QueueEventBase & { type: "enqueued"; jobId: string; key: string | null; delayedUntil?: number })
  | (QueueEventBase & { type: "active"; jobId: string; attempt: number; leaseExpiresAt: number })
  | (QueueEventBase & { type: "progress"; jobId: string; attempt: number; progress: unknown })
  | (QueueEventBase & { type: "completed"; jobId: string; attempt: number; result?: unknown })
  | (QueueEventBase & { type: "failed"; jobId: string; attempt: number; errorClass: string; error: string; willRetry: boolean; retryAt?: number })
  | (QueueEventBase & { type: "stalled"; jobId: string; attempt: number; willRetry: boolean; retryAt?: number })
  | (QueueEventBase & { type: "released"; jobId: string; attempt: number; retryAt?: number })
  | (QueueEventBase & { type: "dead-lettered"; jobId: string })
  | (QueueEventBase & {
      type: "removed";
      jobId: string;
      /** `removed` (`queue.remove(id)`), `replaced` (by a debounce enqueue), `expired` (`onExpire: "drop"`); absent: redriven out of a dead-letter queue. */
      reason?: "removed" | "replaced" | "expired";
    })
  | (QueueEventBase & { type: "purged"; beforeId: string })
  | (QueueEventBase & { type: "gap" });

export type QueueEventType = QueueEvent["type"];

/** The iterable `Queue.events` returns; `close()` (or `await using`) ends it. */
export interface QueueEvents extends AsyncIterable<QueueEvent> {
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export interface Queue<T = unknown> extends QueueSchedules<T> {
  readonly name: string;
  enqueue(data: T & PublishValue, opts?: EnqueueOptions): Promise<EnqueueResult>;
  enqueueBatch(items: EnqueueItem[], opts?: EnqueueBatchOptions): Promise<EnqueueResult[]>;
  /**
   * Stores a flow: parents run only after all their children finished (FLOW-1, FLOW-2). One
   * durable write for the whole tree (at most `MAX_BATCH_ITEMS` jobs): all of it or nothing.
   */
  enqueueFlow(flow: FlowJob, opts?: EnqueueBatchOptions): Promise<FlowResult>;
  work(opts?: WorkOptions): Worker<T>;
  /**
   * Runs `fn` per job: return = ack (the return value, when not undefined, is the job's result,
   * kept when the queue has `resultRetentionMs`), throw = nack with backoff, throw
   * PermanentError = DLQ. Resolves when `signal` aborts (after in-flight handlers finish).
   */
  process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts?: ProcessOptions): Promise<void>;
  stats(): Promise<QueueStats>;
  /** Durably drops every job enqueued before this call (waiting, delayed, in flight). Returns how many. */
  purge(): Promise<number>;
  /**
   * Durably removes one waiting, delayed (or key-blocked) job. True once removed; false when the
   * queue holds no such job (unknown id, already completed, dead-lettered or removed, or being
   * dead-lettered). A job leased to a worker (active) is not removed: JobActiveError (code
   * `JOB_ACTIVE`), and nothing changes. QueueNotFoundError when the queue does not exist.
   */
  remove(id: string): Promise<boolean>;
  /** Treats this queue as a dead-letter queue and moves matching entries back. Resumable after a crash. */
  redrive(opts?: RedriveOptions): Promise<RedriveResult>;
  /**
   * The job with this id (`job.id`, the enqueue result's `id`), or null when the queue does not
   * know it (never enqueued, purged, completed and no longer retained) or the queue does not
   * exist. Never creates the queue.
   */
  getJob(id: string): Promise<JobInfo<T> | null>;
  /**
   * Lists jobs in id order without leasing them: no attempt is counted, nothing is changed or
   * created (QueueNotFoundError for a queue that does not exist). On a dead-letter queue each
   * entry carries its `deadLetter` record. Pages with `after: page.next`.
   */
  browse(opts?: BrowseOptions): Promise<BrowsePage<T>>;
  /**
   * The queue's lifecycle events (enqueued, active, progress, completed, failed, stalled,
   * dead-lettered, ...) in the order they were stored, read from the queue's durable journal:
   * a slow reader holds no memory in the broker and never slows workers down. Each event's
   * `position` resumes after it (`from: position`). `from: "now"` is taken when this is called.
   */
  events(opts?: QueueEventsOptions): QueueEvents;
}

/** What a schedule does about ticks it missed (due while the broker was down, or more than 60 s overdue). */
export type ScheduleCatchUp = "skip" | "once";
/** A named schedule of a queue (`Queue.upsertSchedule`): one of `cron` or `everyMs`. */
export interface ScheduleOptions<D = PublishValue> {
  /** Cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 with leading seconds. */
  cron?: string;
  /** Interval in ms (at least 10): ticks at the upsert time + k × everyMs. */
  everyMs?: number;
  /** IANA time zone the cron is evaluated in. Default "UTC". */
  tz?: string;
  /** The payload of every job this schedule enqueues. Default null. */
  data?: D;
  /** Key of the jobs (per-key FIFO). */
  key?: string | null;
  /** User headers of the jobs (the jobs also carry `sluice-schedule`, `sluice-schedule-tick`, `sluice-schedule-ticks`). */
  headers?: Headers;
  /** Each job becomes visible this long after its tick. Default 0. */
  delayMs?: number;
  /** `skip` (default): no job for missed ticks; `once`: one job for all of them. */
  catchUp?: ScheduleCatchUp;
}
/** A schedule as `Queue.listSchedules` reports it. */
export interface ScheduleInfo<T = unknown> {
  name: string;
  cron: string | null;
  everyMs: number | null;
  tz: string;
  catchUp: ScheduleCatchUp;
  paused: boolean;
  data: T;
  key: string | null;
  headers: Record<string, string | Uint8Array>;
  delayMs: number;
  /** The next tick (ms since epoch), null when paused or when the cron never matches again. */
  nextRunAt: number | null;
  /** The last tick whose job was stored, null before the first. */
  lastRunAt: number | null;
  createdAt: number;
  updatedAt: number;
}
/** Job schedules of a queue (BullMQ job schedulers, pg-boss `schedule`). Part of `Queue<T>`. */
export interface QueueSchedules<T = unknown> {
  /**
   * Creates or replaces the schedule `name`; resolves once it is durable. Each tick enqueues one
   * job, exactly once per tick across crashes (see docs/queues.md "Schedules"). Replacing keeps
   * the schedule's last tick (no tick fires twice) and starts counting from now.
   */
  upsertSchedule(name: string, opts: ScheduleOptions<T & PublishValue>): Promise<ScheduleInfo<T>>;
  /** The queue's schedules, by name. */
  listSchedules(): Promise<ScheduleInfo<T>[]>;
  /** Stops firing (durable) until `resumeSchedule`; NotFoundError for an unknown name. */
  pauseSchedule(name: string): Promise<void>;
  /** Fires again from the next tick after now (ticks while paused are not caught up). */
  resumeSchedule(name: string): Promise<void>;
  /** Removes the schedule durably; false when there was none. */
  removeSchedule(name: string): Promise<boolean>;
}
