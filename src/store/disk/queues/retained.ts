// SPDX-License-Identifier: Apache-2.0
/**
 * Retained outcomes of one queue: completed jobs (with their result, if acked with one) and
 * dead-lettered jobs, kept for `getJob` while the queue's `resultRetentionMs` runs.
 *
 * Where they live: the ACK event carries the result (events.ts, Q-9: one journal write for
 * the completion and its result); the DEAD event's outcome comes from the DLQ_INTENT before
 * it. The journal below a snapshot is deleted, so every snapshot holds the entries not yet
 * expired (snapshot.ts); expired ones are never written again and are skipped on replay, so
 * they are gone from disk after the next snapshot and never come back after a reopen.
 *
 * Memory: entries cost their result's JSON length plus RETAINED_ENTRY_BYTES; at most
 * MAX_RETAINED_BYTES per queue (src/queues/config.ts). Entries are kept in completion order (a
 * Map's insertion order), so expiry and the bound both drop from the front.
 */
import { MAX_RETAINED_BYTES, RETAINED_ENTRY_BYTES } from "../../../queues/config.js";

export interface Retained {
  state: "completed" | "dead";
  /** Wall-clock ms of the ack or the dead-letter move. */
  at: number;
  attempts: number;
  /** JSON text. */
  result?: string;
  lastError?: string;
}

/** As a snapshot stores it: [offset, 0 completed | 1 dead, at, attempts, result, lastError]. */
export type RetainedRow = [number, 0 | 1, number, number, string | null, string | null];

function cost(e: Retained): number {
  return RETAINED_ENTRY_BYTES + (e.result?.length ?? 0) + (e.lastError?.length ?? 0);
}

export class RetainedJobs {
  /** 0: nothing is kept (the queue's `resultRetentionMs`). */
  retentionMs = 0;
  private readonly map = new Map<number, Retained>();
  private bytes = 0;

  constructor(private readonly maxBytes = MAX_RETAINED_BYTES) {}

  get size(): number {
    return this.map.size;
  }
  get heldBytes(): number {
    return this.bytes;
  }

  /** Keeps `e` for job `off` (when retention is on); the oldest go beyond the memory bound. */
  record(off: number, e: Retained): void {
    if (this.retentionMs <= 0) return;
    this.remove(off);
    this.map.set(off, e);
    this.bytes += cost(e);
    for (const [o, old] of this.map) {
      if (this.bytes <= this.maxBytes) break;
      this.map.delete(o);
      this.bytes -= cost(old);
    }
  }

  /** The entry of `off` if its retention has not passed at `now`. */
  get(off: number, now: number): Retained | undefined {
    const e = this.map.get(off);
    if (e === undefined) return undefined;
    if (e.at + this.retentionMs > now) return e;
    this.remove(off);
    return undefined;
  }

  /** Drops expired entries from the front (completion order; a clock step back may leave a few
   * behind a newer one until it expires too, `get` checks each). */
  prune(now: number): void {
    for (const [o, e] of this.map) {
      if (e.at + this.retentionMs > now) break;
      this.map.delete(o);
      this.bytes -= cost(e);
    }
  }

  private remove(off: number): void {
    const e = this.map.get(off);
    if (e === undefined) return;
    this.map.delete(off);
    this.bytes -= cost(e);
  }

  /** Entries not expired at `now`, for a snapshot. */
  rows(now: number): RetainedRow[] {
    const out: RetainedRow[] = [];
    for (const [o, e] of this.map) if (e.at + this.retentionMs > now) out.push([o, e.state === "completed" ? 0 : 1, e.at, e.attempts, e.result ?? null, e.lastError ?? null]);
    return out;
  }

  /** Loads a snapshot's entries (expired ones are dropped by the caller's `prune`/`get`). */
  load(rows: readonly RetainedRow[]): void {
    for (const [o, s, at, attempts, result, lastError] of rows) {
      const e: Retained = { state: s === 0 ? "completed" : "dead", at, attempts };
      if (result !== null) e.result = result;
      if (lastError !== null) e.lastError = lastError;
      this.record(o, e);
    }
  }
}
