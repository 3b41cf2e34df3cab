// SPDX-License-Identifier: Apache-2.0
/**
 * Brings archived segments back online: copies the archived segments from the one holding
 * `from` up to the online log start into the partition directory, then moves the log start
 * back, for fast replay from local disk. Offline only: the caller holds the data dir's lock
 * (FS-3), so no broker has the partition open.
 *
 * Crash safety (ARC-5): each restored file is verified against its manifest (SHA-256) before
 * it is written, then written and fdatasynced under a temp name, renamed, and the directory
 * fsynced; `partition.json` (the log start) is replaced last (META-1). A crash before that
 * leaves segments wholly below the log start, which opening the partition deletes (LOG-6):
 * nothing changes until the restore completes. The manifests stay, so the restored segments
 * are not archived again when retention deletes them later (ARC-1 is idempotent).
 */
import { join } from "node:path";
import { ValidationError } from "../../errors.js";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../io.js";
import { PARTITION_META_FILE, type PartitionMeta } from "../log-loader.js";
import { segmentFileName } from "../segment.js";
import type { ArchiveStore } from "./archive-store.js";
import { Digest, manifestBase, objectKey, parseManifest, type SegmentManifest } from "./manifest.js";
import { ArchiveCorruptError } from "../../errors.js";

export interface RestoreResult {
  /** The log start before and after. */
  previousLogStart: number;
  logStart: number;
  segments: number;
  bytes: number;
}

/** Restores [segment holding `from`, current log start) of the partition in `partitionDir`. */
export async function restoreRange(fs: FileSystem, store: ArchiveStore, prefix: string, partitionDir: string, from: number): Promise<RestoreResult> {
  const meta = await readJsonFile<PartitionMeta>(fs, join(partitionDir, PARTITION_META_FILE));
  const logStart = meta?.logStartOffset ?? 0;
  const names = await fs.readdir(partitionDir);
  // The segment holding the log start (files below it would be leftovers opening deletes, LOG-6).
  const bases = names.filter((n) => /^\d{20}\.log$/.test(n)).map((n) => Number(n.slice(0, 20))).filter((b) => b <= logStart);
  const firstLocal = bases.length > 0 ? Math.max(...bases) : logStart;
  if (from >= logStart) return { previousLogStart: logStart, logStart, segments: 0, bytes: 0 };
  const manifests: SegmentManifest[] = [];
  for (const k of await store.list(prefix)) {
    if (manifestBase(k) === null) continue;
    const b = await store.get(k);
    const m = b === null ? null : parseManifest(b);
    if (m !== null) manifests.push(m);
  }
  manifests.sort((a, b) => a.baseOffset - b.baseOffset);
  // The local log starts at the segment holding `logStart`: restored segments must end exactly there.
  const chain = manifests.filter((m) => m.endOffset > from && m.baseOffset < firstLocal);
  if (chain.length === 0 || chain[0].baseOffset > from) throw new ValidationError(`offset ${from} is not in the archive`);
  for (let i = 1; i < chain.length; i++) if (chain[i].baseOffset !== chain[i - 1].endOffset) throw new ValidationError(`the archive has a gap at offset ${chain[i - 1].endOffset}`);
  if (chain[chain.length - 1].endOffset !== firstLocal) throw new ValidationError(`archived segments end at ${chain[chain.length - 1].endOffset}, but the local log's first segment starts at ${firstLocal}; cannot join them`);
  let bytes = 0;
  for (const m of chain) {
    for (const ext of ["log", "index", "timeindex"] as const) {
      const key = objectKey(prefix, m.baseOffset, ext);
      const data = (await store.get(key)) ?? Buffer.alloc(0);
      const want = ext === "log" ? m.sha256 : ext === "index" ? m.indexSha256 : m.timeIndexSha256;
      if (Digest.of(data).sha256 !== want) {
        if (ext === "log") throw new ArchiveCorruptError(key, "SHA-256 does not match the manifest; nothing restored");
        continue; // indexes are hints (IDX-1): a bad one is rebuilt from the log
      }
      await writeFileAtomic(fs, join(partitionDir, segmentFileName(m.baseOffset, ext)), data);
      bytes += data.length;
    }
  }
  // Last: the log start moves back (META-1). Before this, the copies are leftovers (LOG-6).
  await writeFileAtomic(fs, join(partitionDir, PARTITION_META_FILE), JSON.stringify({ logStartOffset: chain[0].baseOffset } satisfies PartitionMeta));
  return { previousLogStart: logStart, logStart: chain[0].baseOffset, segments: chain.length, bytes };
}
