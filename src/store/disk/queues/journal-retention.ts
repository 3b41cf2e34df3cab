// SPDX-License-Identifier: Apache-2.0
/**
 * How much of a queue's state journal outlives the snapshot that covers it (EVT-2). Recovery
 * needs nothing below the snapshot's journal offset (JRN-3), but `queue.events()` readers read
 * the journal as the queue's event history, so only whole segments beyond the newest
 * `keepBytes` are deleted: the queue's journal segment size (a quarter of `segmentBytes`,
 * within 16 KiB .. 16 MiB), so the journal keeps at least one segment of history below the
 * active one and at most two, however often snapshots are taken (every close takes one).
 */

/**
 * The journal's new start after a snapshot at `snapshotOffset`: the base of the oldest segment
 * that the newest `keepBytes` need, never above `snapshotOffset`. Returns the first segment's
 * base (no change) while the journal is smaller than that.
 */
export function retainedJournalStart(segments: readonly { baseOffset: number; size: number }[], snapshotOffset: number, keepBytes: number): number {
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
