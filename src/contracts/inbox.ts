// SPDX-License-Identifier: Apache-2.0
/**
 * The idempotent consumer (inbox): a handler's business update and the record
 * `(consumer_name, message_id, processed_at)` are written in the **same database transaction**
 * of the application's own database, and a message whose id is already recorded is skipped.
 * A redelivery after a crash between that transaction and the broker commit (or ack) then
 * changes nothing (INBOX-1 in docs/ARCHITECTURE.md).
 *
 * For streams the same transaction can also store the partition's next offset
 * (`consumer_offsets`), so the application's database is the source of truth for its position;
 * `startOffsets()` reads it back.
 *
 * Stores: SQLite (better-sqlite3, stores/sqlite-inbox.ts) and PostgreSQL (pg,
 * stores/pg-inbox.ts); any other database implements `InboxStore`.
 */
import { ValidationError } from "../errors.js";
import type { Headers } from "../value-types.js";
import { messageIdOf } from "./envelope.js";

/** A database behind the inbox: one transaction per handled message. `Tx` is what handlers get. */
export interface InboxStore<Tx> {
  /** Creates the tables if missing (idempotent). */
  ensureSchema(): Promise<void>;
  /** Runs `fn` in one transaction: committed if it resolves, rolled back if it throws. */
  transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R>;
  /** Inside `tx`: records the message as processed; false when it already was. */
  claim(tx: Tx, consumer: string, messageId: string, processedAt: number): Promise<boolean>;
  /** Inside `tx`: stores the next offset to read of a partition (external offsets). */
  saveOffset(tx: Tx, consumer: string, topic: string, partition: number, nextOffset: number): Promise<void>;
  /** Next offsets per partition stored for a consumer and topic. */
  loadOffsets(consumer: string, topic: string): Promise<Map<number, number>>;
  /** Whether a message id is recorded for the consumer (outside any transaction). */
  isProcessed(consumer: string, messageId: string): Promise<boolean>;
  /** Deletes records older than `beforeMs` (ms since epoch); returns how many. */
  prune(consumer: string, beforeMs: number): Promise<number>;
}

/** What the inbox reads of a stream message or a job. */
export interface InboxMessage {
  headers?: Headers | Record<string, Uint8Array>;
  /** Streams: with `storeOffset`, the partition position is stored in the same transaction. */
  topic?: string;
  partition?: number;
  offset?: number;
  /** Jobs: the job id (used when the message carries no envelope id). */
  id?: string;
}

export interface InboxOptions {
  /** The consumer's name: ids are unique per consumer (two consumers may each process a message). */
  consumer: string;
  /** The message id; default: the envelope's `sluice-message-id`, else a job's id, else `topic/partition/offset`. */
  idOf?: (msg: InboxMessage) => string | null;
  /** Clock for `processed_at` (ms). */
  now?: () => number;
}

export interface HandleOptions {
  /** Streams: also store `offset + 1` for the message's partition in the same transaction. */
  storeOffset?: boolean;
}

export type HandleResult<R> = { duplicate: false; result: R } | { duplicate: true };

const NAME = /^[A-Za-z0-9._:-]{1,200}$/;

export class Inbox<Tx> {
  readonly consumer: string;
  private ready: Promise<void> | null = null;

  constructor(
    private readonly store: InboxStore<Tx>,
    private readonly opts: InboxOptions,
  ) {
    if (typeof opts?.consumer !== "string" || !NAME.test(opts.consumer)) throw new ValidationError(`inbox consumer name must match ${NAME}`);
    this.consumer = opts.consumer;
  }

  /**
   * Runs `fn(tx)` and records the message in one transaction, unless the message was processed
   * before (then `fn` is not called and `{ duplicate: true }` is returned). Commit or ack the
   * message after this resolves; a crash before that redelivers it, and the redelivery is a
   * duplicate here.
   */
  async handle<R>(msg: InboxMessage, fn: (tx: Tx) => Promise<R> | R, opts: HandleOptions = {}): Promise<HandleResult<R>> {
    await this.ensureSchema();
    const id = this.idOf(msg);
    if (opts.storeOffset && (msg.topic === undefined || msg.partition === undefined || msg.offset === undefined)) {
      throw new ValidationError("storeOffset needs a stream message (topic, partition, offset)");
    }
    return this.store.transaction(async (tx) => {
      // INBOX-1: the claim and the business update commit or roll back together.
      const fresh = await this.store.claim(tx, this.consumer, id, (this.opts.now ?? Date.now)());
      const outcome: HandleResult<R> = fresh ? { duplicate: false, result: await fn(tx) } : { duplicate: true };
      // A duplicate moves the stored position too: it was consumed, and skipping it is its processing.
      if (opts.storeOffset) await this.store.saveOffset(tx, this.consumer, msg.topic!, msg.partition!, msg.offset! + 1);
      return outcome;
    });
  }

  /**
   * `handle()` for many messages in one transaction (e.g. a `sub.batches()` batch): ids already
   * recorded, or repeated within the batch, are left out; `fn(tx, fresh)` gets the others in
   * their order; with `storeOffset`, each partition's highest offset + 1 is stored. Commit the
   * batch after this resolves. One transaction per batch instead of per message.
   */
  async handleBatch<M extends InboxMessage, R>(msgs: readonly M[], fn: (tx: Tx, fresh: M[]) => Promise<R> | R, opts: HandleOptions = {}): Promise<{ fresh: M[]; duplicates: number; result: R }> {
    await this.ensureSchema();
    const ids = msgs.map((m) => this.idOf(m));
    if (opts.storeOffset && msgs.some((m) => m.topic === undefined || m.partition === undefined || m.offset === undefined)) {
      throw new ValidationError("storeOffset needs stream messages (topic, partition, offset)");
    }
    return this.store.transaction(async (tx) => {
      const fresh: M[] = [];
      const now = (this.opts.now ?? Date.now)();
      // INBOX-1, per message: a claim that fails (recorded before, or earlier in this batch) leaves it out.
      for (let i = 0; i < msgs.length; i++) if (await this.store.claim(tx, this.consumer, ids[i], now)) fresh.push(msgs[i]);
      const result = await fn(tx, fresh);
      if (opts.storeOffset) {
        const high = new Map<string, { topic: string; partition: number; next: number }>();
        for (const m of msgs) {
          const k = `${m.partition}@${m.topic}`;
          const h = high.get(k);
          if (!h || m.offset! + 1 > h.next) high.set(k, { topic: m.topic!, partition: m.partition!, next: m.offset! + 1 });
        }
        for (const h of high.values()) await this.store.saveOffset(tx, this.consumer, h.topic, h.partition, h.next);
      }
      return { fresh, duplicates: msgs.length - fresh.length, result };
    });
  }

  /** The next offset per partition stored by `handle(..., { storeOffset: true })`. */
  async startOffsets(topic: string): Promise<Map<number, number>> {
    await this.ensureSchema();
    return this.store.loadOffsets(this.consumer, topic);
  }

  async isProcessed(msg: InboxMessage): Promise<boolean> {
    await this.ensureSchema();
    return this.store.isProcessed(this.consumer, this.idOf(msg));
  }

  /**
   * Forgets ids processed more than `olderThanMs` ago. Only safe for messages that can no longer
   * be redelivered (older than the topic's retention plus any replay you may run).
   */
  async prune(olderThanMs: number): Promise<number> {
    await this.ensureSchema();
    return this.store.prune(this.consumer, (this.opts.now ?? Date.now)() - olderThanMs);
  }

  private ensureSchema(): Promise<void> {
    this.ready ??= this.store.ensureSchema().catch((e: unknown) => {
      this.ready = null;
      throw e;
    });
    return this.ready;
  }

  private idOf(msg: InboxMessage): string {
    const id = this.opts.idOf ? this.opts.idOf(msg) : (messageIdOf(msg.headers as Headers | undefined) ?? msg.id ?? (msg.topic !== undefined && msg.partition !== undefined && msg.offset !== undefined ? `${msg.topic}/${msg.partition}/${msg.offset}` : null));
    if (typeof id !== "string" || id.length === 0 || id.length > 512) throw new ValidationError("the inbox needs a message id (1-512 characters): an envelope id, a job id, or a stream position");
    return id;
  }
}
