// SPDX-License-Identifier: Apache-2.0
/**
 * The embedded broker: `openBroker({ dataDir })` = a StorageEngine (DiskEngine by default) + GroupCoordinator
 * (membership) + publishing/partitioning + subscriptions. Everything runs in this process;
 * `sluice serve` puts the same object behind the wire protocol.
 */
import { Buffer } from "node:buffer";
import { AbortedError, BrokerClosedError, GroupActiveError, ValidationError, CorruptRecordError, RecordTooLargeError } from "../errors.js";
import { NodeFileSystem, type FileSystem } from "../log/io.js";
import { telemetry, type Logger, type Telemetry } from "../observability/telemetry.js";
import { decodeRecords, prepareValue, recordSize, validateEncodedBatch, type PreparedRecord } from "../log/record-batch.js";
import { DiskEngine } from "../store/disk/disk-engine.js";
import { resolveTopicConfig } from "../store/topic-config.js";
import type { StorageEngine } from "../store/engine.js";
import { validateName } from "../store/names.js";
import { GroupCoordinator } from "../streams/group-coordinator.js";
import { QueueManager } from "../queues/index.js";
import type { QueueConfig } from "../queues/types.js";
import type { HostQueue } from "../queues/host-api.js";
import { partitionForKey } from "../streams/murmur2.js";
import { toConsumed } from "../streams/records.js";
import { GroupSubscription } from "../streams/subscription.js";
import type { BrokerHost, EncodedAppend, MemberListener, MemberSubscription } from "./host.js";
import type {
  Broker,
  FetchOptions,
  FetchResult,
  GroupLag,
  ProducerIdentity,
  PublishBatchOptions,
  PublishOptions,
  PublishReceipt,
  PublishRecord,
  PublishValue,
  ResetResult,
  ResetTarget,
  SubscribeOptions,
  Subscription,
  TopicConfig,
  TopicDescription,
} from "../types.js";

export interface BrokerOptions {
  /**
   * Directory holding all data, created if missing: the default disk engine's home. Required
   * unless `engine` is given.
   */
  dataDir?: string;
  /**
   * The storage engine (default: the disk engine on `dataDir`). The broker opens it, uses it
   * for everything durable, and closes it on `close()`.
   */
  engine?: StorageEngine;
  /** Any pino-compatible logger; default silent (shorthand for `telemetry.logger`). */
  logger?: Logger;
  /**
   * Logger, metrics sink and clock, handed down to the engine, partitions and queues
   * (src/observability/telemetry.ts). Missing parts are no-ops; the clock defaults to the
   * system's.
   */
  telemetry?: Partial<Telemetry>;
  /** File I/O layer; tests inject faults here. Default: node:fs. */
  fs?: FileSystem;
  /** How often retention runs. Default 5 minutes; 0 disables the timer (call enforceRetention()). */
  retentionCheckIntervalMs?: number;
}

/** Keyless records stick to one partition for this many bytes, then move on (Kafka's sticky partitioner). */
const STICKY_BYTES = 16 * 1024;
const MAX_FETCH_BYTES = 64 * 1024 * 1024;
const MAX_WAIT_MS = 5 * 60_000;

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

export class EmbeddedBroker implements Broker, BrokerHost {
  readonly engine: StorageEngine;
  readonly coordinator = new GroupCoordinator();
  readonly logger: Logger;
  readonly telemetry: Telemetry;
  readonly dataDir: string;
  readonly fs: FileSystem;
  private subs = new Set<GroupSubscription<unknown>>();
  private sticky = new Map<string, { partition: number; bytes: number }>();
  private retentionTimer: NodeJS.Timeout | null = null;
  private queues!: QueueManager;
  private closed = false;
  private closing: Promise<void> | null = null;

  private constructor(opts: BrokerOptions) {
    this.telemetry = telemetry({ ...opts.telemetry, logger: opts.logger ?? opts.telemetry?.logger });
    this.logger = this.telemetry.logger;
    this.dataDir = opts.dataDir ?? "";
    this.fs = opts.fs ?? new NodeFileSystem();
    this.engine = opts.engine ?? new DiskEngine({ dataDir: this.dataDir, fs: this.fs, telemetry: this.telemetry });
  }

  static async open(opts: BrokerOptions): Promise<EmbeddedBroker> {
    if (!opts || (opts.engine === undefined && (typeof opts.dataDir !== "string" || opts.dataDir.length === 0)))
      throw new ValidationError("openBroker needs a dataDir (or an engine)");
    const b = new EmbeddedBroker(opts);
    await b.engine.open();
    // Queues reach storage only through the engine's queue store.
    b.queues = new QueueManager({ store: b.engine.queues, clock: b.telemetry.clock });
    const every = opts.retentionCheckIntervalMs ?? 5 * 60_000;
    if (every > 0) {
      b.retentionTimer = setInterval(() => {
        b.engine.enforceRetention().catch((e) => b.logger.error({ err: e }, "retention failed"));
      }, every);
      b.retentionTimer.unref();
    }
    return b;
  }

  private check(): void {
    if (this.closed) throw new BrokerClosedError();
  }

  async createTopic(name: string, config?: TopicConfig): Promise<TopicDescription> {
    this.check();
    await this.engine.createTopic(name, resolveTopicConfig(config));
    return this.engine.describeTopic(name);
  }

  async deleteTopic(name: string): Promise<void> {
    this.check();
    for (const s of [...this.subs]) if (s.topic === name) await s.close();
    await this.engine.deleteTopic(name);
    this.sticky.delete(name);
  }

  async listTopics(): Promise<string[]> {
    this.check();
    return this.engine.listTopics();
  }

  async describeTopic(name: string): Promise<TopicDescription> {
    this.check();
    return this.engine.describeTopic(name);
  }

  async initProducer(producerId?: number): Promise<ProducerIdentity> {
    this.check();
    return this.engine.allocateProducer(producerId);
  }

  publish(topic: string, value: PublishValue, opts: PublishOptions = {}): Promise<PublishReceipt> {
    return this.publishBatch(topic, [{ ...opts, value }]).then((r) => r[0]);
  }

  async publishBatch(topic: string, records: PublishRecord[], opts: PublishBatchOptions = {}): Promise<PublishReceipt[]> {
    this.check();
    if (!Array.isArray(records) || records.length === 0) throw new ValidationError("publishBatch needs a non-empty array of records");
    const t = await this.engine.getTopic(topic);
    const n = t.config.partitions;
    const now = Date.now();
    const parts = new Int32Array(records.length);
    const byPartition = new Map<number, PreparedRecord[]>();
    let sticky = this.sticky.get(topic);
    if (!sticky) this.sticky.set(topic, (sticky = { partition: Math.floor(Math.random() * n), bytes: 0 }));
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      if (r === null || typeof r !== "object") throw new ValidationError(`record ${i} must be an object`);
      const key = toKeyBuffer(r.key);
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
      let list = byPartition.get(p);
      if (!list) byPartition.set(p, (list = []));
      const prepared: PreparedRecord = { key, value, valueKind, timestamp, headers: toHeaders(r.headers) };
      // Validate every record before any partition appends: a rejected batch stores nothing.
      if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record ${i}: invalid timestamp ${timestamp}`);
      const size = recordSize(prepared);
      if (size > t.config.maxMessageBytes) throw new RecordTooLargeError(size, t.config.maxMessageBytes);
      list.push(prepared);
    }
    // Each call is one batch: the next call starts on the next partition, so keyless
    // single publishes spread evenly while each batch stays together (sticky batches).
    this.sticky.set(topic, { partition: (sticky.partition + 1) % n, bytes: 0 });
    let producer: { producerId: number; producerEpoch: number; baseSequence: number } | undefined;
    if (opts.producerId !== undefined) {
      if (byPartition.size !== 1) throw new ValidationError("an idempotent batch must target exactly one partition");
      producer = { producerId: opts.producerId, producerEpoch: opts.producerEpoch ?? 0, baseSequence: opts.baseSequence ?? -1 };
    }
    const results = new Map<number, { baseOffset: number; duplicate: boolean; synced: boolean }>();
    await Promise.all(
      [...byPartition].map(async ([p, recs]) => {
        results.set(p, await this.engine.append(topic, p, recs, producer, opts.signal));
      }),
    );
    const next = new Map<number, number>();
    const out: PublishReceipt[] = new Array(records.length);
    for (let i = 0; i < records.length; i++) {
      const p = parts[i];
      const r = results.get(p)!;
      const k = next.get(p) ?? 0;
      next.set(p, k + 1);
      out[i] = { topic, partition: p, offset: r.baseOffset + k, duplicate: r.duplicate, synced: r.synced };
    }
    return out;
  }

  /**
   * Appends one batch a client encoded in the storage format (base offset 0, CRC over it) to
   * one partition: the server's publish path, which stores client bytes without decoding them
   * into objects. Validated completely by the engine first; producer fields come from the
   * batch header. Resolves with the batch's base offset once durable (per the topic's
   * durability).
   */
  async publishEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<EncodedAppend> {
    this.check();
    const t = await this.engine.getTopic(topic);
    if (!Number.isInteger(partition) || partition < 0 || partition >= t.config.partitions)
      throw new ValidationError(`partition ${partition} out of range for ${topic} (0..${t.config.partitions - 1})`);
    if (this.engine.encoded) return this.engine.encoded.appendEncoded(topic, partition, batch, signal);
    // An engine without the encoded-batch capability: verify and decode, then append records.
    const { header: h } = validateEncodedBatch(batch, t.config.maxMessageBytes);
    const records: PreparedRecord[] = decodeRecords(batch, 0, h).map((r) => ({ key: r.key, value: r.value, valueKind: r.valueKind, timestamp: r.timestamp, headers: r.headers }));
    const producer = h.producerId >= 0 ? { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence } : undefined;
    const r = await this.engine.append(topic, partition, records, producer, signal);
    return { ...r, count: h.count };
  }

  async fetch(topic: string, partition: number, offset: number, opts: FetchOptions = {}): Promise<FetchResult> {
    this.check();
    const maxBytes = opts.maxBytes ?? 1024 * 1024;
    const maxWaitMs = opts.maxWaitMs ?? 0;
    if (!Number.isInteger(maxBytes) || maxBytes < 1 || maxBytes > MAX_FETCH_BYTES) throw new ValidationError(`maxBytes must be in [1, ${MAX_FETCH_BYTES}]`);
    if (!Number.isInteger(maxWaitMs) || maxWaitMs < 0 || maxWaitMs > MAX_WAIT_MS) throw new ValidationError(`maxWaitMs must be in [0, ${MAX_WAIT_MS}]`);
    const o = await this.engine.offsets(topic, partition);
    if (offset === o.highWatermark && maxWaitMs > 0) {
      await this.engine.waitFor(topic, partition, offset, maxWaitMs, opts.signal);
      // The caller gave up: the same AbortedError a client raises for an aborted fetch.
      if (opts.signal?.aborted) throw new AbortedError("fetch aborted", opts.signal.reason);
    }
    const res = await this.engine.read(topic, partition, offset, maxBytes);
    const after = await this.engine.offsets(topic, partition);
    return {
      records: res.records.map((r) => toConsumed(topic, partition, r)),
      nextOffset: res.nextOffset,
      highWatermark: after.highWatermark,
      logStartOffset: after.logStartOffset,
    };
  }

  async offsetForTimestamp(topic: string, partition: number, timestamp: number): Promise<number> {
    this.check();
    if (!Number.isFinite(timestamp)) throw new ValidationError("timestamp must be a number");
    return this.engine.offsetForTimestamp(topic, partition, timestamp);
  }

  subscribe<T = unknown>(topic: string, opts: SubscribeOptions): Subscription<T> {
    return this.join<T>(topic, opts);
  }

  /** A member for a consumer in another process (the server's remote members). */
  subscribeMember(topic: string, opts: SubscribeOptions, listener: MemberListener): MemberSubscription {
    return this.join<unknown>(topic, opts, listener);
  }

  private join<T>(topic: string, opts: SubscribeOptions, listener?: MemberListener): GroupSubscription<T> {
    this.check();
    if (!opts || typeof opts.group !== "string") throw new ValidationError("subscribe needs { group }");
    const sub = new GroupSubscription<T>({ engine: this.engine, coordinator: this.coordinator, logger: this.logger, onClose: (s) => this.subs.delete(s) }, topic, opts, listener);
    this.subs.add(sub as GroupSubscription<unknown>);
    return sub;
  }

  async resetGroup(group: string, topic: string, to: ResetTarget, opts: { dryRun?: boolean } = {}): Promise<ResetResult> {
    this.check();
    validateName("group", group);
    const t = await this.engine.getTopic(topic);
    const dryRun = opts.dryRun ?? false;
    if (!dryRun && this.coordinator.hasMembers(group, topic)) throw new GroupActiveError(group);
    const committed = await this.engine.getCommitted(group, topic);
    const partitions: ResetResult["partitions"] = [];
    const next = new Map<number, number>();
    for (let p = 0; p < t.config.partitions; p++) {
      const { logStartOffset: start, highWatermark: end } = await this.engine.offsets(topic, p);
      const prev = committed.get(p)?.offset ?? null;
      let target: number;
      if (to === "earliest") target = start;
      else if (to === "latest") target = end;
      else if (typeof to === "object" && to !== null && "offset" in to) target = to.offset;
      else if (typeof to === "object" && to !== null && "timestamp" in to) target = await this.engine.offsetForTimestamp(topic, p, to.timestamp);
      else if (typeof to === "object" && to !== null && "shiftBy" in to) target = (prev ?? start) + to.shiftBy;
      else throw new ValidationError("reset target must be earliest, latest, {offset}, {timestamp} or {shiftBy}");
      if (!Number.isFinite(target)) throw new ValidationError("reset target must be a finite number");
      // Clamp into the readable range, as Kafka's reset tool does.
      target = Math.min(Math.max(Math.trunc(target), start), end);
      partitions.push({ partition: p, previous: prev, next: target });
      next.set(p, target);
    }
    if (!dryRun) await this.engine.commitOffsets(group, topic, next);
    return { group, topic, dryRun, partitions };
  }

  async groupLag(group: string, topic: string): Promise<GroupLag> {
    this.check();
    validateName("group", group);
    const t = await this.engine.getTopic(topic);
    const committed = await this.engine.getCommitted(group, topic);
    const now = Date.now();
    const partitions: GroupLag["partitions"] = [];
    for (let p = 0; p < t.config.partitions; p++) {
      const { logStartOffset, highWatermark } = await this.engine.offsets(topic, p);
      const c = committed.get(p)?.offset ?? null;
      const from = Math.min(Math.max(c ?? logStartOffset, logStartOffset), highWatermark);
      const lagRecords = highWatermark - from;
      let lagMs = 0;
      let at = from;
      while (lagRecords > 0 && at < highWatermark) {
        try {
          const r = await this.engine.read(topic, p, at, 1);
          if (r.records.length > 0) {
            lagMs = Math.max(0, now - r.records[0].timestamp);
            break;
          }
          if (r.nextOffset <= at) break;
          at = r.nextOffset;
        } catch (e) {
          if (e instanceof CorruptRecordError && e.nextOffset !== undefined && e.nextOffset > at) at = e.nextOffset;
          else throw e;
        }
      }
      partitions.push({ partition: p, committedOffset: c, logStartOffset, highWatermark, lagRecords, lagMs });
    }
    return {
      group,
      topic,
      totalRecords: partitions.reduce((s, x) => s + x.lagRecords, 0),
      maxLagMs: partitions.reduce((s, x) => Math.max(s, x.lagMs), 0),
      partitions,
    };
  }

  queue<T = unknown>(name: string, config?: QueueConfig): HostQueue<T> {
    this.check();
    return this.queues.queue<T>(name, config);
  }

  async listQueues(): Promise<string[]> {
    this.check();
    return this.queues.listQueues();
  }

  async deleteQueue(name: string): Promise<void> {
    this.check();
    await this.queues.deleteQueue(name);
  }

  /** Runs retention now (it also runs on a timer). */
  enforceRetention(now?: number): Promise<void> {
    this.check();
    return this.engine.enforceRetention(now);
  }

  close(): Promise<void> {
    if (!this.closing) {
      this.closing = (async () => {
        if (this.retentionTimer) clearInterval(this.retentionTimer);
        for (const s of [...this.subs]) await s.close();
        this.closed = true;
        await this.queues.close();
        await this.engine.close();
      })();
    }
    return this.closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Opens (creating if needed) an embedded broker on `dataDir`, running recovery first. */
export function openBroker(opts: BrokerOptions): Promise<EmbeddedBroker> {
  return EmbeddedBroker.open(opts);
}
