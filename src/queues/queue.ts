// SPDX-License-Identifier: Apache-2.0
/**
 * One incarnation of a durable work queue.
 *
 * Storage (under `${dataDir}/queues/<incarnation>/`):
 *  - `msgs/`     a PartitionLog holding the jobs (payload, key, headers, delivery time);
 *  - `journal/`  a PartitionLog of state events (events.ts): deliveries, acks, nacks, extends,
 *                lease expiries, dead-letter moves, purges; many events per record;
 *  - `snapshot.bin` the whole job table at a journal offset (writeFileAtomic), after which the
 *                journal and the fully-settled prefix of `msgs/` are deleted (advanceLogStart),
 *                so storage stays proportional to the backlog;
 *  - `redrive.json` a redrive in progress (resumed on open).
 *
 * Invariants:
 *  Q-1 a job is delivered only after its enqueue is durable, and handed to a worker only after
 *      its DELIVER event (with the new attempt number) is durable: attempts never go backwards.
 *  Q-2 ack/nack/extend resolve only after their journal event is durable (group commit).
 *  Q-3 a settlement must present the receipt of the current lease, checked against a monotonic
 *      deadline; anything else throws LeaseExpiredError and changes nothing.
 *  Q-4 dead-lettering writes DLQ_INTENT (durable) -> DLQ append with a system dedupe id
 *      (durable) -> DEAD. A crash anywhere leaves the job in the source (intent resumed on
 *      open, the dedupe id making the DLQ append idempotent) or in the DLQ; never in neither.
 *  Q-5 redrive appends to the target with a system dedupe id and removes the DLQ entry only
 *      after that append is durable.
 */
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import {
  BrokerClosedError,
  LeaseExpiredError,
  QueueFullError,
  RecordTooLargeError,
  StorageError,
  AbortedError,
  ValidationError,
} from "../errors.js";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../log/io.js";
import { silentLogger, type Logger } from "../log/logger.js";
import { PartitionLog, type LogConfig } from "../log/partition-log.js";
import { decodeValue, prepareValue, recordSize, type PreparedRecord, type StoredRecord, type ValueKind } from "../log/record-batch.js";
import { retryDelayMs } from "./backoff.js";
import { KeyChains } from "../store/disk/queues/chains.js";
import { decodeEvents, encodeEvent, Ev, EVENT_FIXED_BYTES, writeEvent, type JournalEvent } from "../store/disk/queues/events.js";
import { OffsetHeap } from "../store/disk/queues/heap.js";
import {
  decodeIdemHeader,
  encodeIdemHeader,
  EnqueueProducers,
  H_IDEMPOTENCE,
  validateIdentity,
  type EnqueueIdentity,
  type IdemEntry,
  type IdemSnapshot,
} from "./idempotence.js";
import { isTerminal, JobTable, St } from "../store/disk/queues/table.js";
import type {
  AttemptRecord,
  BackoffConfig,
  BlockedKey,
  DeadLetterInfo,
  EnqueueItem,
  EnqueueResult,
  Job,
  NackOptions,
  QueueConfig,
  QueueStats,
  RedriveOptions,
  RedriveResult,
  WorkOptions,
  Worker,
} from "./types.js";

// ───────────────────────────── limits and defaults ─────────────────────────────

export const MAX_PREFETCH = 10_000;
export const MAX_ATTEMPTS_LIMIT = 1000;
export const MAX_KEY_BYTES = 1024;
export const MAX_DEDUPE_ID_BYTES = 256;
export const MAX_HEADERS = 64;
export const MAX_BATCH_ITEMS = 10_000;
/** History entries kept per job (the most recent); bounds memory of repeatedly failing jobs. */
export const MAX_HISTORY = 20;
/** Error messages are cut to this many characters in history and DLQ metadata. */
export const MAX_ERROR_CHARS = 500;
/** Dedupe window for the broker's own ids (dead-letter moves, redrives): 7 days. */
export const SYSTEM_DEDUPE_WINDOW_MS = 7 * 86_400_000;
/** Records per message-log append, and bytes per journal record. */
const MAX_APPEND_RECORDS = 8192;
const MAX_APPEND_BYTES = 8 * 1024 * 1024;
const MAX_JOURNAL_RECORD_BYTES = 1024 * 1024;
/** Recently enqueued payloads kept in memory so delivery of a hot queue does not re-read disk. */
const TAIL_CACHE_BYTES = 32 * 1024 * 1024;
const CACHE_SLOTS = 1 << 17;
/** Take a snapshot (and delete settled log prefixes) after this many journal bytes. */
const SNAPSHOT_EVERY_JOURNAL_BYTES = 32 * 1024 * 1024;
/** ... and after this many message-log bytes (or twice the last snapshot's size, whichever is larger). */
const SNAPSHOT_EVERY_MSG_BYTES = 64 * 1024 * 1024;
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Reserved header names (user headers may not start with `sluice-`). */
const H_DELIVER_AT = "sluice-at";
const H_DEDUPE = "sluice-dd";
const H_REDRIVES = "sluice-rd";
const H_FIRST_ENQUEUED = "sluice-fe";
const H_DLQ = "sluice-dlq";

export interface ResolvedQueueConfig {
  visibilityTimeoutMs: number;
  maxAttempts: number;
  backoff: Required<BackoffConfig>;
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
}

function num(v: unknown, name: string, min: number, max: number, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max)
    throw new ValidationError(`${name} must be a number in [${min}, ${max}], got ${String(v)}`);
  return v;
}

/** Validates a queue config and fills defaults. Throws ValidationError before anything is allocated. */
export function resolveQueueConfig(name: string, c: QueueConfig = {}): ResolvedQueueConfig {
  if (c === null || typeof c !== "object") throw new ValidationError("queue config must be an object");
  const minDelayMs = num(c.backoff?.minDelayMs, "backoff.minDelayMs", 0, 86_400_000, 1000);
  const maxDelayMs = num(c.backoff?.maxDelayMs, "backoff.maxDelayMs", minDelayMs, 30 * 86_400_000, Math.max(minDelayMs, 300_000));
  const type = c.backoff?.type ?? "exponential";
  if (type !== "exponential" && type !== "fixed") throw new ValidationError(`backoff.type must be "exponential" or "fixed"`);
  const overflow = c.overflow ?? "reject";
  if (overflow !== "reject" && overflow !== "block") throw new ValidationError(`overflow must be "reject" or "block"`);
  const durability = c.durability ?? "always";
  if (durability !== "always" && durability !== "interval" && durability !== "never")
    throw new ValidationError(`durability must be always|interval|never`);
  let deadLetter: string | null;
  if (c.deadLetter === undefined) deadLetter = name.endsWith(".dlq") ? null : `${name}.dlq`;
  else if (c.deadLetter === null) deadLetter = null;
  else {
    validateQueueName(c.deadLetter);
    deadLetter = c.deadLetter;
  }
  if (deadLetter === name) throw new ValidationError(`queue ${name} cannot be its own dead-letter queue`);
  const redact = c.redactHeaders ?? [];
  if (!Array.isArray(redact) || redact.length > 256 || redact.some((h) => typeof h !== "string"))
    throw new ValidationError("redactHeaders must be an array of at most 256 header names");
  return {
    visibilityTimeoutMs: num(c.visibilityTimeoutMs, "visibilityTimeoutMs", 10, 12 * 3_600_000, 30_000),
    maxAttempts: Math.floor(num(c.maxAttempts, "maxAttempts", 1, MAX_ATTEMPTS_LIMIT, 5)),
    backoff: { type, minDelayMs, maxDelayMs },
    deadLetter,
    maxDepth: Math.floor(num(c.maxDepth, "maxDepth", 1, 1e12, 10_000_000)),
    maxBytes: Math.floor(num(c.maxBytes, "maxBytes", 1, 2 ** 50, 1024 ** 3)),
    overflow,
    blockTimeoutMs: num(c.blockTimeoutMs, "blockTimeoutMs", 0, 3_600_000, 5000),
    dedupeWindowMs: num(c.dedupeWindowMs, "dedupeWindowMs", 0, 30 * 86_400_000, 0),
    maxDedupeEntries: Math.floor(num(c.maxDedupeEntries, "maxDedupeEntries", 1, 100_000_000, 1_000_000)),
    redactHeaders: redact.map((h) => h.toLowerCase()),
    maxRedrives: Math.floor(num(c.maxRedrives, "maxRedrives", 0, 1000, 3)),
    maxMessageBytes: Math.floor(num(c.maxMessageBytes, "maxMessageBytes", 64, 64 * 1024 * 1024 - 1024, 1024 * 1024)),
    durability,
    maxInFlight: Math.floor(num(c.maxInFlight, "maxInFlight", 1, 10_000_000, 100_000)),
    segmentBytes: Math.floor(num(c.segmentBytes, "segmentBytes", 16 * 1024, 1024 ** 3, 64 * 1024 * 1024)),
  };
}

const NAME_RE = /^[a-zA-Z0-9._-]{1,200}$/;
export function validateQueueName(name: unknown): asserts name is string {
  if (typeof name !== "string" || !NAME_RE.test(name) || name === "." || name === "..")
    throw new ValidationError(`invalid queue name ${JSON.stringify(String(name).slice(0, 300))}: use 1-200 of [a-zA-Z0-9._-], not "." or ".."`);
}

// ─────────────────────────────────── helpers ───────────────────────────────────

interface Deferred<T = void> {
  promise: Promise<T>;
  resolve(v: T): void;
  reject(e: unknown): void;
}
function deferred<T = void>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((a, b) => {
    resolve = a;
    reject = b;
  });
  // Shared by many waiters, some fire-and-forget: never an unhandled rejection.
  promise.catch(() => {});
  return { promise, resolve, reject };
}

function headerMap(h: [string, Buffer][] | null): Record<string, Uint8Array> {
  const out: Record<string, Uint8Array> = {};
  if (h) for (const [k, v] of h) if (!k.startsWith("sluice-")) out[k] = v;
  return out;
}

function getHeader(h: [string, Buffer][] | null, name: string): Buffer | undefined {
  if (h) for (const [k, v] of h) if (k === name) return v;
  return undefined;
}

/** Approximate heap cost of a cached record (object, buffers, header arrays). */
function cacheCost(r: { value: Buffer | null; headers: [string, Buffer][] | null }): number {
  return (r.value?.length ?? 0) + 200 + (r.headers === null ? 0 : r.headers.length * 120);
}

function abortLease(l: Lease, reason: unknown): void {
  if (l.abortReason !== undefined) return;
  l.abortReason = reason;
  l.ac?.abort(reason);
  // Same moment as `job.signal` aborting, without an AbortController per job (the network
  // server relays lease loss to its client this way).
  l.worker?.onLeaseLost?.(l.tag, reason);
}

function errorInfo(e: unknown): { errorClass: string; error: string } {
  if (e instanceof Error) return { errorClass: e.name || e.constructor.name, error: String(e.message).slice(0, MAX_ERROR_CHARS) };
  if (e === undefined) return { errorClass: "Nack", error: "" };
  return { errorClass: typeof e, error: String(e).slice(0, MAX_ERROR_CHARS) };
}

interface JournalBatch {
  chunks: Buffer[];
  cur: Buffer;
  pos: number;
  bytes: number;
  d: Deferred;
}

const JOURNAL_CHUNK_BYTES = 64 * 1024;

/** A job encoded for the message log, plus what the queue needs to know before the append. */
export interface PreparedJob {
  rec: PreparedRecord;
  key: string | null;
  deliverAt: number;
  dedupeId: string | null;
  size: number;
}

interface DedupeEntry {
  off: number;
  exp: number;
  /** While the claiming job's append is in flight: its group's base-offset promise and index. */
  wait: Deferred<number> | null;
  idx: number;
}

/** One enqueue call's new jobs: appended together (never split), one promise for the group. */
interface PendingEnqueue {
  jobs: PreparedJob[];
  bytes: number;
  d: Deferred<number>;
  /** The request's idempotency entry, completed where the rows are added (IDEM-1). */
  idem: IdemRequest | null;
}

/** An enqueue request that carries an identity, with its (pending) entry in the producer table. */
interface IdemRequest {
  id: EnqueueIdentity;
  entry: IdemEntry;
}

interface Lease {
  off: number;
  attempt: number;
  receipt: string;
  deadlineMono: number;
  deadlineWall: number;
  startedMono: number;
  consumer: string;
  codeVersion: string | undefined;
  /** Created lazily on first `job.signal` access (an AbortController per job is costly). */
  ac: AbortController | null;
  abortReason: unknown;
  worker: WorkerImpl<unknown> | null;
  /** Opaque to the queue: a number the worker's consumer attaches (the network server's
   * delivery tag), handed back by `onLeaseLost`. */
  tag: number;
}

/** What DLQ_INTENT stores: everything about the failure not derivable from the record. */
interface DlqIntent {
  at: number;
  attempts: number;
  errorClass: string;
  error: string;
  codeVersion?: string;
  history: AttemptRecord[];
}

interface SnapshotMeta {
  version: 1;
  incarnation: string;
  floor: number;
  rows: number;
  journalOffset: number;
  chains: [number, string][];
  leases: [number, number, number, string][];
  history: [number, AttemptRecord[]][];
  moving: [number, DlqIntent][];
  dedupe: [string, number, number][];
  counters: { redeliveries: number; retries: number; completed: number; deadLettered: number };
  /** Idempotent enqueue requests of jobs below `rows` (absent in snapshots of older versions). */
  idem?: IdemSnapshot;
}

const SNAP_MAGIC = Buffer.from("SLQSNAP1");

/** The manager side a queue needs: other queues (dead-letter targets, redrive targets). */
export interface QueueHost {
  core(name: string): Promise<QueueCore>;
}

export interface QueueCoreOptions {
  name: string;
  incarnation: string;
  dir: string;
  fs: FileSystem;
  config: ResolvedQueueConfig;
  host: QueueHost;
  logger?: Logger;
  random?: () => number;
}

let workerSeq = 0;

// ────────────────────────────────── the queue ──────────────────────────────────

export class QueueCore {
  readonly name: string;
  readonly incarnation: string;
  readonly dir: string;
  config: ResolvedQueueConfig;
  private readonly fs: FileSystem;
  private readonly host: QueueHost;
  private readonly logger: Logger;
  private readonly random: () => number;
  private msgs!: PartitionLog;
  private journal!: PartitionLog;

  private table!: JobTable;
  private ready = new OffsetHeap();
  private delayed = new OffsetHeap();
  private chains = new KeyChains();
  private leases = new Map<number, Lease>();
  private history = new Map<number, AttemptRecord[]>();
  private moving = new Map<number, DlqIntent>();
  /** User dedupe ids (one window, so insertion order is expiry order) and the broker's own `sys:` ids (7 days). */
  private dedupe = new Map<string, DedupeEntry>();
  private sysDedupe = new Map<string, DedupeEntry>();
  /** Requests of the network client's idempotent enqueues (idempotence.ts). */
  private producers = new EnqueueProducers();
  private counts = new Float64Array(8);
  private live = 0;
  private liveBytes = 0;
  private reservedDepth = 0;
  private reservedBytes = 0;
  private redeliveries = 0;
  private retries = 0;
  private completed = 0;
  private deadLettered = 0;
  private ackBuckets = new Float64Array(10);
  private ackBucketSec = 0;

  private workers = new Set<WorkerImpl<unknown>>();
  private rr = 0;
  private pumpScheduled = false;
  private pumpImmediate: NodeJS.Immediate | null = null;
  /**
   * Direct-mapped ring (slot = offset mod size): O(1) without hashing, and neighbouring offsets
   * never collide. A slot taken by another live offset simply is not cached (read back later).
   */
  private cacheSlots: (PreparedRecord | undefined)[] = new Array(CACHE_SLOTS);
  /** Offset held by each slot (the records themselves are stored as enqueued, without a copy). */
  private cacheOffs = new Float64Array(CACHE_SLOTS);
  private cacheBytes = 0;
  /** The cache overflowed: new jobs are read back from disk in order until delivery catches up. */
  private spill = false;
  private readLock: Promise<void> = Promise.resolve();
  private roomWaiters = new Set<() => void>();

  private ePending: PendingEnqueue[] = [];
  private eRunning = false;
  private eIdle: Deferred | null = null;
  private jBatch: JournalBatch | null = null;
  private jRunning = false;
  private jSinceSnapshot = 0;
  /** Message-log bytes appended since the last snapshot: bounds the log scan on recovery. */
  private mSinceSnapshot = 0;
  private lastSnapshotBytes = 0;
  private snapshotRequested = false;
  private snapshotting: Promise<void> | null = null;

  private delayTimer: NodeJS.Timeout | null = null;
  private delayTimerAt = Infinity;
  private leaseTimer: NodeJS.Timeout | null = null;
  private leaseTimerAt = Infinity;
  private keepAlive: NodeJS.Timeout | null = null;
  private closed = false;
  private broken: Error | null = null;
  private background = new Set<Promise<unknown>>();
  private redriveRunning: Promise<RedriveResult> | null = null;

  private constructor(o: QueueCoreOptions) {
    this.name = o.name;
    this.incarnation = o.incarnation;
    this.dir = o.dir;
    this.fs = o.fs;
    this.config = o.config;
    this.host = o.host;
    this.logger = o.logger ?? silentLogger;
    this.random = o.random ?? Math.random;
  }

  static async open(o: QueueCoreOptions): Promise<QueueCore> {
    const q = new QueueCore(o);
    await q.recover();
    return q;
  }

  // ─────────────────────────────── recovery ───────────────────────────────

  private logConfig(maxMessageBytes: number, segmentBytes: number): LogConfig {
    return {
      segmentBytes,
      segmentMs: 7 * 86_400_000,
      maxMessageBytes,
      durability: this.config.durability,
      flushIntervalMs: 1000,
      retentionMs: -1,
      retentionBytes: -1,
    };
  }

  private async recover(): Promise<void> {
    await this.fs.mkdir(this.dir);
    this.msgs = await PartitionLog.open({
      fs: this.fs,
      dir: join(this.dir, "msgs"),
      topic: `queue:${this.name}`,
      partition: 0,
      config: this.logConfig(this.config.maxMessageBytes + 4096, this.config.segmentBytes),
      logger: this.logger,
    });
    this.journal = await PartitionLog.open({
      fs: this.fs,
      dir: join(this.dir, "journal"),
      topic: `queue-journal:${this.name}`,
      partition: 0,
      config: this.logConfig(MAX_JOURNAL_RECORD_BYTES + 128 * 1024, Math.max(16 * 1024, Math.min(16 * 1024 * 1024, this.config.segmentBytes / 4))),
      logger: this.logger,
    });

    const keyIds = new Map<string, number>();
    const restoredLeases = new Map<number, { attempt: number; deadlineWall: number; consumer: string }>();
    let journalFrom = this.journal.logStartOffset;
    const snap = await this.readSnapshot();
    if (snap !== null) {
      const { meta, table } = snap;
      this.table = table;
      for (const [id, key] of meta.chains) keyIds.set(key, id);
      for (const [off, attempt, deadlineWall, consumer] of meta.leases) restoredLeases.set(off, { attempt, deadlineWall, consumer });
      for (const [off, h] of meta.history) this.history.set(off, h);
      for (const [off, m] of meta.moving) this.moving.set(off, m);
      for (const [id, off, exp] of meta.dedupe) this.dd(id).set(id, { off, exp, wait: null, idx: 0 });
      if (meta.idem !== undefined) this.producers.load(meta.idem);
      this.redeliveries = meta.counters.redeliveries;
      this.retries = meta.counters.retries;
      this.completed = meta.counters.completed;
      this.deadLettered = meta.counters.deadLettered;
      journalFrom = Math.max(journalFrom, meta.journalOffset);
    } else {
      this.table = new JobTable(this.msgs.logStartOffset);
    }
    if (this.table.end > this.msgs.highWatermark) {
      // Only possible with durability "interval"/"never": the log lost an unsynced tail the snapshot had seen.
      this.logger.warn({ queue: this.name, snapshotEnd: this.table.end, logEnd: this.msgs.highWatermark }, "queue jobs lost with the unsynced log tail");
      this.table.truncate(this.msgs.highWatermark);
      this.producers.truncate(this.msgs.highWatermark);
    }
    // Jobs appended after the snapshot: rebuild their rows from the message log.
    const now = Date.now();
    let off = Math.max(this.table.end, this.msgs.logStartOffset);
    let nextChainId = 0;
    for (const id of keyIds.values()) nextChainId = Math.max(nextChainId, id + 1);
    while (off < this.msgs.highWatermark) {
      const { records, nextOffset } = await this.msgs.read(off, 4 * 1024 * 1024);
      for (const r of records) {
        const key = r.key === null ? null : r.key.toString("utf8");
        let chain = -1;
        if (key !== null) {
          chain = keyIds.get(key) ?? -1;
          if (chain < 0) {
            chain = nextChainId++;
            keyIds.set(key, chain);
          }
        }
        const at = getHeader(r.headers, H_DELIVER_AT);
        const visibleAt = at !== undefined && at.length === 8 ? at.readDoubleLE(0) : r.timestamp;
        this.table.add(r.offset, St.READY, visibleAt, r.timestamp, chain, this.storedSize(r));
        const dd = getHeader(r.headers, H_DEDUPE);
        if (dd !== undefined) {
          const id = dd.toString("utf8");
          const exp = r.timestamp + (id.startsWith("sys:") ? SYSTEM_DEDUPE_WINDOW_MS : this.config.dedupeWindowMs);
          if (exp > now) this.dd(id).set(id, { off: r.offset, exp, wait: null, idx: 0 });
        }
        // IDEM-1: the first new job of an idempotent request names it; the request's jobs are
        // exactly as durable as this record.
        const ip = getHeader(r.headers, H_IDEMPOTENCE);
        if (ip !== undefined) {
          const h = decodeIdemHeader(ip);
          if (h !== null) this.producers.restore(h.producerId, h.sequence, r.offset, h.count);
          else this.logger.warn({ queue: this.name, offset: r.offset }, "ignoring a malformed idempotent-enqueue header");
        }
      }
      if (nextOffset <= off) break;
      off = nextOffset;
    }
    // Replay the state journal (JRN-1: idempotent assignments, terminal rows stay terminal).
    let j = journalFrom;
    while (j < this.journal.highWatermark) {
      const { records, nextOffset } = await this.journal.read(j, 4 * 1024 * 1024);
      for (const r of records) {
        if (r.value === null) continue;
        for (const ev of decodeEvents(r.value)) this.replay(ev, restoredLeases);
      }
      if (nextOffset <= j) break;
      j = nextOffset;
    }
    // Rebuild derived structures: counts, heaps, chains, leases.
    for (const [key, id] of keyIds) this.chains.restore(id, key);
    const t = this.table;
    const monoNow = performance.now();
    const wallNow = Date.now();
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
      if (s === St.INFLIGHT) {
        const rl = restoredLeases.get(o);
        const deadlineWall = rl?.deadlineWall ?? wallNow;
        const attempt = rl?.attempt ?? t.attempts[i];
        const lease: Lease = {
          off: o,
          attempt,
          receipt: `${o}.${attempt}`,
          deadlineMono: monoNow + Math.max(0, deadlineWall - wallNow),
          deadlineWall,
          startedMono: monoNow,
          consumer: rl?.consumer ?? "(before restart)",
          codeVersion: undefined,
          ac: null,
          abortReason: undefined,
          worker: null,
          tag: -1,
        };
        this.leases.set(o, lease);
      }
      if (s === St.MOVING && !this.moving.has(o)) s = St.READY; // redrive marks are in-memory only
      t.status[i] = s;
      this.counts[s]++;
      if (s === St.READY) this.ready.push(o, o);
      else if (s === St.DELAYED) this.delayed.push(t.visibleAt[i], o);
    });
    this.chains.finishRestore();
    for (const o of [...this.history.keys()]) if (!t.has(o) || isTerminal(t.status[t.idx(o)])) this.history.delete(o);
    for (const o of [...this.moving.keys()]) if (!t.has(o) || t.status[t.idx(o)] !== St.MOVING) this.moving.delete(o);
    this.table.advanceFloor();
    this.scheduleDelayTimer();
    this.scheduleLeaseTimer(0);
    // Resume interrupted dead-letter moves and redrives in the background (they may need other
    // queues, which may need this one: never awaited inside open).
    for (const [o, intent] of this.moving)
      this.track(
        this.finishDeadLetter(o, intent, true).catch((e) => {
          this.logger.warn({ err: e, queue: this.name }, "resuming dead-letter move failed; retrying");
          this.retryMove(o, intent);
        }),
      );
    const rd = await readJsonFile<{ opts: RedriveOptions }>(this.fs, join(this.dir, "redrive.json")).catch(() => null);
    if (rd !== null) {
      const p = Promise.resolve().then(() => this.redrive(rd.opts, true));
      this.track(p.catch((e) => this.logger.error({ err: e, queue: this.name }, "resuming redrive failed")));
    }
  }

  private track(p: Promise<unknown>): void {
    this.background.add(p);
    void p.finally(() => this.background.delete(p));
  }

  /** Resolves when background recovery work (dead-letter moves, redrive) has finished. */
  async whenIdle(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  private replay(ev: JournalEvent, leases: Map<number, { attempt: number; deadlineWall: number; consumer: string }>): void {
    const t = this.table;
    if (ev.type === Ev.PURGE) {
      t.forEachLive((o, i) => {
        if (o < ev.offset) {
          t.status[i] = St.DONE;
          leases.delete(o);
          this.history.delete(o);
          this.moving.delete(o);
        }
      });
      return;
    }
    if (!t.has(ev.offset)) return;
    const i = t.idx(ev.offset);
    if (isTerminal(t.status[i])) return;
    const o = ev.offset;
    switch (ev.type) {
      case Ev.DELIVER:
        t.attempts[i] = Math.max(t.attempts[i], ev.attempt);
        t.status[i] = St.INFLIGHT;
        leases.set(o, { attempt: ev.attempt, deadlineWall: ev.time, consumer: "(before restart)" });
        break;
      case Ev.EXTEND: {
        const l = leases.get(o);
        if (l && l.attempt === ev.attempt) l.deadlineWall = ev.time;
        break;
      }
      case Ev.ACK:
        t.status[i] = St.DONE;
        leases.delete(o);
        break;
      case Ev.NACK:
      case Ev.EXPIRE:
        t.attempts[i] = Math.max(t.attempts[i], ev.attempt);
        t.status[i] = St.DELAYED;
        t.visibleAt[i] = ev.time;
        leases.delete(o);
        if (ev.data !== undefined) this.pushHistory(o, ev.data as AttemptRecord);
        break;
      case Ev.DLQ_INTENT:
        t.status[i] = St.MOVING;
        leases.delete(o);
        this.moving.set(o, ev.data as DlqIntent);
        break;
      case Ev.DEAD:
        t.status[i] = St.DEAD;
        leases.delete(o);
        this.moving.delete(o);
        break;
    }
  }

  private async readSnapshot(): Promise<{ meta: SnapshotMeta; table: JobTable } | null> {
    const path = join(this.dir, "snapshot.bin");
    if ((await this.fs.stat(path)) === null) return null;
    const buf = await this.fs.readFile(path);
    if (buf.length < 12 || !buf.subarray(0, 8).equals(SNAP_MAGIC)) throw new StorageError(`queue ${this.name}: bad snapshot ${path}`);
    const jl = buf.readUInt32LE(8);
    if (jl > buf.length - 12) throw new StorageError(`queue ${this.name}: truncated snapshot ${path}`);
    const meta = JSON.parse(buf.toString("utf8", 12, 12 + jl)) as SnapshotMeta;
    const table = JobTable.decode(meta.floor, meta.rows, buf.subarray(12 + jl));
    return { meta, table };
  }

  // ─────────────────────────────── snapshots ───────────────────────────────

  /**
   * Writes the job table and side maps at the current journal end, then deletes what it covers:
   * the journal below that offset and the message log below the table floor. Taken only when no
   * journal append is in flight (called from the journal loop), so every journal record below
   * `journalOffset` is reflected; later events replay idempotently (JRN-1).
   */
  private async snapshot(): Promise<void> {
    this.table.advanceFloor();
    const t = this.table;
    const chainsUsed = new Map<number, string>();
    t.forEachLive((_o, i) => {
      const c = t.chain[i];
      if (c >= 0 && !chainsUsed.has(c)) chainsUsed.set(c, this.chains.get(c)?.key ?? "");
    });
    const now = Date.now();
    const dedupe: [string, number, number][] = [];
    for (const m of [this.dedupe, this.sysDedupe]) for (const [id, e] of m) if (e.off >= 0 && e.exp > now) dedupe.push([id, e.off, e.exp]);
    const meta: SnapshotMeta = {
      version: 1,
      incarnation: this.incarnation,
      floor: t.floor,
      rows: t.rows,
      journalOffset: this.journal.logEndOffset,
      chains: [...chainsUsed],
      leases: [...this.leases.values()].map((l) => [l.off, l.attempt, l.deadlineWall, l.consumer]),
      history: [...this.history],
      moving: [...this.moving],
      dedupe,
      counters: { redeliveries: this.redeliveries, retries: this.retries, completed: this.completed, deadLettered: this.deadLettered },
      // Completed requests only: their jobs lie below `rows` (completed where rows are added);
      // pending ones append after it and are found by the recovery scan.
      idem: this.producers.snapshot(),
    };
    const json = Buffer.from(JSON.stringify(meta), "utf8");
    const head = Buffer.alloc(12);
    SNAP_MAGIC.copy(head, 0);
    head.writeUInt32LE(json.length, 8);
    const body = Buffer.concat([head, json, t.encode()]);
    this.jSinceSnapshot = 0;
    this.mSinceSnapshot = 0;
    this.lastSnapshotBytes = body.length;
    await writeFileAtomic(this.fs, join(this.dir, "snapshot.bin"), body);
    // The snapshot is durable: what it covers may go (storage proportional to backlog).
    await this.journal.advanceLogStart(Math.min(meta.journalOffset, this.journal.highWatermark));
    await this.msgs.advanceLogStart(Math.min(meta.floor, this.msgs.highWatermark));
  }

  /** Forces a snapshot now (after pending journal events are durable). */
  async compact(): Promise<void> {
    this.snapshotRequested = true;
    await this.journalEvent(null);
    while (this.snapshotting) await this.snapshotting;
  }

  // ─────────────────────────────── journal writer ───────────────────────────────

  /** Queues an event for the journal; resolves once it is durable (group commit). */
  private journalEvent(buf: Buffer | null): Promise<void> {
    const b = this.jOpenBatch();
    if (buf !== null) {
      if (b.pos + buf.length > b.cur.length) this.jNewChunk(b, buf.length);
      buf.copy(b.cur, b.pos);
      b.pos += buf.length;
      b.bytes += buf.length;
    }
    return b.d.promise;
  }

  /** Fast path for fixed-size events: written straight into the batch buffer (no per-event allocation). */
  private jev(type: Ev, off: number, attempt: number, time: number): Promise<void> {
    const b = this.jOpenBatch();
    if (b.pos + EVENT_FIXED_BYTES > b.cur.length) this.jNewChunk(b, EVENT_FIXED_BYTES);
    b.pos = writeEvent(b.cur, b.pos, type, off, attempt, time);
    b.bytes += EVENT_FIXED_BYTES;
    return b.d.promise;
  }

  private jNewChunk(b: JournalBatch, need: number): void {
    if (b.pos > 0) b.chunks.push(b.cur.subarray(0, b.pos));
    b.cur = Buffer.allocUnsafe(Math.max(JOURNAL_CHUNK_BYTES, need));
    b.pos = 0;
  }

  private jOpenBatch(): JournalBatch {
    this.checkOpen();
    if (this.jBatch === null) this.jBatch = { chunks: [], cur: Buffer.allocUnsafe(JOURNAL_CHUNK_BYTES), pos: 0, bytes: 0, d: deferred() };
    const b = this.jBatch;
    if (!this.jRunning) {
      this.jRunning = true;
      queueMicrotask(() => void this.journalLoop());
    }
    return b;
  }

  private async journalLoop(): Promise<void> {
    try {
      for (;;) {
        const b = this.jBatch;
        if (b === null) break;
        this.jBatch = null;
        try {
          if (b.bytes > 0) {
            // One journal record per chunk; events never straddle chunks.
            if (b.pos > 0) b.chunks.push(b.cur.subarray(0, b.pos));
            const ts = Date.now();
            await this.journal.append(b.chunks.map((value) => ({ key: null, value, valueKind: 0 as const, timestamp: ts, headers: null })));
            this.jSinceSnapshot += b.bytes;
          }
          b.d.resolve();
        } catch (e) {
          this.fail(e);
          b.d.reject(this.broken ?? e);
          break;
        }
        if (this.jBatch === null && (this.snapshotRequested || this.jSinceSnapshot > SNAPSHOT_EVERY_JOURNAL_BYTES)) {
          this.snapshotRequested = false;
          const s = this.snapshot();
          this.snapshotting = s;
          try {
            await s;
          } catch (e) {
            this.logger.error({ err: e, queue: this.name }, "queue snapshot failed; will retry later");
          } finally {
            this.snapshotting = null;
          }
        }
      }
    } finally {
      this.jRunning = false;
      if (this.jBatch !== null && !this.broken) {
        this.jRunning = true;
        queueMicrotask(() => void this.journalLoop());
      }
    }
  }

  /** A failed log write leaves memory ahead of disk: refuse further work until reopened. */
  private fail(e: unknown): void {
    if (this.broken) return;
    this.broken = e instanceof Error ? e : new StorageError(String(e));
    this.logger.error({ err: e, queue: this.name }, "queue storage failed; reopen the broker to recover");
    for (const w of this.workers) w.abortAll(this.broken);
  }

  private checkOpen(): void {
    if (this.broken) throw new StorageError(`queue ${this.name} is unusable after a storage failure: ${this.broken.message}`, this.broken);
    if (this.closed) throw new BrokerClosedError(`queue ${this.name} is closed`);
  }

  // ─────────────────────────────── enqueue ───────────────────────────────

  /** Validates and encodes user input (throws ValidationError / RecordTooLargeError before queuing). */
  prepare(item: EnqueueItem): PreparedJob {
    const { value, valueKind } = prepareValue(item.data);
    return this.prepareRaw(value, valueKind, item, null);
  }

  /** `now`: the enqueue time (one clock read for a whole batch). */
  prepareRaw(value: Buffer | null, valueKind: ValueKind, item: Omit<EnqueueItem, "data">, extra: [string, Buffer][] | null, now = Date.now()): PreparedJob {
    let key: string | null = null;
    if (item.key !== undefined && item.key !== null) {
      if (typeof item.key !== "string") throw new ValidationError("key must be a string");
      if (Buffer.byteLength(item.key) > MAX_KEY_BYTES) throw new ValidationError(`key longer than ${MAX_KEY_BYTES} bytes`);
      key = item.key;
    }
    if (item.delayMs !== undefined && item.deliverAt !== undefined) throw new ValidationError("use delayMs or deliverAt, not both");
    let deliverAt = now;
    if (item.delayMs !== undefined) {
      if (typeof item.delayMs !== "number" || !Number.isFinite(item.delayMs) || item.delayMs < 0 || item.delayMs > 366 * 86_400_000)
        throw new ValidationError("delayMs must be a number in [0, 1 year]");
      deliverAt = now + item.delayMs;
    } else if (item.deliverAt !== undefined) {
      const t = item.deliverAt instanceof Date ? item.deliverAt.getTime() : item.deliverAt;
      if (typeof t !== "number" || !Number.isFinite(t) || t > now + 366 * 86_400_000) throw new ValidationError("deliverAt must be a time within a year");
      deliverAt = Math.max(now, t);
    }
    let dedupeId: string | null = null;
    if (item.dedupeId !== undefined) {
      if (typeof item.dedupeId !== "string" || item.dedupeId.length === 0 || Buffer.byteLength(item.dedupeId) > MAX_DEDUPE_ID_BYTES)
        throw new ValidationError(`dedupeId must be a non-empty string of at most ${MAX_DEDUPE_ID_BYTES} bytes`);
      if (extra === null && item.dedupeId.startsWith("sys:")) throw new ValidationError(`dedupeId prefix "sys:" is reserved`);
      dedupeId = item.dedupeId;
    }
    // Most jobs have no headers at all: no array for them.
    let headers: [string, Buffer][] | null = null;
    if (item.headers !== undefined) {
      headers = [];
      if (item.headers === null || typeof item.headers !== "object") throw new ValidationError("headers must be an object");
      const names = Object.keys(item.headers);
      if (names.length > MAX_HEADERS) throw new ValidationError(`at most ${MAX_HEADERS} headers`);
      for (const k of names) {
        if (k.startsWith("sluice-") && extra === null) throw new ValidationError(`header name ${JSON.stringify(k)} is reserved (sluice-*)`);
        const v = item.headers[k];
        if (typeof v === "string") headers.push([k, Buffer.from(v, "utf8")]);
        else if (v instanceof Uint8Array) headers.push([k, Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
        else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
      }
    }
    if (extra !== null) (headers ??= []).push(...extra);
    if (deliverAt > now) {
      const b = Buffer.allocUnsafe(8);
      b.writeDoubleLE(deliverAt, 0);
      (headers ??= []).push([H_DELIVER_AT, b]);
    }
    if (dedupeId !== null) (headers ??= []).push([H_DEDUPE, Buffer.from(dedupeId, "utf8")]);
    const rec: PreparedRecord = {
      key: key === null ? null : Buffer.from(key, "utf8"),
      value,
      valueKind,
      timestamp: now,
      headers: headers !== null && headers.length > 0 ? headers : null,
    };
    const size = recordSize(rec);
    if (size > this.config.maxMessageBytes) throw new RecordTooLargeError(size, this.config.maxMessageBytes);
    return { rec, key, deliverAt, dedupeId, size };
  }

  private storedSize(r: StoredRecord): number {
    return (r.value?.length ?? 0) + (r.key?.length ?? 0) + 16;
  }

  private dd(id: string): Map<string, DedupeEntry> {
    return id.startsWith("sys:") ? this.sysDedupe : this.dedupe;
  }

  private dedupeWindow(id: string): number {
    return id.startsWith("sys:") ? SYSTEM_DEDUPE_WINDOW_MS : this.config.dedupeWindowMs;
  }

  /**
   * Enqueues prepared jobs; resolves after the append is durable. `idem`: the request's
   * identity when it comes from the network client, which may re-send it after a lost
   * connection (idempotence.ts): a request already stored is answered with its original ids.
   */
  async enqueuePrepared(jobs: PreparedJob[], signal?: AbortSignal, idem?: EnqueueIdentity): Promise<EnqueueResult[]> {
    const r = await this.enqueueRequest(jobs, signal, idem ?? null, false);
    return Array.isArray(r) ? r : this.freshResults(r.first, r.n);
  }

  /**
   * Like enqueuePrepared, but answers `{first, n}` (ids first, first+1, ...) when no job has a
   * dedupe id, instead of one result object per job (the network server's compact answer).
   */
  enqueuePreparedCompact(jobs: PreparedJob[], signal?: AbortSignal, idem?: EnqueueIdentity): Promise<{ first: number; n: number } | EnqueueResult[]> {
    return this.enqueueRequest(jobs, signal, idem ?? null, true);
  }

  private freshResults(first: number, n: number): EnqueueResult[] {
    const out = new Array<EnqueueResult>(n);
    for (let k = 0; k < n; k++) out[k] = { id: String(first + k), duplicate: false };
    return out;
  }

  private async enqueueRequest(
    jobs: PreparedJob[],
    signal: AbortSignal | undefined,
    idem: EnqueueIdentity | null,
    compact: boolean,
  ): Promise<{ first: number; n: number } | EnqueueResult[]> {
    this.checkOpen();
    if (jobs.length > MAX_BATCH_ITEMS) throw new ValidationError(`at most ${MAX_BATCH_ITEMS} jobs per batch`);
    if (idem === null) return this.evaluate(jobs, signal, null, compact);
    const id = validateIdentity(idem);
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
        this.checkOpen();
        continue;
      }
      return this.rebuildAnswer(jobs, e.first, e.count, compact);
    }
    // New request: pending from now on, so a concurrent retry waits for this outcome.
    const entry = this.producers.begin(id);
    let r: { first: number; n: number } | EnqueueResult[];
    try {
      r = await this.evaluate(jobs, signal, { id, entry }, compact);
    } catch (err) {
      // Nothing stored (IDEM-1: an entry whose jobs are durable is never dropped; a failed
      // append already dropped it in enqueueLoop).
      if (entry.pending !== null) this.producers.drop(id, entry, err);
      throw err;
    }
    // Every job was a duplicate (or none was given): nothing stored, no entry; a retry gets
    // the same answer from the dedupe table again.
    if (entry.pending !== null) this.producers.drop(id, entry);
    return r;
  }

  /** Dedupe, admission and append of one request. */
  private async evaluate(
    jobs: PreparedJob[],
    signal: AbortSignal | undefined,
    idem: IdemRequest | null,
    compact: boolean,
  ): Promise<{ first: number; n: number } | EnqueueResult[]> {
    if (jobs.length > 0 && jobs.every((j) => j.dedupeId === null)) {
      // The common case: every job is new, one group, no per-job bookkeeping.
      if (this.dedupe.size + this.sysDedupe.size > 0) this.sweepDedupe(Date.now());
      const first = await this.enqueueFreshBase(jobs, signal, idem);
      return compact ? { first, n: jobs.length } : this.freshResults(first, jobs.length);
    }
    const results: (EnqueueResult | Promise<EnqueueResult>)[] = new Array(jobs.length);
    const fresh: { i: number; job: PreparedJob }[] = [];
    const now = Date.now();
    this.sweepDedupe(now);
    const seenInBatch = new Map<string, number>();
    const dupOf: [number, number][] = [];
    for (let i = 0; i < jobs.length; i++) {
      const job = jobs[i];
      if (job.dedupeId !== null) {
        const window = this.dedupeWindow(job.dedupeId);
        const e = window > 0 ? this.dd(job.dedupeId).get(job.dedupeId) : undefined;
        if (e !== undefined && e.exp > now) {
          const idx = e.idx;
          results[i] = e.wait !== null ? e.wait.promise.then((base) => ({ id: String(base + idx), duplicate: true })) : { id: String(e.off), duplicate: true };
          continue;
        }
        if (window > 0 && seenInBatch.has(job.dedupeId)) {
          dupOf.push([i, seenInBatch.get(job.dedupeId)!]);
          results[i] = { id: "", duplicate: true };
          continue;
        }
        if (window > 0 && !job.dedupeId.startsWith("sys:") && this.dedupe.size >= this.config.maxDedupeEntries)
          throw new QueueFullError(this.name, this.live + this.reservedDepth, this.liveBytes + this.reservedBytes);
        if (window > 0) seenInBatch.set(job.dedupeId, i);
      }
      fresh.push({ i, job });
    }
    if (fresh.length > 0) {
      let bytes = 0;
      for (const f of fresh) bytes += f.job.size;
      await this.admit(fresh.length, bytes, signal);
      const d = deferred<number>();
      const group: PendingEnqueue = { jobs: new Array<PreparedJob>(fresh.length), bytes, d, idem };
      for (let k = 0; k < fresh.length; k++) {
        const job = fresh[k].job;
        group.jobs[k] = job;
        if (job.dedupeId !== null && this.dedupeWindow(job.dedupeId) > 0) {
          // Claimed now so a concurrent duplicate waits for this job's id (window survives restart via the header).
          this.dd(job.dedupeId).set(job.dedupeId, { off: -1, exp: now + this.dedupeWindow(job.dedupeId), wait: d, idx: k });
        }
      }
      this.pushGroup(group);
      const base = await d.promise;
      for (let k = 0; k < fresh.length; k++) results[fresh[k].i] = { id: String(base + k), duplicate: false };
    }
    const out = await Promise.all(results);
    for (const [i, first] of dupOf) out[i] = { id: out[first].id, duplicate: true };
    return out;
  }

  /** Appends new jobs as one group; resolves with the first job's offset once durable. */
  private async enqueueFreshBase(jobs: PreparedJob[], signal: AbortSignal | undefined, idem: IdemRequest | null): Promise<number> {
    let bytes = 0;
    for (const j of jobs) bytes += j.size;
    await this.admit(jobs.length, bytes, signal);
    const d = deferred<number>();
    this.pushGroup({ jobs, bytes, d, idem });
    return d.promise;
  }

  /** Queues an admitted group for the enqueue loop (after `admit`, with no await in between). */
  private pushGroup(g: PendingEnqueue): void {
    this.reservedDepth += g.jobs.length;
    this.reservedBytes += g.bytes;
    if (g.idem !== null) {
      // IDEM-1: the request's identity rides on its first new job, in the same append.
      const rec = g.jobs[0].rec;
      const h: [string, Buffer] = [H_IDEMPOTENCE, encodeIdemHeader(g.idem.id, g.jobs.length)];
      rec.headers = rec.headers === null ? [h] : [...rec.headers, h];
    }
    this.ePending.push(g);
    if (!this.eRunning) {
      this.eRunning = true;
      queueMicrotask(() => void this.enqueueLoop());
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
  private async rebuildAnswer(jobs: PreparedJob[], first: number, count: number, compact: boolean): Promise<{ first: number; n: number } | EnqueueResult[]> {
    const n = jobs.length;
    let plain = true;
    for (const j of jobs) if (j.dedupeId !== null && this.dedupeWindow(j.dedupeId) > 0) plain = false;
    if (plain) {
      if (count !== n) this.logger.warn({ queue: this.name, count, jobs: n }, "retried enqueue differs from its original");
      return compact ? { first, n } : this.freshResults(first, n);
    }
    const end = first + count;
    // Kinds: 0 new (no dedupe id: the next new offset), 1 new at a known offset, 2 duplicate of a
    // job stored before the request, 3 duplicate of an earlier job of this request, 4 unknown.
    const kind = new Uint8Array(n);
    const at = new Float64Array(n);
    const out: EnqueueResult[] = new Array(n);
    const firstIdx = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const d = jobs[i].dedupeId;
      if (d === null || this.dedupeWindow(d) <= 0) continue;
      const prev = firstIdx.get(d);
      if (prev !== undefined) {
        kind[i] = 3;
        at[i] = prev;
        continue;
      }
      firstIdx.set(d, i);
      const e = this.dd(d).get(d);
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

  /** Overflow policy (maxDepth / maxBytes): reject with QueueFullError or block up to blockTimeoutMs. */
  private async admit(n: number, bytes: number, signal?: AbortSignal): Promise<void> {
    const fits = (): boolean =>
      this.live + this.reservedDepth + n <= this.config.maxDepth && this.liveBytes + this.reservedBytes + bytes <= this.config.maxBytes;
    if (fits()) return;
    const full = (): QueueFullError => new QueueFullError(this.name, this.live + this.reservedDepth, this.liveBytes + this.reservedBytes);
    if (n > this.config.maxDepth || bytes > this.config.maxBytes || this.config.overflow === "reject") throw full();
    const aborted = (): AbortedError => new AbortedError("enqueue aborted while waiting for room; nothing was stored", signal?.reason);
    const deadline = performance.now() + this.config.blockTimeoutMs;
    while (!fits()) {
      this.checkOpen();
      // Checked on every round: a listener added to an already aborted signal never fires.
      if (signal?.aborted) throw aborted();
      const left = deadline - performance.now();
      if (left <= 0) throw full();
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

  private notifyRoom(): void {
    if (this.roomWaiters.size === 0) return;
    for (const w of [...this.roomWaiters]) w();
  }

  private sweepDedupe(now: number): void {
    // Entries are inserted roughly in expiry order (one window per class); stop at the first live one.
    let n = 0;
    for (const m of [this.dedupe, this.sysDedupe]) {
      for (const [id, e] of m) {
        if (e.exp > now || n++ > 1000) break;
        if (e.wait === null) m.delete(id);
      }
    }
  }

  private async enqueueLoop(): Promise<void> {
    try {
      while (this.ePending.length > 0 && !this.broken) {
        // Whole groups per append, up to MAX_APPEND_RECORDS / MAX_APPEND_BYTES (a group alone may exceed them).
        let n = 0;
        let recs = 0;
        let bytes = 0;
        while (
          n < this.ePending.length &&
          (n === 0 || (recs + this.ePending[n].jobs.length <= MAX_APPEND_RECORDS && bytes + this.ePending[n].bytes <= MAX_APPEND_BYTES))
        ) {
          recs += this.ePending[n].jobs.length;
          bytes += this.ePending[n].bytes;
          n++;
        }
        const groups = this.ePending.splice(0, n);
        const records: PreparedRecord[] = new Array(recs);
        let r = 0;
        for (const g of groups) for (const j of g.jobs) records[r++] = j.rec;
        let base: number;
        try {
          base = (await this.msgs.append(records)).baseOffset;
        } catch (e) {
          // Nothing of a failed append is acknowledged; the log engine made it unwritable, so this queue is too.
          for (const g of [...groups, ...this.ePending.splice(0)]) {
            for (const j of g.jobs) if (j.dedupeId !== null && this.dd(j.dedupeId).get(j.dedupeId)?.wait === g.d) this.dd(j.dedupeId).delete(j.dedupeId);
            this.reservedDepth -= g.jobs.length;
            this.reservedBytes -= g.bytes;
            // IDEM-1: nothing of it is stored, so nothing may claim it is.
            if (g.idem !== null) this.producers.drop(g.idem.id, g.idem.entry, e);
            g.d.reject(e);
          }
          this.fail(e);
          break;
        }
        this.reservedDepth -= recs;
        this.reservedBytes -= bytes;
        this.mSinceSnapshot += bytes;
        if (this.mSinceSnapshot > Math.max(SNAPSHOT_EVERY_MSG_BYTES, 2 * this.lastSnapshotBytes) && !this.snapshotRequested) {
          this.snapshotRequested = true;
          void this.journalEvent(null).catch(() => {});
        }
        let off = base;
        const now = Date.now();
        for (const g of groups) {
          const gBase = off;
          if (!this.closed) {
            for (const job of g.jobs) {
              this.addRow(off, job, now);
              if (job.dedupeId !== null) {
                const e = this.dd(job.dedupeId).get(job.dedupeId);
                if (e !== undefined && e.wait === g.d) {
                  e.off = off;
                  e.wait = null;
                }
              }
              // Delayed jobs are not cached: they are delivered much later (read back in order then).
              if (!this.spill && job.deliverAt <= job.rec.timestamp) this.cacheRecord(off, job.rec);
              off++;
            }
          } else off += g.jobs.length;
          // Together with the rows (no await in between): a snapshot sees both or neither.
          if (g.idem !== null) this.producers.complete(g.idem.entry, gBase, g.jobs.length);
          g.d.resolve(gBase);
        }
        this.scheduleDelayTimer();
        this.pump();
      }
    } finally {
      this.eRunning = false;
      if (this.ePending.length === 0 && this.eIdle) {
        this.eIdle.resolve();
        this.eIdle = null;
      }
    }
  }

  private async enqueueDrained(): Promise<void> {
    if (!this.eRunning && this.ePending.length === 0) return;
    if (!this.eIdle) this.eIdle = deferred();
    await this.eIdle.promise;
  }

  private addRow(off: number, job: PreparedJob, now: number): void {
    const t = this.table;
    let chain = -1;
    let isHead = true;
    if (job.key !== null) [chain, isHead] = this.chains.push(job.key, off);
    const visible = job.deliverAt <= now;
    const s = !isHead ? St.BLOCKED : visible ? St.READY : St.DELAYED;
    t.add(off, s, job.deliverAt, job.rec.timestamp, chain, job.size);
    this.counts[s]++;
    this.live++;
    this.liveBytes += job.size;
    if (s === St.READY) this.ready.push(off, off);
    else if (s === St.DELAYED) this.delayed.push(job.deliverAt, off);
  }

  /**
   * Tail cache: payloads of jobs not yet delivered, so a hot queue delivers from memory. When
   * full, new jobs are not cached (the oldest are delivered next); delivery then reads them
   * back in large sequential chunks (read-ahead), refilling the cache.
   */
  private cacheRecord(off: number, rec: PreparedRecord | StoredRecord): void {
    const bytes = cacheCost(rec);
    const slot = off % CACHE_SLOTS;
    if (this.cacheSlots[slot] !== undefined) {
      if (this.cacheOffs[slot] !== off) this.spill = true;
      return;
    }
    if (this.cacheBytes + bytes > TAIL_CACHE_BYTES) {
      this.spill = true;
      return;
    }
    this.cacheSlots[slot] = rec;
    this.cacheOffs[slot] = off;
    this.cacheBytes += bytes;
  }

  private cacheGet(off: number): PreparedRecord | undefined {
    const slot = off % CACHE_SLOTS;
    const r = this.cacheSlots[slot];
    return r !== undefined && this.cacheOffs[slot] === off ? r : undefined;
  }

  private uncache(off: number): void {
    const slot = off % CACHE_SLOTS;
    const r = this.cacheSlots[slot];
    if (r !== undefined && this.cacheOffs[slot] === off) {
      this.cacheSlots[slot] = undefined;
      this.cacheBytes -= cacheCost(r);
    }
  }

  /** Reads records by offset: the tail cache first, then the message log. */
  private async fetchRecords(offs: number[]): Promise<Map<number, PreparedRecord | Error>> {
    const out = new Map<number, PreparedRecord | Error>();
    const missing: number[] = [];
    for (const o of offs) {
      const r = this.cacheGet(o);
      if (r !== undefined) out.set(o, r);
      else missing.push(o);
    }
    if (missing.length === 0) return out;
    // Reads are serialised: concurrent deliveries of neighbouring jobs then share one read-ahead
    // instead of each decoding the same chunk.
    const prev = this.readLock;
    let release!: () => void;
    this.readLock = new Promise<void>((r) => (release = r));
    await prev;
    try {
      return await this.readMissing(missing, out);
    } finally {
      release();
    }
  }

  private async readMissing(all: number[], out: Map<number, PreparedRecord | Error>): Promise<Map<number, PreparedRecord | Error>> {
    const missing: number[] = [];
    for (const o of all) {
      const r = this.cacheGet(o);
      if (r !== undefined) out.set(o, r);
      else missing.push(o);
    }
    missing.sort((a, b) => a - b);
    let k = 0;
    while (k < missing.length) {
      const o = missing[k];
      try {
        const { records, nextOffset } = await this.msgs.read(o, 1024 * 1024);
        let found = false;
        const t = this.table;
        if (nextOffset >= t.end && this.cacheBytes < TAIL_CACHE_BYTES / 2) this.spill = false;
        for (const r of records) {
          if (r.offset > o && t.has(r.offset) && !isTerminal(t.status[t.idx(r.offset)])) this.cacheRecord(r.offset, r);
          while (k < missing.length && missing[k] < r.offset) {
            if (!out.has(missing[k])) out.set(missing[k], new StorageError(`job ${missing[k]} missing from the message log`));
            k++;
          }
          if (k < missing.length && missing[k] === r.offset) {
            out.set(r.offset, r);
            found = true;
            k++;
          }
        }
        if (!found && k < missing.length && missing[k] === o) {
          out.set(o, new StorageError(`job ${o} missing from the message log`));
          k++;
        }
      } catch (e) {
        out.set(o, e instanceof Error ? e : new StorageError(String(e)));
        k++;
      }
    }
    return out;
  }

  // ─────────────────────────────── state changes ───────────────────────────────

  private setStatus(i: number, s: St): void {
    this.counts[this.table.status[i]]--;
    this.table.status[i] = s;
    this.counts[s]++;
  }

  /** Makes row `off` visible at `visibleAt` (READY now or DELAYED), respecting KEY-1. */
  private makeVisible(off: number, visibleAt: number): void {
    const t = this.table;
    const i = t.idx(off);
    t.visibleAt[i] = visibleAt;
    const c = t.chain[i];
    if (c >= 0 && this.chains.head(c) !== off) {
      this.setStatus(i, St.BLOCKED);
      return;
    }
    if (visibleAt <= Date.now()) {
      this.setStatus(i, St.READY);
      this.ready.push(off, off);
    } else {
      this.setStatus(i, St.DELAYED);
      this.delayed.push(visibleAt, off);
      this.scheduleDelayTimer();
    }
  }

  /** Terminal transition (DONE or DEAD): frees the row and unblocks the key's next job. */
  private finish(off: number, s: St.DONE | St.DEAD): void {
    const t = this.table;
    const i = t.idx(off);
    const c = t.chain[i];
    this.setStatus(i, s);
    this.live--;
    this.liveBytes -= t.size[i];
    this.history.delete(off);
    this.moving.delete(off);
    this.uncache(off);
    if (c >= 0) {
      const next = this.chains.remove(c, off);
      if (next >= 0 && t.has(next)) {
        const ni = t.idx(next);
        if (t.status[ni] === St.BLOCKED) this.makeVisible(next, t.visibleAt[ni]);
      }
    }
    if (off === t.floor) t.advanceFloor();
    this.notifyRoom();
  }

  private pushHistory(off: number, rec: AttemptRecord): void {
    let h = this.history.get(off);
    if (h === undefined) this.history.set(off, (h = []));
    // Replay may repeat an event already reflected in the snapshot (JRN-1): keep history idempotent.
    if (h.some((x) => x.attempt === rec.attempt && x.at === rec.at)) return;
    h.push(rec);
    if (h.length > MAX_HISTORY) h.splice(0, h.length - MAX_HISTORY);
  }

  private countAck(mono: number): void {
    this.completed++;
    const sec = Math.floor(mono / 1000);
    if (sec !== this.ackBucketSec) {
      for (let s = this.ackBucketSec + 1; s <= sec && s <= this.ackBucketSec + 10; s++) this.ackBuckets[s % 10] = 0;
      this.ackBucketSec = sec;
    }
    this.ackBuckets[sec % 10]++;
  }

  // ─────────────────────────────── delivery ───────────────────────────────

  addWorker(w: WorkerImpl<unknown>): void {
    this.checkOpen();
    this.workers.add(w);
    if (this.keepAlive === null) this.keepAlive = setInterval(() => {}, 1 << 30);
    this.pump();
  }

  removeWorker(w: WorkerImpl<unknown>): void {
    this.workers.delete(w);
    if (this.workers.size === 0 && this.keepAlive !== null) {
      clearInterval(this.keepAlive);
      this.keepAlive = null;
    }
  }

  pump(): void {
    if (this.pumpScheduled || this.closed) return;
    this.pumpScheduled = true;
    // setImmediate, not a microtask: settlements of one tick are gathered into one round of
    // grants (one DELIVER group, one read-ahead, one hand-out) instead of one round per ack.
    this.pumpImmediate = setImmediate(() => {
      this.pumpImmediate = null;
      this.pumpScheduled = false;
      this.doPump();
    });
  }

  /**
   * Grants now instead of at the next setImmediate. For a caller that has just applied a whole
   * batch of settlements (one network frame): the DELIVER events then join the journal batch
   * that holds those ACKs and share its fdatasync, instead of waiting for it and paying their own.
   */
  pumpNow(): void {
    if (this.closed) return;
    if (this.pumpImmediate !== null) {
      clearImmediate(this.pumpImmediate);
      this.pumpImmediate = null;
    }
    this.pumpScheduled = false;
    this.doPump();
  }

  private promoteDue(now: number): void {
    const t = this.table;
    while (this.delayed.size > 0 && this.delayed.peekPriority() <= now) {
      const at = this.delayed.peekPriority();
      const off = this.delayed.pop();
      if (!t.has(off)) continue;
      const i = t.idx(off);
      if (t.status[i] !== St.DELAYED || t.visibleAt[i] !== at) continue;
      this.setStatus(i, St.READY);
      this.ready.push(off, off);
    }
  }

  private doPump(): void {
    if (this.closed || this.broken || this.workers.size === 0) return;
    this.promoteDue(Date.now());
    const t = this.table;
    const grants: Lease[] = [];
    const ws = [...this.workers].filter((w) => w.capacity() > 0);
    let p: Promise<void> | null = null;
    const wallNow = Date.now();
    const monoNow = performance.now();
    let progress = true;
    while (progress && this.ready.size > 0 && ws.length > 0 && this.leases.size < this.config.maxInFlight) {
      progress = false;
      for (let k = 0; k < ws.length && this.ready.size > 0; k++) {
        const w = ws[(this.rr + k) % ws.length];
        if (w.capacity() <= 0) continue;
        let off = -1;
        while (this.ready.size > 0) {
          const o = this.ready.pop();
          if (t.has(o) && t.status[t.idx(o)] === St.READY) {
            off = o;
            break;
          }
        }
        if (off < 0) break;
        const i = t.idx(off);
        const attempt = Math.min(65535, t.attempts[i] + 1);
        t.attempts[i] = attempt;
        if (attempt > 1) this.redeliveries++;
        this.setStatus(i, St.INFLIGHT);
        const vt = w.visibilityTimeoutMs;
        const lease: Lease = {
          off,
          attempt,
          receipt: `${off}.${attempt}`,
          deadlineMono: monoNow + vt,
          deadlineWall: wallNow + vt,
          startedMono: monoNow,
          consumer: w.consumerId,
          codeVersion: w.codeVersion,
          ac: null,
          abortReason: undefined,
          worker: w,
          tag: -1,
        };
        this.leases.set(off, lease);
        w.reserve();
        grants.push(lease);
        p = this.jev(Ev.DELIVER, off, attempt, lease.deadlineWall);
        progress = true;
      }
      this.rr++;
    }
    if (grants.length === 0) return;
    let first = Infinity;
    for (const g of grants) if (g.deadlineMono < first) first = g.deadlineMono;
    this.scheduleLeaseTimer(first);
    void this.handOut(grants, p!);
  }

  /** jobs reach workers only after their DELIVER events are durable. */
  private async handOut(grants: Lease[], durable: Promise<void>): Promise<void> {
    let recs: Map<number, PreparedRecord | Error>;
    try {
      [, recs] = await Promise.all([durable, this.fetchRecords(grants.map((g) => g.off))]);
    } catch (e) {
      for (const g of grants) g.worker?.unreserve();
      return;
    }
    // The lease runs from the hand-off, not from the grant: the worker gets the whole
    // visibility timeout even when the DELIVER fdatasync was slow (LEASE-1).
    const handoff = performance.now();
    for (const g of grants) {
      const w = g.worker!;
      const r = recs.get(g.off);
      if (this.leases.get(g.off) !== g) {
        w.unreserve();
        continue;
      }
      g.deadlineMono += handoff - g.startedMono;
      g.startedMono = handoff;
      if (r === undefined || r instanceof Error) {
        // An unreadable job cannot be delivered or copied; park it as dead rather than loop on it.
        this.logger.error({ err: r, queue: this.name, offset: g.off }, "job unreadable; marking it dead");
        this.leases.delete(g.off);
        w.unreserve();
        this.finish(g.off, St.DEAD);
        this.deadLettered++;
        void this.jev(Ev.DEAD, g.off, g.attempt, Date.now()).catch(() => {});
        continue;
      }
      const job = this.makeJob(g, r);
      this.uncache(g.off);
      w.deliver(job, g);
    }
  }

  private makeJob(g: Lease, r: PreparedRecord): JobImpl<unknown> {
    const rd = getHeader(r.headers, H_REDRIVES);
    const dlq = getHeader(r.headers, H_DLQ);
    return new JobImpl(this, g, r, {
      id: String(g.off),
      key: r.key === null ? null : r.key.toString("utf8"),
      attempt: g.attempt,
      enqueuedAt: r.timestamp,
      redriveCount: rd === undefined ? 0 : Number(rd.toString("utf8")) || 0,
      deadLetter: dlq === undefined ? null : (JSON.parse(dlq.toString("utf8")) as DeadLetterInfo),
    });
  }

  // ─────────────────────────────── timers ───────────────────────────────

  private scheduleDelayTimer(): void {
    if (this.closed) return;
    const at = this.delayed.peekPriority();
    if (at === Infinity || at >= this.delayTimerAt) return;
    if (this.delayTimer) clearTimeout(this.delayTimer);
    this.delayTimerAt = at;
    this.delayTimer = setTimeout(() => {
      this.delayTimer = null;
      this.delayTimerAt = Infinity;
      this.promoteDue(Date.now());
      this.scheduleDelayTimer();
      this.pump();
    }, Math.min(MAX_TIMER_MS, Math.max(0, at - Date.now() + 1)));
    this.delayTimer.unref();
  }

  private scheduleLeaseTimer(atMono: number): void {
    if (this.closed || this.leases.size === 0 || atMono >= this.leaseTimerAt) return;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.leaseTimerAt = atMono;
    this.leaseTimer = setTimeout(() => this.checkLeases(), Math.min(MAX_TIMER_MS, Math.max(0, atMono - performance.now() + 1)));
    this.leaseTimer.unref();
  }

  private checkLeases(): void {
    this.leaseTimer = null;
    this.leaseTimerAt = Infinity;
    if (this.closed || this.broken) return;
    const now = performance.now();
    let next = Infinity;
    for (const l of [...this.leases.values()]) {
      if (l.deadlineMono <= now) this.expire(l);
      else if (l.deadlineMono < next) next = l.deadlineMono;
    }
    if (next < Infinity) this.scheduleLeaseTimer(next);
    this.pump();
  }

  /** Lease lost: abort the job's signal, record the attempt, make the job visible again (or dead-letter it). */
  private expire(l: Lease): void {
    this.leases.delete(l.off);
    abortLease(l, new LeaseExpiredError());
    l.worker?.settled(l);
    const rec: AttemptRecord = {
      at: Date.now(),
      attempt: l.attempt,
      consumer: l.consumer,
      errorClass: "LeaseExpiredError",
      error: "lease expired before the job was settled",
      ...(l.codeVersion !== undefined ? { codeVersion: l.codeVersion } : {}),
    };
    this.pushHistory(l.off, rec);
    if (l.attempt >= this.config.maxAttempts) {
      this.track(this.deadLetter(l.off, rec).catch((e) => this.logger.error({ err: e, queue: this.name }, "dead-letter move failed")));
      return;
    }
    const now = Date.now();
    this.makeVisible(l.off, now);
    void this.journalEvent(encodeEvent(Ev.EXPIRE, l.off, l.attempt, now, rec)).catch(() => {});
  }

  // ─────────────────────────────── settlement ───────────────────────────────

  /** the receipt must be the current lease's, and its monotonic deadline not passed. */
  /** Returns the monotonic time it checked against. */
  private checkLease(g: Lease): number {
    this.checkOpen();
    const cur = this.leases.get(g.off);
    if (cur !== g) throw new LeaseExpiredError();
    const mono = performance.now();
    if (mono >= g.deadlineMono) {
      this.expire(g);
      this.pump();
      throw new LeaseExpiredError();
    }
    return mono;
  }

  ack(g: Lease): Promise<void> {
    const mono = this.checkLease(g);
    this.leases.delete(g.off);
    g.worker?.settled(g);
    this.finish(g.off, St.DONE);
    this.countAck(mono);
    const p = this.jev(Ev.ACK, g.off, g.attempt, Date.now());
    this.pump();
    return p;
  }

  async nack(g: Lease, opts: NackOptions = {}): Promise<void> {
    if (opts.delayMs !== undefined && (typeof opts.delayMs !== "number" || !(opts.delayMs >= 0) || opts.delayMs > 366 * 86_400_000))
      throw new ValidationError("nack delayMs must be a number in [0, 1 year]");
    this.checkLease(g);
    this.leases.delete(g.off);
    g.worker?.settled(g);
    const info = opts.error !== undefined ? errorInfo(opts.error) : { errorClass: "Nack", error: "" };
    if (opts.reason !== undefined) info.error = String(opts.reason).slice(0, MAX_ERROR_CHARS);
    const rec: AttemptRecord = {
      at: Date.now(),
      attempt: g.attempt,
      consumer: g.consumer,
      errorClass: info.errorClass,
      error: info.error,
      ...(g.codeVersion !== undefined ? { codeVersion: g.codeVersion } : {}),
    };
    this.pushHistory(g.off, rec);
    if (opts.requeue === false || g.attempt >= this.config.maxAttempts) {
      await this.deadLetter(g.off, rec);
      return;
    }
    const delay = opts.delayMs ?? retryDelayMs(this.config.backoff, g.attempt, this.random);
    const visibleAt = Date.now() + delay;
    this.retries++;
    this.makeVisible(g.off, visibleAt);
    const p = this.journalEvent(encodeEvent(Ev.NACK, g.off, g.attempt, visibleAt, rec));
    this.pump();
    return p;
  }

  /** Returns an unsettled job without recording a failure (worker shutdown). */
  release(g: Lease, unstarted = false): void {
    if (this.closed || this.broken || this.leases.get(g.off) !== g) return;
    this.leases.delete(g.off);
    abortLease(g, new AbortedError("worker closed"));
    g.worker?.settled(g);
    if (unstarted) {
      // Never handed to any consumer: this delivery does not count as an attempt. (Replay may
      // still see its DELIVER and count it; attempts can skip after a restart, never go back.)
      const i = this.table.idx(g.off);
      if (this.table.attempts[i] === g.attempt && g.attempt > 0) {
        this.table.attempts[i] = g.attempt - 1;
        if (g.attempt > 1) this.redeliveries--;
      }
    }
    const now = Date.now();
    this.makeVisible(g.off, now);
    void this.journalEvent(encodeEvent(Ev.NACK, g.off, g.attempt, now)).catch(() => {});
    this.pump();
  }

  /** Whether `g` is still the current lease of its job. */
  holds(g: Lease): boolean {
    return this.leases.get(g.off) === g;
  }

  /** Restarts the lease clock (same length) at the actual hand-off to a consumer. */
  restartLease(g: Lease, mono = performance.now(), wall = Date.now()): void {
    if (this.leases.get(g.off) !== g) return;
    const ttl = g.deadlineMono - g.startedMono;
    g.startedMono = mono;
    g.deadlineMono = mono + ttl;
    g.deadlineWall = wall + ttl;
  }

  extend(g: Lease, ms: number): Promise<void> {
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 1 || ms > 12 * 3_600_000)
      throw new ValidationError("extend(ms) needs a number in [1, 12 h]");
    this.checkLease(g);
    g.deadlineMono = performance.now() + ms;
    g.deadlineWall = Date.now() + ms;
    this.scheduleLeaseTimer(g.deadlineMono);
    return this.jev(Ev.EXTEND, g.off, g.attempt, g.deadlineWall);
  }

  // ─────────────────────────────── dead letters ───────────────────────────────

  /** Q-4 step 1: durable intent, then the move. */
  private async deadLetter(off: number, last: AttemptRecord): Promise<void> {
    const t = this.table;
    const i = t.idx(off);
    const intent: DlqIntent = {
      at: Date.now(),
      attempts: t.attempts[i],
      errorClass: last.errorClass,
      error: last.error,
      ...(last.codeVersion !== undefined ? { codeVersion: last.codeVersion } : {}),
      history: this.history.get(off) ?? [last],
    };
    this.setStatus(i, St.MOVING);
    this.moving.set(off, intent);
    this.pump();
    await this.journalEvent(encodeEvent(Ev.DLQ_INTENT, off, t.attempts[i], intent.at, intent));
    try {
      await this.finishDeadLetter(off, intent);
    } catch (e) {
      // E.g. the DLQ is full: the intent is durable, so keep retrying (and on every open) until it lands.
      this.retryMove(off, intent);
      throw e;
    }
  }

  private retryMove(off: number, intent: DlqIntent): void {
    const timer = setTimeout(() => {
      if (this.closed || this.broken || !this.moving.has(off)) return;
      this.track(
        this.finishDeadLetter(off, intent, true).catch((e) => {
          this.logger.warn({ err: e, queue: this.name, offset: off }, "dead-letter move failed; retrying");
          this.retryMove(off, intent);
        }),
      );
    }, 1000);
    timer.unref();
  }

  /** Q-4 steps 2-3 (also run on open for intents found in the journal). */
  private async finishDeadLetter(off: number, intent: DlqIntent, resumed = false): Promise<void> {
    const t = this.table;
    if (this.config.deadLetter !== null) {
      const [r] = [...(await this.fetchRecords([off])).values()];
      if (r instanceof Error) throw r;
      const dlq = await this.host.core(this.config.deadLetter);
      const redact = new Set(this.config.redactHeaders);
      const redacted: string[] = [];
      const kept: [string, Buffer][] = [];
      let firstEnqueuedAt = r.timestamp;
      let redriveCount = 0;
      for (const [k, v] of r.headers ?? []) {
        if (k === H_FIRST_ENQUEUED) firstEnqueuedAt = Number(v.toString("utf8")) || r.timestamp;
        else if (k === H_REDRIVES) redriveCount = Number(v.toString("utf8")) || 0;
        else if (k.startsWith("sluice-")) continue;
        else if (redact.has(k.toLowerCase())) redacted.push(k);
        else kept.push([k, v]);
      }
      const info: DeadLetterInfo & { key: string | null } = {
        sourceQueue: this.name,
        sourceId: String(off),
        sourceIncarnation: this.incarnation,
        firstEnqueuedAt,
        deadLetteredAt: intent.at,
        attempts: intent.attempts,
        errorClass: intent.errorClass,
        error: intent.error,
        history: intent.history,
        ...(intent.codeVersion !== undefined ? { codeVersion: intent.codeVersion } : {}),
        redriveCount,
        repeat: redriveCount > 0 && redriveCount >= this.config.maxRedrives,
        // A resumed move may follow a DLQ append that landed before the crash; the system dedupe id
        // normally suppresses the second copy, but if it does not (window passed) the copy says so.
        duplicate: resumed,
        redacted,
        key: r.key === null ? null : r.key.toString("utf8"),
      };
      let meta = Buffer.from(JSON.stringify(info), "utf8");
      if (meta.length > 256 * 1024) {
        info.history = info.history.slice(-3);
        meta = Buffer.from(JSON.stringify(info), "utf8");
      }
      const job = dlq.prepareRaw(r.value, r.valueKind, { dedupeId: `sys:dlq:${this.incarnation}:${off}` }, [...kept, [H_DLQ, meta]]);
      await dlq.enqueuePrepared([job]);
    }
    if (t.has(off) && t.status[t.idx(off)] === St.MOVING) {
      this.finish(off, St.DEAD);
      this.deadLettered++;
      this.pump();
      await this.jev(Ev.DEAD, off, 0, Date.now());
    }
  }

  /** moves matching dead-letter entries of this queue back to their source (or `target`). */
  async redrive(opts: RedriveOptions = {}, resuming = false): Promise<RedriveResult> {
    this.checkOpen();
    if (opts.target !== undefined) validateQueueName(opts.target);
    if (opts.limit !== undefined && !(Number.isInteger(opts.limit) && opts.limit >= 0)) throw new ValidationError("limit must be a non-negative integer");
    while (this.redriveRunning) await this.redriveRunning.catch(() => {});
    const run = this.redriveInner(opts, resuming);
    this.redriveRunning = run;
    try {
      return await run;
    } finally {
      this.redriveRunning = null;
    }
  }

  private async redriveInner(opts: RedriveOptions, resuming: boolean): Promise<RedriveResult> {
    const path = join(this.dir, "redrive.json");
    if (!resuming) await writeFileAtomic(this.fs, path, JSON.stringify({ opts }));
    await this.enqueueDrained();
    const t = this.table;
    const ids = opts.filter?.ids ? new Set(opts.filter.ids.map(String)) : null;
    const limit = opts.limit ?? Infinity;
    let moved = 0;
    let skippedRepeats = 0;
    let cursor = t.floor;
    const end = t.end;
    while (moved < limit && cursor < end) {
      this.checkOpen();
      const cand: number[] = [];
      for (let o = Math.max(cursor, t.floor); o < end && cand.length < 256; o++) {
        const s = t.status[t.idx(o)];
        if (s === St.READY || s === St.DELAYED || s === St.BLOCKED) cand.push(o);
        cursor = o + 1;
      }
      if (cand.length === 0) continue;
      const recs = await this.fetchRecords(cand);
      const byTarget = new Map<string, { off: number; job: PreparedJob }[]>();
      for (const o of cand) {
        if (moved + [...byTarget.values()].reduce((a, b) => a + b.length, 0) >= limit) break;
        const r = recs.get(o);
        if (r === undefined || r instanceof Error) continue;
        if (!t.has(o)) continue;
        const s = t.status[t.idx(o)];
        if (s !== St.READY && s !== St.DELAYED && s !== St.BLOCKED) continue;
        const mb = getHeader(r.headers, H_DLQ);
        const info = mb === undefined ? null : (JSON.parse(mb.toString("utf8")) as DeadLetterInfo & { key?: string | null });
        const target = opts.target ?? info?.sourceQueue;
        if (target === undefined) continue;
        const f = opts.filter;
        if (ids !== null && !ids.has(String(o)) && !(info && ids.has(info.sourceId))) continue;
        if (f?.errorClass !== undefined && info?.errorClass !== f.errorClass) continue;
        const at = info?.deadLetteredAt ?? r.timestamp;
        if (f?.from !== undefined && at < f.from) continue;
        if (f?.to !== undefined && at >= f.to) continue;
        if (info?.repeat && !opts.includeRepeats) {
          skippedRepeats++;
          continue;
        }
        const headers: [string, Buffer][] = [];
        for (const [k, v] of r.headers ?? []) if (!k.startsWith("sluice-")) headers.push([k, v]);
        headers.push([H_REDRIVES, Buffer.from(String((info?.redriveCount ?? 0) + 1))]);
        headers.push([H_FIRST_ENQUEUED, Buffer.from(String(info?.firstEnqueuedAt ?? r.timestamp))]);
        const targetCore = target === this.name ? this : await this.host.core(target);
        const job = targetCore.prepareRaw(r.value, r.valueKind, { key: info?.key ?? null, dedupeId: `sys:rd:${this.incarnation}:${o}` }, headers);
        let list = byTarget.get(target);
        if (!list) byTarget.set(target, (list = []));
        list.push({ off: o, job });
      }
      for (const [target, list] of byTarget) {
        const targetCore = target === this.name ? this : await this.host.core(target);
        // Not deliverable while in transit; the mark is in memory only (a crash leaves the entry, and the dedupe id makes the retry idempotent).
        const prev = new Map<number, St>();
        for (const { off } of list) {
          const i = t.idx(off);
          prev.set(off, t.status[i] as St);
          this.setStatus(i, St.MOVING);
        }
        try {
          await targetCore.enqueuePrepared(list.map((x) => x.job));
        } catch (e) {
          for (const { off } of list) if (t.has(off) && t.status[t.idx(off)] === St.MOVING) this.setStatus(t.idx(off), prev.get(off)!);
          throw e;
        }
        let p: Promise<void> = Promise.resolve();
        for (const { off } of list) {
          if (!t.has(off) || t.status[t.idx(off)] !== St.MOVING) continue;
          this.finish(off, St.DONE);
          p = this.jev(Ev.ACK, off, 0, Date.now());
          moved++;
        }
        await p;
      }
    }
    await this.fs.unlink(path).catch(() => {});
    await this.fs.fsyncDir(this.dir).catch(() => {});
    this.pump();
    return { moved, skippedRepeats };
  }

  // ─────────────────────────────── purge / stats / close ───────────────────────────────

  async purge(): Promise<number> {
    this.checkOpen();
    await this.enqueueDrained();
    const t = this.table;
    const end = t.end;
    let n = 0;
    t.forEachLive((o, i) => {
      const l = this.leases.get(o);
      if (l) {
        this.leases.delete(o);
        abortLease(l, new LeaseExpiredError("job was purged"));
        l.worker?.settled(l);
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
    this.chains.clear();
    this.ready.clear();
    this.delayed.clear();
    this.cacheSlots = new Array(CACHE_SLOTS);
    this.cacheBytes = 0;
    t.advanceFloor();
    this.notifyRoom();
    await this.jev(Ev.PURGE, end, 0, Date.now());
    await this.compact();
    return n;
  }

  stats(): QueueStats {
    this.checkOpen();
    const t = this.table;
    const now = Date.now();
    const mono = performance.now();
    let oldestWaiting = 0;
    while (this.ready.size > 0) {
      const o = this.ready.peekOffset();
      if (t.has(o) && t.status[t.idx(o)] === St.READY) {
        oldestWaiting = Math.max(0, now - Math.max(t.enqueuedAt[t.idx(o)], t.visibleAt[t.idx(o)]));
        break;
      }
      this.ready.pop();
    }
    let oldestLease = 0;
    for (const l of this.leases.values()) oldestLease = Math.max(oldestLease, mono - l.startedMono);
    const blockedKeys: BlockedKey[] = [];
    let scanned = 0;
    for (const c of this.chains.entries()) {
      if (blockedKeys.length >= 100 || scanned++ > 100_000) break;
      const h = c.offs[c.h];
      if (h === undefined || !t.has(h)) continue;
      const i = t.idx(h);
      if (t.attempts[i] > 0 && t.status[i] !== St.INFLIGHT) blockedKeys.push({ key: c.key, ageMs: Math.max(0, now - t.enqueuedAt[i]), attempts: t.attempts[i] });
    }
    const sec = Math.floor(mono / 1000);
    let acks = 0;
    for (let s = sec - 9; s <= sec; s++) if (s <= this.ackBucketSec && s > this.ackBucketSec - 10) acks += this.ackBuckets[((s % 10) + 10) % 10];
    return {
      name: this.name,
      waiting: this.counts[St.READY],
      delayed: this.counts[St.DELAYED],
      inFlight: this.counts[St.INFLIGHT],
      blockedByKey: this.counts[St.BLOCKED],
      deadLettered: this.deadLettered,
      depth: this.live,
      bytes: this.liveBytes,
      oldestWaitingAgeMs: oldestWaiting,
      oldestLeaseAgeMs: Math.round(oldestLease),
      redeliveries: this.redeliveries,
      retries: this.retries,
      completed: this.completed,
      completionRatePerSec: acks / 10,
      blockedKeys,
    };
  }

  /** Memory held by the job table and heaps (for docs and the memory benchmark). */
  memoryBytes(): number {
    return this.table.capacityBytes + this.ready.capacityBytes + this.delayed.capacityBytes + this.cacheBytes;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    for (const w of [...this.workers]) w.abortAll(new BrokerClosedError(`queue ${this.name} is closing`));
    await this.enqueueDrained().catch(() => {});
    await this.whenIdle().catch(() => {});
    if (!this.broken) {
      try {
        await this.compact();
      } catch (e) {
        this.logger.warn({ err: e, queue: this.name }, "final queue snapshot failed");
      }
    }
    while (this.jRunning) await new Promise((r) => setImmediate(r));
    this.closed = true;
    if (this.delayTimer) clearTimeout(this.delayTimer);
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    if (this.keepAlive) clearInterval(this.keepAlive);
    for (const w of this.roomWaiters) w();
    for (const l of this.leases.values()) abortLease(l, new BrokerClosedError(`queue ${this.name} is closing`));
    await this.msgs.close();
    await this.journal.close();
  }
}

// ─────────────────────────────────── jobs ───────────────────────────────────

interface JobFields {
  id: string;
  key: string | null;
  attempt: number;
  enqueuedAt: number;
  redriveCount: number;
  deadLetter: DeadLetterInfo | null;
}

const UNDECODED: unique symbol = Symbol("undecoded");

export class JobImpl<T> implements Job<T> {
  readonly id: string;
  readonly key: string | null;
  readonly attempt: number;
  readonly enqueuedAt: number;
  readonly redriveCount: number;
  readonly deadLetter: DeadLetterInfo | null;
  /** `data` and `headers` are decoded on first access: the network server never needs them
   * (it forwards the stored bytes, `record`), and a JSON parse per job is not free. */
  private decoded: T | typeof UNDECODED = UNDECODED;
  private headerObj: Record<string, Uint8Array> | null = null;
  constructor(
    private readonly core: QueueCore,
    private readonly lease: Lease,
    /** @internal The stored record (value bytes and kind, headers including `sluice-*`). */
    readonly record: PreparedRecord,
    f: JobFields,
  ) {
    this.id = f.id;
    this.key = f.key;
    this.attempt = f.attempt;
    this.enqueuedAt = f.enqueuedAt;
    this.redriveCount = f.redriveCount;
    this.deadLetter = f.deadLetter;
  }
  get data(): T {
    if (this.decoded === UNDECODED) {
      const r = this.record;
      try {
        this.decoded = decodeValue(r.value, r.valueKind) as T;
      } catch {
        this.decoded = r.value as T;
      }
    }
    return this.decoded;
  }
  get headers(): Record<string, Uint8Array> {
    return (this.headerObj ??= headerMap(this.record.headers));
  }
  get receipt(): string {
    return this.lease.receipt;
  }
  get leaseExpiresAt(): number {
    return this.lease.deadlineWall;
  }
  get signal(): AbortSignal {
    const l = this.lease;
    if (l.ac === null) {
      l.ac = new AbortController();
      if (l.abortReason !== undefined) l.ac.abort(l.abortReason);
    }
    return l.ac.signal;
  }
  ack(): Promise<void> {
    try {
      return this.core.ack(this.lease);
    } catch (e) {
      return Promise.reject(e);
    }
  }
  nack(opts?: NackOptions): Promise<void> {
    return this.core.nack(this.lease, opts);
  }
  extend(ms: number): Promise<void> {
    try {
      return this.core.extend(this.lease, ms);
    } catch (e) {
      return Promise.reject(e);
    }
  }
  /** @internal */
  release(): void {
    this.core.release(this.lease);
  }
  /** @internal Gives back a job that never reached a consumer (its delivery is not an attempt). */
  unstart(): void {
    this.core.release(this.lease, true);
  }
  /** @internal Whether this job's lease is still current (not settled, expired or released). */
  get leaseHeld(): boolean {
    return this.core.holds(this.lease);
  }
  /** @internal A number the consumer attaches to this delivery (see `WorkerImpl.onLeaseLost`). */
  get tag(): number {
    return this.lease.tag;
  }
  set tag(t: number) {
    this.lease.tag = t;
  }
  /** @internal The lease clock restarts now (`mono`/`wall`: the caller's clock reads for a
   * batch): the consumer gets the full visibility timeout. */
  restartLease(mono?: number, wall?: number): void {
    this.core.restartLease(this.lease, mono, wall);
  }
}

// ─────────────────────────────────── workers ───────────────────────────────────

/**
 * A worker iterator. `prefetch` bounds reserved + buffered + unsettled jobs, so a slow consumer
 * holds at most `prefetch` leases and never an unbounded buffer.
 */
export class WorkerImpl<T> implements Worker<T> {
  readonly visibilityTimeoutMs: number;
  prefetch: number;
  readonly consumerId: string;
  readonly codeVersion: string | undefined;
  private readonly onUnsettled: "nack" | "error";
  private core: QueueCore | null = null;
  private buffer: JobImpl<T>[] = [];
  private reserved = 0;
  private held = new Set<Lease>();
  private waiter: (() => void) | null = null;
  private closed = false;
  private failure: Error | null = null;
  private readonly opening: Promise<void>;
  private readonly signal: AbortSignal | undefined;
  /** Push mode (used by `process()`): jobs go straight to this callback instead of the iterator buffer. */
  onJob: ((job: JobImpl<T>) => void) | null = null;
  /**
   * Batch push mode (used by the network server): the jobs of one hand-out round arrive in one
   * call (on a microtask after the round), so they can travel in one frame. Like `onJob`, the
   * jobs count against `prefetch` until settled or their lease is lost.
   */
  onJobs: ((jobs: JobImpl<T>[]) => void) | null = null;
  private outBatch: JobImpl<T>[] = [];
  /** Called when a lease this worker was granted is lost (expired, purged, released, queue
   * failure or shutdown): the moment `job.signal` aborts, without needing the signal. */
  onLeaseLost: ((tag: number, reason: unknown) => void) | null = null;
  private closedWaiters: (() => void)[] = [];

  constructor(corePromise: Promise<QueueCore>, opts: WorkOptions = {}) {
    const c = opts;
    this.prefetch = Math.floor(num(c.prefetch, "prefetch", 1, MAX_PREFETCH, 16));
    this.visibilityTimeoutMs = num(c.visibilityTimeoutMs, "visibilityTimeoutMs", 10, 12 * 3_600_000, 0);
    this.consumerId = c.consumerId ?? `${process.pid}-worker-${++workerSeq}`;
    this.codeVersion = c.codeVersion;
    this.onUnsettled = c.onUnsettled ?? "nack";
    this.signal = c.signal;
    this.opening = corePromise.then(
      (core) => {
        this.core = core;
        if (this.visibilityTimeoutMs === 0) (this as { visibilityTimeoutMs: number }).visibilityTimeoutMs = core.config.visibilityTimeoutMs;
        if (this.closed) return;
        core.addWorker(this as WorkerImpl<unknown>);
      },
      (e) => {
        this.failure = e instanceof Error ? e : new Error(String(e));
        this.closed = true;
        this.wake();
      },
    );
    this.opening.catch(() => {});
    if (this.signal) {
      if (this.signal.aborted) this.closed = true;
      else this.signal.addEventListener("abort", () => void this.close(), { once: true });
    }
  }

  /** Why the worker stopped, if it failed (queue could not open, storage failure, queue closed). */
  get error(): Error | null {
    return this.failure;
  }

  capacity(): number {
    return this.closed ? 0 : this.prefetch - this.reserved - this.buffer.length - this.held.size;
  }
  reserve(): void {
    this.reserved++;
  }
  unreserve(): void {
    this.reserved--;
    this.core?.pump();
  }
  deliver(job: JobImpl<T>, g: Lease): void {
    this.reserved--;
    if (this.closed) {
      this.core?.release(g);
      return;
    }
    if (this.onJob !== null) {
      this.held.add(g);
      this.onJob(job);
      return;
    }
    if (this.onJobs !== null) {
      this.held.add(g);
      this.outBatch.push(job);
      if (this.outBatch.length === 1) queueMicrotask(() => this.flushOut());
      return;
    }
    this.buffer.push(job);
    this.wake();
  }

  private flushOut(): void {
    const jobs = this.outBatch;
    this.outBatch = [];
    if (jobs.length === 0) return;
    if (this.onJobs !== null && !this.closed) {
      this.onJobs(jobs);
      return;
    }
    // Closed between the hand-out and this microtask: give the jobs back.
    for (const j of jobs) j.release();
  }

  /** Changes how many unsettled jobs this worker may hold (more: granted on the next pump;
   * 0: no more grants, the jobs it holds stay leased). */
  setPrefetch(n: number): void {
    this.prefetch = Math.max(0, Math.min(MAX_PREFETCH, Math.floor(n)));
  }

  /** Grants jobs now (see QueueCore.pumpNow): call after settling a batch. */
  pumpNow(): void {
    this.core?.pumpNow();
  }

  /** Set when the queue could not be opened (the iterator would throw it). */
  get openError(): Error | null {
    return this.core === null ? this.failure : null;
  }

  /** Resolves once the worker stopped receiving (close, stopReceiving, abort, queue shutdown). */
  whenStopped(): Promise<void> {
    if (this.closed) return Promise.resolve();
    return new Promise((r) => this.closedWaiters.push(r));
  }
  /** Called by the queue when a lease this worker held ended (settled, expired, purged). */
  settled(g: Lease): void {
    if (this.held.delete(g)) this.core?.pump();
    else {
      const i = this.buffer.findIndex((j) => j.receipt === g.receipt);
      if (i >= 0) this.buffer.splice(i, 1);
    }
  }
  abortAll(err: Error): void {
    this.failure = this.failure ?? err;
    for (const g of this.held) abortLease(g, err);
    void this.close();
  }
  private wake(): void {
    if (this.closed) for (const r of this.closedWaiters.splice(0)) r();
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  async next(): Promise<IteratorResult<Job<T>>> {
    for (;;) {
      if (this.buffer.length > 0 && !this.closed) {
        const job = this.buffer.shift()!;
        this.held.add((job as unknown as { lease: Lease }).lease);
        return { value: job, done: false };
      }
      if (this.failure && this.core === null) throw this.failure;
      if (this.closed) return { value: undefined, done: true };
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Job<T>> {
    return {
      next: () => this.next(),
      return: async () => {
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  /** Stops receiving; buffered jobs are released, unsettled ones too (onUnsettled "nack") or left to expire ("error"). */
  async close(): Promise<void> {
    if (this.closed && this.core === null) return;
    this.closed = true;
    this.wake();
    await this.opening.catch(() => {});
    const core = this.core;
    if (core === null) return;
    core.removeWorker(this as WorkerImpl<unknown>);
    for (const j of this.buffer.splice(0)) j.release();
    if (this.onUnsettled === "nack") for (const g of [...this.held]) core.release(g);
    this.held.clear();
  }

  /** Aborts the signals of unsettled jobs (shutdown) without releasing their leases. */
  abortSignals(reason: unknown): void {
    for (const g of this.held) abortLease(g, reason);
  }

  /** Like close(), but unsettled jobs stay leased so running handlers can still settle them. */
  stopReceiving(): void {
    this.closed = true;
    this.wake();
    const core = this.core;
    if (core === null) return;
    core.removeWorker(this as WorkerImpl<unknown>);
    for (const j of this.buffer.splice(0)) j.release();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

