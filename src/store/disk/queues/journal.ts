// SPDX-License-Identifier: Apache-2.0
/**
 * The queue's state journal: a group-commit writer on top of its own PartitionLog. Events
 * (events.ts) of one event-loop turn and of the time an append is in flight go into one batch;
 * each batch is appended as one record per 64 KiB chunk, and every event of the batch resolves
 * with one shared promise once the append is durable (JRN-2: a settlement resolves only after
 * the record holding its event is durable; Q-2). Up to MAX_APPENDS_IN_FLIGHT appends run at
 * once; the log orders them as issued, so the journal's order is the order events were issued.
 *
 * Snapshots are taken here, between two appends (JRN-3): with no append in flight every record
 * below the journal's end is reflected in memory, so the snapshot can name that end as its
 * replay start.
 */
import type { Logger } from "../../../observability/telemetry.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import { EVENT_FIXED_BYTES, writeEvent, type Ev } from "./events.js";

/** Bytes per journal record (one chunk of a batch). */
export const MAX_JOURNAL_RECORD_BYTES = 1024 * 1024;
const JOURNAL_CHUNK_BYTES = 64 * 1024;
/** Take a snapshot (and delete what it covers) after this many journal bytes. */
const SNAPSHOT_EVERY_JOURNAL_BYTES = 32 * 1024 * 1024;
/**
 * Journal appends in flight at once. One at a time, a DELIVER issued while an ACK batch's
 * fdatasync ran waited for it and then for its own: hand-outs took two fdatasyncs. The log
 * pipelines them (its group commit gathers appends behind running fdatasyncs).
 */
const MAX_APPENDS_IN_FLIGHT = 4;

export interface Deferred<T = void> {
  promise: Promise<T>;
  resolve(v: T): void;
  reject(e: unknown): void;
}

export function deferred<T = void>(): Deferred<T> {
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

interface JournalBatch {
  chunks: Buffer[];
  cur: Buffer;
  pos: number;
  bytes: number;
  d: Deferred;
}

export interface JournalHooks {
  /** Throws when the queue cannot take events (closed or failed). */
  check(): void;
  /** An append failed: the queue's memory is ahead of its disk (it must be reopened). */
  failed(err: unknown): Error;
  /** Writes a snapshot covering the journal up to `journalEnd`. */
  snapshot(journalEnd: number): Promise<void>;
  /** The scheduled batch is about to be taken: events issued now still join it (grants). */
  beforeWrite(): void;
  logger: Logger;
  queue: string;
  now(): number;
}

export class Journal {
  private batch: JournalBatch | null = null;
  /** A pump is queued on a microtask (events of one turn share a batch). */
  private scheduled = false;
  private readonly scheduledPump = (): void => {
    // Still `scheduled` while the hook runs: the events it issues (DELIVERs of grants the
    // settlements of this turn made room for) join the batch about to be written.
    if (this.failure === null) this.hooks.beforeWrite();
    this.scheduled = false;
    this.pump();
  };
  /** Appends handed to the log and not yet settled (at most MAX_APPENDS_IN_FLIGHT). */
  private inflight = 0;
  /** Settles once every append issued so far has settled (a barrier chains on it). */
  private lastWrite: Promise<void> = Promise.resolve();
  private failure: Error | null = null;
  private sinceSnapshot = 0;
  private snapshotRequested = false;
  private snapshotting: Promise<void> | null = null;

  constructor(
    readonly log: PartitionLog,
    private readonly hooks: JournalHooks,
  ) {}

  /** Queues an event (encoded, or null for none); resolves once it is durable. */
  event(buf: Buffer | null): Promise<void> {
    const b = this.open();
    if (buf !== null) {
      if (b.pos + buf.length > b.cur.length) this.newChunk(b, buf.length);
      buf.copy(b.cur, b.pos);
      b.pos += buf.length;
      b.bytes += buf.length;
    }
    return b.d.promise;
  }

  /** Fast path for fixed-size events: written straight into the batch buffer. */
  fixed(type: Ev, off: number, attempt: number, time: number): Promise<void> {
    const b = this.open();
    if (b.pos + EVENT_FIXED_BYTES > b.cur.length) this.newChunk(b, EVENT_FIXED_BYTES);
    b.pos = writeEvent(b.cur, b.pos, type, off, attempt, time);
    b.bytes += EVENT_FIXED_BYTES;
    return b.d.promise;
  }

  /** Asks for a snapshot after the batches in flight (message log grew enough). */
  requestSnapshot(): void {
    if (this.snapshotRequested) return;
    this.snapshotRequested = true;
    void this.event(null).catch(() => {});
  }

  /** Forces a snapshot now (after pending events are durable). */
  async compact(): Promise<void> {
    this.snapshotRequested = true;
    await this.event(null);
    while (this.snapshotting) await this.snapshotting;
  }

  /** Resolves once no append or snapshot is running and no batch waits. */
  async idle(): Promise<void> {
    while (this.inflight > 0 || this.snapshotting !== null || (this.batch !== null && this.failure === null)) await new Promise((r) => setImmediate(r));
  }

  /** Journal bytes since the last snapshot reset the count. */
  snapshotTaken(): void {
    this.sinceSnapshot = 0;
  }

  private newChunk(b: JournalBatch, need: number): void {
    if (b.pos > 0) b.chunks.push(b.cur.subarray(0, b.pos));
    b.cur = Buffer.allocUnsafe(Math.max(JOURNAL_CHUNK_BYTES, need));
    b.pos = 0;
  }

  private open(): JournalBatch {
    this.hooks.check();
    if (this.batch === null) this.batch = { chunks: [], cur: Buffer.allocUnsafe(JOURNAL_CHUNK_BYTES), pos: 0, bytes: 0, d: deferred() };
    const b = this.batch;
    if (!this.scheduled) {
      this.scheduled = true;
      // Idle journal: append after this microtask checkpoint (latency). With appends in flight
      // the batch gathers the whole event-loop turn: a loop that settles one job per microtask
      // (the README's un-awaited acks) would otherwise make one append per job.
      if (this.inflight === 0) queueMicrotask(this.scheduledPump);
      else setImmediate(this.scheduledPump);
    }
    return b;
  }

  private snapshotWanted(): boolean {
    return this.snapshotRequested || this.sinceSnapshot > SNAPSHOT_EVERY_JOURNAL_BYTES;
  }

  /**
   * Starts appends while fewer than MAX_APPENDS_IN_FLIGHT run (JRN-2: the log assigns their
   * offsets in call order and publishes them in that order, so batches become durable, and
   * resolve, in the order their events were issued; a failed append fails every append behind
   * it). While a snapshot is wanted appends go one at a time again, so the journal reaches a
   * point with none in flight; the snapshot is taken there (JRN-3).
   */
  private pump(): void {
    while (this.batch !== null && this.failure === null && this.snapshotting === null && this.inflight < MAX_APPENDS_IN_FLIGHT) {
      if (this.inflight > 0 && this.snapshotWanted()) break;
      const b = this.batch;
      this.batch = null;
      this.write(b);
    }
    if (this.inflight === 0 && this.batch === null && this.snapshotting === null && this.failure === null && this.snapshotWanted()) this.takeSnapshot();
  }

  private write(b: JournalBatch): void {
    if (b.bytes === 0) {
      // A barrier (requestSnapshot, compact): durable once everything issued before it is.
      this.lastWrite.then(() => (this.failure === null ? b.d.resolve() : b.d.reject(this.failure)));
      return;
    }
    // One journal record per chunk; events never straddle chunks.
    if (b.pos > 0) b.chunks.push(b.cur.subarray(0, b.pos));
    const ts = this.hooks.now();
    this.inflight++;
    let appended: Promise<unknown>;
    try {
      appended = this.log.append(b.chunks.map((value) => ({ key: null, value, valueKind: 0 as const, timestamp: ts, headers: null })));
    } catch (e) {
      appended = Promise.reject(e);
    }
    this.lastWrite = appended.then(
      () => {
        this.inflight--;
        this.sinceSnapshot += b.bytes;
        if (this.failure !== null) b.d.reject(this.failure);
        else b.d.resolve();
        this.pump();
      },
      (e: unknown) => {
        this.inflight--;
        this.fail(b, e);
      },
    );
  }

  /** An append failed: its batch and every batch behind it fail (the queue must be reopened). */
  private fail(b: JournalBatch, e: unknown): void {
    this.failure ??= this.hooks.failed(e);
    b.d.reject(this.failure);
    // Events queued behind it can never be written in order: they fail the same way.
    const rest = this.batch;
    this.batch = null;
    rest?.d.reject(this.failure);
  }

  private takeSnapshot(): void {
    this.snapshotRequested = false;
    this.snapshotting = this.hooks
      .snapshot(this.log.logEndOffset)
      .catch((e: unknown) => this.hooks.logger.error({ err: e, queue: this.hooks.queue }, "queue snapshot failed; will retry later"))
      .finally(() => {
        this.snapshotting = null;
        this.pump();
      });
  }
}
