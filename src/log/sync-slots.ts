// SPDX-License-Identifier: Apache-2.0
/**
 * Bookkeeping of the append pipeline's syncs (group-commit.ts, durability "always"): the
 * descriptors concurrent syncs run on, and which rounds in flight may be published.
 *
 * LOG-9: an fdatasync that returns covers every byte written before it was issued; an O_DSYNC
 * write covers only its own bytes; concurrent syncs use distinct descriptors, one at a time per
 * descriptor, so each reports a writeback error (Linux reports one once per open file
 * description: two syncs sharing one could leave one of them returning success for lost data).
 */
import type { FileHandle, FileSystem } from "./io.js";
import type { Segment } from "./segment.js";

/** One round whose sync (an fdatasync or an O_DSYNC write) is in flight. */
export interface InflightSync<I> {
  items: I[];
  /** Byte position in the active segment where this round ends. */
  endPos: number;
  /**
   * true: an fdatasync issued after the round was written, so it also covers every older
   * round written before it (LOG-9). false: an O_DSYNC write of the round (write and sync in
   * one I/O operation), which makes only its own bytes durable.
   */
  covers: boolean;
  state: "running" | "ok" | "failed";
  err: unknown;
  /** Settles (never rejects) when the sync returns; `state` tells how. */
  promise: Promise<void>;
}

/**
 * How many of the oldest rounds in `syncs` (oldest first) can be published now: each one's
 * own sync returned, or (a round written before a later fdatasync was issued) a later
 * fdatasync returned (LOG-9). -1 when a sync failed.
 */
export function settledPrefix(syncs: readonly InflightSync<unknown>[]): number {
  let lastCover = -1;
  for (let i = 0; i < syncs.length; i++) {
    const s = syncs[i];
    if (s.state === "failed") return -1;
    if (s.state === "ok" && s.covers) lastCover = i;
  }
  let n = 0;
  while (n < syncs.length) {
    const s = syncs[n];
    // An O_DSYNC write may still be running when a later fdatasync is issued: only its own
    // return makes its bytes durable.
    if (s.state === "ok" || (s.covers && n < lastCover)) n++;
    else break;
  }
  return n;
}

/** The active segment's descriptors for concurrent syncs: its own handle, then extra ones. */
export class SyncSlots {
  /** Extra descriptors of the active segment, one per concurrent sync (see LOG-9). */
  private handles: FileHandle[] = [];
  private turn = 0;
  /** Per descriptor, its last sync (settles, never rejects): one at a time per descriptor. */
  private busy: Promise<void>[] = [];

  constructor(
    private readonly fs: FileSystem,
    private readonly max: number,
  ) {}

  /**
   * The descriptor for the next sync, once its previous one returned: at most one per
   * descriptor, including syncs already covered by a later fdatasync and no longer tracked.
   * The caller hands the sync's promise to `occupy(slot, ...)` before its next await.
   */
  async take(seg: Segment): Promise<{ fh: FileHandle; slot: number }> {
    const k = this.turn % this.max;
    let fh: FileHandle;
    if (k === 0) fh = seg.handle!;
    else {
      while (this.handles.length < k) this.handles.push(await this.fs.open(seg.logPath, "rw"));
      fh = this.handles[k - 1];
    }
    const busy = this.busy[k];
    if (busy) await busy;
    this.turn++;
    return { fh, slot: k };
  }

  occupy(slot: number, sync: Promise<void>): void {
    this.busy[slot] = sync;
  }

  /** Waits for every sync and closes the extra descriptors (the active segment changes or the log closes). */
  async closeAll(): Promise<void> {
    await Promise.all(this.busy);
    const hs = this.handles;
    this.handles = [];
    this.turn = 0;
    this.busy = [];
    for (const h of hs) await h.close().catch(() => {});
  }
}
