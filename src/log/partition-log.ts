// SPDX-License-Identifier: Apache-2.0
/**
 * One partition: an ordered list of segments under one directory. This is the facade; the
 * work is done by its parts, one job each (as Kafka's storage module):
 *
 *   log-loader.ts     opening and recovery (LOG-7), producer state recovery (PROD-1)
 *   log-state.ts      the shared in-memory state, fault and fence (LOG-11), waiters
 *   group-commit.ts   the append pipeline: offsets, rounds, fdatasyncs, rolls (LOG-1, 3, 4, 9)
 *   preallocator.ts   zero fills ahead of the write position (LOG-8)
 *   log-reader.ts     reads, raw batch reads, handle and index caches (LOG-2 via batch-cursor)
 *   retention.ts      log start moves and segment deletion (LOG-6)
 *   producer-state.ts idempotent-producer state (PROD-1, PROD-2)
 *
 * Invariants (docs/ARCHITECTURE.md):
 *  LOG-1 offsets are contiguous: segment[i+1].baseOffset === segment[i].endOffset.
 *  LOG-3 with durability "always", an append resolves only after an fdatasync covering it,
 *        and readers never see past the durable end (highWatermark), so a record a consumer
 *        saw can never vanish in a crash and its offset is never reused.
 */
import { AbortedError, CorruptRecordError, EncryptionKeyMissingError, InvalidBatchError, RecordTooLargeError, ValidationError, type StorageError } from "../errors.js";
import { noopTelemetry, type Logger, type Telemetry } from "../observability/telemetry.js";
import type { FileSystem } from "./io.js";
import { LogWriter, type AppendResult } from "./group-commit.js";
import { CLEAN_MARKER, loadLog, PRODUCER_SNAPSHOT_FILE } from "./log-loader.js";
import { LogReader, type RawRead } from "./log-reader.js";
import type { LogConfig, LogState } from "./log-state.js";
import { Preallocator, type PreallocateMode } from "./preallocator.js";
import { ProducerStateManager, type ProducerBatch } from "./producer-state.js";
import { encodeBatch, HEADER_SIZE, readHeader, MAX_BATCH_BYTES, recordSize, validateEncodedBatch, type BatchHeader, type PreparedRecord, type ProducerInfo, type StoredRecord } from "./record-batch.js";
import { Retention } from "./retention.js";
import type { ArchiveStats, PartitionArchive } from "./archive/partition-archive.js";
import type { LocalSegment } from "./archive/segment-archiver.js";
import { firstKeylessRecord, isCompacted, keyRequiredError } from "./compaction-policy.js";
import { LogCleaner, type CleanerStats, type CleanResult } from "./cleaner.js";
import { IoBudget } from "./io-budget.js";
import { segmentFileName } from "./segment.js";
import { writeFileAtomic } from "./io.js";
import { join } from "node:path";
import type { BatchCipher } from "./batch-crypto.js";

export type { Durability, LogConfig } from "./log-state.js";
export type { PreallocateMode } from "./preallocator.js";
export type { AppendResult } from "./group-commit.js";
export type { RawRead } from "./log-reader.js";
export type { CleanerStats, CleanResult } from "./cleaner.js";
export type { ArchiveStats } from "./archive/partition-archive.js";
export { segmentFileName };

export interface PartitionLogOptions {
  fs: FileSystem;
  dir: string;
  topic: string;
  partition: number;
  config: LogConfig;
  /** Logger, metrics sink and clock (default: no-ops and the system clock). */
  telemetry?: Telemetry;
  /** Overrides the telemetry's logger (tests). */
  logger?: Logger;
  /** Default "auto". */
  preallocate?: PreallocateMode;
  /**
   * Called once when the partition faults (an I/O error after which only recovery can tell
   * what is on disk): the owner reopens it from disk (src/store/disk/disk-engine.ts).
   */
  onFault?: (err: StorageError) => void;
  /**
   * Tiered storage (src/log/archive/): sealed segments are archived before retention deletes
   * them (ARC-1), and reads below the online log start are served from the archive (ARC-2).
   * Opened once the log is loaded, with its log start.
   */
  archive?: (logStart: number) => Promise<PartitionArchive>;
  /** The I/O budget of the cleaner, shared by an engine's partitions (default: unthrottled). */
  cleanerBudget?: IoBudget;
  /**
   * Encryption at rest (an `encrypted` topic or queue): appends are encrypted, reads decrypted
   * (batch-crypto.ts, ENC-1, ENC-2). Absent: batches are stored in clear.
   */
  cipher?: BatchCipher;
}

export class PartitionLog {
  readonly fs: FileSystem;
  readonly dir: string;
  readonly topic: string;
  readonly partition: number;
  readonly config: LogConfig;

  private constructor(
    private readonly st: LogState,
    private readonly writer: LogWriter,
    private readonly reader: LogReader,
    private readonly retention: Retention,
    private readonly prealloc: Preallocator,
    /** The partition's archive, if its topic has one. */
    readonly archive: PartitionArchive | null,
    private readonly cleaner: LogCleaner,
  ) {
    ({ fs: this.fs, dir: this.dir, topic: this.topic, partition: this.partition, config: this.config } = st.ctx);
  }

  static async open(opts: PartitionLogOptions): Promise<PartitionLog> {
    const telemetry = opts.telemetry ?? noopTelemetry;
    const ctx = { fs: opts.fs, dir: opts.dir, topic: opts.topic, partition: opts.partition, config: opts.config, logger: opts.logger ?? telemetry.logger, telemetry, cipher: opts.cipher ?? null };
    const st = await loadLog(ctx, opts.onFault ?? null);
    const reader = new LogReader(st);
    const prealloc = new Preallocator(st, opts.preallocate ?? "auto");
    const writer = new LogWriter(st, prealloc, (sealed) => reader.sealed(sealed));
    // Never throws: an archive it cannot read yet is loaded on first use (partition-archive.ts).
    const archive = opts.archive ? await opts.archive(st.logStart) : null;
    const beforeDelete = archive === null ? null : (segs: LocalSegment[]) => archive.beforeDelete(segs, telemetry.clock.now());
    if (ctx.config.durability === "interval") writer.startFlushTimer();
    const cleaner = new LogCleaner(st, reader, opts.cleanerBudget ?? new IoBudget(Infinity));
    if (isCompacted(ctx.config.cleanupPolicy)) await cleaner.loadCheckpoint();
    return new PartitionLog(st, writer, reader, new Retention(st, reader, beforeDelete), prealloc, archive, cleaner);
  }

  /** The first readable offset: the archive's start when older segments are archived (ARC-2). */
  get logStartOffset(): number {
    const a = this.archive?.startOffset ?? null;
    return a !== null && a < this.st.logStart ? a : this.st.logStart;
  }
  /** The first offset held in local segments. */
  get onlineLogStartOffset(): number {
    return this.st.logStart;
  }
  get logEndOffset(): number {
    return this.st.nextOffset;
  }
  get highWatermark(): number {
    return this.st.hwm;
  }
  get sizeBytes(): number {
    let s = 0;
    for (const seg of this.st.segments) s += seg.size;
    return s;
  }
  get segmentCount(): number {
    return this.st.segments.length;
  }

  // ───────────────────────────────── append ──────────────────────────────────

  /**
   * Appends records as one batch. With durability "always" it resolves after fdatasync; many
   * concurrent appends share one fdatasync (group commit).
   */
  async append(records: readonly PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal): Promise<AppendResult> {
    this.st.checkWritable();
    if (records.length === 0) throw new ValidationError("append needs at least one record");
    if (isCompacted(this.config.cleanupPolicy)) {
      // CMP-1: a compacted topic keeps the latest record per key; a keyless one has none.
      const i = records.findIndex((r) => r.key === null);
      if (i >= 0) throw keyRequiredError(this.topic, i);
    }
    return this.appendBatch(encodeAppend(records, producer, this.config.maxMessageBytes), records.length, producer, signal, false);
  }

  /**
   * Appends a batch encoded elsewhere (the client encodes in the storage format, so the server
   * stores it without decoding and re-encoding). The batch is fully validated first
   * (validateEncodedBatch: CRC, structure, record sizes); its producer fields come from its
   * header. Offsets are then set by patching the verified CRC (restampBatch), so every record
   * byte is read once on this path.
   */
  async appendEncoded(buf: Buffer, signal?: AbortSignal): Promise<AppendResult> {
    this.st.checkWritable();
    // Structure and CRC first; sizes against maxMessageBytes as recordSize() measures them.
    const { header: h, maxRecordBytes } = validateEncodedBatch(buf, MAX_BATCH_BYTES);
    if (maxRecordBytes > this.config.maxMessageBytes) checkRecordSizes(buf, h, this.config.maxMessageBytes);
    if (isCompacted(this.config.cleanupPolicy)) {
      const i = firstKeylessRecord(buf, h.count); // CMP-1
      if (i >= 0) throw keyRequiredError(this.topic, i);
    }
    const producer = h.producerId >= 0 ? { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence } : undefined;
    return this.appendBatch(buf, h.count, producer, signal, true);
  }

  /** Common tail of both appends: idempotence check, memory bound, then offsets (enqueue). */
  private async appendBatch(buf: Buffer, count: number, producer: ProducerInfo | undefined, signal: AbortSignal | undefined, crcValid: boolean): Promise<AppendResult> {
    const producers = this.st.producers;
    // ENC-1: an encrypted log stores nothing it cannot encrypt (no key, or no room for the envelope).
    if (this.st.ctx.cipher !== null) this.st.ctx.cipher.checkWritable(buf.length);
    if (producer) {
      const c = producers.check(producer, count);
      if (c.duplicate) return this.duplicateOf(c.batch, signal);
    }
    // No await between the sequence check and the enqueue unless the batch must wait for
    // room: pipelined batches of one producer are checked and recorded in arrival order.
    if (!this.writer.hasRoom(buf.length)) {
      await this.writer.waitForRoom(buf.length);
      if (producer) {
        // Re-check after waiting: another append of the same producer may have gone first.
        const c = producers.check(producer, count);
        if (c.duplicate) return this.duplicateOf(c.batch, signal);
      }
    }
    return this.writer.enqueue(buf, count, producer ?? null, crcValid);
  }

  /**
   * A retry of a remembered batch: its original offsets, once the original is published. If
   * the original is still in flight this waits for its outcome and shares it: a retry is
   * never answered with offsets of a batch that was not stored (PROD-1).
   */
  private async duplicateOf(b: ProducerBatch, signal: AbortSignal | undefined): Promise<AppendResult> {
    if (b.outcome !== undefined) {
      if (signal === undefined) await b.outcome;
      else {
        signal.throwIfAborted();
        let onAbort!: () => void;
        const aborted = new Promise<never>((_, reject) => {
          onAbort = () => reject(new AbortedError("append aborted while waiting for the original batch", signal.reason));
          signal.addEventListener("abort", onAbort, { once: true });
        });
        try {
          await Promise.race([b.outcome, aborted]);
        } finally {
          signal.removeEventListener("abort", onAbort);
        }
      }
    }
    return { baseOffset: b.baseOffset, duplicate: true, synced: this.config.durability === "always" };
  }

  // ────────────────────────────────── read ───────────────────────────────────

  /** See LogReader.read. */
  read(offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    // ARC-2: below the online log start, the archive answers (if the topic has one).
    if (this.archive !== null && Number.isSafeInteger(offset) && offset < this.st.logStart) return this.archive.read(offset, maxBytes, this.st.logStart, this.st.hwm);
    return this.reader.read(offset, maxBytes);
  }

  /** See LogReader.readRaw. */
  readRaw(offset: number, maxBytes: number, maxRecords = Infinity): Promise<RawRead> {
    const cipher = this.st.ctx.cipher;
    if (this.archive !== null && Number.isSafeInteger(offset) && offset < this.st.logStart && Number.isSafeInteger(maxBytes) && maxBytes >= 1) {
      const a = this.archive.readRaw(offset, maxBytes, maxRecords, this.st.logStart, this.st.hwm);
      return cipher === null ? a : a.then((r) => this.openRaw(cipher, r, offset));
    }
    if (cipher !== null) return this.reader.readRaw(offset, maxBytes, maxRecords).then((r) => this.openRaw(cipher, r, offset));
    return this.reader.readRaw(offset, maxBytes, maxRecords);
  }

  /**
   * A raw read of an encrypted log in clear (ENC-1: the server pushes it to clients). A batch
   * that fails authentication is reported like any damaged batch (LOG-2): CorruptRecordError.
   */
  private openRaw(cipher: BatchCipher, r: RawRead, offset: number): RawRead {
    const parts: Buffer[] = [];
    let records = 0;
    for (let pos = 0; pos < r.data.length; ) {
      const h = readHeader(r.data, pos);
      try {
        parts.push(cipher.openStamped(r.data, pos, h));
      } catch (e) {
        if (!(e instanceof InvalidBatchError || e instanceof EncryptionKeyMissingError)) throw e;
        // Hand out what precedes it; a read that starts at it reports it (as LogReader.read).
        if (parts.length > 0) return { data: Buffer.concat(parts), nextOffset: h.baseOffset, records };
        if (e instanceof EncryptionKeyMissingError) throw e;
        throw new CorruptRecordError(this.topic, this.partition, h.baseOffset, this.dir, -1, e.message, h.baseOffset + h.count);
      }
      records += h.baseOffset + h.count - Math.max(h.baseOffset, offset);
      pos += h.length;
    }
    return { ...r, data: parts.length === 1 ? parts[0] : Buffer.concat(parts) };
  }

  /** Resolves true once a record at `offset` is readable, false on timeout. */
  waitFor(offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    return this.st.waitFor(offset, maxWaitMs, signal);
  }

  /** First offset whose timestamp is >= ts; the high watermark if there is none. */
  async offsetForTimestamp(ts: number): Promise<number> {
    // The archived range comes first (ARC-2): its manifests say which segment may hold `ts`.
    const a = this.archive === null ? null : await this.archive.offsetForTimestamp(ts, this.st.logStart, this.st.hwm);
    return a ?? this.reader.offsetForTimestamp(ts);
  }

  // ─────────────────────────────── retention ────────────────────────────────

  /** Durably moves the log start to `offset` and deletes whole sealed segments below it (LOG-6). */
  advanceLogStart(offset: number): Promise<void> {
    return this.retention.advanceLogStart(offset);
  }

  /** Deletes whole sealed segments past retention by time or size; never the active one. */
  async enforceRetention(now = this.st.ctx.telemetry.clock.now()): Promise<number> {
    // cleanupPolicy "compact" alone: the cleaner bounds the log, not time or size (as Kafka).
    if (this.config.cleanupPolicy === "compact") return this.st.logStart;
    const start = await this.retention.enforce(now);
    if (this.archive !== null) {
      // Everything this run wanted deleted is archived now (or there was nothing): no lag.
      this.archive.caughtUp();
      await this.archive.enforceRetention(now, this.st.logStart);
    }
    return start;
  }

  // ─────────────────────────────── compaction ────────────────────────────────

  /**
   * Key compaction of the sealed segments (cleaner.ts; a no-op unless cleanupPolicy includes
   * "compact"). `mapBytes` bounds the key map of one pass (tests lower it to force passes).
   */
  compact(now = this.st.ctx.telemetry.clock.now(), mapBytes?: number): Promise<CleanResult> {
    return this.cleaner.clean(now, mapBytes);
  }

  /** Cleaner figures of this partition (describeTopic). */
  cleanerStats(): CleanerStats {
    return this.cleaner.stats();
  }

  /** Archive figures of this partition (describeTopic); null without an archive. */
  archiveStats(): ArchiveStats | null {
    return this.archive === null ? null : this.archive.stats();
  }

  // ───────────────────────────────── close ───────────────────────────────────

  /** Flushes, syncs, writes indexes and the producer snapshot, then marks a clean shutdown. */
  async close(): Promise<void> {
    const st = this.st;
    if (st.closed) return;
    await this.writer.idle();
    st.closed = true;
    st.wakeWaiters();
    await this.retention.idle();
    await this.cleaner.idle();
    const active = st.active;
    await this.prealloc.stop(active);
    await this.writer.close();
    if (!st.faulted) {
      try {
        // Cut preallocated zeros so that the file size is the logical size on the next open.
        if (active.fileEnd > active.size) {
          await active.handle!.truncate(active.size);
          active.fileEnd = active.size;
        }
        await active.handle!.datasync();
        await active.writeIndexes();
        await writeFileAtomic(this.fs, join(this.dir, PRODUCER_SNAPSHOT_FILE), JSON.stringify(st.producers.snapshot(st.hwm, st.ctx.telemetry.clock.now())));
        const fh = await this.fs.open(join(this.dir, CLEAN_MARKER), "create");
        await fh.close();
        await this.fs.fsyncDir(this.dir);
      } catch (e) {
        st.ctx.logger.error({ err: e }, "clean shutdown failed; next open will run recovery");
      }
    }
    for (const seg of st.segments) {
      if (seg.handle) {
        const h = seg.handle;
        seg.handle = null;
        await h.close().catch(() => {});
      }
    }
  }

  /** Used by tests and tools. */
  describeSegments(): { baseOffset: number; endOffset: number; size: number; sealed: boolean; file: string }[] {
    return this.st.segments.map((s) => ({ baseOffset: s.baseOffset, endOffset: s.endOffset, size: s.size, sealed: s.sealed, file: s.logPath }));
  }
}

/**
 * Validates and encodes the records of one append (any engine): with a producer, the records
 * first, then the producer fields, before encoding them (the append checks sequences); without
 * one the encoder's size pass checks the records (one walk). Throws RecordTooLargeError or
 * ValidationError.
 */
export function encodeAppend(records: readonly PreparedRecord[], producer: ProducerInfo | undefined, maxMessageBytes: number): Buffer {
  if (producer) {
    for (const r of records) {
      const size = recordSize(r);
      if (size > maxMessageBytes) throw new RecordTooLargeError(size, maxMessageBytes);
      if (!Number.isSafeInteger(r.timestamp) || r.timestamp < 0) throw new ValidationError(`invalid timestamp ${r.timestamp}`);
    }
    ProducerStateManager.validate(producer, records.length);
  }
  return encodeBatch(records, producer, maxMessageBytes);
}

/**
 * `maxMessageBytes` applies to `recordSize()`: a record encoded with a zero timestamp delta
 * (docs/storage-format.md), the size the embedded broker and the client check each record
 * against. Within a batch a record's delta from the first timestamp may take more bytes, so
 * a batch whose largest record exceeds the limit there is measured again record by record:
 * only a record that is too large by recordSize() refuses the batch, and every client that
 * validated its records with recordSize() never has a batch refused for a record it accepted.
 * Called only on a batch validateEncodedBatch accepted (every length was checked). Exported
 * for the PostgreSQL engine, which validates client batches by the same rule.
 */
export function checkRecordSizes(buf: Buffer, h: BatchHeader, max: number): void {
  let p = HEADER_SIZE;
  for (let i = 0; i < h.count; i++) {
    const bodyLen = varintAt(buf, p);
    const body = p + varintBytes;
    // Attributes (1 byte), then the timestamp delta: recordSize() counts it as 1 byte.
    varintAt(buf, body + 1);
    const zeroDelta = bodyLen - varintBytes + 1;
    const size = varintLength(zeroDelta) + zeroDelta;
    if (size > max) throw new RecordTooLargeError(size, max);
    p = body + bodyLen;
  }
}

/** Bytes taken by the varint read by the last varintAt call. */
let varintBytes = 0;
function varintAt(buf: Buffer, pos: number): number {
  let result = 0;
  let mul = 1;
  let i = 0;
  for (;;) {
    const byte = buf[pos + i++];
    result += (byte & 0x7f) * mul;
    if ((byte & 0x80) === 0) break;
    mul *= 128;
  }
  varintBytes = i;
  return result;
}

function varintLength(n: number): number {
  let s = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    s++;
  }
  return s;
}
