// SPDX-License-Identifier: Apache-2.0
/**
 * Copies one sealed segment to the archive, verified, before retention may delete it
 * (docs/ARCHITECTURE.md):
 *
 *  ARC-1 a segment is deleted locally only after its archive copy was read back and verified
 *        against the local bytes and its manifest is durable. The manifest is put last and is
 *        the commit point: the data objects are put (each atomic and durable, archive-store.ts),
 *        read back and compared (length, CRC-32C, SHA-256), and only then the manifest. A crash
 *        anywhere before leaves the local segment in place (retention has not written the new
 *        log start yet, LOG-6) and at most objects without a manifest, which the next attempt
 *        overwrites: archiving is idempotent.
 */
import type { FileHandle, FileSystem } from "../io.js";
import { Segment } from "../segment.js";
import { ArchiveCorruptError, StorageError } from "../../errors.js";
import type { ArchiveStore } from "./archive-store.js";
import { Digest, MANIFEST_VERSION, objectKey, parseManifest, type SegmentManifest } from "./manifest.js";

/** Read-back chunk: verification never holds more than this of the copy in memory. */
const VERIFY_CHUNK = 1024 * 1024;

export interface ArchiveTarget {
  topic: string;
  topicId: string;
  partition: number;
  /** Key prefix of the partition (manifest.ts partitionPrefix). */
  prefix: string;
}

/** What the archiver needs of a local sealed segment. */
export interface LocalSegment {
  baseOffset: number;
  endOffset: number;
  size: number;
  logPath: string;
  indexPath: string;
  timeIndexPath: string;
}

/**
 * Archives `seg` unless a manifest for it is already there (an earlier attempt finished:
 * ARC-1 made it durable only after verification). Returns the manifest.
 */
export async function archiveSegment(fs: FileSystem, store: ArchiveStore, t: ArchiveTarget, seg: LocalSegment, now: number): Promise<SegmentManifest> {
  const mkey = objectKey(t.prefix, seg.baseOffset, "manifest.json");
  const existing = await store.get(mkey);
  if (existing !== null) {
    const m = parseManifest(existing);
    if (m !== null && m.baseOffset === seg.baseOffset && m.endOffset === seg.endOffset && m.bytes === seg.size && m.topicId === t.topicId) return m;
    // Not ours or not whole (a foreign file: puts are atomic): archive again over it.
  }
  const index = await readOptional(fs, seg.indexPath);
  const timeIndex = await readOptional(fs, seg.timeIndexPath);
  const fh = await fs.open(seg.logPath, "r");
  let d: { bytes: number; crc32c: number; sha256: string };
  let stats: Stats;
  try {
    // A sealed segment's file is exactly its logical size (LOG-4).
    const size = await fh.size();
    if (size < seg.size) throw new StorageError(`segment ${seg.logPath} is ${size} bytes, expected ${seg.size}`);
    stats = await scanStats(fh, seg.size, seg.baseOffset);
    // Streamed in VERIFY_CHUNK pieces, hashed on the way: memory stays O(chunk).
    const digest = new Digest();
    await store.put(objectKey(t.prefix, seg.baseOffset, "log"), chunks(fh, seg.size, digest));
    d = digest.finish();
    if (d.bytes !== seg.size) throw new StorageError(`read ${d.bytes} bytes of ${seg.logPath}, expected ${seg.size}`);
  } finally {
    await fh.close();
  }
  const di = Digest.of(index);
  const dt = Digest.of(timeIndex);
  await store.put(objectKey(t.prefix, seg.baseOffset, "index"), index);
  await store.put(objectKey(t.prefix, seg.baseOffset, "timeindex"), timeIndex);
  // Read back what the store holds now, not what we sent (ARC-1).
  await verifyObject(store, objectKey(t.prefix, seg.baseOffset, "log"), d);
  await verifyObject(store, objectKey(t.prefix, seg.baseOffset, "index"), di);
  await verifyObject(store, objectKey(t.prefix, seg.baseOffset, "timeindex"), dt);
  const m: SegmentManifest = {
    version: MANIFEST_VERSION,
    topic: t.topic,
    topicId: t.topicId,
    partition: t.partition,
    baseOffset: seg.baseOffset,
    endOffset: seg.endOffset,
    ...stats,
    bytes: d.bytes,
    crc32c: d.crc32c,
    sha256: d.sha256,
    indexBytes: di.bytes,
    indexSha256: di.sha256,
    timeIndexBytes: dt.bytes,
    timeIndexSha256: dt.sha256,
    archivedAt: now,
  };
  await store.put(mkey, Buffer.from(JSON.stringify(m), "utf8"));
  return m;
}

/**
 * Streams the object back in VERIFY_CHUNK ranges and compares length, CRC-32C and SHA-256
 * (memory bounded by the chunk). Throws ArchiveCorruptError on a mismatch (ARC-3).
 */
export async function verifyObject(store: ArchiveStore, key: string, want: { bytes: number; sha256: string; crc32c?: number }): Promise<void> {
  const size = await store.size(key);
  if (size === null) throw new ArchiveCorruptError(key, "missing");
  if (size !== want.bytes) throw new ArchiveCorruptError(key, `${size} bytes, expected ${want.bytes}`);
  const d = new Digest();
  for (let pos = 0; pos < size; pos += VERIFY_CHUNK) {
    const chunk = await store.get(key, { start: pos, end: Math.min(size, pos + VERIFY_CHUNK) });
    if (chunk === null) throw new ArchiveCorruptError(key, "vanished while being verified");
    d.update(chunk);
  }
  const got = d.finish();
  if (got.bytes !== want.bytes) throw new ArchiveCorruptError(key, `read ${got.bytes} bytes, expected ${want.bytes}`);
  if (want.crc32c !== undefined && got.crc32c !== want.crc32c) throw new ArchiveCorruptError(key, `CRC-32C ${got.crc32c}, expected ${want.crc32c}`);
  if (got.sha256 !== want.sha256) throw new ArchiveCorruptError(key, `SHA-256 ${got.sha256}, expected ${want.sha256}`);
}

async function readOptional(fs: FileSystem, path: string): Promise<Buffer> {
  return (await fs.stat(path)) === null ? Buffer.alloc(0) : fs.readFile(path);
}

type Stats = Pick<SegmentManifest, "minTimestamp" | "maxTimestamp" | "recordCount" | "batchCount" | "damagedRanges">;

/** Walks the batches (verified as every read verifies them, LOG-2) for the manifest's counts. */
async function scanStats(fh: FileHandle, size: number, baseOffset: number): Promise<Stats> {
  const s: Stats = { minTimestamp: -1, maxTimestamp: -1, recordCount: 0, batchCount: 0, damagedRanges: 0 };
  await Segment.scan(fh, 0, baseOffset, size, {
    onBatch: (h) => {
      s.batchCount++;
      s.recordCount += h.count; // offsets spanned: a sparse batch (compaction) holds fewer records
      if (s.minTimestamp < 0 || h.firstTimestamp < s.minTimestamp) s.minTimestamp = h.firstTimestamp;
      if (h.maxTimestamp > s.maxTimestamp) s.maxTimestamp = h.maxTimestamp;
    },
    onCorrupt: () => {
      s.damagedRanges++;
      return "skip";
    },
  });
  return s;
}

/** The first `size` bytes of a file in VERIFY_CHUNK pieces, each fed to `digest` on the way. */
async function* chunks(fh: FileHandle, size: number, digest: Digest): AsyncIterable<Uint8Array> {
  for (let pos = 0; pos < size; pos += VERIFY_CHUNK) {
    const n = Math.min(VERIFY_CHUNK, size - pos);
    const buf = Buffer.allocUnsafe(n);
    let got = 0;
    while (got < n) {
      const r = await fh.read(buf, got, n - got, pos + got);
      if (r === 0) throw new StorageError(`short read of ${fh.path} at ${pos + got}`);
      got += r;
    }
    digest.update(buf);
    yield buf;
  }
}
