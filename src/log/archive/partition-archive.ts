// SPDX-License-Identifier: Apache-2.0
/**
 * The archive of one partition (tiered storage): archives sealed segments before retention
 * deletes them (segment-archiver.ts, ARC-1), serves reads below the online log start from the
 * archived copies (ARC-2, ARC-3), and applies `archiveRetentionMs` to them (ARC-4).
 *
 * Invariants (docs/ARCHITECTURE.md):
 *  ARC-2 reads below the online log start are served from archived segments that have a
 *        manifest; the archived offsets form one contiguous range ending where the online log
 *        starts (retention archives every segment it deletes, oldest first, and archive
 *        retention only removes the oldest).
 *  ARC-3 an archived segment's bytes are served only after their length, CRC-32C and SHA-256
 *        matched the manifest (and each batch its own CRC-32C, LOG-2); a mismatch raises
 *        ArchiveCorruptError and nothing of that segment is served.
 *  ARC-4 archive retention removes the manifest first (the segment stops being archived),
 *        then the data objects; data objects without a manifest are garbage, removed at open.
 *
 * Memory: manifests are held in memory (a few hundred bytes per archived segment). A segment
 * is verified against its manifest by streaming it (1 MiB at a time) on its first read in
 * this process, then read in ranges about the size of each read; no segment is held whole.
 */
import { CorruptRecordError, InvalidBatchError, OffsetOutOfRangeError, ArchiveCorruptError, StorageError } from "../../errors.js";
import type { Logger } from "../../observability/telemetry.js";
import type { FileSystem } from "../io.js";
import type { BatchCipher } from "../batch-crypto.js";
import { BATCH_ATTR_ENCRYPTED, decodeRecords, HEADER_SIZE, MAX_BATCH_BYTES, readBatchLength, verifyBatch, type BatchHeader, type StoredRecord } from "../record-batch.js";
import type { RawRead } from "../log-reader.js";
import type { ArchiveStore } from "./archive-store.js";
import { dataBase, manifestBase, objectKey, parseManifest, type SegmentManifest } from "./manifest.js";
import { archiveSegment, verifyObject, type ArchiveTarget, type LocalSegment } from "./segment-archiver.js";

/** Archived segments remembered as verified (with their indexes: ~3 bytes per 4 KiB) per partition. */
export const MAX_VERIFIED_SEGMENTS = 64;
const EMPTY = Buffer.alloc(0);

/** An archived segment whose .log matched its manifest (ARC-3), with its offset index. */
interface Verified {
  key: string;
  /** Offset index entries (relative offset, position), validated; empty if unusable. */
  rel: Uint32Array;
  pos: Uint32Array;
}

/** Bytes fetched per range: the read's size plus the lead-in from an index entry (IDX-2). */
function readWindow(maxBytes: number): number {
  return Math.min(Math.max(64 * 1024, maxBytes + 2 * 4096 + HEADER_SIZE), 16 * 1024 * 1024);
}

export interface PartitionArchiveOptions {
  fs: FileSystem;
  store: ArchiveStore;
  target: ArchiveTarget;
  logger: Logger;
  /** Current `archiveRetentionMs` (read at each check: the topic config object is shared). */
  retentionMs: () => number;
  /**
   * An encrypted topic's cipher: archived segments are copied as stored (ciphertext, ENC-1)
   * and their batches decrypted when read back, as the online log's (ENC-2).
   */
  cipher?: BatchCipher;
}

/** Figures of one partition's archive (describeTopic, metrics); counters since the partition opened. */
export interface ArchiveStats {
  /** Bytes of the archived segments (their `.log` objects, as the manifests say). */
  archivedBytes: number;
  archivedSegments: number;
  /** First archived offset, null when nothing is archived. */
  startOffset: number | null;
  /**
   * Bytes of local segments that retention is waiting to delete and that are not archived yet
   * (ARC-1: they stay on local disk until they are). 0 once a retention run finds all it deletes
   * archived; it stays above 0 while archiving is slow or failing.
   */
  lagBytes: number;
  /** Bytes of record batches served from the archive to reads (fetch, subscriptions). */
  readBytes: number;
}

export class PartitionArchive {
  /** Manifests by base offset, ascending. */
  private manifests: SegmentManifest[] = [];
  /** Sum of the manifests' `bytes` (kept with `manifests`; stats only). */
  private archivedBytes = 0;
  private lagBytes = 0;
  /** beforeDelete runs under way (a retention run that finished may clear the lag only when none is). */
  private archiving = 0;
  private readBytes = 0;
  /** Segments checked against their manifests in this process (LRU, MAX_VERIFIED_SEGMENTS). */
  private readonly verified = new Map<number, Promise<Verified>>();

  private constructor(private readonly o: PartitionArchiveOptions) {}

  /**
   * Loads the manifests and removes objects left without one below `logStart` (ARC-4). An
   * archive that cannot be read now does not keep the partition from opening: it is loaded
   * again on its next use (until then nothing is archived, so retention deletes nothing, and
   * reads below the online log start fail with StorageError).
   */
  static async open(o: PartitionArchiveOptions, logStart: number): Promise<PartitionArchive> {
    const a = new PartitionArchive(o);
    await a.ensureLoaded(logStart).catch((e: unknown) => o.logger.error({ err: e, archive: o.store.location, topic: o.target.topic, partition: o.target.partition }, "archive unreadable; retrying on next use"));
    return a;
  }

  private loaded: Promise<void> | null = null;

  private ensureLoaded(logStart: number): Promise<void> {
    if (this.loaded === null) {
      const p = this.load0(logStart).catch((e: unknown) => {
        throw e instanceof StorageError ? e : new StorageError(`archive ${this.o.store.location} of ${this.o.target.topic}/${this.o.target.partition} is unreadable: ${(e as Error)?.message ?? String(e)}`, e);
      });
      this.loaded = p;
      p.catch(() => {
        if (this.loaded === p) this.loaded = null;
      });
    }
    return this.loaded;
  }

  private async load0(logStart: number): Promise<void> {
    const o = this.o;
    const keys = await o.store.list(o.target.prefix);
    const bases = new Set<number>();
    const found: SegmentManifest[] = [];
    for (const k of keys) {
      const base = manifestBase(k);
      if (base === null) continue;
      const bytes = await o.store.get(k);
      const m = bytes === null ? null : parseManifest(bytes);
      if (m === null || m.baseOffset !== base || m.topicId !== o.target.topicId) {
        o.logger.error({ key: k, archive: o.store.location }, "ignoring an unreadable archive manifest");
        continue;
      }
      found.push(m);
      bases.add(base);
    }
    for (const m of this.manifests) if (!bases.has(m.baseOffset)) found.push(m);
    this.manifests = found.sort((x, y) => x.baseOffset - y.baseOffset);
    this.recount();
    for (const k of keys) {
      const base = dataBase(k);
      // Without a manifest nothing relies on these (ARC-1): an interrupted archive attempt
      // (redone if the segment is still local) or an interrupted archive deletion.
      if (base !== null && !bases.has(base) && base < logStart) await o.store.delete(k);
    }
  }

  /** First archived offset, or null when nothing is archived. */
  get startOffset(): number | null {
    return this.manifests.length > 0 ? this.manifests[0].baseOffset : null;
  }

  /** Manifests, oldest first (tools, tests). */
  list(): readonly SegmentManifest[] {
    return this.manifests;
  }

  stats(): ArchiveStats {
    return { archivedBytes: this.archivedBytes, archivedSegments: this.manifests.length, startOffset: this.startOffset, lagBytes: this.lagBytes, readBytes: this.readBytes };
  }

  private recount(): void {
    let n = 0;
    for (const m of this.manifests) n += m.bytes;
    this.archivedBytes = n;
  }

  /**
   * Called by retention before it writes a new log start (retention.ts, LOG-6): archives each
   * segment about to be deleted, oldest first, and resolves only when all are archived (ARC-1).
   * Until then the segments not yet archived are the archive's lag (stats()).
   */
  async beforeDelete(segs: readonly LocalSegment[], now: number): Promise<void> {
    this.archiving++;
    try {
      let pending = 0;
      for (const s of segs) pending += s.size;
      this.lagBytes = pending;
      if (segs.length > 0) await this.ensureLoaded(segs[0].baseOffset);
      for (const s of segs) {
        if (this.find(s.baseOffset)?.endOffset !== s.endOffset) {
          const m = await archiveSegment(this.o.fs, this.o.store, this.o.target, s, now);
          this.insert(m);
          this.o.logger.info({ topic: m.topic, partition: m.partition, baseOffset: m.baseOffset, endOffset: m.endOffset, bytes: m.bytes }, "archived segment");
        }
        this.lagBytes = pending -= s.size;
      }
    } finally {
      this.archiving--;
    }
  }

  /** A retention run finished with nothing left to archive: no lag (unless another run is archiving). */
  caughtUp(): void {
    if (this.archiving === 0) this.lagBytes = 0;
  }

  private insert(m: SegmentManifest): void {
    const i = this.manifests.findIndex((x) => x.baseOffset >= m.baseOffset);
    if (i < 0) this.manifests.push(m);
    else if (this.manifests[i].baseOffset === m.baseOffset) this.manifests[i] = m;
    else this.manifests.splice(i, 0, m);
    this.recount();
  }

  /** The manifest of the archived segment holding `offset`, or undefined. */
  private find(offset: number): SegmentManifest | undefined {
    let lo = 0;
    let hi = this.manifests.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const m = this.manifests[mid];
      if (offset < m.baseOffset) hi = mid - 1;
      else if (offset >= m.endOffset) lo = mid + 1;
      else return m;
    }
    return undefined;
  }

  /**
   * An archived segment checked against its manifest (ARC-3: length, CRC-32C, SHA-256,
   * streamed in bounded chunks by verifyObject) and its offset index; from the cache of
   * verified segments or checked now.
   */
  private load(m: SegmentManifest): Promise<Verified> {
    let p = this.verified.get(m.baseOffset);
    if (p !== undefined) {
      this.verified.delete(m.baseOffset);
      this.verified.set(m.baseOffset, p);
      return p;
    }
    p = this.check(m);
    this.verified.set(m.baseOffset, p);
    p.catch(() => this.forget(m.baseOffset, p));
    for (const base of this.verified.keys()) {
      if (this.verified.size <= MAX_VERIFIED_SEGMENTS) break;
      this.verified.delete(base);
    }
    return p;
  }

  private forget(base: number, p?: Promise<Verified>): void {
    if (p === undefined || this.verified.get(base) === p) this.verified.delete(base);
  }

  private async check(m: SegmentManifest): Promise<Verified> {
    const { store, target } = this.o;
    const key = objectKey(target.prefix, m.baseOffset, "log");
    // ARC-3: checked before a single byte is decoded or served.
    await verifyObject(store, key, { bytes: m.bytes, sha256: m.sha256, crc32c: m.crc32c });
    const idx = await store.get(objectKey(target.prefix, m.baseOffset, "index")).catch(() => null);
    return { key, ...parseIndex(idx ?? EMPTY, m.bytes) };
  }

  private outOfRange(offset: number, logStart: number, hwm: number): OffsetOutOfRangeError {
    return new OffsetOutOfRangeError(this.o.target.topic, this.o.target.partition, offset, this.startOffset ?? logStart, hwm);
  }

  /**
   * The batches of the archived segment holding `offset`, from the indexed batch at or below
   * it, read in ranges of about `window` bytes (memory stays O(window + largest batch)); each
   * batch is verified (LOG-2) and `each` is called per batch until it returns false. With
   * `contiguous`, the walk ends where a new range would be needed once `each` took a batch
   * (readRaw hands out one view of one buffer). A batch that fails its check raises
   * ArchiveCorruptError (the copy changed after it was verified) or, in a segment archived
   * with damage, CorruptRecordError, unless `each` already took batches.
   */
  private async walk(offset: number, logStart: number, hwm: number, window: number, contiguous: boolean, each: (h: BatchHeader, buf: Buffer, pos: number) => boolean): Promise<SegmentManifest> {
    await this.ensureLoaded(logStart);
    const m = this.find(offset);
    if (m === undefined) throw this.outOfRange(offset, logStart, hwm);
    let v: Verified;
    try {
      v = await this.load(m);
    } catch (e) {
      // Archive retention removed it meanwhile: out of range now, not damage.
      if (e instanceof ArchiveCorruptError && this.find(offset) === undefined) throw this.outOfRange(offset, logStart, hwm);
      throw e;
    }
    let pos = 0;
    let expected = m.baseOffset;
    const e = floor(v.rel, offset - m.baseOffset);
    if (e >= 0) {
      pos = v.pos[e];
      expected = m.baseOffset + v.rel[e];
    }
    let buf: Buffer = EMPTY;
    let bufStart = pos;
    const fill = async (need: number): Promise<void> => {
      const end = Math.min(m.bytes, pos + Math.max(window, need));
      const got = await this.o.store.get(v.key, { start: pos, end });
      if (got === null || got.length !== end - pos) {
        this.forget(m.baseOffset);
        throw new ArchiveCorruptError(v.key, got === null ? "missing" : `short read at ${pos}`);
      }
      buf = got;
      bufStart = pos;
    };
    let took = false;
    while (pos < m.bytes) {
      let h: BatchHeader;
      try {
        const have = bufStart + buf.length - pos;
        if (have < HEADER_SIZE) {
          if (took && contiguous) break;
          await fill(HEADER_SIZE);
        }
        const len = readBatchLength(buf, pos - bufStart);
        if (len < HEADER_SIZE || len > MAX_BATCH_BYTES || pos + len > m.bytes) throw new InvalidBatchError(`implausible batch length ${len}`);
        if (bufStart + buf.length - pos < len) {
          if (took && contiguous) break;
          await fill(len);
        }
        h = verifyBatch(buf, pos - bufStart, pos - bufStart + len);
        if (h.baseOffset !== expected) throw new InvalidBatchError(`batch at offset ${h.baseOffset}, expected ${expected}`);
      } catch (err) {
        if (!(err instanceof InvalidBatchError)) throw err;
        if (took) break;
        if (m.damagedRanges === 0) {
          this.forget(m.baseOffset);
          throw new ArchiveCorruptError(v.key, `batch at byte ${pos} fails its check after the segment was verified: ${err.message}`);
        }
        const { topic, partition } = this.o.target;
        throw new CorruptRecordError(topic, partition, expected, v.key, pos, err.message, m.endOffset);
      }
      if (h.baseOffset + h.count > offset) {
        took = true;
        if (!each(h, buf, pos - bufStart)) break;
      }
      pos += h.length;
      expected = h.baseOffset + h.count;
    }
    return m;
  }

  /** Records from `offset` (below the online log start), as LogReader.read (ARC-2). */
  async read(offset: number, maxBytes: number, logStart: number, hwm: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    const out: StoredRecord[] = [];
    let bytes = 0;
    const m = await this.walk(offset, logStart, hwm, readWindow(maxBytes), false, (h, buf, pos) => {
      if (out.length > 0 && bytes >= maxBytes) return false;
      this.decode(buf, pos, h, offset, out);
      bytes += h.length;
      return true;
    });
    this.readBytes += bytes;
    return { records: out, nextOffset: out.length > 0 ? out[out.length - 1].offset + 1 : m.endOffset };
  }

  /**
   * decodeRecords of a verified archived batch, decrypted first when it is encrypted (ENC-1);
   * one that fails authentication (ENC-2) is damage: CorruptRecordError, never served.
   */
  private decode(buf: Buffer, pos: number, h: BatchHeader, minOffset: number, out: StoredRecord[]): StoredRecord[] {
    const cipher = this.o.cipher;
    if (cipher === undefined || (h.attributes & BATCH_ATTR_ENCRYPTED) === 0) return decodeRecords(buf, pos, h, minOffset, out);
    let o: { buf: Buffer; h: BatchHeader };
    try {
      o = cipher.open(buf, pos, h);
    } catch (e) {
      if (!(e instanceof InvalidBatchError)) throw e;
      const { topic, partition, prefix } = this.o.target;
      throw new CorruptRecordError(topic, partition, h.baseOffset, prefix, -1, e.message, h.baseOffset + h.count);
    }
    return decodeRecords(o.buf, 0, o.h, minOffset, out);
  }

  /** Whole stored batches from `offset`, as LogReader.readRaw (ARC-2; PartitionLog.readRaw decrypts them). */
  async readRaw(offset: number, maxBytes: number, maxRecords: number, logStart: number, hwm: number): Promise<RawRead> {
    let data: Buffer = EMPTY;
    let first = -1;
    let end = -1;
    let bytes = 0;
    let records = 0;
    let next = offset;
    const m = await this.walk(offset, logStart, hwm, readWindow(maxBytes), true, (h, buf, pos) => {
      if (first >= 0 && (bytes + h.length > maxBytes || records >= maxRecords)) return false;
      if (first < 0) {
        data = buf;
        first = pos;
      }
      records += h.baseOffset + h.count - Math.max(h.baseOffset, offset);
      bytes += h.length;
      end = pos + h.length;
      next = h.baseOffset + h.count;
      return true;
    });
    if (first < 0) return { data: EMPTY, nextOffset: m.endOffset, records: 0 };
    this.readBytes += bytes;
    return { data: data.subarray(first, end), nextOffset: next, records };
  }

  /** First archived offset below `logStart` with a timestamp >= ts, or null (then the online log answers). */
  async offsetForTimestamp(ts: number, logStart: number, hwm: number): Promise<number | null> {
    await this.ensureLoaded(logStart);
    for (const m of [...this.manifests]) {
      if (m.baseOffset >= logStart) break;
      if (m.maxTimestamp < ts || m.recordCount === 0) continue;
      let found: number | null = null;
      await this.walk(m.baseOffset, logStart, hwm, readWindow(256 * 1024), false, (h, buf, pos) => {
        if (h.maxTimestamp < ts) return true;
        for (const r of this.decode(buf, pos, h, 0, [])) {
          if (r.timestamp >= ts) {
            found = r.offset;
            return false;
          }
        }
        return true;
      });
      if (found !== null) return found;
    }
    return null;
  }

  /**
   * Removes the oldest archived segments whose newest record is older than
   * `archiveRetentionMs` (ARC-4: manifest first, then the data). Never one at or above the
   * online log start. Returns how many were removed.
   */
  enforceRetention(now: number, logStart: number): Promise<number> {
    // One run at a time (the retention timer and an explicit call may overlap): each removes
    // the manifest at the front it has just deleted.
    const run = this.retentionRun.then(() => this.removeExpired(now, logStart));
    this.retentionRun = run.catch(() => {});
    return run;
  }

  private retentionRun: Promise<unknown> = Promise.resolve();

  private async removeExpired(now: number, logStart: number): Promise<number> {
    const ms = this.o.retentionMs();
    if (ms < 0) return 0;
    await this.ensureLoaded(logStart);
    let n = 0;
    const { store, target } = this.o;
    while (this.manifests.length > 0) {
      const m = this.manifests[0];
      if (m.endOffset > logStart || m.maxTimestamp >= now - ms) break;
      await store.delete(objectKey(target.prefix, m.baseOffset, "manifest.json"));
      this.manifests.shift();
      this.archivedBytes -= m.bytes;
      this.forget(m.baseOffset);
      for (const ext of ["log", "index", "timeindex"] as const) await store.delete(objectKey(target.prefix, m.baseOffset, ext));
      n++;
    }
    return n;
  }
}

/** The archived offset index (8-byte entries: relative offset, position), if consistent (IDX-1: a hint). */
function parseIndex(b: Buffer, size: number): { rel: Uint32Array; pos: Uint32Array } {
  const n = b.length % 8 === 0 ? b.length / 8 : 0;
  const rel = new Uint32Array(n);
  const pos = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    rel[i] = b.readUInt32BE(i * 8);
    pos[i] = b.readUInt32BE(i * 8 + 4);
    const bad = i === 0 ? rel[0] !== 0 || pos[0] !== 0 : rel[i] <= rel[i - 1] || pos[i] <= pos[i - 1];
    if (bad || pos[i] >= size) return { rel: new Uint32Array(0), pos: new Uint32Array(0) };
  }
  return { rel, pos };
}

function floor(rel: Uint32Array, target: number): number {
  let lo = 0;
  let hi = rel.length - 1;
  let ans = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >>> 1;
    if (rel[mid] <= target) {
      ans = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return ans;
}
