// SPDX-License-Identifier: Apache-2.0
/**
 * The embedded broker's publishing: validation, partitioning, and the placement of every call
 * in its partition's order. `publish()` records join their partition's accumulator
 * (publish-accumulator.ts); a `publishBatch()` goes to the engine as one batch per partition,
 * or joins behind records of that partition still waiting.
 *
 * Order: every call is placed at the moment it is made, synchronously, so calls of one key keep
 * their order whatever mix of publish() and publishBatch() made them. That needs the topic's
 * partition count and limits without asking the engine: they are cached per topic (`TopicPublisher`,
 * dropped when the topic is deleted or re-created, or an append finds it gone). Calls made
 * before the first lookup of a topic finished wait for it in one list, in call order.
 *
 * Partitioning (docs/ARCHITECTURE.md, publish path): explicit partition, else murmur2 of the
 * key, else the topic's sticky partition, which every call moves on by one.
 */
import { Buffer } from "node:buffer";
import { BrokerClosedError, PartitionNotFoundError, RecordTooLargeError, TopicNotFoundError, ValidationError } from "../errors.js";
import { prepareValue, recordSize, type PreparedRecord, type ProducerInfo, type ValueKind } from "../log/record-batch.js";
import type { AppendResult, EngineTopic, StorageEngine, TransactionalAppends } from "../store/engine.js";
import { partitionForKey } from "../streams/murmur2.js";
import { isCompacted, keyRequiredError } from "../log/compaction-policy.js";
import type { PublishBatchOptions, PublishOptions, PublishReceipt, PublishRecord, PublishValue, SqlTransaction } from "../types.js";
import { PartitionAccumulator, PendingRecord, pendingPromise, type AccumulatorHost } from "./publish-accumulator.js";

/** Keyless records stick to one partition for this many bytes, then move on (Kafka's sticky partitioner). */
const STICKY_BYTES = 16 * 1024;
const NO_OPTS: PublishOptions = {};

/** What publishing knows of a topic without asking the engine: its partitions' gatherers. */
interface TopicPublisher {
  name: string;
  topicId: string;
  partitions: number;
  maxMessageBytes: number;
  /** The topic is compacted: a record without a key is refused (CMP-1). */
  keyRequired: boolean;
  parts: (PartitionAccumulator | undefined)[];
}

/** A call waiting for its topic's first lookup (kept in call order): one record or a batch. */
interface EarlyCall {
  run(tp: TopicPublisher): void;
  reject(e: unknown): void;
}

function toKeyBuffer(key: unknown): Buffer | null {
  if (key === undefined || key === null) return null;
  if (typeof key === "string") return Buffer.from(key, "utf8");
  if (key instanceof Uint8Array) return Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  throw new ValidationError("key must be a string or Uint8Array");
}

function toHeaders(h: unknown): [string, Buffer][] | null {
  if (h === undefined || h === null) return null;
  if (typeof h !== "object") throw new ValidationError("headers must be an object");
  const out: [string, Buffer][] = [];
  for (const [k, v] of Object.entries(h as Record<string, unknown>)) {
    if (typeof v === "string") out.push([k, Buffer.from(v, "utf8")]);
    else if (v instanceof Uint8Array) out.push([k, Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
    else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
  }
  return out.length > 0 ? out : null;
}

export class Publisher {
  private topics = new Map<string, TopicPublisher>();
  /** Calls waiting for their topic's first lookup, in call order. */
  private lookups = new Map<string, EarlyCall[]>();
  private sticky = new Map<string, { partition: number; bytes: number }>();
  /** Calls accepted and not yet settled (drain() waits for them). */
  private readonly pending = { outstanding: 0 };
  private drainWaiters: (() => void)[] = [];
  private readonly host: AccumulatorHost;

  constructor(
    private readonly engine: StorageEngine,
    private readonly isClosed: () => boolean,
  ) {
    this.host = {
      engine,
      appendFailed: (topic, err) => {
        if (err instanceof TopicNotFoundError || err instanceof PartitionNotFoundError) this.topics.delete(topic);
      },
      settledAll: () => this.wakeDrainers(),
    };
  }

  /** The topic was deleted or created: look it up again on the next call. */
  forget(topic: string): void {
    this.topics.delete(topic);
    this.sticky.delete(topic);
  }

  /** Resolves once every call accepted so far is settled (close()). */
  async drain(): Promise<void> {
    while (this.pending.outstanding > 0) await new Promise<void>((r) => this.drainWaiters.push(r));
  }

  private wakeDrainers(): void {
    const ws = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of ws) w();
  }

  publish(topic: string, value: PublishValue, opts: PublishOptions | undefined): Promise<PublishReceipt> {
    if (this.isClosed()) return Promise.reject(new BrokerClosedError());
    // In the caller's transaction: never coalesced with other callers' records.
    if (opts?.transaction !== undefined) return this.publishBatch(topic, [{ ...opts, value }], { transaction: opts.transaction }).then((r) => r[0]);
    const tp = this.topics.get(topic);
    if (tp !== undefined) {
      let rec: PendingRecord;
      try {
        rec = this.prepare(tp, value, opts);
      } catch (e) {
        // Validation rejects this record's promise only.
        return Promise.reject(e);
      }
      const done = pendingPromise(rec);
      this.accumulator(tp, rec.partition).add(rec);
      return done;
    }
    // A copy: the caller may reuse its options object once publish() returned.
    const o = { ...opts };
    return new Promise<PublishReceipt>((resolve, reject) => this.early(topic, { run: (t) => this.accept(t, value, o, resolve, reject), reject }));
  }

  publishBatch(topic: string, records: PublishRecord[], opts: PublishBatchOptions): Promise<PublishReceipt[]> {
    if (this.isClosed()) return Promise.reject(new BrokerClosedError());
    if (!Array.isArray(records) || records.length === 0) return Promise.reject(new ValidationError("publishBatch needs a non-empty array of records"));
    if (opts.transaction !== undefined) {
      try {
        this.transactionalAppends(opts);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    const tp = this.topics.get(topic);
    if (tp !== undefined) {
      try {
        return this.placeBatch(tp, records, opts);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    return new Promise<PublishReceipt[]>((resolve, reject) => this.early(topic, { run: (t) => this.placeBatch(t, records, opts).then(resolve, reject), reject }));
  }

  /** Queues a call behind the topic's first lookup (started by the first such call). */
  private early(topic: string, call: EarlyCall): void {
    let list = this.lookups.get(topic);
    this.pending.outstanding++;
    if (list !== undefined) {
      list.push(call);
      return;
    }
    const calls: EarlyCall[] = (list = [call]);
    this.lookups.set(topic, calls);
    let lookup: Promise<EngineTopic>;
    try {
      lookup = this.engine.getTopic(topic);
    } catch (err) {
      lookup = Promise.reject(err);
    }
    lookup.then(
      (t) => {
        this.lookups.delete(topic);
        this.pending.outstanding -= calls.length;
        const tp = this.publisherOf(t);
        for (const c of calls) {
          try {
            c.run(tp);
          } catch (err) {
            c.reject(err);
          }
        }
        if (this.pending.outstanding === 0) this.wakeDrainers();
      },
      (err: unknown) => {
        this.lookups.delete(topic);
        this.pending.outstanding -= calls.length;
        for (const c of calls) c.reject(err);
        if (this.pending.outstanding === 0) this.wakeDrainers();
      },
    );
  }

  private publisherOf(t: EngineTopic): TopicPublisher {
    let tp = this.topics.get(t.name);
    if (tp === undefined || tp.topicId !== t.topicId) {
      tp = { name: t.name, topicId: t.topicId, partitions: t.config.partitions, maxMessageBytes: t.config.maxMessageBytes, keyRequired: isCompacted(t.config.cleanupPolicy), parts: [] };
      this.topics.set(t.name, tp);
    }
    return tp;
  }

  private accumulator(tp: TopicPublisher, p: number): PartitionAccumulator {
    return tp.parts[p] ?? (tp.parts[p] = new PartitionAccumulator(this.host, this.pending, tp.name, p));
  }

  /** A call that waited for its topic's lookup: validated and queued as publish() does. */
  private accept(tp: TopicPublisher, value: PublishValue, opts: PublishOptions | undefined, resolve: (r: PublishReceipt) => void, reject: (e: unknown) => void): void {
    const rec = this.prepare(tp, value, opts);
    rec.resolve = resolve;
    rec.reject = reject;
    this.accumulator(tp, rec.partition).add(rec);
  }

  /**
   * Validates one record exactly as publishBatch does (same order, same errors) and picks its
   * partition. A string or JSON value stays text (see PendingRecord). Throws if invalid.
   */
  private prepare(tp: TopicPublisher, value: PublishValue, opts: PublishOptions | undefined): PendingRecord {
    const o = opts !== null && typeof opts === "object" ? opts : NO_OPTS;
    const n = tp.partitions;
    const key = toKeyBuffer(o.key);
    if (key === null && tp.keyRequired) throw keyRequiredError(tp.name, 0);
    let bytes: Buffer | null = null;
    let text: string | undefined;
    let kind: ValueKind = 0;
    if (typeof value === "string") {
      text = value;
      kind = 1;
    } else if (value === null || value === undefined) bytes = null;
    else if (Buffer.isBuffer(value)) bytes = value;
    else if (value instanceof Uint8Array) bytes = Buffer.from(value.buffer, value.byteOffset, value.byteLength);
    else {
      // As prepareValue(): the JSON text, kept as a string.
      text = JSON.stringify(value) as string | undefined;
      if (text === undefined) throw new ValidationError(`value of type ${typeof value} cannot be published`);
      kind = 2;
    }
    const timestamp = o.timestamp ?? Date.now();
    let p: number;
    if (o.partition !== undefined) {
      if (!Number.isInteger(o.partition) || o.partition < 0 || o.partition >= n)
        throw new ValidationError(`partition ${o.partition} out of range for ${tp.name} (0..${n - 1})`);
      p = o.partition;
    } else if (key !== null) p = partitionForKey(key, n);
    else p = n === 1 ? 0 : this.nextSticky(tp.name, n);
    const textBytes = text === undefined ? undefined : Buffer.byteLength(text, "utf8");
    const rec = new PendingRecord(key, bytes, kind, timestamp, toHeaders(o.headers), text, textBytes, p);
    if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record 0: invalid timestamp ${timestamp}`);
    const size = recordSize(rec);
    if (size > tp.maxMessageBytes) throw new RecordTooLargeError(size, tp.maxMessageBytes);
    rec.size = size;
    return rec;
  }

  private stickyOf(topic: string, n: number): { partition: number; bytes: number } {
    let sticky = this.sticky.get(topic);
    if (!sticky) this.sticky.set(topic, (sticky = { partition: Math.floor(Math.random() * n), bytes: 0 }));
    return sticky;
  }

  /** A keyless publish() takes the sticky partition and moves it on (each call is one batch; one partition: always 0, see prepare). */
  private nextSticky(topic: string, n: number): number {
    const sticky = this.stickyOf(topic, n);
    const p = sticky.partition % n;
    sticky.partition = (p + 1) % n;
    sticky.bytes = 0;
    return p;
  }

  /**
   * Validates every record before any partition appends (a rejected batch stores nothing),
   * then places each partition's records: behind publish() records still waiting there (their
   * order is kept), otherwise straight to the engine as one batch. Throws if invalid.
   */
  private placeBatch(tp: TopicPublisher, records: PublishRecord[], opts: PublishBatchOptions): Promise<PublishReceipt[]> {
    const topic = tp.name;
    const n = tp.partitions;
    const now = Date.now();
    const parts = new Int32Array(records.length);
    const byPartition = new Map<number, { recs: PreparedRecord[]; size: number }>();
    let sticky = this.stickyOf(topic, n);
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      if (r === null || typeof r !== "object") throw new ValidationError(`record ${i} must be an object`);
      const key = toKeyBuffer(r.key);
      if (key === null && tp.keyRequired) throw keyRequiredError(topic, i);
      const { value, valueKind } = prepareValue(r.value);
      const timestamp = r.timestamp ?? now;
      let p: number;
      if (r.partition !== undefined) {
        if (!Number.isInteger(r.partition) || r.partition < 0 || r.partition >= n)
          throw new ValidationError(`partition ${r.partition} out of range for ${topic} (0..${n - 1})`);
        p = r.partition;
      } else if (key !== null) p = partitionForKey(key, n);
      else {
        p = sticky.partition;
        sticky.bytes += (value?.length ?? 0) + 32;
        if (sticky.bytes >= STICKY_BYTES) sticky = { partition: (sticky.partition + 1) % n, bytes: 0 };
      }
      parts[i] = p;
      let group = byPartition.get(p);
      if (!group) byPartition.set(p, (group = { recs: [], size: 0 }));
      const prepared: PreparedRecord = { key, value, valueKind, timestamp, headers: toHeaders(r.headers) };
      if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record ${i}: invalid timestamp ${timestamp}`);
      const size = recordSize(prepared);
      if (size > tp.maxMessageBytes) throw new RecordTooLargeError(size, tp.maxMessageBytes);
      group.recs.push(prepared);
      group.size += size;
    }
    // Each call is one batch: the next call starts on the next partition, so keyless
    // single publishes spread evenly while each batch stays together (sticky batches).
    this.sticky.set(topic, { partition: (sticky.partition + 1) % n, bytes: 0 });
    let producer: ProducerInfo | undefined;
    if (opts.producerId !== undefined) {
      if (byPartition.size !== 1) throw new ValidationError("an idempotent batch must target exactly one partition");
      producer = { producerId: opts.producerId, producerEpoch: opts.producerEpoch ?? 0, baseSequence: opts.baseSequence ?? -1 };
    }
    if (opts.transaction !== undefined) return this.placeInTransaction(topic, { ...opts, transaction: opts.transaction }, parts, byPartition);
    const placed: Promise<AppendResult>[] = [];
    for (const [p, g] of byPartition) {
      const acc = tp.parts[p];
      if (acc !== undefined && acc.hasWaiting) {
        placed.push(new Promise<AppendResult>((resolve, reject) => acc.add({ records: g.recs, size: g.size, producer, signal: opts.signal, resolve, reject })));
      } else {
        let a: Promise<AppendResult>;
        try {
          a = this.engine.append(topic, p, g.recs, producer, opts.signal);
        } catch (e) {
          a = Promise.reject(e);
        }
        placed.push(a.catch((e: unknown) => (this.host.appendFailed(topic, e), Promise.reject(e))));
      }
    }
    return Promise.all(placed).then((results) => receipts(topic, parts, byPartition, results));
  }

  /**
   * The partitions' batches appended one after the other on the caller's transaction (one
   * connection runs one statement at a time), bypassing the accumulators: these records are
   * the caller's alone and become readable when the caller commits.
   */
  private async placeInTransaction(topic: string, opts: PublishBatchOptions & { transaction: SqlTransaction }, parts: Int32Array, byPartition: Map<number, { recs: PreparedRecord[] }>): Promise<PublishReceipt[]> {
    const appends = this.transactionalAppends(opts);
    const results: AppendResult[] = [];
    for (const [p, g] of byPartition) results.push(await appends.append(opts.transaction, topic, p, g.recs));
    return receipts(topic, parts, byPartition, results);
  }

  /** The engine's capability for `opts.transaction`, or the ValidationError saying why not. */
  private transactionalAppends(opts: PublishBatchOptions): TransactionalAppends {
    const appends = this.engine.transactional;
    if (appends === undefined) throw new ValidationError(`publishing inside a transaction needs the PostgreSQL engine (openBroker({ engine: postgresEngine(...) })); this broker runs on the ${this.engine.kind} engine`);
    if (opts.producerId !== undefined) throw new ValidationError("a publish inside a transaction takes no producerId: the transaction's commit or rollback already decides it once");
    return appends;
  }
}

/** Receipts in record order: record k of a partition's group has its append's base offset + k. */
function receipts(topic: string, parts: Int32Array, byPartition: Map<number, unknown>, results: AppendResult[]): PublishReceipt[] {
  const index = new Map<number, number>();
  let j = 0;
  for (const p of byPartition.keys()) index.set(p, j++);
  const next = new Int32Array(results.length);
  const out: PublishReceipt[] = new Array(parts.length);
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    const k = index.get(p)!;
    const r = results[k];
    out[i] = { topic, partition: p, offset: r.baseOffset + next[k]++, duplicate: r.duplicate, synced: r.synced };
  }
  return out;
}
