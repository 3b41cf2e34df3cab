// SPDX-License-Identifier: Apache-2.0
/**
 * Per-partition gathering of `publish()` calls into engine appends, as Kafka's producer
 * accumulator: each partition has at most MAX_APPENDS_IN_FLIGHT appends in the engine; records
 * published while they run wait here and go out together, as one `StorageEngine.append()`
 * (one batch, encoded once), when one of them returns. Nothing lingers: a partition with room
 * sends at once (on a microtask, so the calls of one tick share the append), so a lone publish
 * costs what it did; under load the batches grow with the number of records in flight. With
 * room for two appends, a large gathering is cut in two (the second half a turn later, see
 * `sendShare`), so the records in flight ride two alternating appends, not one.
 *
 * Per-record outcomes: a record is validated completely (and its size checked against
 * `maxMessageBytes` exactly as the engine checks it, `recordSize()`) before it joins, so the
 * only errors a batch shares are those of its append (storage, a deleted topic, close), which
 * every record of it would have met alone. Order: entries of a partition are appended in the
 * order they joined, so records of one key keep their order; `publishBatch()` of a partition
 * with waiting records joins behind them as one entry (and an idempotent one is appended on its
 * own, with its producer fields and signal).
 *
 * Bounds: one append takes at most MAX_APPEND_BYTES (at least one entry); what waits is bounded
 * by the callers' own publishes in flight (each waiting record is a pending publish() promise),
 * as the engine's pending appends were before.
 */
import type { PreparedRecord, ProducerInfo, ValueKind } from "../log/record-batch.js";
import type { AppendResult, StorageEngine } from "../store/engine.js";
import type { PublishReceipt } from "../types.js";

/**
 * Appends of one partition in the engine at a time. Two keep the engine's group commit
 * pipelined (one batch written and synced while the next gathers) without splitting the
 * records in flight into many small appends.
 */
export const MAX_APPENDS_IN_FLIGHT = 2;
/** Waiting records are split into appends of at least this many when several can start (sendShare). */
export const MIN_SPLIT_RECORDS = 64;
/** Bound on the records' bytes (`recordSize()`) gathered into one append (at least one entry). */
export const MAX_APPEND_BYTES = 1024 * 1024;

/**
 * One waiting publish(): the prepared record and its settlement in one object. A string or
 * JSON value stays text (`valueText`, encoded straight into the batch): no Buffer per record;
 * `value` makes one only if something asks for the bytes.
 */
export class PendingRecord implements PreparedRecord {
  /** Its `recordSize()`, set once validated. */
  size = 0;
  /** Set by `pendingPromise()` before the record joins an accumulator. */
  resolve: (r: PublishReceipt) => void = noop;
  reject: (e: unknown) => void = noop;
  constructor(
    public key: Buffer | null,
    private readonly bytes: Buffer | null,
    public valueKind: ValueKind,
    public timestamp: number,
    public headers: [string, Buffer][] | null,
    readonly valueText: string | undefined,
    readonly valueTextBytes: number | undefined,
    /** The partition it was placed on. */
    readonly partition: number,
  ) {}

  get value(): Buffer | null {
    return this.valueText !== undefined ? Buffer.from(this.valueText, "utf8") : this.bytes;
  }
}

function noop(): void {}

/** The record `pendingPromise()` is creating (the executor below runs synchronously). */
let filling: PendingRecord | null = null;
/** One executor for every record: no closure per publish(). */
const fill = (resolve: (r: PublishReceipt) => void, reject: (e: unknown) => void): void => {
  filling!.resolve = resolve;
  filling!.reject = reject;
};

/** The promise a publish() returns, settled through `rec.resolve` / `rec.reject`. */
export function pendingPromise(rec: PendingRecord): Promise<PublishReceipt> {
  filling = rec;
  const p = new Promise<PublishReceipt>(fill);
  filling = null;
  return p;
}

/** The records of one publishBatch() call for one partition, joining behind waiting records. */
export interface PendingGroup {
  records: PreparedRecord[];
  /** The records' `recordSize()` sum. */
  size: number;
  producer: ProducerInfo | undefined;
  signal: AbortSignal | undefined;
  resolve(r: AppendResult): void;
  reject(e: unknown): void;
}

type Entry = PendingRecord | PendingGroup;

/** What a partition's gatherer needs from its owner. */
export interface AccumulatorHost {
  readonly engine: StorageEngine;
  /** An append failed with `err` (the owner forgets a deleted topic's metadata). */
  appendFailed(topic: string, err: unknown): void;
  /** Entries accepted and not yet settled went from n to 0 (close() drains). */
  settledAll(): void;
}

export class PartitionAccumulator {
  private waiting: Entry[] = [];
  /** `size` sum and publishBatch groups among `waiting` (a batch of plain records is taken whole, with no walk). */
  private waitingBytes = 0;
  private waitingGroups = 0;
  private inFlight = 0;
  private scheduled = false;
  private readonly flushNow = (): void => {
    this.scheduled = false;
    this.flush();
  };
  /** The rest of a split (sendShare) is due on the next turn. */
  private turnScheduled = false;
  private readonly flushTurn = (): void => {
    this.turnScheduled = false;
    this.flush();
  };

  constructor(
    private readonly host: AccumulatorHost,
    private readonly counter: { outstanding: number },
    readonly topic: string,
    readonly partition: number,
  ) {}

  /** Records of this partition wait to be appended (a publishBatch must join behind them). */
  get hasWaiting(): boolean {
    return this.waiting.length > 0;
  }

  /** A validated record (or publishBatch group) joins the next append. */
  add(entry: Entry): void {
    this.waiting.push(entry);
    this.waitingBytes += entry.size;
    if (!(entry instanceof PendingRecord)) this.waitingGroups++;
    this.counter.outstanding++;
    if (this.inFlight < MAX_APPENDS_IN_FLIGHT && !this.scheduled) {
      // On a microtask: the publishes of this tick share one append.
      this.scheduled = true;
      queueMicrotask(this.flushNow);
    }
  }

  private flush(): void {
    while (this.inFlight < MAX_APPENDS_IN_FLIGHT && this.waiting.length > 0) {
      const free = MAX_APPENDS_IN_FLIGHT - this.inFlight;
      if (free > 1 && this.waiting.length >= free * MIN_SPLIT_RECORDS && this.waitingGroups === 0 && this.waitingBytes <= MAX_APPEND_BYTES) {
        this.sendShare(free);
        return;
      }
      this.send(this.take());
    }
  }

  /**
   * Room for `free` > 1 appends and many records waiting (a burst, or the acks of one append
   * coming back as the callers' next publishes): a `1/free` share goes now, the rest on the
   * next event-loop turn (split again while room remains), once this share's write is under
   * way, as appends of their own. They then take turns (the records of each publish again
   * while the others are on the disk), so the disk's latency overlaps the CPU time of the
   * other shares instead of adding to it.
   */
  private sendShare(free: number): void {
    const w = this.waiting;
    const n = Math.floor(w.length / free);
    let bytes = 0;
    for (let i = 0; i < n; i++) bytes += w[i].size;
    this.send(this.takeFirst(n, bytes, 0));
    if (!this.turnScheduled) {
      this.turnScheduled = true;
      setImmediate(this.flushTurn);
    }
  }

  /** The next append's entries, in order: one idempotent group alone, else up to MAX_APPEND_BYTES. */
  private take(): Entry[] {
    const w = this.waiting;
    if (this.waitingGroups === 0 && this.waitingBytes <= MAX_APPEND_BYTES) return this.takeFirst(w.length, this.waitingBytes, 0);
    let n = 0;
    let bytes = 0;
    let groups = 0;
    for (; n < w.length; n++) {
      const e = w[n];
      if (!(e instanceof PendingRecord)) {
        if (e.producer !== undefined) {
          // An idempotent batch goes alone (its producer fields cover exactly its records).
          if (n === 0) return this.takeFirst(1, e.size, 1);
          break;
        }
        if (n > 0 && bytes + e.size > MAX_APPEND_BYTES) break;
        groups++;
      } else if (n > 0 && bytes + e.size > MAX_APPEND_BYTES) break;
      bytes += e.size;
    }
    return this.takeFirst(n, bytes, groups);
  }

  /** Removes the first `n` waiting entries (`bytes` and `groups` of them) and returns them. */
  private takeFirst(n: number, bytes: number, groups: number): Entry[] {
    const w = this.waiting;
    this.waitingBytes -= bytes;
    this.waitingGroups -= groups;
    if (n === w.length) {
      this.waiting = [];
      return w;
    }
    this.waiting = w.slice(n);
    return w.slice(0, n);
  }

  private send(entries: Entry[]): void {
    this.inFlight++;
    let records: PreparedRecord[] = entries as PendingRecord[];
    let producer: ProducerInfo | undefined;
    let signal: AbortSignal | undefined;
    const plain = allRecords(entries);
    if (!plain) {
      if (entries.length === 1) {
        const g = entries[0] as PendingGroup;
        ({ records, producer, signal } = g);
      } else records = entries.flatMap((e) => (e instanceof PendingRecord ? e : e.records));
    }
    let p: Promise<AppendResult>;
    try {
      p = this.host.engine.append(this.topic, this.partition, records, producer, signal);
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(
      (r) => {
        this.inFlight--;
        // The next append first: what gathered meanwhile goes to the engine before the
        // receipts of this one are built.
        this.flush();
        if (plain) this.settleRecords(entries as PendingRecord[], r);
        else this.settle(entries, r);
      },
      (err: unknown) => {
        this.inFlight--;
        this.host.appendFailed(this.topic, err);
        this.flush();
        this.fail(entries, err);
      },
    );
  }

  /**
   * An append of publish() records only (the common case): one receipt per record, once the
   * engine's append resolved (with durability "always": after an fdatasync covering it, LOG-3).
   */
  private settleRecords(entries: PendingRecord[], r: AppendResult): void {
    const { topic, partition } = this;
    const { duplicate, synced } = r;
    let offset = r.baseOffset;
    for (let i = 0; i < entries.length; i++) entries[i].resolve({ topic, partition, offset: offset++, duplicate, synced });
    this.done(entries.length);
  }

  private settle(entries: Entry[], r: AppendResult): void {
    const { topic, partition } = this;
    const { duplicate, synced } = r;
    let offset = r.baseOffset;
    for (let i = 0; i < entries.length; i++) {
      const e = entries[i];
      if (e instanceof PendingRecord) e.resolve({ topic, partition, offset: offset++, duplicate, synced });
      else {
        e.resolve({ baseOffset: offset, duplicate, synced });
        offset += e.records.length;
      }
    }
    this.done(entries.length);
  }

  private fail(entries: Entry[], err: unknown): void {
    for (let i = 0; i < entries.length; i++) entries[i].reject(err);
    this.done(entries.length);
  }

  private done(n: number): void {
    this.counter.outstanding -= n;
    if (this.counter.outstanding === 0) this.host.settledAll();
  }
}

function allRecords(entries: Entry[]): boolean {
  for (let i = 0; i < entries.length; i++) if (!(entries[i] instanceof PendingRecord)) return false;
  return true;
}
