// SPDX-License-Identifier: Apache-2.0
/**
 * The last progress of each live job (`job.progress(value)`, JSON text of at most
 * MAX_PROGRESS_BYTES): set by a PROGRESS journal event while the job is leased (durable before
 * the call resolves, Q-2), carried by snapshots, replayed on open, and dropped when the job
 * finishes (acked, dead-lettered, purged), so its memory is bounded by the live jobs that
 * reported progress. Empty (one `size` check per settlement) for queues that never use it.
 */
import { isTerminal, type JobTable } from "./table.js";

export class JobProgress {
  constructor(private readonly byOffset = new Map<number, string>()) {}

  get(off: number): string | undefined {
    return this.byOffset.get(off);
  }

  set(off: number, json: string): void {
    this.byOffset.set(off, json);
  }

  /** The job finished. */
  drop(off: number): void {
    if (this.byOffset.size > 0) this.byOffset.delete(off);
  }

  /** A purge: every job below `end` is gone. */
  dropBelow(end: number): void {
    for (const off of this.byOffset.keys()) if (off < end) this.byOffset.delete(off);
  }

  /** Entries of jobs still live in `t` (the snapshot's; the rest are dropped). */
  live(t: JobTable): [number, string][] {
    const out: [number, string][] = [];
    for (const [off, json] of this.byOffset) {
      if (t.has(off) && !isTerminal(t.status[t.idx(off)])) out.push([off, json]);
      else this.byOffset.delete(off);
    }
    return out;
  }
}
