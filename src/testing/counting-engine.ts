// SPDX-License-Identifier: Apache-2.0
/**
 * A storage engine built only from the public engine interface: it counts every call and
 * delegates to another engine. Running the broker conformance suite on
 * `openBroker({ engine: new CountingEngine(inner) })` proves that the broker reaches storage
 * only through `StorageEngine` (a reach-around would bypass the counts, and any method the
 * interface lacks would not compile here).
 */
import type { CommitFence, GroupCoordination } from "../store/group-coordination.js";
import type { AppendResult, CommittedOffset, EncodedBatches, EngineTopic, OffsetReset, PartitionOffsets, PreparedRecord, ProducerInfo, StorageEngine, StoredRecord, TransactionalAppends } from "../store/engine.js";
import type { TopicConfig, TopicDescription } from "../types.js";
import type { QueueStore } from "../store/queue-store.js";
import { CountingQueueStore } from "./counting-queue-store.js";

export class CountingEngine implements StorageEngine {
  /** Calls per method name (`encoded.appendEncoded` for the capability's methods). */
  readonly calls = new Map<string, number>();
  readonly kind: string;
  readonly encoded?: EncodedBatches;
  readonly transactional?: TransactionalAppends;
  /** The inner engine's group coordination, as is (its calls are not counted). */
  readonly groupCoordination?: GroupCoordination;
  /** The inner engine's queues, counted as `queues.<method>` (every opened queue wrapped too). */
  readonly queues: QueueStore;

  /**
   * @param opts.encoded false: hide the inner engine's encoded-batch capability, so the broker
   *   takes its fallbacks (what an engine without it, e.g. a database engine, gets)
   */
  constructor(
    private readonly inner: StorageEngine,
    opts: { encoded?: boolean } = {},
  ) {
    this.kind = `counting(${inner.kind})`;
    this.queues = new CountingQueueStore(inner.queues, (name, fn) => this.count(name, fn));
    const enc = opts.encoded === false ? undefined : inner.encoded;
    if (enc) {
      this.encoded = {
        appendEncoded: (topic, partition, batch, signal) => this.count("encoded.appendEncoded", () => enc.appendEncoded(topic, partition, batch, signal)),
        readRaw: (topic, partition, offset, maxBytes, maxRecords) => this.count("encoded.readRaw", () => enc.readRaw(topic, partition, offset, maxBytes, maxRecords)),
      };
    }
    this.groupCoordination = inner.groupCoordination;
    const tr = inner.transactional;
    if (tr !== undefined) this.transactional = { append: (tx, topic, partition, records) => this.count("transactional.append", () => tr.append(tx, topic, partition, records)) };
  }

  private count<R>(name: string, fn: () => R): R {
    this.calls.set(name, (this.calls.get(name) ?? 0) + 1);
    return fn();
  }

  open(): Promise<void> {
    return this.count("open", () => this.inner.open());
  }
  close(): Promise<void> {
    return this.count("close", () => this.inner.close());
  }
  createTopic(name: string, config: Required<TopicConfig>): Promise<EngineTopic> {
    return this.count("createTopic", () => this.inner.createTopic(name, config));
  }
  deleteTopic(name: string): Promise<void> {
    return this.count("deleteTopic", () => this.inner.deleteTopic(name));
  }
  listTopics(): Promise<string[]> {
    return this.count("listTopics", () => this.inner.listTopics());
  }
  getTopic(name: string): Promise<EngineTopic> {
    return this.count("getTopic", () => this.inner.getTopic(name));
  }
  alterTopic(name: string, changes: { retentionMs?: number; retentionBytes?: number }): Promise<EngineTopic> {
    return this.count("alterTopic", () => this.inner.alterTopic(name, changes));
  }
  describeTopic(name: string): Promise<TopicDescription> {
    return this.count("describeTopic", () => this.inner.describeTopic(name));
  }
  append(topic: string, partition: number, records: PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult> {
    return this.count("append", () => this.inner.append(topic, partition, records, producer, signal));
  }
  read(topic: string, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    return this.count("read", () => this.inner.read(topic, partition, offset, maxBytes));
  }
  waitFor(topic: string, partition: number, offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    return this.count("waitFor", () => this.inner.waitFor(topic, partition, offset, maxWaitMs, signal));
  }
  offsets(topic: string, partition: number): Promise<PartitionOffsets> {
    return this.count("offsets", () => this.inner.offsets(topic, partition));
  }
  offsetForTimestamp(topic: string, partition: number, ts: number): Promise<number> {
    return this.count("offsetForTimestamp", () => this.inner.offsetForTimestamp(topic, partition, ts));
  }
  enforceRetention(now?: number): Promise<void> {
    return this.count("enforceRetention", () => this.inner.enforceRetention(now));
  }
  allocateProducer(producerId?: number): Promise<{ producerId: number; producerEpoch: number }> {
    return this.count("allocateProducer", () => this.inner.allocateProducer(producerId));
  }
  listCommittedGroups(): Promise<{ group: string; topic: string }[]> {
    return this.count("listCommittedGroups", () => this.inner.listCommittedGroups());
  }

  getCommitted(group: string, topic: string): Promise<Map<number, CommittedOffset>> {
    return this.count("getCommitted", () => this.inner.getCommitted(group, topic));
  }
  commitOffsets(group: string, topic: string, offsets: Map<number, number>, fence?: CommitFence): Promise<void> {
    return this.count("commitOffsets", () => this.inner.commitOffsets(group, topic, offsets, fence));
  }
  resetOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void> {
    return this.count("resetOffsets", () => this.inner.resetOffsets(group, topic, offsets));
  }
  recentResets(group: string, topic: string): Promise<OffsetReset[]> {
    return this.count("recentResets", () => this.inner.recentResets?.(group, topic) ?? Promise.resolve([]));
  }
}
