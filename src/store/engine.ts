// SPDX-License-Identifier: Apache-2.0
/**
 * The storage engine contract under the broker. The embedded broker runs on DiskEngine
 * (src/store/disk-engine.ts); a PostgreSQL engine for multi-node deployments is planned and
 * must pass the same contract tests (test/engine-contract.test.ts runs `defineEngineContract` from src/testing/engine-contract.ts
 * against every engine).
 */
import type { PreparedRecord, StoredRecord, ProducerInfo } from "../log/record-batch.js";
import type { TopicConfig, TopicDescription } from "../types.js";

export interface EngineTopic {
  name: string;
  topicId: string;
  createdAt: number;
  config: Required<TopicConfig>;
}

export interface CommittedOffset {
  offset: number;
  committedAt: number;
  metadata?: string;
}

export interface StorageEngine {
  open(): Promise<void>;
  close(): Promise<void>;

  createTopic(name: string, config: Required<TopicConfig>): Promise<EngineTopic>;
  deleteTopic(name: string): Promise<void>;
  listTopics(): string[];
  getTopic(name: string): EngineTopic;
  describeTopic(name: string): TopicDescription;

  append(topic: string, partition: number, records: PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<{ baseOffset: number; duplicate: boolean; synced: boolean }>;
  /**
   * Appends one batch already encoded in the storage format with base offset 0 (built by a
   * client). The engine validates it completely (CRC, structure, record sizes) before storing;
   * producer id/epoch/sequence come from the batch header.
   */
  appendEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<{ baseOffset: number; duplicate: boolean; synced: boolean; count: number }>;
  read(topic: string, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }>;
  /**
   * Stored batches from `offset` as bytes, without decoding records (the server forwards them
   * to remote consumers): whole batches, each verified like `read` verifies it, at most
   * `maxBytes` and none past the batch that reaches `maxRecords`, but at least one batch. The
   * first batch may start below `offset`; `records` counts those at or after it. Damage at
   * `offset` raises CorruptRecordError (as `read`).
   */
  readRaw(topic: string, partition: number, offset: number, maxBytes: number, maxRecords?: number): Promise<{ data: Buffer; nextOffset: number; records: number }>;
  waitFor(topic: string, partition: number, offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean>;
  offsets(topic: string, partition: number): { logStartOffset: number; highWatermark: number; logEndOffset: number };
  offsetForTimestamp(topic: string, partition: number, ts: number): Promise<number>;
  enforceRetention(now?: number): Promise<void>;

  allocateProducer(producerId?: number): Promise<{ producerId: number; producerEpoch: number }>;

  /** Committed offsets of a group for a topic incarnation (stored value = next offset to read). */
  getCommitted(group: string, topic: string): Map<number, CommittedOffset>;
  commitOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void>;
}
