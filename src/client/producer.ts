// SPDX-License-Identifier: Apache-2.0
/**
 * Client-side batching and idempotent producing.
 *
 * `publish()` calls are gathered per (topic, partition) for up to `lingerMs` (0 = until the
 * current event-loop turn ends) or until a batch reaches `maxBatchRecords`/`maxBatchBytes`,
 * then sent as one PUBLISH frame. Several batches may be in flight at once (pipelining).
 *
 * Idempotence: the client picks the partition itself (Kafka's murmur2 for keys, a sticky
 * partition per batch otherwise) so that every batch carries producerId, epoch and the
 * per-partition sequence of its first record. A batch whose connection drops is re-sent on the
 * next connection with the same sequence, and the broker answers a batch it already stored
 * with its original offsets (`duplicate: true`): retries never duplicate.
 *
 * When a batch fails for good (e.g. RECORD_TOO_LARGE), later batches of that partition were
 * already numbered after it, so the broker would see a sequence gap. We then bump the producer
 * epoch (initProducer with the same id), which restarts all sequences at 0, and re-send the
 * batches that the old epoch could no longer place.
 */
import { RecordTooLargeError, ValidationError } from "../errors.js";
import { encodeBatch, prepareValue, recordSize, stampBatch, type PreparedRecord } from "../log/record-batch.js";
import { partitionForKey } from "../streams/murmur2.js";
import type { PublishReceipt, PublishRecord } from "../types.js";
import { Op } from "../server/protocol.js";
import type { Transport } from "./transport.js";

export interface ProducerOptions {
  lingerMs: number;
  maxBatchRecords: number;
  maxBatchBytes: number;
  idempotent: boolean;
  /** Upper bound on records accepted but not yet acknowledged; publish() waits beyond it. */
  maxBufferedRecords: number;
}

/** The records of one send() call for one partition (one promise for all of them). */
interface Item {
  /** Validated and converted to bytes once, at send() time (the caller may reuse its objects). */
  records: PreparedRecord[];
  size: number;
  resolve(r: PublishReceipt[]): void;
  reject(e: unknown): void;
}

interface Batch {
  topic: string;
  partition: number;
  items: Item[];
  count: number;
  bytes: number;
}

interface TopicMeta {
  partitions: number;
  maxMessageBytes: number;
  sticky: number;
  fetched: number;
}


export class Producer {
  private readonly open = new Map<string, Batch>();
  private flushScheduled = false;
  private lingerTimer: NodeJS.Timeout | null = null;
  private meta = new Map<string, TopicMeta>();
  private metaLoading = new Map<string, Promise<TopicMeta>>();
  private identity: { producerId: number; producerEpoch: number } | null = null;
  private identityLoading: Promise<void> | null = null;
  private seqs = new Map<string, number>();
  private buffered = 0;
  private spaceWaiters: (() => void)[] = [];
  private rr = 0;

  constructor(
    private readonly transport: Transport,
    private readonly opts: ProducerOptions,
    private readonly describe: (topic: string) => Promise<{ partitions: unknown[]; config: { maxMessageBytes: number } }>,
  ) {}

  private async topicMeta(topic: string, refresh = false): Promise<TopicMeta> {
    const cur = this.meta.get(topic);
    if (cur && !refresh) return cur;
    let p = this.metaLoading.get(topic);
    if (!p) {
      p = this.describe(topic)
        .then((d) => {
          const m: TopicMeta = { partitions: d.partitions.length, maxMessageBytes: d.config.maxMessageBytes, sticky: this.rr++ % d.partitions.length, fetched: Date.now() };
          this.meta.set(topic, m);
          return m;
        })
        .finally(() => this.metaLoading.delete(topic));
      this.metaLoading.set(topic, p);
    }
    return p;
  }

  /** Forget cached partition counts (topic deleted / re-created). */
  invalidate(topic: string): void {
    this.meta.delete(topic);
  }

  /** A new incarnation of the topic starts its producer sequences from scratch. */
  resetSequences(topic: string): void {
    for (const k of [...this.seqs.keys()]) if (k.startsWith(`${topic}\u0000`)) this.seqs.delete(k);
  }

  /** Sends what is gathered and waits (up to `timeoutMs`) until every accepted record is answered. */
  async drain(timeoutMs: number): Promise<void> {
    this.flush();
    const deadline = Date.now() + timeoutMs;
    while (this.buffered > 0 && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 10);
        this.spaceWaiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  private async ensureIdentity(): Promise<void> {
    if (this.identity) return;
    if (!this.identityLoading) {
      this.identityLoading = (async () => {
        // Safe to retry: a lost reply only wastes a producer id.
        const f = await this.transport.request(Op.InitProducer, {}, null, { retry: true });
        this.identity = { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
      })().finally(() => (this.identityLoading = null));
    }
    await this.identityLoading;
  }

  async send(topic: string, records: PublishRecord[]): Promise<PublishReceipt[]> {
    if (!Array.isArray(records) || records.length === 0) throw new ValidationError("publishBatch needs a non-empty array of records");
    while (this.buffered >= this.opts.maxBufferedRecords) {
      await new Promise<void>((r) => this.spaceWaiters.push(r));
    }
    this.buffered += records.length;
    let parts: number[];
    let prepared: PreparedRecord[];
    let sizes: Int32Array;
    try {
      ({ parts, prepared, sizes } = await this.choosePartitions(topic, records));
    } catch (err) {
      // Nothing was queued: give the room back (close() waits for buffered records).
      this.release(records.length);
      throw err;
    }
    // Group by partition (in record order), one item per group and batch-sized chunk.
    const groups = new Map<number, number[]>();
    for (let i = 0; i < records.length; i++) {
      let g = groups.get(parts[i]);
      if (!g) groups.set(parts[i], (g = []));
      g.push(i);
    }
    const out: PublishReceipt[] = new Array(records.length);
    const promises: Promise<void>[] = [];
    const max = this.opts.maxBatchRecords;
    for (const [p, idx] of groups) {
      for (let s = 0; s < idx.length; s += max) {
        const chunk = groups.size === 1 && idx.length <= max ? null : idx.slice(s, s + max);
        const recs = chunk === null ? prepared : chunk.map((i) => prepared[i]);
        let size = 0;
        if (chunk === null) for (let k = 0; k < sizes.length; k++) size += sizes[k];
        else for (const i of chunk) size += sizes[i];
        promises.push(
          new Promise<PublishReceipt[]>((resolve, reject) => this.add(topic, p, { records: recs, size, resolve, reject })).then(
            (rs) => {
              if (chunk === null) for (let k = 0; k < rs.length; k++) out[k] = rs[k];
              else for (let k = 0; k < rs.length; k++) out[chunk[k]] = rs[k];
            },
          ),
        );
      }
    }
    this.scheduleFlush();
    await Promise.all(promises);
    return out;
  }

  /**
   * Validates every record (as the broker would), converts it to bytes and picks its
   * partition (Kafka's murmur2 for keys, the sticky partition otherwise). Throws, queues nothing.
   */
  private async choosePartitions(topic: string, records: PublishRecord[]): Promise<{ parts: number[]; prepared: PreparedRecord[]; sizes: Int32Array }> {
    if (this.opts.idempotent) await this.ensureIdentity();
    let meta = this.meta.get(topic) ?? (await this.topicMeta(topic));
    const parts: number[] = new Array(records.length);
    const prepared: PreparedRecord[] = new Array(records.length);
    const sizes = new Int32Array(records.length);
    const now = Date.now();
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      // Validate here, exactly as the broker would: this record will share a batch with other
      // callers' records, and one bad record must not fail their publishes.
      const pr = this.validate(r, i, meta, now);
      prepared[i] = pr;
      sizes[i] = recordSize(pr);
      if (sizes[i] > meta.maxMessageBytes) throw new RecordTooLargeError(sizes[i], meta.maxMessageBytes);
      let p: number;
      if (r.partition !== undefined) {
        if (r.partition >= meta.partitions) {
          meta = await this.topicMeta(topic, true);
          if (r.partition >= meta.partitions) {
            throw new ValidationError(`partition ${r.partition} out of range for ${topic} (0..${meta.partitions - 1})`);
          }
        }
        p = r.partition;
      } else if (pr.key !== null) {
        p = partitionForKey(pr.key, meta.partitions);
      } else {
        p = meta.sticky;
      }
      parts[i] = p;
    }
    return { parts, prepared, sizes };
  }

  private validate(r: PublishRecord, i: number, meta: TopicMeta, now: number): PreparedRecord {
    if (r === null || typeof r !== "object") throw new ValidationError(`record ${i} must be an object`);
    if (r.partition !== undefined && (!Number.isInteger(r.partition) || r.partition < 0)) {
      throw new ValidationError(`partition ${r.partition} out of range (0..${meta.partitions - 1})`);
    }
    let key: Buffer | null = null;
    if (r.key !== undefined && r.key !== null) {
      if (typeof r.key === "string") key = Buffer.from(r.key, "utf8");
      else if (r.key instanceof Uint8Array) key = Buffer.from(r.key.buffer, r.key.byteOffset, r.key.byteLength);
      else throw new ValidationError("key must be a string or Uint8Array");
    }
    let headers: [string, Buffer][] | null = null;
    if (r.headers !== undefined && r.headers !== null) {
      if (typeof r.headers !== "object") throw new ValidationError("headers must be an object");
      headers = [];
      for (const [k, v] of Object.entries(r.headers)) {
        if (typeof v === "string") headers.push([k, Buffer.from(v, "utf8")]);
        else if (v instanceof Uint8Array) headers.push([k, Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
        else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
      }
      if (headers.length === 0) headers = null;
    }
    const timestamp = r.timestamp ?? now;
    if (!Number.isSafeInteger(timestamp) || timestamp < 0) throw new ValidationError(`record ${i}: invalid timestamp ${timestamp}`);
    const v = r.value;
    // Bytes are the common case: no intermediate object per record.
    if (Buffer.isBuffer(v)) return { key, value: v, valueKind: 0, timestamp, headers };
    const { value, valueKind } = prepareValue(v);
    return { key, value, valueKind, timestamp, headers };
  }

  private release(n: number): void {
    this.buffered -= n;
    while (this.spaceWaiters.length && this.buffered < this.opts.maxBufferedRecords) this.spaceWaiters.shift()!();
  }

  private add(topic: string, partition: number, item: Item): void {
    const key = `${topic}\u0000${partition}`;
    let b = this.open.get(key);
    if (b && b.count + item.records.length > this.opts.maxBatchRecords) {
      // Keep batches within maxBatchRecords: send what is gathered, start a new one.
      this.open.delete(key);
      this.dispatch(b);
      b = undefined;
    }
    if (!b) {
      b = { topic, partition, items: [], count: 0, bytes: 0 };
      this.open.set(key, b);
    }
    b.items.push(item);
    b.count += item.records.length;
    b.bytes += item.size;
    if (b.count >= this.opts.maxBatchRecords || b.bytes >= this.opts.maxBatchBytes) {
      this.open.delete(key);
      this.dispatch(b);
    }
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    const run = (): void => {
      this.flushScheduled = false;
      this.lingerTimer = null;
      this.flush();
    };
    if (this.opts.lingerMs <= 0) setImmediate(run);
    else this.lingerTimer = setTimeout(run, this.opts.lingerMs);
  }

  flush(): void {
    if (this.lingerTimer) {
      clearTimeout(this.lingerTimer);
      this.lingerTimer = null;
      this.flushScheduled = false;
    }
    const batches = [...this.open.values()];
    this.open.clear();
    // Next linger window: keyless records move to another partition (sticky batches).
    for (const m of this.meta.values()) m.sticky = (m.sticky + 1) % m.partitions;
    for (const b of batches) this.dispatch(b);
  }

  private dispatch(b: Batch): void {
    if (!this.opts.idempotent || !this.identity) {
      void this.sendBatch(b, null);
      return;
    }
    const seqKey = `${b.topic}\u0000${b.partition}`;
    const base = this.seqs.get(seqKey) ?? 0;
    this.seqs.set(seqKey, base + b.count);
    void this.sendBatch(b, { ...this.identity, baseSequence: base });
  }

  private async sendBatch(
    b: Batch,
    idem: { producerId: number; producerEpoch: number; baseSequence: number } | null,
  ): Promise<void> {
    const records: PreparedRecord[] = b.items.length === 1 ? b.items[0].records : b.items.flatMap((it) => it.records);
    let batch: Buffer;
    try {
      // The batch travels in the storage format with its CRC (base offset 0): the broker
      // verifies it and stores it as is, so the checksum covers the records from here to disk.
      batch = encodeBatch(records, idem ?? undefined);
      stampBatch(batch, 0);
    } catch (err) {
      this.failBatch(b, err, idem);
      return;
    }
    try {
      const f = await this.transport.request(
        Op.PublishEncoded,
        { topic: b.topic, partition: b.partition },
        batch,
        // Only idempotent batches are safe to re-send after a connection loss.
        { retry: idem !== null },
      );
      const baseOffset = Number(f.meta.baseOffset);
      const count = Number(f.meta.count);
      if (count !== b.count || !Number.isSafeInteger(baseOffset)) throw new Error(`server acknowledged ${count} records for ${b.count}`);
      const duplicate = f.meta.duplicate === true;
      const synced = f.meta.synced === true;
      let offset = baseOffset;
      for (const it of b.items) {
        const rs: PublishReceipt[] = new Array(it.records.length);
        for (let k = 0; k < rs.length; k++) rs[k] = { topic: b.topic, partition: b.partition, offset: offset++, duplicate, synced };
        it.resolve(rs);
      }
      this.release(b.count);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (idem && this.identity && (code === "OUT_OF_ORDER_SEQUENCE" || code === "PRODUCER_FENCED") && idem.producerEpoch < this.identity.producerEpoch) {
        // Numbered under an epoch we abandoned after an earlier failure: renumber and resend.
        this.dispatch(b);
        return;
      }
      if (code === "TOPIC_NOT_FOUND" || code === "PARTITION_NOT_FOUND") this.invalidate(b.topic);
      this.failBatch(b, err, idem);
    }
  }

  private failBatch(b: Batch, err: unknown, idem: { producerEpoch: number } | null): void {
    for (const it of b.items) it.reject(err);
    this.release(b.count);
    if (idem && this.identity && idem.producerEpoch === this.identity.producerEpoch) void this.bumpEpoch();
  }

  private bumping: Promise<void> | null = null;
  /** Restart all sequences under a new epoch (see the module comment). */
  private bumpEpoch(): Promise<void> {
    if (this.bumping) return this.bumping;
    const id = this.identity!.producerId;
    this.bumping = (async () => {
      try {
        const f = await this.transport.request(Op.InitProducer, { producerId: id }, null, { retry: true });
        this.identity = { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
      } catch {
        // Fall back to a brand-new producer id on the next publish.
        this.identity = null;
      }
      this.seqs.clear();
    })().finally(() => (this.bumping = null));
    return this.bumping;
  }
}
