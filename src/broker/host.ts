// SPDX-License-Identifier: Apache-2.0
/**
 * What the server (src/server) needs from a broker, as an interface: the embedded broker
 * implements it, and so do test doubles. The server calls these and nothing else; it never
 * probes for optional methods, so every remote operation has one path.
 */
import type { QueueHostApi } from "../queues/host-api.js";
import type { RawChunk } from "../streams/subscription.js";
import type { AuditActor, AuditRecord } from "../security/audit/record.js";
import type { ListOptions as AuditListOptions } from "../security/audit/reader.js";
import type { AuditTarget } from "../security/audit/auditor.js";
import type { Broker, ResetResult, ResetTarget, SubscribeOptions, Subscription, TopicAlteration, TopicConfig, TopicDescription } from "../types.js";

/** The outcome of appending one client-encoded batch. */
export interface EncodedAppend {
  baseOffset: number;
  count: number;
  /** True when an idempotent retry matched a batch stored earlier (its original offsets). */
  duplicate: boolean;
  synced: boolean;
}

/**
 * Told about a group member's rebalances as they happen, so a remote consumer can follow
 * them: the coordinator hands revoked partitions to their new owner only once `revoked`'s
 * promise settles (ownership was already dropped, GRP-1), so the server can wait for the
 * client to stop first.
 */
export interface MemberListener {
  revoked(partitions: number[], generation: number): Promise<void> | void;
  assigned(partitions: number[], generation: number): void;
}

/** A group member that the server drives for a consumer in another process. */
export interface MemberSubscription extends Subscription<unknown> {
  /** The group generation this member last saw. */
  readonly generation: number;
  /**
   * The next stored batches of an assigned partition (verified, not decoded), waiting for data
   * when all are caught up; null once closed. One read of at most `maxBytes`, no batch past
   * the one reaching `maxRecords`, at least one batch. Not mixed with the message iterators.
   */
  nextRaw(maxBytes: number, maxRecords?: number): Promise<RawChunk | null>;
  /** "Processed through" for several partitions in one durable write: partition -> next
   * offset to read. `NotAssignedError` for a partition this member does not own. */
  commitOffsets(next: Map<number, number>): Promise<void>;
}

/** The stream half: topics, publishing (also client-encoded batches), reads, groups. */
export interface StreamHost
  extends Pick<
    Broker,
    | "createTopic"
    | "alterTopic"
    | "deleteTopic"
    | "listTopics"
    | "describeTopic"
    | "publishBatch"
    | "initProducer"
    | "fetch"
    | "offsetForTimestamp"
    | "resetGroup"
    | "groupLag"
    | "listGroups"
  > {
  // Administrative operations take who asked (`actor`), for the audit log (AUD-1); the server
  // passes the connection's peer address.
  createTopic(name: string, config?: TopicConfig, actor?: AuditActor): Promise<TopicDescription>;
  alterTopic(name: string, changes: TopicAlteration, actor?: AuditActor): Promise<TopicDescription>;
  deleteTopic(name: string, actor?: AuditActor): Promise<void>;
  resetGroup(group: string, topic: string, to: ResetTarget, opts?: { dryRun?: boolean }, actor?: AuditActor): Promise<ResetResult>;
  /**
   * Appends one batch a client encoded in the storage format (base offset 0, CRC over it) to
   * one partition, validated completely first; producer fields come from the batch header.
   */
  publishEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<EncodedAppend>;
  /** Audit log records (`GET /v1/audit`): the last `limit`, or the first `limit` from `since`; [] without an audit log. */
  listAudit(opts: AuditListOptions): Promise<AuditRecord[]>;
  /**
   * Records an event the server observed (a login's result, AUD-4) in the audit log; resolves
   * once the record is durable (at once without an audit log). `error` undefined: it succeeded.
   */
  recordAudit(actor: AuditActor, target: AuditTarget, error?: unknown): Promise<void>;
  /** Joins `opts.group` for `topic` as a member whose rebalances `listener` hears of. */
  subscribeMember(topic: string, opts: SubscribeOptions, listener: MemberListener): MemberSubscription;
}

export interface BrokerHost extends StreamHost, QueueHostApi {}
