// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL storage engine: topics, partitions, idempotent producers, group offsets and
 * work queues in one PostgreSQL schema, so several broker nodes can share one store. It passes the same
 * engine contract as the disk engine (src/testing/engine-contract.ts).
 *
 * This is the facade; each job lives in its own file:
 *   database.ts        pool, schema-qualified names, transactions, pg errors -> StorageError
 *   migrations.ts      the schema, versioned, applied under an advisory lock
 *   topics.ts          topics and the name -> incarnation lookup
 *   partition-store.ts appends, reads, offsets, time lookups (one row per batch, disk format)
 *   producer-state.ts  producer ids, epochs, sequence state
 *   group-offsets.ts   committed offsets, replay marks, reset history
 *   group-membership.ts consumer groups across nodes: members, generations, owners (PG-1)
 *   retention.ts       retention by time and size
 *   notifier.ts        waitFor: LISTEN/NOTIFY with a polling fallback
 *   queues/            work queues, one row per job (queues/store.ts lists the parts)
 *
 * Not yet available here (refused clearly, never faked): the topic features key compaction,
 * archive and encryption at rest (refused at createTopic), and encrypted queues (refused with
 * a ValidationError at open, queues/store.ts). Every topic is durable on commit
 * whatever its `durability` (PostgreSQL's commit is the sync).
 */
import pg from "pg";
import { BrokerClosedError, ValidationError } from "../../errors.js";
import type { CommitFence } from "../group-coordination.js";
import { PgGroupMembership } from "./group-membership.js";
import type { PreparedRecord, ProducerInfo, StoredRecord } from "../../log/record-batch.js";
import type { Logger } from "../../observability/telemetry.js";
import type { TopicConfig, TopicDescription } from "../../types.js";
import type { AppendResult, CommittedOffset, EncodedBatches, EngineTopic, OffsetReset, PartitionOffsets, StorageEngine, TransactionalAppends } from "../engine.js";
import { Db, translateError } from "./database.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "./schema-name.js";
import { migrate } from "./migrations.js";
import { AppendNotifier } from "./notifier.js";
import { PartitionStore, partitionKey, StaleTopic, staleToNotFound } from "./partition-store.js";
import { allocateProducer } from "./producer-state.js";
import { PgGroupOffsets } from "./group-offsets.js";
import { enforcePartitionRetention } from "./retention.js";
import { checkPartition, TopicCatalog } from "./topics.js";
import { SchemaLock } from "./node-lock.js";
import { PgQueueStore } from "./queues/store.js";

export interface PostgresEngineOptions {
  /** Where to connect (ignored when `pool` is given). Default: the PG* environment variables. */
  connectionString?: string;
  /** A pool to use instead of one of the engine's own; the engine never ends it. */
  pool?: pg.Pool;
  /** The schema holding the engine's tables (created if needed). Default "sluice". */
  schema?: string;
  /** Connections of the engine's own pool (default DEFAULT_POOL_SIZE), plus one for LISTEN. */
  poolSize?: number;
  /**
   * Refuse to open while another node has this schema open (default false): for a deployment
   * that wants exactly one broker node on a schema. A second node gets DataDirLockedError
   * naming the holder. Several nodes are safe without it: consumer groups are coordinated
   * through the database (PG-1).
   */
  exclusive?: boolean;
  /** A consumer group member whose node is silent this long is removed and its partitions reassigned (default 10 s). */
  groupSessionTimeoutMs?: number;
  /** How often a node stamps its members' heartbeats and re-checks its groups' assignments (default 1 s). */
  groupHeartbeatMs?: number;
  /** Wall clock (tests). */
  now?: () => number;
  /** Where failures of background queue work (lease expiry, sweeps) are logged; default: nowhere. */
  logger?: Pick<Logger, "warn">;
}

export { DEFAULT_SCHEMA };
export const DEFAULT_POOL_SIZE = 10;

export function postgresEngine(opts: PostgresEngineOptions = {}): PostgresEngine {
  return new PostgresEngine(opts);
}

export class PostgresEngine implements StorageEngine {
  readonly kind = "postgres";
  /** Batches in the disk format: client batches stored as sent, raw reads for the server's push. */
  readonly encoded: EncodedBatches = {
    appendEncoded: (topic, partition, batch, signal) => this.onPartition(topic, partition, (t) => this.partitions.appendEncoded(t, partition, batch, signal)),
    readRaw: (topic, partition, offset, maxBytes, maxRecords) => this.onPartition(topic, partition, (t) => this.partitions.readRaw(t, partition, offset, maxBytes, maxRecords)),
  };
  /** Appends inside the application's transaction: `publish(..., { transaction })`. */
  readonly transactional: TransactionalAppends = {
    append: (tx, topic, partition, records) => this.onPartition(topic, partition, (t) => this.partitions.appendInTransaction(tx, t, partition, records)),
  };
  /** Work queues: one row per job (queues/store.ts). */
  readonly queues: PgQueueStore;
  /** Consumer groups shared by every broker node on the schema (group-membership.ts, PG-1). */
  readonly groupCoordination: PgGroupMembership;
  private readonly pool: pg.Pool;
  private readonly ownsPool: boolean;
  private readonly db: Db;
  private readonly topics: TopicCatalog;
  private readonly partitions: PartitionStore;
  private readonly groups: PgGroupOffsets;
  private readonly notifier: AppendNotifier;
  private readonly now: () => number;
  private state: "new" | "open" | "closed" = "new";
  /** Held while open with `exclusive: true`, else null. */
  readonly schemaLock: SchemaLock | null;

  constructor(opts: PostgresEngineOptions = {}) {
    const schema = validateSchemaName(opts.schema ?? DEFAULT_SCHEMA);
    this.now = opts.now ?? Date.now;
    this.ownsPool = opts.pool === undefined;
    const clientConfig: pg.ClientConfig = opts.pool ? { ...opts.pool.options } : { connectionString: opts.connectionString };
    this.pool = opts.pool ?? new pg.Pool({ connectionString: opts.connectionString, max: opts.poolSize ?? DEFAULT_POOL_SIZE });
    // An idle connection that dies is replaced on next use; without a listener it would crash the process.
    if (this.ownsPool) this.pool.on("error", () => {});
    this.db = new Db(this.pool, schema);
    this.topics = new TopicCatalog(this.db, this.now);
    this.notifier = new AppendNotifier(clientConfig, (keys) => this.partitions.ends(keys));
    this.partitions = new PartitionStore(this.db, (key, end) => this.notifier.notify(key, end));
    this.groups = new PgGroupOffsets(this.db, this.now);
    this.schemaLock = opts.exclusive === true ? new SchemaLock(clientConfig, schema) : null;
    for (const [name, v] of [["groupSessionTimeoutMs", opts.groupSessionTimeoutMs], ["groupHeartbeatMs", opts.groupHeartbeatMs]] as const) {
      if (v !== undefined && (!Number.isInteger(v) || v < 10)) throw new ValidationError(`${name} must be an integer number of milliseconds >= 10, got ${String(v)}`);
    }
    this.groupCoordination = new PgGroupMembership(this.db, clientConfig, { sessionTimeoutMs: opts.groupSessionTimeoutMs, heartbeatMs: opts.groupHeartbeatMs, logger: opts.logger });
    this.queues = new PgQueueStore({ db: this.db, clientConfig, now: this.now, logger: opts.logger });
  }

  /** Connects, applies migrations, starts listening for appends. */
  async open(): Promise<void> {
    if (this.state !== "new") throw new BrokerClosedError("a PostgresEngine opens once; create a new one to reopen");
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (e) {
      throw translateError(e);
    }
    try {
      await migrate(client, this.db.t, this.db.schemaName);
    } catch (e) {
      throw translateError(e);
    } finally {
      client.release();
    }
    try {
      await this.schemaLock?.acquire();
    } catch (e) {
      // Refused (another node holds the schema) or unreachable: leave nothing open behind.
      this.state = "closed";
      if (this.ownsPool) await this.pool.end().catch(() => {});
      throw e;
    }
    await this.notifier.start();
    await this.queues.start();
    await this.groupCoordination.start();
    this.state = "open";
  }

  async close(): Promise<void> {
    if (this.state === "closed") return;
    this.state = "closed";
    await this.groupCoordination.close();
    await this.queues.close();
    await this.notifier.close();
    await this.schemaLock?.release();
    if (this.ownsPool) await this.pool.end();
  }

  private check(): void {
    if (this.state !== "open") throw new BrokerClosedError(this.state === "new" ? "engine is not open" : "broker is closed");
    // With `exclusive`, without the lock another node may be serving this schema.
    if (this.schemaLock?.lost) throw this.schemaLock.lost;
  }

  /**
   * Runs `fn` on the topic's current incarnation. The cached incarnation may be stale (the
   * topic deleted, perhaps re-created, by another node): then once more on a fresh lookup.
   */
  private async onTopic<T>(name: string, fn: (t: EngineTopic) => Promise<T>): Promise<T> {
    this.check();
    const t = await this.topics.lookup(name);
    try {
      return await fn(t);
    } catch (e) {
      if (!(e instanceof StaleTopic)) throw e;
      this.topics.forget(name, t.topicId);
      const fresh = await this.topics.get(name);
      try {
        return await fn(fresh);
      } catch (e2) {
        throw staleToNotFound(e2);
      }
    }
  }

  private onPartition<T>(name: string, partition: number, fn: (t: EngineTopic) => Promise<T>): Promise<T> {
    return this.onTopic(name, async (t) => {
      checkPartition(t, partition);
      return fn(t);
    });
  }

  // ── topics ──

  async createTopic(name: string, config: Required<TopicConfig>): Promise<EngineTopic> {
    this.check();
    return this.topics.create(name, config);
  }
  async deleteTopic(name: string): Promise<void> {
    this.check();
    return this.topics.delete(name);
  }
  async listTopics(): Promise<string[]> {
    this.check();
    return this.topics.list();
  }
  async getTopic(name: string): Promise<EngineTopic> {
    this.check();
    return this.topics.get(name);
  }
  async describeTopic(name: string): Promise<TopicDescription> {
    this.check();
    return this.topics.describe(name);
  }
  async alterTopic(name: string, changes: { retentionMs?: number; retentionBytes?: number }): Promise<EngineTopic> {
    this.check();
    return this.topics.alter(name, changes);
  }

  // ── partitions ──

  append(topic: string, partition: number, records: PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult> {
    return this.onPartition(topic, partition, (t) => this.partitions.append(t, partition, records, producer, signal));
  }
  read(topic: string, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    return this.onPartition(topic, partition, (t) => this.partitions.read(t, partition, offset, maxBytes));
  }
  waitFor(topic: string, partition: number, offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    return this.onPartition(topic, partition, (t) =>
      this.notifier.wait(partitionKey(t.topicId, partition), offset, maxWaitMs, async () => (await this.partitions.offsets(t, partition)).highWatermark, signal),
    );
  }
  offsets(topic: string, partition: number): Promise<PartitionOffsets> {
    return this.onPartition(topic, partition, (t) => this.partitions.offsets(t, partition));
  }
  offsetForTimestamp(topic: string, partition: number, ts: number): Promise<number> {
    return this.onPartition(topic, partition, (t) => this.partitions.offsetForTimestamp(t, partition, ts));
  }

  /** Retention of every partition; one that fails does not hold back the others (first error raised at the end). */
  async enforceRetention(now = this.now()): Promise<void> {
    this.check();
    let first: unknown = null;
    for (const t of await this.topics.all()) {
      for (let p = 0; p < t.config.partitions; p++) {
        try {
          await enforcePartitionRetention(this.db, t, p, now);
        } catch (e) {
          first ??= e;
        }
      }
    }
    if (first !== null) throw first;
  }

  // ── idempotent producers ──

  allocateProducer(producerId?: number): Promise<{ producerId: number; producerEpoch: number }> {
    this.check();
    return allocateProducer(this.db, producerId);
  }

  // ── group offsets ──

  /** Group calls read the topic row (not the cache): positions must never attach to a stale incarnation. */
  private async current(topic: string): Promise<EngineTopic> {
    this.check();
    return this.topics.get(topic);
  }
  async getCommitted(group: string, topic: string): Promise<Map<number, CommittedOffset>> {
    return this.groups.get(group, await this.current(topic));
  }
  async commitOffsets(group: string, topic: string, offsets: Map<number, number>, fence?: CommitFence): Promise<void> {
    return this.groups.commit(group, await this.current(topic), offsets, fence);
  }
  async resetOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void> {
    return this.groups.reset(group, await this.current(topic), offsets);
  }
  async recentResets(group: string, topic: string): Promise<OffsetReset[]> {
    return this.groups.resets(group, await this.current(topic));
  }
  async listCommittedGroups(): Promise<{ group: string; topic: string }[]> {
    this.check();
    return this.groups.list();
  }
}
