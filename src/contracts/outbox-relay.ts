// SPDX-License-Identifier: Apache-2.0
/**
 * The outbox relay: publishes `message_outbox` rows to a topic, keyed by aggregate id (so one
 * aggregate's messages keep their order in one partition), as an idempotent producer whose
 * state lives in the outbox's database (OUTBOX-1, see outbox.ts):
 *
 *   plan (one transaction: pending batches, or new ones with their base sequences)
 *   → publishBatch per partition with producer id, epoch and base sequence
 *   → complete (one transaction: rows marked published, pending forgotten)
 *
 * A relay killed anywhere re-plans the same pending batches and re-publishes them; the broker
 * answers a re-published batch with the offsets it stored the first time (`duplicate: true`).
 * Each record carries an envelope whose message id is the row's `message_id`.
 */
import type { Broker, PublishRecord } from "../types.js";
import { BrokerError, ValidationError } from "../errors.js";
import { partitionForKey } from "../streams/murmur2.js";
import { envelope } from "./envelope.js";
import { sleepUnlessAborted, type OutboxRow, type OutboxStore, type PlannedBatch, type RelayIdentity } from "./outbox.js";

/** The broker calls the relay uses (an embedded broker or a `connect()` client). */
export type RelayBroker = Pick<Broker, "publishBatch" | "describeTopic" | "initProducer">;

export interface OutboxRelayOptions {
  /** Topic of every row, or per row (e.g. from its aggregate type). */
  topic: string | ((row: OutboxRow) => string);
  /** The relay's name: its producer state is stored under it. One relay name per outbox. Default "default". */
  name?: string;
  /** Rows per round. Default 500. */
  batchSize?: number;
  /** Longest idle wait between rounds when no notification comes. Default 1,000 ms. */
  idleWaitMs?: number;
  /** Called with an error the relay will retry (after a backoff); default: ignored. */
  onError?: (error: unknown) => void;
}

export class OutboxRelay {
  readonly name: string;
  private identity: RelayIdentity | null = null;
  private readonly partitions = new Map<string, number>();
  private published = 0;

  constructor(
    private readonly broker: RelayBroker,
    private readonly store: OutboxStore,
    private readonly opts: OutboxRelayOptions,
  ) {
    this.name = opts.name ?? "default";
    if (!/^[A-Za-z0-9._:-]{1,200}$/.test(this.name)) throw new ValidationError("outbox relay name must be 1-200 characters of [A-Za-z0-9._:-]");
    const size = opts.batchSize ?? 500;
    if (!Number.isSafeInteger(size) || size < 1 || size > 100_000) throw new ValidationError("outbox relay batchSize must be an integer in [1, 100000]");
  }

  /** Rows published by this relay object since it was created. */
  get publishedRows(): number {
    return this.published;
  }

  /** One round: plans, publishes and completes up to `batchSize` rows; returns how many (OUTBOX-1). */
  async runOnce(): Promise<number> {
    const id = await this.ensureIdentity();
    await this.loadPartitions();
    const batches = await this.store.plan(this.name, this.opts.batchSize ?? 500, (row) => this.place(row));
    if (batches.length === 0) return 0;
    await Promise.all(batches.map((b) => this.publish(b, id)));
    await this.store.complete(this.name, batches, Date.now());
    const n = batches.reduce((s, b) => s + b.rows.length, 0);
    this.published += n;
    return n;
  }

  /**
   * Runs rounds until `signal` aborts: at once while rows are waiting, else after a
   * notification or `idleWaitMs`. Retriable failures (connection lost, storage busy, database
   * down) are retried with backoff; a non-retriable broker error (e.g. the producer was fenced)
   * ends the run with it.
   */
  async run(signal: AbortSignal): Promise<void> {
    let backoffMs = 0;
    while (!signal.aborted) {
      try {
        const n = await this.runOnce();
        backoffMs = 0;
        if (n === 0) await this.store.waitForRows(this.opts.idleWaitMs ?? 1000, signal);
      } catch (e) {
        if (signal.aborted) break;
        if (e instanceof BrokerError && !e.retriable) throw e;
        this.opts.onError?.(e);
        backoffMs = Math.min(5_000, Math.max(50, backoffMs * 2));
        await sleepUnlessAborted(backoffMs * (0.5 + Math.random() / 2), signal);
      }
    }
  }

  backlog(): Promise<{ rows: number; oldestAgeMs: number }> {
    return this.store.backlog(Date.now());
  }

  private async ensureIdentity(): Promise<RelayIdentity> {
    if (this.identity) return this.identity;
    await this.store.ensureSchema();
    let id = await this.store.loadIdentity(this.name);
    // A relay that never ran gets a new producer id; a restarted one keeps its id and epoch, so
    // its re-published pending batches are recognised as duplicates (bumping the epoch would
    // restart its sequences and lose that).
    if (!id) id = await this.store.saveIdentity(this.name, await this.broker.initProducer());
    this.identity = id;
    return id;
  }

  private async loadPartitions(): Promise<void> {
    if (typeof this.opts.topic === "string" && !this.partitions.has(this.opts.topic)) {
      this.partitions.set(this.opts.topic, (await this.broker.describeTopic(this.opts.topic)).partitions.length);
    }
  }

  private place(row: OutboxRow): { topic: string; partition: number } {
    const topic = typeof this.opts.topic === "string" ? this.opts.topic : this.opts.topic(row);
    const n = this.partitions.get(topic);
    if (n === undefined) throw new ValidationError(`outbox relay: topic ${JSON.stringify(topic)} not described yet (describeTopic first)`);
    return { topic, partition: partitionForKey(Buffer.from(row.aggregateId, "utf8"), n) };
  }

  private async publish(b: PlannedBatch, id: RelayIdentity): Promise<void> {
    const records: PublishRecord[] = b.rows.map((r) => ({
      partition: b.partition,
      key: r.aggregateId,
      value: JSON.parse(r.payloadJson) as PublishRecord["value"],
      headers: { ...envelope({ messageId: r.messageId, type: r.type, occurredAt: r.createdAt }), "sluice-aggregate-type": r.aggregateType, "sluice-aggregate-id": r.aggregateId },
    }));
    await this.broker.publishBatch(b.topic, records, { producerId: id.producerId, producerEpoch: id.producerEpoch, baseSequence: b.baseSequence });
  }

  /** Describes the topics a per-row topic function may return, before the first round. */
  async prepareTopics(topics: string[]): Promise<void> {
    for (const t of topics) this.partitions.set(t, (await this.broker.describeTopic(t)).partitions.length);
  }
}
