// SPDX-License-Identifier: Apache-2.0
/**
 * Retention of one partition: the log start moves forward (by time, by size, or by request,
 * e.g. a queue whose prefix is settled), and whole sealed segments below it are deleted.
 *
 * Invariant LOG-6: the new log start is written durably (`partition.json`) before any segment
 * below it is deleted, so a crash in between leaves segments that recovery removes, never a
 * log start that points into deleted data.
 */
import { join } from "node:path";
import { ValidationError } from "../errors.js";
import { writeFileAtomic } from "./io.js";
import { PARTITION_META_FILE, type PartitionMeta } from "./log-loader.js";
import type { LogReader } from "./log-reader.js";
import type { LogState } from "./log-state.js";
import type { Segment } from "./segment.js";

export class Retention {
  /** Serializes log start moves (concurrent callers queue). */
  private lock: Promise<void> = Promise.resolve();

  constructor(
    private readonly st: LogState,
    private readonly reader: LogReader,
    /**
     * Runs before the new log start is written, with the segments about to be deleted (a
     * topic with an archive copies them there first: ARC-1, src/log/archive/). If it fails,
     * nothing moves and nothing is deleted.
     */
    private readonly beforeDelete: ((segs: Segment[]) => Promise<void>) | null = null,
  ) {}

  /** Resolves when no log start move is running (close). */
  idle(): Promise<void> {
    return this.lock;
  }

  /** Durably moves the log start to `offset` and deletes whole sealed segments below it (LOG-6). */
  advanceLogStart(offset: number): Promise<void> {
    const st = this.st;
    if (offset <= st.logStart) return Promise.resolve();
    if (offset > st.hwm) return Promise.reject(new ValidationError(`cannot move log start to ${offset} beyond ${st.hwm}`));
    const { fs, dir } = st.ctx;
    const run = this.lock.then(async () => {
      if (this.beforeDelete !== null) await this.beforeDelete(st.segments.slice(0, -1).filter((seg) => seg.endOffset <= offset));
      await writeFileAtomic(fs, join(dir, PARTITION_META_FILE), JSON.stringify({ logStartOffset: offset } satisfies PartitionMeta));
      st.logStart = Math.max(st.logStart, offset);
      while (st.segments.length > 1 && st.segments[0].endOffset <= st.logStart) {
        const seg = st.segments.shift()!;
        seg.deleted = true;
        await seg.unlinkFiles();
        // A reader still holding the handle closes it on release.
        if (seg.refs === 0 && seg.handle) {
          const h = seg.handle;
          seg.handle = null;
          await h.close();
        }
      }
      await fs.fsyncDir(dir);
    });
    this.lock = run.catch(() => {});
    return run;
  }

  /** Deletes whole sealed segments past retention by time or size; never the active one. */
  async enforce(now = this.st.ctx.telemetry.clock.now()): Promise<number> {
    const st = this.st;
    const { retentionMs, retentionBytes } = st.ctx.config;
    let newStart = st.logStart;
    let total = 0;
    for (const seg of st.segments) total += seg.size;
    for (let i = 0; i < st.segments.length - 1; i++) {
      const seg = st.segments[i];
      if (seg.endOffset <= newStart) {
        total -= seg.size;
        continue;
      }
      let expired = false;
      if (retentionMs >= 0) {
        await this.reader.ensureTimestamps(seg);
        if (seg.maxTimestamp < now - retentionMs) expired = true;
      }
      if (retentionBytes >= 0 && total - seg.size >= retentionBytes) expired = true;
      if (!expired) break;
      total -= seg.size;
      newStart = seg.endOffset;
    }
    if (newStart > st.logStart) {
      st.ctx.logger.info({ topic: st.ctx.topic, partition: st.ctx.partition, logStartOffset: newStart }, "retention moved log start");
      await this.advanceLogStart(newStart);
    }
    return st.logStart;
  }
}
