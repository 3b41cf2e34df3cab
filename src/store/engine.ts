// SPDX-License-Identifier: Apache-2.0
/**
 * The storage engine contract: everything durable goes through it (topics and their
 * partitions, appends and reads, idempotent-producer state, group offsets, work queues), so
 * the broker above it (src/broker, src/streams, src/queues policy) runs unchanged on any
 * engine. The disk engine (src/store/disk/disk-engine.ts) is the default; a PostgreSQL engine for
 * multi-node deployments must pass the same contract tests (`defineEngineContract` in
 * src/testing/engine-contract.ts) and the broker conformance suite through
 * `openBroker({ engine })` (test/engine-interface.test.ts runs it on a wrapper that only
 * delegates, which proves nothing reaches around this interface).
 *
 * Types are neutral: records in and out (`PreparedRecord`, `StoredRecord`), not the disk
 * format. Calls a database engine would need to make asynchronous are asynchronous. The disk
 * engine's encoded-batch fast path is an optional capability (`encoded`), with a fallback in
 * the broker for engines without it.
 */
import type { CommitFence, GroupCoordination } from "./group-coordination.js";
import type { PreparedRecord, StoredRecord, ProducerInfo } from "../log/record-batch.js";
import type { SqlTransaction, TopicConfig, TopicDescription } from "../types.js";
import type { QueueStore } from "./queue-store.js";

export type { PreparedRecord, StoredRecord, ProducerInfo };

export interface EngineTopic {
  name: string;
  /** Identifies this incarnation of the name: offsets and commits are keyed by it. */
  topicId: string;
  createdAt: number;
  config: Required<TopicConfig>;
}

export interface CommittedOffset {
  offset: number;
  committedAt: number;
  metadata?: string;
  /**
   * Replay mark (META-4): set by a reset that moved this offset backwards, to the offset
   * committed before it (or an earlier mark, if higher). Records below it are replays;
   * absent once a commit (or a reset) reaches it.
   */
  replayUntil?: number;
}

/** One administrative reset of a group on a topic, as the engine remembers it (newest kept). */
export interface OffsetReset {
  /** Wall-clock ms of the reset. */
  at: number;
  /** Each partition it set: the committed offset before (null: none) and after. */
  partitions: { partition: number; from: number | null; to: number }[];
}

/** Resets remembered per group and topic (older ones are forgotten). */
export const MAX_REMEMBERED_RESETS = 10;

/**
 * The replay mark a partition has after a reset moves it from `prev` to `next` (META-4): the
 * highest position reached before (the previous offset, or an earlier mark if higher) when
 * `next` lies below it, else none. Shared by engines so they apply one rule.
 */
export function markAfterReset(prev: CommittedOffset | undefined, next: number): number | undefined {
  if (prev === undefined) return undefined;
  const reached = Math.max(prev.offset, prev.replayUntil ?? 0);
  return next < reached ? reached : undefined;
}

/** The replay mark a partition keeps after a commit of `next`: cleared once `next` reaches it. */
export function markAfterCommit(prev: CommittedOffset | undefined, next: number): number | undefined {
  const mark = prev?.replayUntil;
  return mark !== undefined && next < mark ? mark : undefined;
}

export interface PartitionOffsets {
  logStartOffset: number;
  /** Readable (durable, with durability "always") end: readers never see past it. */
  highWatermark: number;
  logEndOffset: number;
}

export interface AppendResult {
  baseOffset: number;
  /** An idempotent retry of a stored batch: `baseOffset` is the original's. */
  duplicate: boolean;
  /** True once an fdatasync (or the engine's equivalent) covered the batch. */
  synced: boolean;
}

/**
 * Optional capability: batches in the disk engine's storage format (src/log/record-batch.ts),
 * built by the network client and forwarded to remote consumers without decoding.
 */
export interface EncodedBatches {
  /**
   * Appends one batch already encoded in the storage format with base offset 0. The engine
   * validates it completely (CRC, structure, record sizes) before storing; producer
   * id/epoch/sequence come from the batch header.
   */
  appendEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<AppendResult & { count: number }>;
  /**
   * Stored batches from `offset` as bytes, without decoding records: whole batches, each
   * verified like `read` verifies it, at most `maxBytes` and none past the batch that reaches
   * `maxRecords`, but at least one batch. The first batch may start below `offset`; `records`
   * counts those at or after it. Damage at `offset` raises CorruptRecordError (as `read`).
   */
  readRaw(topic: string, partition: number, offset: number, maxBytes: number, maxRecords?: number): Promise<{ data: Buffer; nextOffset: number; records: number }>;
}

/**
 * Optional capability: appends inside the caller's open SQL transaction (`publish(..., {
 * transaction })`). The batch takes its offsets at once and becomes readable only when the
 * caller commits; a rollback undoes it completely, offsets included (offsets stay gap-free).
 * The partition stays locked for other appends until the caller's transaction ends.
 */
export interface TransactionalAppends {
  append(tx: SqlTransaction, topic: string, partition: number, records: PreparedRecord[]): Promise<AppendResult>;
}

export interface StorageEngine {
  /** A short name for logs and errors ("disk", ...). */
  readonly kind: string;
  open(): Promise<void>;
  close(): Promise<void>;

  // ── topics ──
  createTopic(name: string, config: Required<TopicConfig>): Promise<EngineTopic>;
  deleteTopic(name: string): Promise<void>;
  listTopics(): Promise<string[]>;
  /** Throws TopicNotFoundError (or InvalidNameError) for a missing topic. */
  getTopic(name: string): Promise<EngineTopic>;
  describeTopic(name: string): Promise<TopicDescription>;
  /** Stores new retention settings durably (topic metadata) and applies them to the open partitions. */
  alterTopic(name: string, changes: { retentionMs?: number; retentionBytes?: number }): Promise<EngineTopic>;

  // ── partitions ──
  append(topic: string, partition: number, records: PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult>;
  read(topic: string, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }>;
  /** Resolves true once a record at `offset` is readable, false on timeout, abort or close. */
  waitFor(topic: string, partition: number, offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean>;
  offsets(topic: string, partition: number): Promise<PartitionOffsets>;
  offsetForTimestamp(topic: string, partition: number, ts: number): Promise<number>;
  enforceRetention(now?: number): Promise<void>;
  /** Present when the engine stores batches in the disk format (see EncodedBatches). */
  readonly encoded?: EncodedBatches;
  /** Present when the engine can append inside an application's transaction (see TransactionalAppends). */
  readonly transactional?: TransactionalAppends;
  /**
   * Present when the engine coordinates consumer groups itself, shared by every broker node on
   * it (PG-1); the broker then uses it instead of its in-process coordinator, and the engine
   * checks `commitOffsets`' fence inside the write.
   */
  readonly groupCoordination?: GroupCoordination;

  // ── idempotent producers ──
  /** A new producer id (epoch 0), or the next epoch of an existing one (fencing older ones). */
  allocateProducer(producerId?: number): Promise<{ producerId: number; producerEpoch: number }>;

  // ── group offsets ──
  /** Committed offsets of a group for the current incarnation of a topic (value = next offset to read). */
  getCommitted(group: string, topic: string): Promise<Map<number, CommittedOffset>>;
  /**
   * Durable once resolved; refuses offsets beyond a partition's high watermark (META-3). A
   * partition's replay mark is dropped in the same write once its offset reaches the mark.
   */
  commitOffsets(group: string, topic: string, offsets: Map<number, number>, fence?: CommitFence): Promise<void>;
  /**
   * An administrative reset (`resetGroup`): commits `offsets` as `commitOffsets` does and, in
   * the same durable write, keeps the replay marks (META-4): a partition moved below its
   * committed offset gets the mark max(previous offset, existing mark); one whose new offset
   * reaches its mark loses it; others keep theirs. Previous offsets are the engine's own at
   * the moment of the write, so a concurrent commit cannot leave a mark inconsistent with them.
   */
  resetOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void>;
  /**
   * The last resets (at most MAX_REMEMBERED_RESETS) of a group on the current incarnation of a
   * topic, newest first, durable like the offsets. Optional: an engine without it reports none.
   */
  recentResets?(group: string, topic: string): Promise<OffsetReset[]>;
  /** Every (group, topic) with committed offsets for the topic's current incarnation. Reads only. */
  listCommittedGroups(): Promise<{ group: string; topic: string }[]>;

  // ── work queues ──
  /**
   * The engine's queues (src/store/queue-store.ts): jobs, leases, settlements, dead-letter
   * moves. Opened and closed with the engine; the queue policy (src/queues) reaches queue
   * storage only through this.
   */
  readonly queues: QueueStore;
}
