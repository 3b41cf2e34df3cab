// SPDX-License-Identifier: Apache-2.0
/**
 * Public contracts of sluice. `openBroker()` (embedded) and `connect()` (client of a server)
 * both return a `Broker`; the conformance suite in `src/testing/` runs against either.
 */

import type { Queue, QueueConfig } from "./queues/types.js";

import type { Durability, Headers, PublishValue } from "./value-types.js";
import type { CleanupPolicy } from "./log/compaction-policy.js";

export type { CleanupPolicy, Durability, Headers, PublishValue };

/** What `alterTopic` can change on a live topic (the rest is fixed at creation). */
export type TopicAlteration = Partial<Pick<TopicConfig, "retentionMs" | "retentionBytes">>;

export interface TopicConfig {
  /** Number of partitions (1..10_000). Default 1. */
  partitions?: number;
  /** Delete sealed segments whose newest record is older than this. Default: keep forever (-1). */
  retentionMs?: number;
  /** Per partition: delete oldest sealed segments while the rest still exceeds this. -1 = no limit. */
  retentionBytes?: number;
  /** Roll the active segment once it would exceed this many bytes. Default 256 MiB. */
  segmentBytes?: number;
  /** Roll the active segment once its first record is older than this. Default 7 days. */
  segmentMs?: number;
  /** Largest encoded record accepted. Default 1 MiB. */
  maxMessageBytes?: number;
  /** `always` (default): ack after fdatasync (group commit). `interval`: fsync every
   * `flushIntervalMs`, ack says `synced: false`. `never`: tests only. */
  durability?: Durability;
  /** For `interval` durability. Default 1000 ms. */
  flushIntervalMs?: number;
  /**
   * `delete` (default): sealed segments go by `retentionMs`/`retentionBytes`. `compact`: the
   * cleaner keeps only the latest record per key (docs/topics.md, key compaction); every record
   * needs a key. `compact,delete`: both.
   */
  cleanupPolicy?: CleanupPolicy;
  /** Compaction: a segment is cleaned only once all its records are at least this old. Default 0. */
  minCompactionLagMs?: number;
  /** Compaction: a tombstone (null value) is kept at least this long after its timestamp. Default 1 day. */
  deleteRetentionMs?: number;
  /**
   * Tiered storage: before retention deletes a sealed segment, copy it (verified, with a
   * manifest) to this archive, and serve reads below the online log start from there
   * (docs/storage-format.md "Segment archive"). Default null: segments are simply deleted.
   */
  archive?: ArchiveConfig | null;
  /** Delete archived segments whose newest record is older than this. -1 (default) = keep forever. */
  archiveRetentionMs?: number;
  /**
   * Encryption at rest (docs/security.md): records are stored AES-256-GCM encrypted per batch
   * with the broker's active key (`encryptionKeys`). Needs a keyring; not with `compact`
   * (archived segments stay encrypted); cannot be changed on an existing topic. Default false.
   */
  encrypted?: boolean;
}

/** Where a topic's archive lives: an absolute directory (a second disk, an NFS or object-store mount). */
export interface ArchiveConfig {
  dir: string;
}


export interface TopicDescription {
  name: string;
  /** Unique per incarnation: deleting and re-creating a name yields a new id. */
  topicId: string;
  createdAt: number;
  config: Required<TopicConfig>;
  partitions: PartitionDescription[];
}

export interface PartitionDescription {
  partition: number;
  logStartOffset: number;
  /** Next offset to be assigned; readers see records below `highWatermark`. */
  logEndOffset: number;
  /** Offsets below this are durable per the topic's durability and readable. */
  highWatermark: number;
  sizeBytes: number;
  segments: number;
  /** Compacted topics only: share of sealed bytes not yet compacted (0..1; kept across restarts by the cleaner's checkpoint). */
  cleanerDirtyRatio?: number;
  /** Compacted topics only: bytes removed by compaction since the broker opened. */
  bytesReclaimed?: number;
  /** Compacted topics only: clock time of the last compaction pass since the broker opened, or null. */
  lastCleanedAt?: number | null;
  /** Compacted topics only: compaction passes completed since the broker opened. */
  cleanerPasses?: number;
  /** Compacted topics only: share (0..1) of the running compaction pass done; null when none runs. */
  cleanerPassProgress?: number | null;
  /** Archived topics only: bytes of the archived segments of this partition. */
  archivedBytes?: number;
  /** Archived topics only: segments in the archive. */
  archivedSegments?: number;
  /** Archived topics only: first offset held in the archive, null when nothing is archived. */
  archiveStartOffset?: number | null;
  /**
   * Archived topics only: bytes of local segments retention is waiting to delete that are not
   * archived yet (they stay on local disk until they are); 0 when archiving keeps up.
   */
  archiveLagBytes?: number;
  /** Archived topics only: bytes of record batches served from the archive to reads since the broker opened. */
  archiveReadBytes?: number;
}

/**
 * An open SQL transaction of the application's: for PostgreSQL, a `pg` client (`PoolClient`)
 * after `BEGIN`. See `PublishOptions.transaction`.
 */
export interface SqlTransaction {
  query<R extends Record<string, any> = any>(text: string, values?: any[]): Promise<{ rows: R[]; rowCount: number | null }>;
}

export interface PublishOptions {
  key?: string | Uint8Array | null;
  headers?: Headers;
  partition?: number;
  /** Record timestamp (ms since epoch). Default: now. */
  timestamp?: number;
  /**
   * Publish inside the application's own transaction (a transactional outbox without a
   * relay): the record takes its offset now and becomes readable when the caller commits; a
   * rollback leaves no trace, not even a used offset. The embedded broker on the PostgreSQL
   * engine only, with `tx` a client of the same database (`ValidationError` otherwise). Until
   * the caller commits or rolls back, other appends to the same partition wait.
   */
  transaction?: SqlTransaction;
}

export interface PublishRecord extends PublishOptions {
  value: PublishValue;
}

export interface PublishBatchOptions {
  /** Idempotent producing: id from `initProducer()`. Requires `partition` on every record
   * (or a single-partition topic) and `baseSequence`. */
  producerId?: number;
  producerEpoch?: number;
  /** Sequence number of the first record of this batch for this (producer, partition). */
  baseSequence?: number;
  signal?: AbortSignal;
  /** Publish inside the application's transaction: see `PublishOptions.transaction`. Not with `producerId`. */
  transaction?: SqlTransaction;
}

export interface PublishReceipt {
  topic: string;
  partition: number;
  offset: number;
  /** True when an idempotent retry matched a batch stored earlier: offset is the original. */
  duplicate: boolean;
  /** False only with `durability: interval|never`, when the ack precedes the fsync. */
  synced: boolean;
}

export interface ProducerIdentity {
  producerId: number;
  producerEpoch: number;
}

export interface ConsumedRecord<T = unknown> {
  topic: string;
  partition: number;
  offset: number;
  timestamp: number;
  key: Uint8Array | null;
  /** Decoded as published: bytes → Uint8Array, string → string, others → parsed JSON. */
  value: T;
  headers: Record<string, Uint8Array>;
}

export interface FetchOptions {
  /** Soft upper bound on bytes returned (at least one record is returned if one exists). Default 1 MiB. */
  maxBytes?: number;
  /** Long-poll: wait up to this long for a record at `offset`. Default 0. */
  maxWaitMs?: number;
  signal?: AbortSignal;
}

export interface FetchResult {
  records: ConsumedRecord[];
  /** Offset to fetch next. */
  nextOffset: number;
  highWatermark: number;
  logStartOffset: number;
}

export type StartPosition =
  | "earliest"
  | "latest"
  | { offset: number }
  | { timestamp: number };

export type OffsetResetPolicy = "earliest" | "latest" | "error";

export interface SubscribeOptions {
  group: string;
  /** Where a group with no committed offset starts. Default "latest". */
  start?: "earliest" | "latest";
  /** What to do when the committed offset is below the log start (retention). Default "earliest". */
  offsetReset?: OffsetResetPolicy;
  /** Partition assignment strategy across members. Default "range". */
  assignment?: "range" | "roundrobin";
  /** Max records buffered per partition fetch. Default 1 MiB of bytes. */
  maxBytes?: number;
  /**
   * Commits (`msg.commit()`, `batch.commit()`) made but not yet durable, counted in messages,
   * before the subscription stops handing out messages until they are. Bounds what is
   * redelivered after a crash when commits are not awaited. Default 10,000.
   */
  maxPendingCommits?: number;
  /**
   * Called after each change of this member's assignment (a rebalance), synchronously, before
   * messages of newly assigned partitions are handed out. Exceptions it throws are ignored.
   */
  onRebalance?: (event: SubscriptionStatus) => void;
  /**
   * When `signal` aborts while the loop holds a message (or batch): how long the member waits
   * for the loop to finish it (commit it, or come back for the next one) before leaving the
   * group. Nothing further is handed out meanwhile. Default 10,000 ms; 0 leaves at once.
   * `close()` always closes at once (after writing the commits already made).
   */
  drainTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface Message<T = unknown> extends ConsumedRecord<T> {
  /** Aborts when this partition is revoked from the member or the subscription closes. */
  readonly signal: AbortSignal;
  /**
   * True when the group has delivered this message before a `resetGroup` moved its position
   * back: the reset left a mark at the position the group had reached (the highest, after
   * several resets), and every message below it is a replay. The mark is stored with the
   * group's offsets (it survives restarts and moves with the partition on a rebalance) and is
   * cleared once the group commits at or past it, or a reset moves the group there. False for
   * every other delivery, including a redelivery of uncommitted messages after a crash or a
   * rebalance. See docs/patterns.md, "Safe replay".
   */
  readonly replay: boolean;
  /**
   * Marks "processed through this message" for the group. Commits made while an offsets write
   * is in flight share the next one; the promise resolves once a durable write covers this
   * message, and may be left un-awaited (it never rejects unhandled; a failed write is retried
   * while the partition stays assigned). See docs/guarantees.md for what a crash redelivers.
   */
  commit(): Promise<void>;
}

export interface MessageBatch<T = unknown> {
  readonly messages: Message<T>[];
  /** Commits the highest offset per partition in this batch (shared writes, as `msg.commit()`). */
  commit(): Promise<void>;
}

/**
 * A change of a member's assignment: `assigned` is its whole assignment after the change
 * (sorted), `revoked` the partitions this change took away from it.
 */
export type SubscriptionStatus =
  | { type: "group:rebalance"; generation: number; assigned: number[]; revoked: number[] };

export interface Subscription<T = unknown> extends AsyncIterable<Message<T>> {
  readonly group: string;
  readonly topic: string;
  /** Partitions currently assigned to this member. */
  assignment(): number[];
  batches(opts?: { maxMessages?: number; maxWaitMs?: number }): AsyncIterable<MessageBatch<T>>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export type ResetTarget =
  | "earliest"
  | "latest"
  | { offset: number }
  | { timestamp: number }
  | { shiftBy: number }
  /** Per partition (`{ partitions: { 0: 8200, 1: 7900 } }`); partitions not named keep their position. */
  | { partitions: Record<number, number> };

export interface ResetResult {
  group: string;
  topic: string;
  dryRun: boolean;
  partitions: { partition: number; previous: number | null; next: number }[];
}

export interface PartitionLag {
  partition: number;
  /** Next offset the group will consume (stored offset = last processed + 1); null if none. */
  committedOffset: number | null;
  logStartOffset: number;
  highWatermark: number;
  /** Records not yet processed by the group. */
  lagRecords: number;
  /** now − timestamp of the oldest unprocessed record, in ms; 0 when caught up. */
  lagMs: number;
  /**
   * Retention headroom: ms until time retention removes the oldest record the group still
   * needs (that record's timestamp + `retentionMs` − now; negative once it is overdue for
   * removal). When caught up, the whole retention period. null when the topic has no time
   * retention.
   */
  headroomMs: number | null;
}

/** One consumer group on one topic, as `listGroups()` reports it. */
export interface GroupListing {
  group: string;
  topic: string;
  /** Members subscribed now (in this broker; through a server, its members). */
  members: number;
  /** Partitions with a committed offset. */
  committedPartitions: number;
  /** Records the group has not processed yet, over all partitions. */
  lagRecords: number;
  /** Age of the oldest unprocessed record, ms (0 when caught up). */
  maxLagMs: number;
}

export interface GroupLag {
  group: string;
  topic: string;
  totalRecords: number;
  maxLagMs: number;
  /** Smallest headroom over the partitions (see PartitionLag.headroomMs); null: no time retention. */
  minHeadroomMs: number | null;
  /** Rebalance generation of the group on this topic (0: never had members here). */
  generation: number;
  /** Members subscribed now (in this broker; through a server, its members) and the partitions each owns. */
  members: { memberId: string; partitions: number[] }[];
  /**
   * The group's last offset resets on this topic (at most 10), newest first: when, and each
   * partition's committed offset before (null: none) and after.
   */
  recentResets: { at: number; partitions: { partition: number; from: number | null; to: number }[] }[];
  partitions: PartitionLag[];
}

export interface Broker {
  createTopic(name: string, config?: TopicConfig): Promise<TopicDescription>;
  deleteTopic(name: string): Promise<void>;
  listTopics(): Promise<string[]>;
  describeTopic(name: string): Promise<TopicDescription>;
  /**
   * Changes a topic's retention (`retentionMs`, `retentionBytes`) durably; the next retention
   * check applies it. Partitions, segment and durability settings are fixed at creation
   * (ValidationError names the key).
   */
  alterTopic(name: string, changes: TopicAlteration): Promise<TopicDescription>;
  publish(topic: string, value: PublishValue, opts?: PublishOptions): Promise<PublishReceipt>;
  publishBatch(topic: string, records: PublishRecord[], opts?: PublishBatchOptions): Promise<PublishReceipt[]>;
  /** Allocates a producer id (and epoch) for idempotent producing. Passing an existing id bumps its epoch, fencing older instances. */
  initProducer(producerId?: number): Promise<ProducerIdentity>;
  fetch(topic: string, partition: number, offset: number, opts?: FetchOptions): Promise<FetchResult>;
  /** First offset whose timestamp ≥ ts, or the high watermark if none. */
  offsetForTimestamp(topic: string, partition: number, timestamp: number): Promise<number>;
  subscribe<T = unknown>(topic: string, opts: SubscribeOptions): Subscription<T>;
  resetGroup(group: string, topic: string, to: ResetTarget, opts?: { dryRun?: boolean }): Promise<ResetResult>;
  /**
   * A durable work queue (leases, ack/nack, retries, DLQ): see docs/queues.md. With `config`
   * the queue is declared: created if missing, its config stored at once. Without, it is
   * created by its first write; reading one that does not exist raises QueueNotFoundError.
   */
  queue<T = unknown>(name: string, config?: QueueConfig): Queue<T>;
  /** Names of every queue (dead-letter queues included). */
  listQueues(): Promise<string[]>;
  groupLag(group: string, topic: string): Promise<GroupLag>;
  /** Every consumer group with committed offsets or members now, per topic; `topic` narrows it. */
  listGroups(opts?: { topic?: string }): Promise<GroupListing[]>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}
