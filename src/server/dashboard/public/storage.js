// SPDX-License-Identifier: Apache-2.0
// The Topics page's compaction and archive figures: describeTopic's per-partition fields for
// compacted topics (cleaner*) and topics with an archive (archive*), counted since the broker
// opened. Plain values only (no DOM), so the wording is tested in Node.
import { bytes, num, percent, seconds, time } from "./format.js";

export const isCompacted = (d) => d.partitions.some((p) => p.cleanerDirtyRatio !== undefined);
export const isArchived = (d) => d.partitions.some((p) => p.archivedBytes !== undefined);

/** When the last compaction pass ended and how long ago (by this browser's clock). */
export function lastPass(ms, nowMs) {
  if (ms === null || ms === undefined) return "none since the broker started";
  return `${time(ms)} (${seconds(Math.max(0, nowMs - ms) / 1000)} ago)`;
}

/** A running pass's progress, or "idle". */
export function passState(progress) {
  return progress === null || progress === undefined ? "idle" : `running, ${percent(progress)} done`;
}

/** Bytes per second, or "—" without a rate yet. */
export function byteRate(r) {
  return r === null || r === undefined ? "—" : `${bytes(r)}/s`;
}

export const CLEANER_HEADERS = ["Partition", "Not yet compacted", "Reclaimed", "Passes", "Last pass", "Running pass"];

/** One row per partition of a compacted topic: cells as format.js's table() takes them. */
export function cleanerRows(d, nowMs) {
  return d.partitions
    .filter((p) => p.cleanerDirtyRatio !== undefined)
    .map((p) => ({
      attrs: { "data-partition": p.partition },
      cells: [
        { v: String(p.partition), class: "num" },
        { v: percent(p.cleanerDirtyRatio), class: "num cleaner-dirty" },
        { v: bytes(p.bytesReclaimed), class: "num cleaner-reclaimed" },
        { v: num(p.cleanerPasses), class: "num cleaner-passes" },
        { v: lastPass(p.lastCleanedAt, nowMs), class: "cleaner-last" },
        { v: passState(p.cleanerPassProgress), class: "cleaner-pass" },
      ],
    }));
}

export const ARCHIVE_HEADERS = ["Partition", "First archived (offset)", "Archived", "Archived segments", "Waiting to be archived", "Read from archive", "Archive read rate"];

/** One row per partition of a topic with an archive; `readRate(partition)` is bytes/s or null. */
export function archiveRows(d, readRate) {
  return d.partitions
    .filter((p) => p.archivedBytes !== undefined)
    .map((p) => ({
      attrs: { "data-partition": p.partition },
      cells: [
        { v: String(p.partition), class: "num" },
        { v: p.archiveStartOffset === null ? "none" : num(p.archiveStartOffset), class: "num archive-start" },
        { v: bytes(p.archivedBytes), class: "num archive-bytes" },
        { v: num(p.archivedSegments), class: "num archive-segments" },
        { v: bytes(p.archiveLagBytes), class: p.archiveLagBytes > 0 ? "num archive-lag warn" : "num archive-lag" },
        { v: bytes(p.archiveReadBytes), class: "num archive-read" },
        { v: byteRate(readRate(p.partition)), class: "num archive-read-rate" },
      ],
    }));
}
