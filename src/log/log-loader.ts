// SPDX-License-Identifier: Apache-2.0
/**
 * Opening a partition directory (Kafka's LogLoader): the log start from `partition.json`,
 * the segment list, the active segment verified batch by batch after an unclean shutdown
 * (LOG-7: a torn or zero tail is cut, damage inside acknowledged data is kept and reported),
 * and the producer state from its snapshot plus the batches after it (PROD-1).
 */
import { join } from "node:path";
import { readJsonFile, unlinkIfExists } from "./io.js";
import { endOfNonZero, MAX_CORRUPT_RANGES, readFully } from "./batch-cursor.js";
import { LogState, type LogContext } from "./log-state.js";
import type { ProducerSnapshot } from "./producer-state.js";
import { HEADER_SIZE } from "./record-batch.js";
import { Segment } from "./segment.js";
import { recoverSwaps } from "./segment-swap.js";
import type { StorageError } from "../errors.js";

/** `partition.json`: where the log starts (LOG-6: written before segments below it go). */
export interface PartitionMeta {
  logStartOffset: number;
}

export const PARTITION_META_FILE = "partition.json";
export const PRODUCER_SNAPSHOT_FILE = "producers.json";
/** Written by a clean close; its presence means the active segment needs no scan. */
export const CLEAN_MARKER = ".clean";

export async function loadLog(ctx: LogContext, onFault: ((err: StorageError) => void) | null): Promise<LogState> {
  const { fs, dir } = ctx;
  const st = new LogState(ctx, onFault);
  await fs.mkdir(dir);
  const meta = await readJsonFile<PartitionMeta>(fs, join(dir, PARTITION_META_FILE));
  st.logStart = meta?.logStartOffset ?? 0;
  let names = await fs.readdir(dir);
  // CMP-3: an interrupted compaction swap is finished (committed) or discarded first.
  if (await recoverSwaps(fs, dir, names)) names = await fs.readdir(dir);
  const clean = names.includes(CLEAN_MARKER);
  // A stray temp file may vanish between the listing and here (its writer's rename): gone is fine.
  for (const n of names) if (n.endsWith(".tmp")) await unlinkIfExists(fs, join(dir, n));
  const bases = names
    .filter((n) => /^\d{20}\.log$/.test(n))
    .map((n) => Number(n.slice(0, 20)))
    .sort((a, b) => a - b);
  // Segments wholly below the log start are leftovers of an interrupted deletion (LOG-6).
  while (bases.length > 1 && bases[1] <= st.logStart) await new Segment(fs, dir, bases.shift()!).unlinkFiles();
  if (clean) {
    // The marker is removed durably before any new write, so a later crash is never
    // mistaken for a clean shutdown.
    await fs.unlink(join(dir, CLEAN_MARKER));
    await fs.fsyncDir(dir);
  }
  if (bases.length === 0) bases.push(st.logStart);
  for (let i = 0; i < bases.length; i++) {
    const seg = new Segment(fs, dir, bases[i]);
    seg.size = (await fs.stat(seg.logPath))?.size ?? 0;
    if (i < bases.length - 1) {
      seg.sealed = true;
      seg.endOffset = bases[i + 1];
    }
    st.segments.push(seg);
  }
  if (st.logStart < st.segments[0].baseOffset) st.logStart = st.segments[0].baseOffset;

  const active = st.active;
  // A new log (or one whose start passed all its segments) creates its first segment here:
  // its directory entry must be durable before anything appended to it is acknowledged (FS-2).
  const created = (await fs.stat(active.logPath)) === null;
  active.handle = await fs.open(active.logPath, "create");
  if (created) await fs.fsyncDir(dir);
  active.size = await active.handle.size();
  // A clean close truncated the file to its last batch, so its size is the logical size.
  const trusted = clean && (await active.loadIndexes(active.size, null));
  if (!trusted) await recoverActive(ctx, active);
  active.fileEnd = active.size;
  // The age of a recovered segment counts from its first record (as Kafka's segment.ms),
  // not from this open, so restarts cannot keep a segment (and its data) alive forever.
  active.createdAtMs = active.size > 0 ? await firstTimestamp(active, ctx.telemetry.clock.now()) : null;
  active.bytesSinceIndex = active.index && active.index.n > 0 ? active.size - active.index.pos[active.index.n - 1] : active.size;
  st.nextOffset = st.hwm = active.endOffset;
  st.readableSize = st.syncedSize = active.size;
  if (st.logStart > st.nextOffset) st.logStart = st.nextOffset;
  await recoverProducers(st, clean);
  return st;
}

async function firstTimestamp(seg: Segment, now: number): Promise<number> {
  const head = Buffer.alloc(HEADER_SIZE);
  if ((await readFully(seg.handle!, head, HEADER_SIZE, 0)) < HEADER_SIZE) return now;
  const ts = head.readInt32BE(24) * 4294967296 + head.readUInt32BE(28);
  return Math.min(ts, now);
}

/** Scans the active segment after an unclean shutdown, truncating a torn tail (LOG-7). */
async function recoverActive(ctx: LogContext, seg: Segment): Promise<void> {
  const { logger } = ctx;
  seg.index = null;
  seg.maxTimestamp = -1;
  seg.endOffset = seg.baseOffset;
  seg.bytesSinceIndex = 0;
  let validEnd = 0;
  let tornAt: number | null = null;
  let tornDetail = "";
  const fileSize = seg.size;
  const end = await Segment.scan(seg.handle!, 0, seg.baseOffset, fileSize, {
    onBatch: (h, pos) => {
      seg.noteBatch(h.baseOffset, h.count, pos, h.length, h.maxTimestamp);
      validEnd = pos + h.length;
    },
    onCorrupt: (pos, expected, detail, next) => {
      if (next === null) {
        tornAt = pos;
        tornDetail = detail;
        return "stop";
      }
      // Intact batches follow: this is damage inside acknowledged data, not a torn write.
      // Never drop it silently: keep the bytes, record the range, serve a typed error.
      logger.error({ file: seg.logPath, position: pos, offset: expected, nextOffset: next.offset, detail }, "corrupt batch inside active segment");
      if (seg.corrupt.length < MAX_CORRUPT_RANGES) seg.corrupt.push({ offset: expected, nextOffset: next.offset, pos, nextPos: next.pos });
      seg.endOffset = next.offset;
      return "skip";
    },
  });
  if (tornAt !== null) {
    // Past the last intact batch: zeros of preallocation (LOG-8), possibly after the torn
    // remains of a write the crash interrupted. Neither was acknowledged; both are cut.
    const nonZeroEnd = await endOfNonZero(seg.handle!, tornAt, fileSize);
    const dropped = fileSize - tornAt;
    if (nonZeroEnd > tornAt)
      logger.warn({ file: seg.logPath, position: tornAt, bytesDropped: dropped, tornBytes: nonZeroEnd - tornAt, detail: tornDetail }, "truncating torn tail of active segment");
    else logger.info({ file: seg.logPath, position: tornAt, bytesDropped: dropped }, "dropping preallocated zero tail of active segment");
    await seg.handle!.truncate(tornAt);
    await seg.handle!.datasync();
    seg.size = tornAt;
  } else seg.size = end.pos;
  if (validEnd > seg.size) throw new Error("recovery invariant: valid end beyond size");
  seg.endOffset = end.offset;
}

/**
 * Producer state: the snapshot, if it describes a prefix of this log (PROD-1: it never names
 * a batch at or past its offset, and its offset must not lie beyond the recovered end), then
 * the producer fields of every batch from there to the end, replayed in offset order.
 */
async function recoverProducers(st: LogState, clean: boolean): Promise<void> {
  const { fs, dir, logger } = st.ctx;
  const snap = await readJsonFile<ProducerSnapshot>(fs, join(dir, PRODUCER_SNAPSHOT_FILE)).catch((e: unknown) => {
    logger.warn({ err: e, dir }, "ignoring unreadable producer snapshot; rebuilding producer state from the log");
    return null;
  });
  let from = st.logStart;
  if (snap && snap.offset >= st.logStart && snap.offset <= st.nextOffset) {
    st.producers.load(snap);
    from = snap.offset;
  } else if (snap) {
    logger.warn({ dir, snapshotOffset: snap.offset, logStartOffset: st.logStart, logEndOffset: st.nextOffset }, "producer snapshot does not describe this log; rebuilding producer state from the log");
  }
  if (clean && from === st.nextOffset) return;
  // Replay the producer fields of batches written after the snapshot (each batch is verified).
  for (const seg of st.segments) {
    const isActive = seg === st.active;
    if (seg.endOffset <= from && !isActive) continue;
    if (seg.baseOffset >= st.nextOffset) break;
    const fh = isActive ? seg.handle! : await fs.open(seg.logPath, "r");
    try {
      await Segment.scan(fh, 0, seg.baseOffset, isActive ? st.readableSize : seg.size, {
        onBatch: (h) => {
          if (h.baseOffset >= from && h.producerId >= 0) st.producers.replay(h.producerId, h.producerEpoch, h.baseSequence, h.count, h.baseOffset, h.maxTimestamp);
        },
        onCorrupt: () => "skip",
      });
    } finally {
      if (!isActive) await fh.close();
    }
  }
}
