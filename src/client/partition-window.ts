// SPDX-License-Identifier: Apache-2.0
/**
 * The idempotent producer's per-partition window (docs/protocol.md §5): which batches of one
 * (topic, partition) are numbered, sent, re-sent with their number, renumbered or failed.
 * Gathering records into batches and talking to the transport is the producer's
 * (src/client/producer.ts); it reaches this state machine through `PartitionWindow` and answers
 * its needs through `WindowHost`.
 *
 * The broker answers a batch it already stored with its original offsets (`duplicate: true`),
 * but it remembers only the last PRODUCER_BATCHES_KEPT batches per producer and partition. So
 * per partition the client keeps a *window* of at most PRODUCER_BATCHES_KEPT numbered batches,
 * from the oldest one not yet settled to the newest one sent; further batches wait, unnumbered,
 * in order. Every batch that might have been stored is therefore still in the broker's memory
 * when it is retried.
 *
 * The broker checks sequences and answers the batches of one partition in arrival order, and
 * the transport re-sends pending requests in their original order after a reconnect. When a
 * batch of the window fails, the batches behind it come back OUT_OF_ORDER_SEQUENCE (refused for
 * the gap, so certainly not stored). Nothing new is sent to that partition until every batch
 * of its window is answered; then `recover()`:
 * - re-sends, with the same sequence and epoch, every batch that failed retriably (connection
 *   lost, timeouts, storage errors: it may be stored, and the broker recognises the retry)
 *   or was refused for the gap, after a backoff if the failure was retriable;
 * - drops a batch that failed for good (its callers already have the error; the broker did
 *   not store it) and renumbers the batches after it from its sequence, which the broker still
 *   expects.
 * An OUT_OF_ORDER_SEQUENCE for the oldest batch of a window with no earlier failure means the
 * broker no longer has this producer's state; a publish whose retries outlast
 * `deliveryTimeoutMs` leaves its sequence in doubt. Both are answered by a fresh producer id
 * (the producer's `maybeRenew()`), obtained once no numbered batch of any partition is
 * unsettled, because a new id restarts every partition's sequences at 0.
 */
import { ProtocolError, TimeoutError } from "../errors.js";
import { PRODUCER_BATCHES_KEPT } from "../log/producer-state.js";
import { encodeBatch, stampBatch, type PreparedRecord, type ValueKind } from "../log/record-batch.js";
import type { ProducerIdentity, PublishReceipt } from "../types.js";
import type { Frame } from "../wire/index.js";

/**
 * A record validated and converted to bytes once, at publish time (the caller may reuse its
 * objects). A publish() of one record is settled through the record itself (`resolve`), so
 * such a publish costs one object and one promise; records of a larger call belong to a
 * `Group` and have no settlement of their own.
 */
export class QueuedRecord implements PreparedRecord {
  constructor(
    public key: Buffer | null,
    public value: Buffer | null,
    public valueKind: ValueKind,
    public timestamp: number,
    public headers: [string, Buffer][] | null,
    /** A publish of its own: its receipt (or `[receipt]` with `asArray`); null in a Group. */
    readonly resolve: ((r: never) => void) | null,
    readonly reject: ((e: unknown) => void) | null,
    readonly asArray: boolean,
  ) {}
}

/** The records of one send() call for one partition (one promise for all of them). */
export class Group {
  constructor(
    readonly records: QueuedRecord[],
    readonly resolve: (r: PublishReceipt[]) => void,
    readonly reject: (e: unknown) => void,
  ) {}
}

/** What a batch gathers: single publishes (their record) and groups, in publish order. */
export type Entry = QueuedRecord | Group;

export const enum St {
  /** Gathering records or waiting for a window slot: no sequence yet. */
  Queued,
  /** Sent; no answer yet. */
  Flying,
  /** Stored and acknowledged (kept in the window until the batches before it settle). */
  Acked,
  /** Failed retriably: may be stored; re-sent with the same sequence. */
  Retry,
  /** Refused with OUT_OF_ORDER_SEQUENCE behind an earlier failure: not stored; re-sent. */
  Gap,
  /** Failed for good (callers rejected); not stored. */
  Failed,
}

const enum Mode {
  /** New batches may be numbered and sent. */
  Normal,
  /** A batch of the window failed: wait until none is in flight, then recover(). */
  Failing,
  /** recover() decided to re-send after a backoff. */
  Backoff,
}

const NO_ENTRIES: Entry[] = [];
/** Largest sequence + count the broker accepts (the header field is an i32). */
const MAX_SEQUENCE = 2 ** 31 - 1;
const RETRY_BACKOFF_MIN_MS = 50;
const RETRY_BACKOFF_MAX_MS = 2000;

/** The next retry backoff after `prevMs` (0: the first): doubling from 50 ms up to 2 s. */
export function nextBackoffMs(prevMs: number): number {
  return Math.min(RETRY_BACKOFF_MAX_MS, prevMs === 0 ? RETRY_BACKOFF_MIN_MS : prevMs * 2);
}

/**
 * What the windows of one producer share and need from it. Fields are producer-wide state the
 * windows read and update in place (one object, no copies per batch).
 */
export interface WindowHost {
  /** The id and epoch new batches are numbered under (set before the first batch is pumped). */
  readonly identity: ProducerIdentity | null;
  /** Set once the client is closed: everything waiting fails with it. */
  closedError: unknown;
  /** A fresh producer id is needed before any new batch is numbered. */
  renewNeeded: boolean;
  /** Numbered batches in all windows (a fresh id is taken only when this is 0). */
  windowed: number;
  readonly deliveryTimeoutMs: number;
  /** Sends a numbered batch; its answer comes back through `onAnswer`/`onError`. */
  dispatch(b: Batch): void;
  /** `n` accepted records are settled (answered or failed): room for more. */
  release(n: number): void;
  /** Forget the topic's cached metadata (it was deleted or re-created). */
  invalidate(topic: string): void;
  /** Obtain a fresh producer id if one is needed and no numbered batch is unsettled. */
  maybeRenew(): void;
  /** Whether `err` means the client itself was closed (nothing will be retried). */
  closedBy(err: unknown): boolean;
}

export class Batch {
  entries: Entry[] = [];
  /** Groups among the entries (none: the entries are the records, no copy). */
  groups = 0;
  count = 0;
  bytes = 0;
  seq = -1;
  state = St.Queued;
  /** Encoded once when numbered; a re-send sends the same bytes (same sequence and epoch). */
  encoded: Buffer | null = null;
  /** The last retriable error of this batch: what its callers get if it expires. */
  lastError: unknown = null;
  /** Closed by a flush or by filling up: may be sent when a slot frees. */
  ready = false;
  constructor(
    readonly part: PartitionWindow,
    /** deliveryTimeoutMs after the first record was accepted. */
    readonly deadline: number,
  ) {}

  /** All records of the batch, in order (no groups, or one: no copy). */
  records(): PreparedRecord[] {
    const es = this.entries;
    if (this.groups === 0) return es as QueuedRecord[];
    if (es.length === 1) return (es[0] as Group).records;
    return es.flatMap((e) => (e instanceof Group ? e.records : e));
  }

  /** The broker stored the batch at `baseOffset`: every caller gets its receipts. */
  resolve(baseOffset: number, duplicate: boolean, synced: boolean): void {
    const { topic, partition } = this.part;
    const es = this.entries;
    this.entries = NO_ENTRIES;
    let offset = baseOffset;
    for (let i = 0; i < es.length; i++) {
      const e = es[i];
      if (e instanceof Group) {
        const rs: PublishReceipt[] = new Array(e.records.length);
        for (let k = 0; k < rs.length; k++) rs[k] = { topic, partition, offset: offset++, duplicate, synced };
        e.resolve(rs);
      } else {
        const r = { topic, partition, offset: offset++, duplicate, synced };
        (e.resolve as (x: PublishReceipt | PublishReceipt[]) => void)(e.asArray ? [r] : r);
      }
    }
    this.part.host.release(this.count);
  }

  /** A numbered batch failed for good (or expired): its callers get `err`. */
  fail(err: unknown): void {
    this.state = St.Failed;
    this.encoded = null;
    this.rejectItems(err);
  }

  /** An unnumbered batch fails: its callers get `err`. */
  reject(err: unknown): void {
    this.state = St.Failed;
    this.rejectItems(err);
  }

  rejectItems(err: unknown): void {
    const es = this.entries;
    this.entries = NO_ENTRIES;
    for (const e of es) e.reject!(err);
    this.part.host.release(this.count);
  }

  /** Back to waiting for a slot: a new number (and encoding) when it is pumped again. */
  unnumber(): void {
    this.state = St.Queued;
    this.seq = -1;
    this.encoded = null;
  }
}

/** Producer state of one (topic, partition): the batch gathering records and the window. */
export class PartitionWindow {
  /** The batch gathering records (never numbered); the producer's batching fills it. */
  open: Batch | null = null;
  /** In the producer's flush list (avoids duplicates). */
  listed = false;
  /** Without idempotence: batches sent and not answered (the producer caps them too). */
  plainInFlight = 0;
  /** Closed batches waiting for a window slot, in order (head index: no O(n) shift). */
  private queue: (Batch | undefined)[] = [];
  private qHead = 0;
  /** Numbered batches from the oldest unsettled one to the newest sent; at most PRODUCER_BATCHES_KEPT. */
  private window: Batch[] = [];
  private inFlight = 0;
  nextSeq = 0;
  private mode = Mode.Normal;
  private backoffMs = 0;
  /** The last retriable error seen on this partition (what waiting batches get if they expire). */
  lastRetriable: unknown = null;
  constructor(
    readonly host: WindowHost,
    readonly topic: string,
    readonly partition: number,
  ) {}

  /** Numbered batches not yet settled (sent, or waiting to be re-sent). */
  get busy(): boolean {
    return this.window.length > 0;
  }

  /** Nothing gathering, waiting or numbered. */
  get idle(): boolean {
    return this.window.length === 0 && this.open === null && this.qHead === this.queue.length;
  }

  /** A closed batch waits for a slot behind the ones before it. */
  enqueue(b: Batch): void {
    this.queue.push(b);
    this.pump();
  }

  /** Numbers and sends waiting batches while the window has room. */
  pump(): void {
    const host = this.host;
    if (host.closedError) {
      this.failWaiting(host.closedError);
      return;
    }
    if (this.mode !== Mode.Normal || host.renewNeeded) return;
    const id = host.identity!;
    while (this.window.length < PRODUCER_BATCHES_KEPT) {
      const b = this.takeNext();
      if (b === null) break;
      if (this.nextSeq + b.count > MAX_SEQUENCE) {
        // Sequences of this producer id are used up on this partition: continue under a new id.
        this.unshiftQueue([b]);
        host.renewNeeded = true;
        host.maybeRenew();
        return;
      }
      try {
        // The batch travels in the storage format with its CRC (base offset 0): the broker
        // verifies it and stores it as is, so the checksum covers the records from here to disk.
        b.encoded = encodeBatch(b.records(), { producerId: id.producerId, producerEpoch: id.producerEpoch, baseSequence: this.nextSeq });
        stampBatch(b.encoded, 0);
      } catch (err) {
        // Not numbered, not sent: the sequence stays free.
        b.reject(err);
        continue;
      }
      b.seq = this.nextSeq;
      this.nextSeq += b.count;
      this.window.push(b);
      host.windowed++;
      this.transmit(b);
    }
  }

  /** The next batch to number: the oldest waiting one, else the gathering one if it is ready. */
  private takeNext(): Batch | null {
    if (this.qHead < this.queue.length) {
      const b = this.queue[this.qHead]!;
      this.queue[this.qHead++] = undefined;
      if (this.qHead === this.queue.length) {
        this.queue.length = 0;
        this.qHead = 0;
      } else if (this.qHead >= 1024 && this.qHead * 2 >= this.queue.length) {
        this.queue = this.queue.slice(this.qHead);
        this.qHead = 0;
      }
      return b;
    }
    if (this.open !== null && this.open.ready) {
      const b = this.open;
      this.open = null;
      return b;
    }
    return null;
  }

  private transmit(b: Batch): void {
    b.state = St.Flying;
    this.inFlight++;
    this.host.dispatch(b);
  }

  /** The broker answered a numbered batch of this window. */
  onAnswer(b: Batch, f: Frame): void {
    this.inFlight--;
    const baseOffset = Number(f.meta.baseOffset);
    const count = Number(f.meta.count);
    b.state = St.Acked;
    b.encoded = null;
    if (count !== b.count || !Number.isSafeInteger(baseOffset)) {
      // Cannot happen with a conforming server. The broker did take the sequence, so the batch
      // stays Acked for the numbering; its callers cannot be told where the records went.
      b.rejectItems(new ProtocolError(`server acknowledged ${count} records for ${b.count}`));
    } else {
      b.resolve(baseOffset, f.meta.duplicate === true, f.meta.synced === true);
    }
    this.backoffMs = 0;
    this.dropSettledHead();
    this.settled();
  }

  /** A numbered batch of this window failed: classify, then recover once none is in flight. */
  onError(b: Batch, err: unknown): void {
    const host = this.host;
    this.inFlight--;
    const code = (err as { code?: unknown } | null)?.code;
    const wasNormal = this.mode === Mode.Normal;
    this.mode = Mode.Failing;
    if (host.closedBy(err)) {
      // The client itself was closed (close() gave up draining): nothing will be retried.
      host.closedError ??= err;
      b.fail(err);
    } else if (code === "OUT_OF_ORDER_SEQUENCE") {
      if (wasNormal && this.window[0] === b) {
        // The oldest unsettled batch, and nothing failed before it: the broker does not hold
        // the sequence this producer left it at (its state was lost or evicted). Refused, so
        // not stored; the batches behind it go again under a fresh producer id.
        process.emitWarning(
          `sluice producer ${host.identity?.producerId}: the broker lost its sequence state for ${this.topic}/${this.partition}; ` +
            `the publish fails with OUT_OF_ORDER_SEQUENCE (not stored) and the producer continues under a new id`,
          { code: "SLUICE_PRODUCER_STATE_LOST" },
        );
        b.fail(err);
        host.renewNeeded = true;
      } else {
        b.state = St.Gap;
      }
    } else if (code === "CONNECTION_CLOSED" || code === "TIMEOUT" || code === "STORAGE_ERROR" || code === "STORAGE_FULL" || code === "BROKER_CLOSED" || (err as { retriable?: unknown } | null)?.retriable === true) {
      // May or may not be stored (BROKER_CLOSED here comes from a server shutting down).
      b.state = St.Retry;
      // A re-send cut at the delivery deadline times out; the caller is better served by the
      // error that made it retry (QUOTA_EXCEEDED, STORAGE_FULL, ...) than by that TIMEOUT.
      const cutAtDeadline = code === "TIMEOUT" && b.lastError != null && b.deadline <= Date.now();
      if (!cutAtDeadline) {
        b.lastError = err;
        this.lastRetriable = err;
      }
    } else {
      // Refused for good (VALIDATION, RECORD_TOO_LARGE, INVALID_BATCH, TOPIC_NOT_FOUND,
      // PRODUCER_FENCED, ...): not stored, the callers get the error.
      if (code === "TOPIC_NOT_FOUND" || code === "PARTITION_NOT_FOUND") host.invalidate(this.topic);
      b.fail(err);
    }
    this.settled();
  }

  /** Settled batches leave the window from its oldest end (later ones wait for earlier ones). */
  private dropSettledHead(): void {
    const w = this.window;
    while (w.length > 0 && w[0].state === St.Acked) {
      w.shift();
      this.host.windowed--;
    }
  }

  /** After an answer: recover a failing partition once nothing of it is in flight, else send more. */
  private settled(): void {
    if (this.mode === Mode.Failing) {
      if (this.inFlight === 0) this.recover();
    } else this.pump();
    if (this.host.renewNeeded) this.host.maybeRenew();
  }

  /**
   * A batch of this window failed and nothing of it is in flight any more: decide, batch by
   * batch, what goes again with its number, what is renumbered, what fails.
   */
  private recover(): void {
    const w = this.window;
    const requeue: Batch[] = [];
    const keep = this.triage(requeue);
    const front = this.expireWindow(keep);
    for (const b of front) b.unnumber();
    for (const b of requeue) b.unnumber();
    this.host.windowed -= w.length - keep.length;
    this.window = keep;
    this.dropSettledHead();
    if (front.length + requeue.length > 0) this.unshiftQueue(front.length === 0 ? requeue : front.concat(requeue));
    this.expireWaiting();
    this.restart();
  }

  /**
   * Splits the window: batches that keep their number are returned, those to renumber go to
   * `requeue`, those failed for good are dropped.
   */
  private triage(requeue: Batch[]): Batch[] {
    const w = this.window;
    let firstFailed = -1;
    let ackedAfterFailed = false;
    for (let i = 0; i < w.length; i++) {
      if (w[i].state === St.Failed && firstFailed < 0) firstFailed = i;
      else if (w[i].state === St.Acked && firstFailed >= 0) ackedAfterFailed = true;
    }
    // After a batch refused for good the broker refused the later ones for the gap: they were
    // not stored and are renumbered from the failed batch's sequence, which the broker still
    // expects. (If one after it was stored anyway, the broker had no state for this producer
    // and accepted a gap: then every batch keeps its number.)
    const renumber = firstFailed >= 0 && !ackedAfterFailed;
    const keep: Batch[] = [];
    for (let i = 0; i < w.length; i++) {
      const b = w[i];
      if (b.state === St.Failed) continue;
      if (renumber && i > firstFailed) requeue.push(b);
      else keep.push(b);
    }
    if (renumber) this.nextSeq = w[firstFailed].seq;
    return keep;
  }

  /**
   * Expiry: once the oldest batch to re-send has been retried for deliveryTimeoutMs, `keep` is
   * emptied. Batches that may be stored fail with their last error (their records may or may
   * not be stored); those refused for the gap were not stored and are returned, to wait for a
   * new producer id, since the broker's next expected sequence is unknown now.
   */
  private expireWindow(keep: Batch[]): Batch[] {
    const front: Batch[] = [];
    let first: Batch | null = null;
    for (const b of keep) if (b.state !== St.Acked) {
      first = b;
      break;
    }
    if (first !== null && first.deadline <= Date.now()) {
      for (const b of keep) {
        if (b.state === St.Retry) b.fail(b.lastError);
        else if (b.state === St.Gap) front.push(b);
      }
      keep.length = 0;
      this.host.renewNeeded = true;
    }
    return front;
  }

  /** After recover(): re-send the window's unsettled batches (after a backoff if one failed retriably), then send more. */
  private restart(): void {
    let resend = false;
    let retriable = false;
    for (const b of this.window) {
      if (b.state === St.Retry) retriable = true;
      if (b.state === St.Retry || b.state === St.Gap) resend = true;
    }
    if (resend && retriable && !this.host.closedError) {
      // Same batches, same numbers, after a backoff (the broker or the network needs time).
      this.backoffMs = nextBackoffMs(this.backoffMs);
      const delay = this.backoffMs / 2 + (Math.random() * this.backoffMs) / 2;
      this.mode = Mode.Backoff;
      setTimeout(() => {
        this.mode = Mode.Normal;
        this.resend();
        this.pump();
      }, delay);
      return;
    }
    this.mode = Mode.Normal;
    if (resend) this.resend();
    this.pump();
  }

  /** Re-sends the window's unsettled batches in sequence order, with their numbers. */
  private resend(): void {
    for (const b of this.window) {
      if (b.state === St.Retry || b.state === St.Gap) this.transmit(b);
    }
  }

  private unshiftQueue(batches: Batch[]): void {
    const rest = this.queue.slice(this.qHead);
    this.queue = (batches as (Batch | undefined)[]).concat(rest);
    this.qHead = 0;
  }

  /** Batches waiting for a slot whose delivery deadline passed fail (they were never stored). */
  expireWaiting(): void {
    const now = Date.now();
    while (this.qHead < this.queue.length && this.queue[this.qHead]!.deadline <= now) {
      const b = this.queue[this.qHead]!;
      this.queue[this.qHead++] = undefined;
      b.reject(b.lastError ?? this.lastRetriable ?? new TimeoutError(`publish not sent within deliveryTimeoutMs (${this.host.deliveryTimeoutMs} ms)`));
    }
  }

  /** Fails everything of this partition that is not numbered (the client was closed). */
  failWaiting(err: unknown): void {
    while (this.qHead < this.queue.length) {
      const b = this.queue[this.qHead]!;
      this.queue[this.qHead++] = undefined;
      b.reject(err);
    }
    this.queue.length = 0;
    this.qHead = 0;
    if (this.open !== null && this.open.ready) {
      const b = this.open;
      this.open = null;
      b.reject(err);
    }
  }
}
