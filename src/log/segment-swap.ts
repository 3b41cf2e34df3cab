// SPDX-License-Identifier: Apache-2.0
/**
 * Replacing a sealed segment's files by a cleaned copy, crash-safely (invariant CMP-3 in
 * docs/ARCHITECTURE.md: after a crash at any point each segment is wholly the old one or
 * wholly the new one). Kafka's `.cleaned` → `.swap` → rename, here per segment:
 *
 *   1. `<base>.log.cleaned` is written and fdatasync'ed, its directory entry fsync'ed;
 *   2. renamed to `<base>.log.swap`, directory fsync'ed: **the commit point**. From here on
 *      recovery finishes the swap; before it, recovery deletes the `.cleaned` file;
 *   3. the old `<base>.index` and `<base>.timeindex` are unlinked, directory fsync'ed (so no
 *      old index can ever sit next to the new log: indexes are hints, IDX-1, but a stale one
 *      of the same size would point into the wrong bytes);
 *   4. `<base>.log.swap` renamed over `<base>.log` (atomic replace), directory fsync'ed;
 *   5. the new indexes are written (rebuildable, not synced, as any segment's).
 *
 * A reader holding the old file's handle keeps reading the old file (the rename replaces the
 * directory entry, not the open inode); the cleaner holds a reference to the old segment until
 * the new one is published in memory, so no reader opens the new file with the old index.
 */
import { join } from "node:path";
import { unlinkIfExists, type FileSystem } from "./io.js";
import type { Segment } from "./segment.js";

export const CLEANED_SUFFIX = ".cleaned";
export const SWAP_SUFFIX = ".swap";

/** Steps 2-4 for a segment whose `.cleaned` log is written and durable (step 1 done). */
export async function commitSwap(fs: FileSystem, dir: string, seg: Segment): Promise<void> {
  await fs.rename(seg.logPath + CLEANED_SUFFIX, seg.logPath + SWAP_SUFFIX);
  await fs.fsyncDir(dir);
  await finishSwap(fs, dir, seg.logPath, seg.indexPath, seg.timeIndexPath);
}

async function finishSwap(fs: FileSystem, dir: string, logPath: string, indexPath: string, timeIndexPath: string): Promise<void> {
  await unlinkIfExists(fs, indexPath);
  await unlinkIfExists(fs, timeIndexPath);
  await fs.fsyncDir(dir);
  await fs.rename(logPath + SWAP_SUFFIX, logPath);
  await fs.fsyncDir(dir);
}

/**
 * Recovery (log-loader.ts, before segments are listed): finishes every committed swap and
 * deletes every uncommitted `.cleaned` file (CMP-3). Returns true if anything changed.
 */
export async function recoverSwaps(fs: FileSystem, dir: string, names: readonly string[]): Promise<boolean> {
  let changed = false;
  for (const n of names) {
    if (/^\d{20}\.log\.cleaned$/.test(n)) {
      await fs.unlink(join(dir, n));
      changed = true;
    }
  }
  if (changed) await fs.fsyncDir(dir);
  for (const n of names) {
    const m = /^(\d{20})\.log\.swap$/.exec(n);
    if (m === null) continue;
    await finishSwap(fs, dir, join(dir, `${m[1]}.log`), join(dir, `${m[1]}.index`), join(dir, `${m[1]}.timeindex`));
    changed = true;
  }
  return changed;
}
