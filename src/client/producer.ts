// SPDX-License-Identifier: Apache-2.0
/**
 * Client-side batching and idempotent producing (docs/protocol.md §5).
 *
 * `publish()` calls are gathered per (topic, partition) into batches, each sent as one
 * PUBLISH_ENCODED frame, at most PRODUCER_BATCHES_KEPT batches in flight per partition (the
 * idempotent window, and the same cap without idempotence). With `lingerMs` 0 (the default)
 * nothing waits for time: records for a partition with nothing in flight close their batch on a
 * microtask (the publishes of one tick share it), so a lone publish goes out at once; records
 * for a partition with batches in flight gather until the end of the event-loop turn, and
 * while its window is full they keep gathering in its open batch (up to `maxBatchRecords` /
 * `maxBatchBytes`), sent when an answer frees a slot: under load batches grow with the records
 * in flight (as Kafka's accumulator). With `lingerMs` > 0 batches gather for that long.
 * A publish of one record (`publishOne`) costs one object and one promise when its topic and
 * producer id are known (nothing else is being admitted, so order is kept).
 *
 * Idempotence: the client picks the partition itself (Kafka's murmur2 for keys, a sticky
 * partition per batch otherwise) so that every batch carries producerId, epoch and the
 * per-partition sequence of its first record. Which batches of a partition are numbered, sent,
 * re-sent or renumbered is the partition window's (src/client/partition-window.ts); this file
 * gathers records into batches, sends what a window releases (`dispatch`) and keeps the
 * producer-wide state the windows share (identity, renewal, buffered records).
 */
import { ProtocolError, RecordTooLargeError, ValidationError } from "../errors.js";
import { PRODUCER_BATCHES_KEPT } from "../log/producer-state.js";
import { encodeBatch, prepareValue, recordSize, stampBatch, type ValueKind } from "../log/record-batch.js";
import { partitionForKey } from "../streams/murmur2.js";
import type { ProducerIdentity, PublishOptions, PublishReceipt, PublishRecord, PublishValue } from "../types.js";
import type { Frame } from "../wire/index.js";
import { Batch, Group, nextBackoffMs, PartitionWindow, QueuedRecord, type Entry, type WindowHost } from "./partition-window.js";
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

const NO_OPTS: PublishOptions = {};

interface TopicMeta {
  partitions: number;
  maxMessageBytes: number;
  sticky: number;
  fetched: number;
}

/**
 * The `WindowHost` members (identity, closedError, renewNeeded, windowed, dispatch, release,
 * maybeRenew, closedBy) are public for the partition windows only.
 */
export class Producer implements WindowHost {
  private readonly parts = new Map<string, PartitionWindow[]>();
  /** Partitions with a batch gathering since the last flush. */
  private openList: PartitionWindow[] = [];
  private flushScheduled = false;
  /** A flush on a microtask is queued (a record for a partition with nothing in flight). */
  private flushSoon = false;
  /** add() opened a batch on a partition with nothing in flight: flush on a microtask. */
  private idleOpened = false;
  private lingerTimer: NodeJS.Timeout | null = null;
  private meta = new Map<string, TopicMeta>();
  private metaLoading = new Map<string, Promise<TopicMeta>>();
  identity: ProducerIdentity | null = null;
  private identityLoading: Promise<void> | null = null;
  /** Numbered batches in all windows (maybeRenew() waits until this is 0). */
  windowed = 0;
  /** A fresh producer id is needed before any new batch is numbered. */
  renewNeeded = false;
  private renewing = false;
  private renewBackoffMs = 0;
  /** Set once the transport reports the client closed: everything waiting fails with it. */
  closedError: unknown = null;
  private buffered = 0;
  private spaceWaiters: (() => void)[] = [];
  private rr = 0;
  /** send() calls between their start and their records joining a batch (they wait for metadata, an id or room). */
  private admitting = 0;

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
    for (const p of arr) if (p && p.idle) p.nextSeq = 0;
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

  /**
   * One record (`publish()`): validated and queued at once, settled through its own record,
   * when the topic's metadata and the producer id are known and no other call is being
   * admitted (which keeps publish order); otherwise the general path.
   */
  publishOne(topic: string, value: PublishValue, opts: PublishOptions | undefined): Promise<PublishReceipt> {
    const o = opts !== null && typeof opts === "object" ? opts : NO_OPTS;
    const meta = this.meta.get(topic);
    if (meta !== undefined && this.canAdmitNow(meta, o)) return new Promise<PublishReceipt>((resolve, reject) => this.admitOne(topic, meta, value, o, resolve, reject, false));
    return this.send(topic, [{ ...o, value }]).then((rs) => rs[0]);
  }

  send(topic: string, records: PublishRecord[]): Promise<PublishReceipt[]> {
    if (Array.isArray(records) && records.length === 1) {
      const r = records[0];
      const meta = this.meta.get(topic);
      if (r !== null && typeof r === "object" && meta !== undefined && this.canAdmitNow(meta, r))
        return new Promise<PublishReceipt[]>((resolve, reject) => this.admitOne(topic, meta, r.value, r, resolve, reject, true));
    }
    return this.sendSlow(topic, records);
  }

  /** Whether a record can join a batch now, without waiting and without overtaking a call that waits. */
  private canAdmitNow(meta: TopicMeta, o: PublishOptions): boolean {
    return (
      this.closedError === null &&
      this.admitting === 0 &&
      this.buffered < this.opts.maxBufferedRecords &&
      (!this.opts.idempotent || this.identity !== null) &&
      // A partition beyond the cached count needs fresh metadata (the general path).
      (o.partition === undefined || o.partition < meta.partitions)
    );
  }

  /** Validates one record, queues it in its partition's open batch; throws (queues nothing) if invalid. */
  private admitOne(topic: string, meta: TopicMeta, value: PublishValue, o: PublishOptions, resolve: (r: never) => void, reject: (e: unknown) => void, asArray: boolean): void {
    const rec = this.validate(o, value, 0, meta, Date.now(), resolve, reject, asArray);
    const size = recordSize(rec);
    if (size > meta.maxMessageBytes) throw new RecordTooLargeError(size, meta.maxMessageBytes);
    const p = o.partition !== undefined ? o.partition : rec.key !== null ? partitionForKey(rec.key, meta.partitions) : meta.sticky;
    this.buffered++;
    this.add(this.windowOf(topic, p), rec, 1, size);
    this.scheduleFlush();
  }

  private windowOf(topic: string, p: number): PartitionWindow {
    let arr = this.parts.get(topic);
    if (!arr) this.parts.set(topic, (arr = []));
    return arr[p] ?? (arr[p] = new PartitionWindow(this, topic, p));
  }

  /**
   * The general path: waits for room, the producer id and the topic's metadata, then queues
   * the records (one group per partition and batch-sized chunk). Counted in `admitting` until
   * queued, so no single publish overtakes it meanwhile.
   */
  private async sendSlow(topic: string, records: PublishRecord[]): Promise<PublishReceipt[]> {
    if (!Array.isArray(records) || records.length === 0) throw new ValidationError("publishBatch needs a non-empty array of records");
    if (this.closedError) throw this.closedError;
    this.admitting++;
    let done: Promise<PublishReceipt[]>;
    try {
      while (this.buffered >= this.opts.maxBufferedRecords) {
        await new Promise<void>((r) => this.spaceWaiters.push(r));
      }
      this.buffered += records.length;
      let chosen: { parts: number[]; prepared: QueuedRecord[]; sizes: Int32Array };
      try {
        chosen = await this.choosePartitions(topic, records);
      } catch (err) {
        // Nothing was queued: give the room back (close() waits for buffered records).
        this.release(records.length);
        throw err;
      }
      done = this.admitGroups(topic, chosen.parts, chosen.prepared, chosen.sizes);
    } finally {
      this.admitting--;
    }
    this.scheduleFlush();
    return done;
  }

  /** Queues validated records, grouped by partition in record order; resolves with receipts in record order. */
  private admitGroups(topic: string, parts: number[], prepared: QueuedRecord[], sizes: Int32Array): Promise<PublishReceipt[]> {
    const groups = new Map<number, number[]>();
    for (let i = 0; i < parts.length; i++) {
      let g = groups.get(parts[i]);
      if (!g) groups.set(parts[i], (g = []));
      g.push(i);
    }
    const out: PublishReceipt[] = new Array(parts.length);
    const promises: Promise<void>[] = [];
    const max = this.opts.maxBatchRecords;
    for (const [p, idx] of groups) {
      const part = this.windowOf(topic, p);
      for (let s = 0; s < idx.length; s += max) {
        const chunk = groups.size === 1 && idx.length <= max ? null : idx.slice(s, s + max);
        const recs = chunk === null ? prepared : chunk.map((i) => prepared[i]);
        let size = 0;
        if (chunk === null) for (let k = 0; k < sizes.length; k++) size += sizes[k];
        else for (const i of chunk) size += sizes[i];
        promises.push(
          new Promise<PublishReceipt[]>((resolve, reject) => this.add(part, new Group(recs, resolve, reject), recs.length, size)).then((rs) => {
            if (chunk === null) for (let k = 0; k < rs.length; k++) out[k] = rs[k];
            else for (let k = 0; k < rs.length; k++) out[chunk[k]] = rs[k];
          }),
        );
      }
    }
    return Promise.all(promises).then(() => out);
  }

  /**
   * Validates every record (as the broker would), converts it to bytes and picks its
   * partition (Kafka's murmur2 for keys, the sticky partition otherwise). Throws, queues nothing.
   */
  private async choosePartitions(topic: string, records: PublishRecord[]): Promise<{ parts: number[]; prepared: QueuedRecord[]; sizes: Int32Array }> {
    if (this.opts.idempotent) await this.ensureIdentity();
    let meta = this.meta.get(topic) ?? (await this.topicMeta(topic));
    const parts: number[] = new Array(records.length);
    const prepared: QueuedRecord[] = new Array(records.length);
    const sizes = new Int32Array(records.length);
    const now = Date.now();
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      if (r === null || typeof r !== "object") throw new ValidationError(`record ${i} must be an object`);
      // Validate here, exactly as the broker would: this record will share a batch with other
      // callers' records, and one bad record must not fail their publishes.
      const pr = this.validate(r, r.value, i, meta, now, null, null, false);
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

  /**
   * One record, checked as the broker checks it (its size is checked by the caller with
   * recordSize(), the measure the broker applies, so a record accepted here is never the
   * reason its batch is refused).
   */
  private validate(r: PublishOptions, v: unknown, i: number, meta: TopicMeta, now: number, resolve: ((x: never) => void) | null, reject: ((e: unknown) => void) | null, asArray: boolean): QueuedRecord {
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
      for (const [k, hv] of Object.entries(r.headers)) {
        if (typeof hv === "string") headers.push([k, Buffer.from(hv, "utf8")]);
        else if (hv instanceof Uint8Array) headers.push([k, Buffer.from(hv.buffer, hv.byteOffset, hv.byteLength)]);
        else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
      }
      if (headers.length === 0) headers = null;
    }
    const timestamp = r.timestamp ?? now;
    if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record ${i}: invalid timestamp ${timestamp}`);
    // Bytes are the common case: no intermediate object per record.
    let value: Buffer | null;
    let valueKind: ValueKind;
    if (Buffer.isBuffer(v)) {
      value = v;
      valueKind = 0;
    } else ({ value, valueKind } = prepareValue(v));
    return new QueuedRecord(key, value, valueKind, timestamp, headers, resolve, reject, asArray);
  }

  get deliveryTimeoutMs(): number {
    return this.opts.deliveryTimeoutMs;
  }

  release(n: number): void {
    this.buffered -= n;
    while (this.spaceWaiters.length && this.buffered < this.opts.maxBufferedRecords) this.spaceWaiters.shift()!();
  }

  /** An entry of `count` records and `size` bytes joins its partition's open batch. */
  private add(part: PartitionWindow, e: Entry, count: number, size: number): void {
    let b = part.open;
    if (b && b.count + count > this.opts.maxBatchRecords) {
      // Keep batches within maxBatchRecords: close what is gathered, start a new one.
      part.open = null;
      this.close(b);
      b = null;
    }
    if (!b) {
      b = new Batch(part, Date.now() + this.opts.deliveryTimeoutMs);
      part.open = b;
      if (!(this.opts.idempotent ? part.busy : part.plainInFlight > 0)) this.idleOpened = true;
      if (!part.listed) {
        part.listed = true;
        this.openList.push(part);
      }
    }
    b.entries.push(e);
    if (e instanceof Group) b.groups++;
    b.count += count;
    b.bytes += size;
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
    b.part.enqueue(b);
  }

  private readonly runFlush = (): void => {
    this.flushScheduled = false;
    this.lingerTimer = null;
    this.flush();
  };

  private readonly runFlushSoon = (): void => {
    this.flushSoon = false;
    this.flush();
  };

  /**
   * No linger (lingerMs 0): a record for a partition with nothing in flight is sent on a
   * microtask (the publishes of this tick share its batch), so a lone publish goes out at once;
   * records for a partition with batches in flight gather until the end of this event-loop
   * turn (as a busy Kafka sender gathers), then go while its window has room.
   */
  private scheduleFlush(): void {
    if (this.opts.lingerMs > 0) {
      if (this.flushScheduled) return;
      this.flushScheduled = true;
      this.lingerTimer = setTimeout(this.runFlush, this.opts.lingerMs);
      return;
    }
    if (this.idleOpened) {
      this.idleOpened = false;
      if (!this.flushSoon) {
        this.flushSoon = true;
        queueMicrotask(this.runFlushSoon);
      }
      return;
    }
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(this.runFlush);
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
        // The same cap as the idempotent window: a full partition keeps gathering, and
        // sendPlain() sends the batch when an answer frees a slot.
        if (part.plainInFlight < PRODUCER_BATCHES_KEPT) {
          part.open = null;
          this.close(b);
        } else b.ready = true;
        continue;
      }
      // Ready to go. If the window is full it stays open and keeps gathering (fewer, larger
      // batches while the partition is busy); pump() takes it when a slot frees.
      b.ready = true;
      part.pump();
    }
  }

  // ───────────────────────────── idempotent path ─────────────────────────────

  /** Sends a batch numbered by its window; the answer goes back to the window. */
  dispatch(b: Batch): void {
    const part = b.part;
    // The request's own deadline never outlives the publish's delivery deadline.
    const extraTimeoutMs = Math.min(0, b.deadline - Date.now() - this.opts.requestTimeoutMs);
    let p: Promise<Frame>;
    try {
      p = this.transport.rpc.PublishEncoded({ topic: part.topic, partition: part.partition }, { body: b.encoded, retry: true, extraTimeoutMs });
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (f) => part.onAnswer(b, f),
      (err: unknown) => part.onError(b, err),
    );
  }

  closedBy(err: unknown): boolean {
    const code = (err as { code?: unknown } | null)?.code;
    return (code === "BROKER_CLOSED" || code === "ABORTED") && this.transport.isClosed;
  }

  /**
   * Obtains a fresh producer id once no numbered batch of any partition is unsettled (a new id
   * restarts every partition's sequence at 0), then lets the waiting batches go.
   */
  maybeRenew(): void {
    if (!this.renewNeeded || this.renewing || this.windowed > 0 || this.closedError) return;
    this.renewing = true;
    this.transport.rpc.InitProducer({}, { retry: true }).then(
      (f) => {
        this.renewing = false;
        this.renewBackoffMs = 0;
        this.identity = { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
        this.renewNeeded = false;
        for (const arr of this.parts.values()) for (const p of arr) if (p) p.nextSeq = 0;
        for (const arr of this.parts.values()) for (const p of arr) if (p) p.pump();
      },
      (err: unknown) => {
        this.renewing = false;
        if (this.closedBy(err)) {
          this.closedError ??= err;
          for (const arr of this.parts.values()) for (const p of arr) if (p) p.failWaiting(err);
          return;
        }
        for (const arr of this.parts.values()) {
          for (const p of arr) {
            if (!p) continue;
            p.lastRetriable = err;
            p.expireWaiting();
          }
        }
        this.renewBackoffMs = nextBackoffMs(this.renewBackoffMs);
        setTimeout(() => this.maybeRenew(), this.renewBackoffMs);
      },
    );
  }

  // ─────────────────────────── non-idempotent path ───────────────────────────

  /** `idempotent: false`: one request per batch, never re-sent (a retry could store it twice). */
  private async sendPlain(b: Batch): Promise<void> {
    const part = b.part;
    let batch: Buffer;
    try {
      batch = encodeBatch(b.records());
      stampBatch(batch, 0);
    } catch (err) {
      b.reject(err);
      return;
    }
    part.plainInFlight++;
    try {
      const f = await this.transport.rpc.PublishEncoded({ topic: part.topic, partition: part.partition }, { body: batch, retry: false });
      const baseOffset = Number(f.meta.baseOffset);
      const count = Number(f.meta.count);
      if (count !== b.count || !Number.isSafeInteger(baseOffset)) throw new ProtocolError(`server acknowledged ${count} records for ${b.count}`);
      b.resolve(baseOffset, f.meta.duplicate === true, f.meta.synced === true);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "TOPIC_NOT_FOUND" || code === "PARTITION_NOT_FOUND") this.invalidate(part.topic);
      b.reject(err);
    } finally {
      part.plainInFlight--;
      // A batch that gathered while the partition was full goes now.
      const open = part.open;
      if (open !== null && open.ready && part.plainInFlight < PRODUCER_BATCHES_KEPT) {
        part.open = null;
        this.close(open);
      }
    }
  }
}
