// SPDX-License-Identifier: Apache-2.0
/**
 * The manifest of one archived segment and the archive's key layout
 * (docs/storage-format.md "Segment archive"):
 *
 *   <topic>/<topicId>/<partition>/<base>.log            the segment's bytes, as they were on disk
 *   <topic>/<topicId>/<partition>/<base>.index          its offset index (a hint, may be empty)
 *   <topic>/<topicId>/<partition>/<base>.timeindex      its time index (a hint, may be empty)
 *   <topic>/<topicId>/<partition>/<base>.manifest.json  written last: the segment is archived (ARC-1)
 *
 * `<base>` is the 20-digit base offset, as in a partition directory. The topic id keeps a
 * deleted and re-created topic of the same name from ever reading the old one's archive.
 */
import { createHash } from "node:crypto";
import { crc32c } from "../crc32c.js";
import { segmentFileName } from "../segment.js";
import { keyPart } from "./archive-store.js";

export const MANIFEST_VERSION = 1;

export interface SegmentManifest {
  version: number;
  topic: string;
  topicId: string;
  partition: number;
  baseOffset: number;
  /** Offset after the segment's last record. */
  endOffset: number;
  /** Smallest and largest record timestamp of the intact batches (-1 if none). */
  minTimestamp: number;
  maxTimestamp: number;
  /** Records and batches in intact batches. */
  recordCount: number;
  batchCount: number;
  /** Damaged batch ranges found when archiving (bytes copied as they were; never served, LOG-2). */
  damagedRanges: number;
  /** Length of the .log object; its CRC-32C (Castagnoli, as unsigned) and SHA-256 (hex). */
  bytes: number;
  crc32c: number;
  sha256: string;
  /** The index objects' lengths and SHA-256 (indexes are hints; checked by `archive verify`). */
  indexBytes: number;
  indexSha256: string;
  timeIndexBytes: number;
  timeIndexSha256: string;
  /** Wall time of archiving (ms since epoch). */
  archivedAt: number;
}

/** `<topic>/<topicId>/<partition>/` */
export function partitionPrefix(topic: string, topicId: string, partition: number): string {
  return `${keyPart(topic)}/${topicId}/${partition}/`;
}

export function objectKey(prefix: string, baseOffset: number, ext: "log" | "index" | "timeindex" | "manifest.json"): string {
  return prefix + segmentFileName(baseOffset, ext);
}

const MANIFEST_RE = /(?:^|\/)(\d{20})\.manifest\.json$/;
const DATA_RE = /(?:^|\/)(\d{20})\.(log|index|timeindex)$/;

/** The base offset of a manifest key, or null. */
export function manifestBase(key: string): number | null {
  const m = MANIFEST_RE.exec(key);
  return m ? Number(m[1]) : null;
}

/** The base offset of a data object key (.log, .index, .timeindex), or null. */
export function dataBase(key: string): number | null {
  const m = DATA_RE.exec(key);
  return m ? Number(m[1]) : null;
}

/** Hashes of bytes fed in chunks: CRC-32C and SHA-256 of the whole. */
export class Digest {
  private crc = 0;
  private readonly sha = createHash("sha256");
  length = 0;
  update(b: Uint8Array): void {
    this.crc = crc32c(b, 0, b.length, this.crc);
    this.sha.update(b);
    this.length += b.length;
  }
  finish(): { bytes: number; crc32c: number; sha256: string } {
    return { bytes: this.length, crc32c: this.crc >>> 0, sha256: this.sha.digest("hex") };
  }
  static of(b: Uint8Array): { bytes: number; crc32c: number; sha256: string } {
    const d = new Digest();
    d.update(b);
    return d.finish();
  }
}

const NUM_FIELDS = ["version", "partition", "baseOffset", "endOffset", "minTimestamp", "maxTimestamp", "recordCount", "batchCount", "damagedRanges", "bytes", "crc32c", "indexBytes", "timeIndexBytes", "archivedAt"] as const;
const STR_FIELDS = ["topic", "topicId", "sha256", "indexSha256", "timeIndexSha256"] as const;

/** Parses a manifest; null if it is not one this version understands (reported by the caller). */
export function parseManifest(bytes: Buffer): SegmentManifest | null {
  let m: Record<string, unknown>;
  try {
    m = JSON.parse(bytes.toString("utf8")) as Record<string, unknown>;
  } catch {
    return null;
  }
  if (typeof m !== "object" || m === null || m.version !== MANIFEST_VERSION) return null;
  for (const k of NUM_FIELDS) if (typeof m[k] !== "number" || !Number.isSafeInteger(m[k]) ) return null;
  for (const k of STR_FIELDS) if (typeof m[k] !== "string") return null;
  const r = m as unknown as SegmentManifest;
  if (r.endOffset < r.baseOffset || r.bytes < 0) return null;
  return r;
}
