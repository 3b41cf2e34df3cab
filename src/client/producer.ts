// SPDX-License-Identifier: Apache-2.0
/**
 * Client-side batching and idempotent producing (docs/protocol.md §5).
 *
 * `publish()` calls are gathered per (topic, partition) for up to `lingerMs` (0 = until the
 * current event-loop turn ends) or until a batch reaches `maxBatchRecords`/`maxBatchBytes`,
 * then sent as one PUBLISH_ENCODED frame. Batches of different partitions are pipelined freely.
 *
 * Idempotence: the client picks the partition itself (Kafka's murmur2 for keys, a sticky
 * partition per batch otherwise) so that every batch carries producerId, epoch and the
 * per-partition sequence of its first record. The broker answers a batch it already stored with
 * its original offsets (`duplicate: true`), but it remembers only the last
 * PRODUCER_BATCHES_KEPT batches per producer and partition. So per partition this client keeps
 * a *window* of at most PRODUCER_BATCHES_KEPT numbered batches, from the oldest one not yet
 * settled to the newest one sent; further batches wait, unnumbered, in order. Every batch that
 * might have been stored is therefore still in the broker's memory when it is retried.
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
 * (`renew()`), obtained once no numbered batch of any partition is unsettled, because a new id
 * restarts every partition's sequences at 0.
 */
import { ProtocolError, RecordTooLargeError, TimeoutError, ValidationError } from "../errors.js";
import { PRODUCER_BATCHES_KEPT } from "../log/producer-state.js";
import { encodeBatch, prepareValue, recordSize, stampBatch, type PreparedRecord } from "../log/record-batch.js";
import { partitionForKey } from "../streams/murmur2.js";
import type { PublishReceipt, PublishRecord } from "../types.js";
import type { Frame } from "../wire/index.js";
import type { Transport } from "./transport.js";

/** What the producer uses of its transport (a test may script it). */
export type ProducerTransport = Pick<Transport, "rpc" | "isClosed">;

export interface ProducerOptions {
  lingerMs: number;
  maxBatchRecords: number;
  maxBatchBytes: number;
  idempotent: boolean;
  /** Upper bound on records accepted but not yet acknowledged; publish() waits beyond it. */
  maxBufferedRecords: number;
  /**
   * How long one publish keeps being retried (from the moment publish() accepted it) before it
   * fails with the last error. The only failure after which its records may or may not be
   * stored. Default 120 000 ms.
   */
  deliveryTimeoutMs: number;
  /** The transport's per-request deadline: requests of a batch are cut to its delivery deadline. */
  requestTimeoutMs: number;
}

/** The records of one send() call for one partition (one promise for all of them). */
interface Item {
  /** Validated and converted to bytes once, at send() time (the caller may reuse its objects). */
  records: PreparedRecord[];
  size: number;
  resolve(r: PublishReceipt[]): void;
  reject(e: unknown): void;
}

const enum St {
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

const NO_ITEMS: Item[] = [];
/** Largest sequence + count the broker accepts (the header field is an i32). */
const MAX_SEQUENCE = 2 ** 31 - 1;
const RETRY_BACKOFF_MIN_MS = 50;
const RETRY_BACKOFF_MAX_MS = 2000;

class Batch {
  items: Item[] = [];
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
    readonly part: Part,
    /** deliveryTimeoutMs after the first record was accepted. */
    readonly deadline: number,
  ) {}
}

/** Producer state of one (topic, partition). */
class Part {
  /** The batch gathering records (never numbered). */
  open: Batch | null = null;
  /** In the flush list (avoids duplicates). */
  listed = false;
  /** Closed batches waiting for a window slot, in order (head index: no O(n) shift). */
  queue: (Batch | undefined)[] = [];
  qHead = 0;
  /** Numbered batches from the oldest unsettled one to the newest sent; at most PRODUCER_BATCHES_KEPT. */
  window: Batch[] = [];
  inFlight = 0;
  nextSeq = 0;
  mode = Mode.Normal;
  backoffMs = 0;
  /** The last retriable error seen on this partition (what waiting batches get if they expire). */
  lastRetriable: unknown = null;
  constructor(
    readonly topic: string,
    readonly partition: number,
  ) {}
}

interface TopicMeta {
  partitions: number;
  maxMessageBytes: number;
  sticky: number;
  fetched: number;
}

export class Producer {
  private readonly parts = new Map<string, Part[]>();
  /** Partitions with a batch gathering since the last flush. */
  private openList: Part[] = [];
  private flushScheduled = false;
  private lingerTimer: NodeJS.Timeout | null = null;
  private meta = new Map<string, TopicMeta>();
  private metaLoading = new Map<string, Promise<TopicMeta>>();
  private identity: { producerId: number; producerEpoch: number } | null = null;
  private identityLoading: Promise<void> | null = null;
  /** Numbered batches in all windows (renew() waits until this is 0). */
  private windowed = 0;
  /** A fresh producer id is needed before any new batch is numbered. */
  private renewNeeded = false;
  private renewing = false;
  private renewBackoffMs = 0;
  /** Set once the transport reports the client closed: everything waiting fails with it. */
  private closedError: unknown = null;
  private buffered = 0;
  private spaceWaiters: (() => void)[] = [];
  private rr = 0;

  constructor(
    private readonly transport: ProducerTransport,
    private readonly opts: ProducerOptions,
    private readonly describe: (topic: string) => Promise<{ partitions: unknown[]; config: { maxMessageBytes: number } }>,
  ) {
    const d = opts.deliveryTimeoutMs;
    if (typeof d !== "number" || !Number.isFinite(d) || d <= 0) throw new ValidationError(`deliveryTimeoutMs must be a positive number of milliseconds, got ${String(d)}`);
  }

  private async topicMeta(topic: string, refresh = false): Promise<TopicMeta> {
    const cur = this.meta.get(topic);
    if (cur && !refresh) return cur;
    let p = this.metaLoading.get(topic);
    if (!p) {
      p = this.describe(topic)
        .then((d) => {
          const m: TopicMeta = { partitions: d.partitions.length, maxMessageBytes: d.config.maxMessageBytes, sticky: this.rr++ % d.partitions.length, fetched: Date.now() };
          this.meta.set(topic, m);
          return m;
        })
        .finally(() => this.metaLoading.delete(topic));
      this.metaLoading.set(topic, p);
    }
    return p;
  }

  /** Forget cached partition counts (topic deleted / re-created). */
  invalidate(topic: string): void {
    this.meta.delete(topic);
  }

  /**
   * A new incarnation of the topic starts its producer sequences from scratch. Partitions with
   * batches still on their way keep their numbering (the broker has no state for a new topic
   * and accepts either).
   */
  resetSequences(topic: string): void {
    const arr = this.parts.get(topic);
    if (!arr) return;
    for (const p of arr) if (p && p.window.length === 0 && p.open === null && p.qHead === p.queue.length) p.nextSeq = 0;
  }

  /** Sends what is gathered and waits (up to `timeoutMs`) until every accepted record is answered. */
  async drain(timeoutMs: number): Promise<void> {
    this.flush();
    const deadline = Date.now() + timeoutMs;
    while (this.buffered > 0 && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 10);
        this.spaceWaiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  private async ensureIdentity(): Promise<void> {
    if (this.identity) return;
    if (!this.identityLoading) {
      this.identityLoading = (async () => {
        // Safe to retry: a lost reply only wastes a producer id.
        const f = await this.transport.rpc.InitProducer({}, { retry: true });
        this.identity = { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
      })().finally(() => (this.identityLoading = null));
    }
    await this.identityLoading;
  }

  async send(topic: string, records: PublishRecord[]): Promise<PublishReceipt[]> {
    if (!Array.isArray(records) || records.length === 0) throw new ValidationError("publishBatch needs a non-empty array of records");
    if (this.closedError) throw this.closedError;
    while (this.buffered >= this.opts.maxBufferedRecords) {
      await new Promise<void>((r) => this.spaceWaiters.push(r));
    }
    this.buffered += records.length;
    let parts: number[];
    let prepared: PreparedRecord[];
    let sizes: Int32Array;
    try {
      ({ parts, prepared, sizes } = await this.choosePartitions(topic, records));
    } catch (err) {
      // Nothing was queued: give the room back (close() waits for buffered records).
      this.release(records.length);
      throw err;
    }
    let arr = this.parts.get(topic);
    if (!arr) this.parts.set(topic, (arr = []));
    // Group by partition (in record order), one item per group and batch-sized chunk.
    const groups = new Map<number, number[]>();
    for (let i = 0; i < records.length; i++) {
      let g = groups.get(parts[i]);
      if (!g) groups.set(parts[i], (g = []));
      g.push(i);
    }
    const out: PublishReceipt[] = new Array(records.length);
    const promises: Promise<void>[] = [];
    const max = this.opts.maxBatchRecords;
    for (const [p, idx] of groups) {
      const part = arr[p] ?? (arr[p] = new Part(topic, p));
      for (let s = 0; s < idx.length; s += max) {
        const chunk = groups.size === 1 && idx.length <= max ? null : idx.slice(s, s + max);
        const recs = chunk === null ? prepared : chunk.map((i) => prepared[i]);
        let size = 0;
        if (chunk === null) for (let k = 0; k < sizes.length; k++) size += sizes[k];
        else for (const i of chunk) size += sizes[i];
        promises.push(
          new Promise<PublishReceipt[]>((resolve, reject) => this.add(part, { records: recs, size, resolve, reject })).then((rs) => {
            if (chunk === null) for (let k = 0; k < rs.length; k++) out[k] = rs[k];
            else for (let k = 0; k < rs.length; k++) out[chunk[k]] = rs[k];
          }),
        );
      }
    }
    this.scheduleFlush();
    await Promise.all(promises);
    return out;
  }

  /**
   * Validates every record (as the broker would), converts it to bytes and picks its
   * partition (Kafka's murmur2 for keys, the sticky partition otherwise). Throws, queues nothing.
   */
  private async choosePartitions(topic: string, records: PublishRecord[]): Promise<{ parts: number[]; prepared: PreparedRecord[]; sizes: Int32Array }> {
    if (this.opts.idempotent) await this.ensureIdentity();
    let meta = this.meta.get(topic) ?? (await this.topicMeta(topic));
    const parts: number[] = new Array(records.length);
    const prepared: PreparedRecord[] = new Array(records.length);
    const sizes = new Int32Array(records.length);
    const now = Date.now();
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      // Validate here, exactly as the broker would: this record will share a batch with other
      // callers' records, and one bad record must not fail their publishes.
      const pr = this.validate(r, i, meta, now);
      prepared[i] = pr;
      sizes[i] = recordSize(pr);
      if (sizes[i] > meta.maxMessageBytes) throw new RecordTooLargeError(sizes[i], meta.maxMessageBytes);
      let p: number;
      if (r.partition !== undefined) {
        if (r.partition >= meta.partitions) {
          meta = await this.topicMeta(topic, true);
          if (r.partition >= meta.partitions) {
            throw new ValidationError(`partition ${r.partition} out of range for ${topic} (0..${meta.partitions - 1})`);
          }
        }
        p = r.partition;
      } else if (pr.key !== null) {
        p = partitionForKey(pr.key, meta.partitions);
      } else {
        p = meta.sticky;
      }
      parts[i] = p;
    }
    return { parts, prepared, sizes };
  }

  private validate(r: PublishRecord, i: number, meta: TopicMeta, now: number): PreparedRecord {
    if (r === null || typeof r !== "object") throw new ValidationError(`record ${i} must be an object`);
    if (r.partition !== undefined && (!Number.isInteger(r.partition) || r.partition < 0)) {
      throw new ValidationError(`partition ${r.partition} out of range (0..${meta.partitions - 1})`);
    }
    let key: Buffer | null = null;
    if (r.key !== undefined && r.key !== null) {
      if (typeof r.key === "string") key = Buffer.from(r.key, "utf8");
      else if (r.key instanceof Uint8Array) key = Buffer.from(r.key.buffer, r.key.byteOffset, r.key.byteLength);
      else throw new ValidationError("key must be a string or Uint8Array");
    }
    let headers: [string, Buffer][] | null = null;
    if (r.headers !== undefined && r.headers !== null) {
      if (typeof r.headers !== "object") throw new ValidationError("headers must be an object");
      headers = [];
      for (const [k, v] of Object.entries(r.headers)) {
        if (typeof v === "string") headers.push([k, Buffer.from(v, "utf8")]);
        else if (v instanceof Uint8Array) headers.push([k, Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
        else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
      }
      if (headers.length === 0) headers = null;
    }
    const timestamp = r.timestamp ?? now;
    if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record ${i}: invalid timestamp ${timestamp}`);
    const v = r.value;
    // Bytes are the common case: no intermediate object per record.
    if (Buffer.isBuffer(v)) return { key, value: v, valueKind: 0, timestamp, headers };
    const { value, valueKind } = prepareValue(v);
    return { key, value, valueKind, timestamp, headers };
  }

  private release(n: number): void {
    this.buffered -= n;
    while (this.spaceWaiters.length && this.buffered < this.opts.maxBufferedRecords) this.spaceWaiters.shift()!();
  }

  private add(part: Part, item: Item): void {
    let b = part.open;
    if (b && b.count + item.records.length > this.opts.maxBatchRecords) {
      // Keep batches within maxBatchRecords: close what is gathered, start a new one.
      part.open = null;
      this.close(b);
      b = null;
    }
    if (!b) {
      b = new Batch(part, Date.now() + this.opts.deliveryTimeoutMs);
      part.open = b;
      if (!part.listed) {
        part.listed = true;
        this.openList.push(part);
      }
    }
    b.items.push(item);
    b.count += item.records.length;
    b.bytes += item.size;
    if (b.count >= this.opts.maxBatchRecords || b.bytes >= this.opts.maxBatchBytes) {
      part.open = null;
      this.close(b);
    }
  }

  /** A batch stops gathering: sent at once, or queued behind its partition's window. */
  private close(b: Batch): void {
    b.ready = true;
    if (!this.opts.idempotent) {
      void this.sendPlain(b);
      return;
    }
    const part = b.part;
    part.queue.push(b);
    this.pump(part);
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    const run = (): void => {
      this.flushScheduled = false;
      this.lingerTimer = null;
      this.flush();
    };
    if (this.opts.lingerMs <= 0) setImmediate(run);
    else this.lingerTimer = setTimeout(run, this.opts.lingerMs);
  }

  flush(): void {
    if (this.lingerTimer) {
      clearTimeout(this.lingerTimer);
      this.lingerTimer = null;
      this.flushScheduled = false;
    }
    const list = this.openList;
    this.openList = [];
    // Next linger window: keyless records move to another partition (sticky batches).
    for (const m of this.meta.values()) m.sticky = (m.sticky + 1) % m.partitions;
    for (const part of list) {
      part.listed = false;
      const b = part.open;
      if (b === null) continue;
      if (!this.opts.idempotent) {
        part.open = null;
        this.close(b);
        continue;
      }
      // Ready to go. If the window is full it stays open and keeps gathering (fewer, larger
      // batches while the partition is busy); pump() takes it when a slot frees.
      b.ready = true;
      this.pump(part);
    }
  }

  // ───────────────────────────── idempotent path ─────────────────────────────

  /** Numbers and sends waiting batches while the partition's window has room. */
  private pump(part: Part): void {
    if (this.closedError) {
      this.failWaiting(part, this.closedError);
      return;
    }
    if (part.mode !== Mode.Normal || this.renewNeeded) return;
    const id = this.identity!;
    while (part.window.length < PRODUCER_BATCHES_KEPT) {
      let b: Batch;
      if (part.qHead < part.queue.length) {
        b = part.queue[part.qHead]!;
        part.queue[part.qHead++] = undefined;
        if (part.qHead === part.queue.length) {
          part.queue.length = 0;
          part.qHead = 0;
        } else if (part.qHead >= 1024 && part.qHead * 2 >= part.queue.length) {
          part.queue = part.queue.slice(part.qHead);
          part.qHead = 0;
        }
      } else if (part.open !== null && part.open.ready) {
        b = part.open;
        part.open = null;
      } else break;
      if (part.nextSeq + b.count > MAX_SEQUENCE) {
        // Sequences of this producer id are used up on this partition: continue under a new id.
        this.unshiftQueue(part, [b]);
        this.renewNeeded = true;
        this.maybeRenew();
        return;
      }
      try {
        // The batch travels in the storage format with its CRC (base offset 0): the broker
        // verifies it and stores it as is, so the checksum covers the records from here to disk.
        const records = b.items.length === 1 ? b.items[0].records : b.items.flatMap((it) => it.records);
        b.encoded = encodeBatch(records, { producerId: id.producerId, producerEpoch: id.producerEpoch, baseSequence: part.nextSeq });
        stampBatch(b.encoded, 0);
      } catch (err) {
        // Not numbered, not sent: the sequence stays free.
        this.reject(b, err);
        continue;
      }
      b.seq = part.nextSeq;
      part.nextSeq += b.count;
      part.window.push(b);
      this.windowed++;
      this.transmit(b);
    }
  }

  private transmit(b: Batch): void {
    const part = b.part;
    b.state = St.Flying;
    part.inFlight++;
    // The request's own deadline never outlives the publish's delivery deadline.
    const extraTimeoutMs = Math.min(0, b.deadline - Date.now() - this.opts.requestTimeoutMs);
    let p: Promise<Frame>;
    try {
      p = this.transport.rpc.PublishEncoded({ topic: part.topic, partition: part.partition }, { body: b.encoded, retry: true, extraTimeoutMs });
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (f) => this.onAnswer(b, f),
      (err: unknown) => this.onError(b, err),
    );
  }

  private onAnswer(b: Batch, f: Frame): void {
    const part = b.part;
    part.inFlight--;
    const baseOffset = Number(f.meta.baseOffset);
    const count = Number(f.meta.count);
    b.state = St.Acked;
    b.encoded = null;
    if (count !== b.count || !Number.isSafeInteger(baseOffset)) {
      // Cannot happen with a conforming server. The broker did take the sequence, so the batch
      // stays Acked for the numbering; its callers cannot be told where the records went.
      this.rejectItems(b, new ProtocolError(`server acknowledged ${count} records for ${b.count}`));
    } else {
      const duplicate = f.meta.duplicate === true;
      const synced = f.meta.synced === true;
      let offset = baseOffset;
      for (const it of b.items) {
        const rs: PublishReceipt[] = new Array(it.records.length);
        for (let k = 0; k < rs.length; k++) rs[k] = { topic: part.topic, partition: part.partition, offset: offset++, duplicate, synced };
        it.resolve(rs);
      }
      b.items = NO_ITEMS;
      this.release(b.count);
    }
    part.backoffMs = 0;
    const w = part.window;
    while (w.length > 0 && w[0].state === St.Acked) {
      w.shift();
      this.windowed--;
    }
    this.settled(part);
  }

  private onError(b: Batch, err: unknown): void {
    const part = b.part;
    part.inFlight--;
    const code = (err as { code?: unknown } | null)?.code;
    const wasNormal = part.mode === Mode.Normal;
    part.mode = Mode.Failing;
    if ((code === "BROKER_CLOSED" || code === "ABORTED") && this.transport.isClosed) {
      // The client itself was closed (close() gave up draining): nothing will be retried.
      this.closedError ??= err;
      this.fail(b, err);
    } else if (code === "OUT_OF_ORDER_SEQUENCE") {
      if (wasNormal && part.window[0] === b) {
        // The oldest unsettled batch, and nothing failed before it: the broker does not hold
        // the sequence this producer left it at (its state was lost or evicted). Refused, so
        // not stored; the batches behind it go again under a fresh producer id.
        process.emitWarning(
          `sluice producer ${this.identity?.producerId}: the broker lost its sequence state for ${part.topic}/${part.partition}; ` +
            `the publish fails with OUT_OF_ORDER_SEQUENCE (not stored) and the producer continues under a new id`,
          { code: "SLUICE_PRODUCER_STATE_LOST" },
        );
        this.fail(b, err);
        this.renewNeeded = true;
      } else {
        b.state = St.Gap;
      }
    } else if (code === "CONNECTION_CLOSED" || code === "TIMEOUT" || code === "STORAGE_ERROR" || code === "STORAGE_FULL" || code === "BROKER_CLOSED" || (err as { retriable?: unknown } | null)?.retriable === true) {
      // May or may not be stored (BROKER_CLOSED here comes from a server shutting down).
      b.state = St.Retry;
      b.lastError = err;
      part.lastRetriable = err;
    } else {
      // Refused for good (VALIDATION, RECORD_TOO_LARGE, INVALID_BATCH, TOPIC_NOT_FOUND,
      // PRODUCER_FENCED, ...): not stored, the callers get the error.
      if (code === "TOPIC_NOT_FOUND" || code === "PARTITION_NOT_FOUND") this.invalidate(part.topic);
      this.fail(b, err);
    }
    this.settled(part);
  }

  /** After an answer: recover a failing partition once nothing of it is in flight, else send more. */
  private settled(part: Part): void {
    if (part.mode === Mode.Failing) {
      if (part.inFlight === 0) this.recover(part);
    } else this.pump(part);
    if (this.renewNeeded) this.maybeRenew();
  }

  /**
   * A batch of this partition's window failed and nothing of it is in flight any more: decide,
   * batch by batch, what goes again with its number, what is renumbered, what fails.
   */
  private recover(part: Part): void {
    const w = part.window;
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
    const requeue: Batch[] = [];
    for (let i = 0; i < w.length; i++) {
      const b = w[i];
      if (b.state === St.Failed) continue;
      if (renumber && i > firstFailed) requeue.push(b);
      else keep.push(b);
    }
    if (renumber) part.nextSeq = w[firstFailed].seq;
    // Expiry: the oldest batch to re-send has been retried for deliveryTimeoutMs.
    let first: Batch | null = null;
    for (const b of keep) if (b.state !== St.Acked) {
      first = b;
      break;
    }
    const front: Batch[] = [];
    if (first !== null && first.deadline <= Date.now()) {
      // Batches that may be stored fail with their last error (their records may or may not be
      // stored); those refused for the gap were not stored and wait for a new producer id, since
      // the broker's next expected sequence is unknown now.
      for (const b of keep) {
        if (b.state === St.Retry) this.fail(b, b.lastError);
        else if (b.state === St.Gap) front.push(b);
      }
      keep.length = 0;
      this.renewNeeded = true;
    }
    for (const b of front) this.unnumber(b);
    for (const b of requeue) this.unnumber(b);
    this.windowed -= w.length - keep.length;
    part.window = keep;
    while (keep.length > 0 && keep[0].state === St.Acked) {
      keep.shift();
      this.windowed--;
    }
    if (front.length + requeue.length > 0) this.unshiftQueue(part, front.length === 0 ? requeue : front.concat(requeue));
    this.expireWaiting(part);

    let resend = false;
    let retriable = false;
    for (const b of keep) {
      if (b.state === St.Retry) retriable = true;
      if (b.state === St.Retry || b.state === St.Gap) resend = true;
    }
    if (resend && retriable && !this.closedError) {
      // Same batches, same numbers, after a backoff (the broker or the network needs time).
      part.backoffMs = Math.min(RETRY_BACKOFF_MAX_MS, part.backoffMs === 0 ? RETRY_BACKOFF_MIN_MS : part.backoffMs * 2);
      const delay = part.backoffMs / 2 + (Math.random() * part.backoffMs) / 2;
      part.mode = Mode.Backoff;
      setTimeout(() => {
        part.mode = Mode.Normal;
        this.resend(part);
        this.pump(part);
      }, delay);
      return;
    }
    part.mode = Mode.Normal;
    if (resend) this.resend(part);
    this.pump(part);
  }

  /** Re-sends the window's unsettled batches in sequence order, with their numbers. */
  private resend(part: Part): void {
    for (const b of part.window) {
      if (b.state === St.Retry || b.state === St.Gap) this.transmit(b);
    }
  }

  private unnumber(b: Batch): void {
    b.state = St.Queued;
    b.seq = -1;
    b.encoded = null;
  }

  private unshiftQueue(part: Part, batches: Batch[]): void {
    const rest = part.queue.slice(part.qHead);
    part.queue = (batches as (Batch | undefined)[]).concat(rest);
    part.qHead = 0;
  }

  /** Batches waiting for a slot whose delivery deadline passed fail (they were never stored). */
  private expireWaiting(part: Part): void {
    const now = Date.now();
    while (part.qHead < part.queue.length && part.queue[part.qHead]!.deadline <= now) {
      const b = part.queue[part.qHead]!;
      part.queue[part.qHead++] = undefined;
      this.reject(b, b.lastError ?? part.lastRetriable ?? new TimeoutError(`publish not sent within deliveryTimeoutMs (${this.opts.deliveryTimeoutMs} ms)`));
    }
  }

  /** Fails everything of this partition that is not numbered (the client was closed). */
  private failWaiting(part: Part, err: unknown): void {
    while (part.qHead < part.queue.length) {
      const b = part.queue[part.qHead]!;
      part.queue[part.qHead++] = undefined;
      this.reject(b, err);
    }
    part.queue.length = 0;
    part.qHead = 0;
    if (part.open !== null && part.open.ready) {
      const b = part.open;
      part.open = null;
      this.reject(b, err);
    }
  }

  /**
   * Obtains a fresh producer id once no numbered batch of any partition is unsettled (a new id
   * restarts every partition's sequence at 0), then lets the waiting batches go.
   */
  private maybeRenew(): void {
    if (!this.renewNeeded || this.renewing || this.windowed > 0 || this.closedError) return;
    this.renewing = true;
    this.transport.rpc.InitProducer({}, { retry: true }).then(
      (f) => {
        this.renewing = false;
        this.renewBackoffMs = 0;
        this.identity = { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
        this.renewNeeded = false;
        for (const arr of this.parts.values()) for (const p of arr) if (p) p.nextSeq = 0;
        for (const arr of this.parts.values()) for (const p of arr) if (p) this.pump(p);
      },
      (err: unknown) => {
        this.renewing = false;
        const code = (err as { code?: unknown } | null)?.code;
        if ((code === "BROKER_CLOSED" || code === "ABORTED") && this.transport.isClosed) {
          this.closedError ??= err;
          for (const arr of this.parts.values()) for (const p of arr) if (p) this.failWaiting(p, err);
          return;
        }
        for (const arr of this.parts.values()) {
          for (const p of arr) {
            if (!p) continue;
            p.lastRetriable = err;
            this.expireWaiting(p);
          }
        }
        this.renewBackoffMs = Math.min(RETRY_BACKOFF_MAX_MS, this.renewBackoffMs === 0 ? RETRY_BACKOFF_MIN_MS : this.renewBackoffMs * 2);
        setTimeout(() => this.maybeRenew(), this.renewBackoffMs);
      },
    );
  }

  /** A numbered batch failed for good (or expired): its callers get `err`. */
  private fail(b: Batch, err: unknown): void {
    b.state = St.Failed;
    b.encoded = null;
    this.rejectItems(b, err);
  }

  /** An unnumbered batch fails: its callers get `err`. */
  private reject(b: Batch, err: unknown): void {
    b.state = St.Failed;
    this.rejectItems(b, err);
  }

  private rejectItems(b: Batch, err: unknown): void {
    const items = b.items;
    b.items = NO_ITEMS;
    for (const it of items) it.reject(err);
    this.release(b.count);
  }

  // ─────────────────────────── non-idempotent path ───────────────────────────

  /** `idempotent: false`: one request per batch, never re-sent (a retry could store it twice). */
  private async sendPlain(b: Batch): Promise<void> {
    const part = b.part;
    let batch: Buffer;
    try {
      const records = b.items.length === 1 ? b.items[0].records : b.items.flatMap((it) => it.records);
      batch = encodeBatch(records);
      stampBatch(batch, 0);
    } catch (err) {
      this.reject(b, err);
      return;
    }
    try {
      const f = await this.transport.rpc.PublishEncoded({ topic: part.topic, partition: part.partition }, { body: batch, retry: false });
      const baseOffset = Number(f.meta.baseOffset);
      const count = Number(f.meta.count);
      if (count !== b.count || !Number.isSafeInteger(baseOffset)) throw new ProtocolError(`server acknowledged ${count} records for ${b.count}`);
      const duplicate = f.meta.duplicate === true;
      const synced = f.meta.synced === true;
      let offset = baseOffset;
      for (const it of b.items) {
        const rs: PublishReceipt[] = new Array(it.records.length);
        for (let k = 0; k < rs.length; k++) rs[k] = { topic: part.topic, partition: part.partition, offset: offset++, duplicate, synced };
        it.resolve(rs);
      }
      b.items = NO_ITEMS;
      this.release(b.count);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "TOPIC_NOT_FOUND" || code === "PARTITION_NOT_FOUND") this.invalidate(part.topic);
      this.reject(b, err);
    }
  }
}
