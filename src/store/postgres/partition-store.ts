// SPDX-License-Identifier: Apache-2.0
/**
 * Partitions of the PostgreSQL engine: appends (records and client-encoded batches), reads
 * (records and raw batches), offsets and time lookups.
 *
 * Why this shape:
 *  - One row per batch, in the disk engine's batch format stamped with its real base offset:
 *    the CRC-32C covers the offsets, every read verifies it (LOG-2: a damaged or misplaced
 *    batch is never served), and raw reads return the stored bytes unchanged.
 *  - An append is one transaction: lock the partition row (`FOR UPDATE`), check the producer
 *    (epoch, sequence), insert the batch at `next_offset`, advance it, notify, commit. Offsets
 *    are allocated by the transaction that inserts them, so they are gap-free and a reader
 *    never sees a hole. With synchronous_commit on (the default), COMMIT returns after the WAL
 *    flush, so `synced: true` means what it means on disk (LOG-3: readers see only committed,
 *    i.e. durable, batches; high watermark = log end).
 *  - Appends to one partition from this process are issued one after the other, in arrival
 *    order, so pipelined batches of one producer reach the sequence check in the order sent
 *    (as the disk engine's enqueue); other nodes are ordered by the row lock.
 *  - Sizes are checked before the database is asked anything, with the disk engine's own
 *    functions and limits (encodeAppend with maxMessageBytes, validateEncodedBatch and
 *    checkRecordSizes with MAX_BATCH_BYTES).
 */
import { AbortedError, CorruptRecordError, InvalidBatchError, OffsetOutOfRangeError, TopicNotFoundError, ValidationError } from "../../errors.js";
import { checkRecordSizes, encodeAppend } from "../../log/partition-log.js";
import { ProducerStateManager } from "../../log/producer-state.js";
import { decodeRecords, MAX_BATCH_BYTES, readHeader, restampBatch, stampBatch, validateEncodedBatch, verifyBatch, type BatchHeader, type PreparedRecord, type ProducerInfo, type StoredRecord } from "../../log/record-batch.js";
import type { AppendResult, EngineTopic, PartitionOffsets } from "../engine.js";
import { num, translateError, type Db } from "./database.js";
import type { SqlTransaction } from "../../types.js";
import { APPEND_CHANNEL } from "./notifier.js";
import { checkProducerEpoch, checkSequence } from "./producer-state.js";

/** Most batch rows one read fetches (each holds at least one record). */
const MAX_BATCHES_PER_READ = 1000;

export const partitionKey = (topicId: string, partition: number): string => `${topicId}:${partition}`;

/** The partition row of a topic incarnation is gone: the topic was deleted (maybe elsewhere). */
export class StaleTopic extends Error {}

interface BatchRow {
  base_offset: string;
  last_offset: string;
  bytes: number;
  data: Buffer;
}

export class PartitionStore {
  /** Per partition, the tail of this process's appends (arrival order). */
  private lanes = new Map<string, Promise<unknown>>();

  constructor(
    private readonly db: Db,
    /** Called after an append committed: the partition's new log end. */
    private readonly appended: (key: string, end: number) => void,
  ) {}

  /** Validates and encodes records (before any database call), then appends the batch. */
  append(topic: EngineTopic, partition: number, records: readonly PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult> {
    if (records.length === 0) throw new ValidationError("append needs at least one record");
    const buf = encodeAppend(records, producer, topic.config.maxMessageBytes);
    return this.store(topic, partition, buf, readHeader(buf, 0), producer, signal, false);
  }

  /** A client-encoded batch, validated completely (as PartitionLog.appendEncoded) first. */
  async appendEncoded(topic: EngineTopic, partition: number, buf: Buffer, signal?: AbortSignal): Promise<AppendResult & { count: number }> {
    const { header: h, maxRecordBytes } = validateEncodedBatch(buf, MAX_BATCH_BYTES);
    if (maxRecordBytes > topic.config.maxMessageBytes) checkRecordSizes(buf, h, topic.config.maxMessageBytes);
    const producer = h.producerId >= 0 ? { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence } : undefined;
    if (producer) ProducerStateManager.validate(producer, h.count);
    const r = await this.store(topic, partition, buf, h, producer, signal, true);
    return { ...r, count: h.count };
  }

  /** Queues the append behind this process's earlier appends to the partition. */
  private store(topic: EngineTopic, partition: number, buf: Buffer, h: BatchHeader, producer: ProducerInfo | undefined, signal: AbortSignal | undefined, crcValid: boolean): Promise<AppendResult> {
    const key = partitionKey(topic.topicId, partition);
    const run = (this.lanes.get(key) ?? Promise.resolve()).then(
      () => this.transact(topic, partition, buf, h, producer, signal, crcValid),
      () => this.transact(topic, partition, buf, h, producer, signal, crcValid),
    );
    const tail = run.catch(() => {});
    this.lanes.set(key, tail);
    void tail.then(() => {
      if (this.lanes.get(key) === tail) this.lanes.delete(key);
    });
    return run;
  }

  private async transact(topic: EngineTopic, partition: number, buf: Buffer, h: BatchHeader, producer: ProducerInfo | undefined, signal: AbortSignal | undefined, crcValid: boolean): Promise<AppendResult> {
    if (signal?.aborted) throw new AbortedError("append aborted before it was stored", signal.reason);
    const result = await this.db.tx((c) => this.appendWith(c, topic, partition, buf, h, producer, crcValid));
    if (result.end >= 0) this.appended(partitionKey(topic.topicId, partition), result.end);
    // Committed with synchronous_commit on: durable, as an fdatasync'd disk append.
    return { baseOffset: result.baseOffset, duplicate: result.duplicate, synced: true };
  }

  /**
   * Appends inside the caller's open transaction (TransactionalAppends). Not queued behind
   * this process's other appends to the partition: the caller's transaction holds the
   * partition's row lock until it ends, and an append queued behind one waiting for that lock
   * would never run. Readers and local waiters learn of it from the NOTIFY, which PostgreSQL
   * delivers only at commit; before that the batch is invisible, after a rollback it never was.
   */
  async appendInTransaction(tx: SqlTransaction, topic: EngineTopic, partition: number, records: readonly PreparedRecord[]): Promise<AppendResult> {
    if (records.length === 0) throw new ValidationError("append needs at least one record");
    const buf = encodeAppend(records, undefined, topic.config.maxMessageBytes);
    let r: { baseOffset: number };
    try {
      r = await this.appendWith(tx, topic, partition, buf, readHeader(buf, 0), undefined, false);
    } catch (e) {
      throw translateError(e);
    }
    // Durable when the caller's COMMIT returns, not before: synced is the caller's to know.
    return { baseOffset: r.baseOffset, duplicate: false, synced: false };
  }

  /** The statements of one append, on a connection inside a transaction (the engine's or the caller's). */
  private async appendWith(c: SqlTransaction, topic: EngineTopic, partition: number, buf: Buffer, h: BatchHeader, producer: ProducerInfo | undefined, crcValid: boolean): Promise<{ baseOffset: number; duplicate: boolean; end: number }> {
    const t = this.db.t;
    const count = h.count;
    {
      const p = await c.query<{ next_offset: string; max_timestamp: string }>(`SELECT next_offset, max_timestamp FROM ${t.partitions} WHERE topic_id = $1 AND partition = $2 FOR UPDATE`, [topic.topicId, partition]);
      if (p.rowCount === 0) throw new StaleTopic(topic.name);
      const base = num(p.rows[0].next_offset);
      // The time index: the partition's largest timestamp so far, this batch's included.
      const timeIndex = Math.max(num(p.rows[0].max_timestamp), h.maxTimestamp);
      let record: ((baseOffset: number, ts: number) => Promise<void>) | null = null;
      if (producer) {
        await checkProducerEpoch(c, this.db, producer);
        const s = await checkSequence(c, this.db, topic.topicId, partition, producer, count);
        if (s.duplicate) return { baseOffset: s.baseOffset, duplicate: true, end: -1 };
        record = s.record;
      }
      // The CRC is set once the offset is known; a verified client batch keeps its own CRC,
      // patched for the offset (restampBatch), so it stays covered end to end.
      if (crcValid) restampBatch(buf, base);
      else stampBatch(buf, base);
      const end = base + count;
      await c.query(
        `INSERT INTO ${t.batches} (topic_id, partition, base_offset, last_offset, first_timestamp, max_timestamp, record_count, bytes, data, time_index)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
        [topic.topicId, partition, base, end - 1, h.firstTimestamp, h.maxTimestamp, count, buf.length, buf, timeIndex],
      );
      if (record !== null) await record(base, h.maxTimestamp);
      await c.query(`UPDATE ${t.partitions} SET next_offset = $3, max_timestamp = $4 WHERE topic_id = $1 AND partition = $2`, [topic.topicId, partition, end, timeIndex]);
      await c.query(`SELECT pg_notify($1, $2)`, [APPEND_CHANNEL, `${partitionKey(topic.topicId, partition)}:${end}`]);
      return { baseOffset: base, duplicate: false, end };
    }
  }

  async offsets(topic: EngineTopic, partition: number): Promise<PartitionOffsets> {
    const r = await this.db.query<{ next_offset: string; log_start_offset: string }>(
      `SELECT next_offset, log_start_offset FROM ${this.db.t.partitions} WHERE topic_id = $1 AND partition = $2`,
      [topic.topicId, partition],
    );
    if (r.rowCount === 0) throw new StaleTopic(topic.name);
    const end = num(r.rows[0].next_offset);
    return { logStartOffset: num(r.rows[0].log_start_offset), highWatermark: end, logEndOffset: end };
  }

  /** Log ends of several partitions ("topicId:partition" keys), for the waiters' polling. */
  async ends(keys: string[]): Promise<Map<string, number>> {
    const ids = keys.map((k) => k.slice(0, k.lastIndexOf(":")));
    const parts = keys.map((k) => Number(k.slice(k.lastIndexOf(":") + 1)));
    const r = await this.db.query<{ topic_id: string; partition: number; next_offset: string }>(
      `SELECT p.topic_id, p.partition, p.next_offset FROM ${this.db.t.partitions} p
         JOIN unnest($1::uuid[], $2::int[]) AS k(topic_id, partition) ON p.topic_id = k.topic_id AND p.partition = k.partition`,
      [ids, parts],
    );
    return new Map(r.rows.map((x) => [partitionKey(x.topic_id, x.partition), num(x.next_offset)]));
  }

  /**
   * Batches from the one holding `offset`, in offset order, at most `limit` rows and no row
   * starting at or beyond `maxBytes` of batches before it. Checks the range first
   * (OffsetOutOfRangeError outside [logStart, end]); none at the end.
   */
  private async batchesFrom(topic: EngineTopic, partition: number, offset: number, maxBytes: number, limit: number): Promise<BatchRow[]> {
    if (!Number.isSafeInteger(offset)) throw new ValidationError(`invalid offset ${offset}`);
    const o = await this.offsets(topic, partition);
    if (offset < o.logStartOffset || offset > o.highWatermark) throw new OffsetOutOfRangeError(topic.name, partition, offset, o.logStartOffset, o.highWatermark);
    if (offset === o.highWatermark) return [];
    const t = this.db.t;
    const r = await this.db.query<BatchRow>(
      `SELECT base_offset, last_offset, bytes, data FROM (
         SELECT base_offset, last_offset, bytes, data, sum(bytes) OVER (ORDER BY base_offset) - bytes AS before
           FROM ${t.batches}
          WHERE topic_id = $1 AND partition = $2
            AND base_offset >= COALESCE((SELECT base_offset FROM ${t.batches} WHERE topic_id = $1 AND partition = $2 AND base_offset <= $3 ORDER BY base_offset DESC LIMIT 1), $3)
          ORDER BY base_offset LIMIT $5) s
        WHERE before < $4 ORDER BY base_offset`,
      [topic.topicId, partition, offset, Math.max(1, maxBytes), limit],
    );
    if (r.rows.length === 0 || num(r.rows[0].base_offset) > offset || num(r.rows[0].last_offset) < offset) {
      // Retention removed the batch between the range check and the read.
      const now = await this.offsets(topic, partition);
      throw new OffsetOutOfRangeError(topic.name, partition, offset, now.logStartOffset, now.highWatermark);
    }
    return r.rows;
  }

  /** A stored batch, verified (LOG-2: CRC, structure, and that it sits where its row says). */
  private verify(topic: EngineTopic, partition: number, row: BatchRow): BatchHeader {
    const base = num(row.base_offset);
    try {
      const h = verifyBatch(row.data, 0, row.data.length);
      if (h.length !== row.data.length || h.baseOffset !== base || h.baseOffset + h.count - 1 !== num(row.last_offset)) throw new InvalidBatchError(`batch does not match its row (base ${h.baseOffset}, count ${h.count})`);
      return h;
    } catch (e) {
      if (!(e instanceof InvalidBatchError)) throw e;
      throw new CorruptRecordError(topic.name, partition, base, `postgres:${this.db.schemaName}.batches`, 0, e.message, num(row.last_offset) + 1);
    }
  }

  /** Records from `offset`, about `maxBytes` of batches, at least one batch (as LogReader.read). */
  async read(topic: EngineTopic, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    const rows = await this.batchesFrom(topic, partition, offset, maxBytes, MAX_BATCHES_PER_READ);
    const out: StoredRecord[] = [];
    for (const row of rows) {
      const before = out.length;
      try {
        decodeRecords(row.data, 0, this.verify(topic, partition, row), offset, out);
      } catch (e) {
        if (!(e instanceof CorruptRecordError || e instanceof InvalidBatchError)) throw e;
        // Nothing of a damaged batch is served; what precedes it is, and a read that starts at it reports it.
        out.length = before;
        if (out.length > 0) break;
        if (e instanceof CorruptRecordError) throw e;
        throw new CorruptRecordError(topic.name, partition, num(row.base_offset), `postgres:${this.db.schemaName}.batches`, 0, e.message, num(row.last_offset) + 1);
      }
    }
    return { records: out, nextOffset: out.length > 0 ? out[out.length - 1].offset + 1 : offset };
  }

  /** Whole stored batches from `offset` as bytes (EncodedBatches.readRaw, as LogReader.readRaw). */
  async readRaw(topic: EngineTopic, partition: number, offset: number, maxBytes: number, maxRecords = Infinity): Promise<{ data: Buffer; nextOffset: number; records: number }> {
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new ValidationError(`invalid maxBytes ${maxBytes}`);
    const limit = Number.isFinite(maxRecords) ? Math.max(1, Math.min(MAX_BATCHES_PER_READ, maxRecords)) : MAX_BATCHES_PER_READ;
    const rows = await this.batchesFrom(topic, partition, offset, maxBytes, limit);
    const parts: Buffer[] = [];
    let bytes = 0;
    let records = 0;
    let next = offset;
    for (const row of rows) {
      if (parts.length > 0 && (bytes + row.data.length > maxBytes || records >= maxRecords)) break;
      let h: BatchHeader;
      try {
        h = this.verify(topic, partition, row);
      } catch (e) {
        if (parts.length > 0 && e instanceof CorruptRecordError) break;
        throw e;
      }
      parts.push(row.data);
      bytes += row.data.length;
      records += h.baseOffset + h.count - Math.max(h.baseOffset, offset);
      next = h.baseOffset + h.count;
    }
    return { data: parts.length === 1 ? parts[0] : Buffer.concat(parts), nextOffset: next, records };
  }

  /** First offset whose timestamp is >= ts; the log end if there is none. */
  async offsetForTimestamp(topic: EngineTopic, partition: number, ts: number): Promise<number> {
    const t = this.db.t;
    const o = await this.offsets(topic, partition);
    // The first batch whose time index (largest timestamp up to it) reaches ts is the first
    // whose own records do: one probe of batches_time. Its running maximum may come from a
    // batch retention removed since; then its records are all earlier and the next one is read.
    for (let from = o.logStartOffset; ; ) {
      const r = await this.db.query<BatchRow>(
        `SELECT base_offset, last_offset, bytes, data FROM ${t.batches}
          WHERE topic_id = $1 AND partition = $2 AND time_index >= $4 AND base_offset >= $3
          ORDER BY time_index, base_offset LIMIT 1`,
        [topic.topicId, partition, from, ts],
      );
      if (r.rows.length === 0) return o.highWatermark;
      const row = r.rows[0];
      const h = this.verify(topic, partition, row);
      for (const rec of decodeRecords(row.data, 0, h, o.logStartOffset)) if (rec.timestamp >= ts) return rec.offset;
      from = num(row.last_offset) + 1;
    }
  }
}

/** Maps StaleTopic to the error callers expect once a fresh lookup failed too. */
export function staleToNotFound(e: unknown): unknown {
  return e instanceof StaleTopic ? new TopicNotFoundError(e.message) : e;
}
