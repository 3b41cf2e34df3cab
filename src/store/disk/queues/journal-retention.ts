// SPDX-License-Identifier: Apache-2.0
/**
 * How much of a queue's state journal outlives the snapshot that covers it (EVT-2). Recovery
 * needs nothing below the snapshot's journal offset (JRN-3), but `queue.events()` readers read
 * the journal as the queue's event history, so only whole segments beyond the newest
 * EVENT_HISTORY_BYTES are deleted: the journal keeps at least that much history (and at most
 * that plus one segment), however often snapshots are taken (every close takes one).
 */

/** Journal bytes kept for events readers below the latest snapshot: 16 MiB. */
export const EVENT_HISTORY_BYTES = 16 * 1024 * 1024;

/**
 * The journal's new start after a snapshot at `snapshotOffset`: the base of the oldest segment
 * that the newest EVENT_HISTORY_BYTES need, never above `snapshotOffset`. Returns the first
 * segment's base (no change) while the journal is smaller than that.
 */
export function retainedJournalStart(segments: readonly { baseOffset: number; size: number }[], snapshotOffset: number, keepBytes = EVENT_HISTORY_BYTES): number {
  let bytes = 0;
  for (let i = segments.length - 1; i >= 0; i--) {
    bytes += segments[i].size;
    if (bytes >= keepBytes) return Math.min(snapshotOffset, segments[i].baseOffset);
  }
  return Math.min(snapshotOffset, segments[0]?.baseOffset ?? snapshotOffset);
}

/**
 * The message log's new start for a snapshot whose floor is `floor`: the base of the segment
 * holding it. The same segments are deleted as with the floor itself (only whole ones ever
 * are), but the finished jobs still on disk stay readable for `queue.events()` ("enqueued").
 */
export function messageLogStart(segments: readonly { baseOffset: number }[], floor: number): number {
  let start = floor;
  for (const s of segments) if (s.baseOffset <= floor) start = s.baseOffset;
  return start;
}
