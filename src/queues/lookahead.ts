// SPDX-License-Identifier: Apache-2.0
/**
 * Lookahead of an embedded worker (iterator and `process()` modes): besides the `prefetch` jobs
 * it may hand to application code, a worker holds about LOOKAHEAD_MS worth of further jobs,
 * granted and durable but not yet handed out ("parked"). A hand-out then waits for no
 * DELIVER fdatasync: without it every slot sat idle through one per job, so a worker could never
 * run faster than prefetch jobs per fdatasync (README loop, prefetch 8: ~2,200 jobs/s). Sizing
 * by the recent hand-out rate keeps a parked job's wait near LOOKAHEAD_MS; a job parked longer
 * than PARK_MAX_MS (the consumer slowed down) goes back without counting an attempt, so a slow
 * consumer does not sit on jobs other workers could run. The network server does the same for
 * its remote workers (src/server/remote-queue.ts).
 */
import { MAX_PREFETCH } from "./config.js";

export const LOOKAHEAD_MS = 10;
/** A job parked longer than this goes back to the queue (not an attempt). */
export const PARK_MAX_MS = 250;
/** Below this lease length no lookahead: a parked lease must never get near expiry. */
export const MIN_LOOKAHEAD_LEASE_MS = 2000;
/**
 * Lookahead of a worker: at most max(2 x prefetch, this), and never above MAX_PREFETCH in all.
 * Every grant is one journal fdatasync, so a worker runs at most (prefetch + lookahead) jobs per
 * fdatasync round: with 64, `process(fn, { concurrency: 16 })` topped out at 80 jobs per round
 * (~30-40k jobs/s on a 1-2 ms disk); the rate-based sizing (LOOKAHEAD_MS of hand-outs) keeps a
 * slow worker far below the cap, so the cap only binds for fast ones.
 */
export const MIN_LOOKAHEAD_CAP = 512;
/** The rate is measured over windows of at least this long. */
const RATE_WINDOW_MS = 20;
/**
 * No lookahead before a worker handed out this many jobs: a short-lived or trickling worker
 * never parks jobs, and a small scripted workload (the crash-point enumeration) issues the same
 * grants, hence the same I/O, on every run.
 */
export const LOOKAHEAD_WARMUP_JOBS = 256;

export function maxLookahead(prefetch: number): number {
  return Math.max(0, Math.min(Math.max(2 * prefetch, MIN_LOOKAHEAD_CAP), MAX_PREFETCH - prefetch));
}

/** Sizes the lookahead from the recent hand-out rate (an EWMA over RATE_WINDOW_MS windows). */
export class LookaheadSizer {
  private rate = 0;
  private count = 0;
  private start = performance.now();
  private current = 0;
  private total = 0;

  constructor(private max: number) {}

  setMax(max: number): void {
    this.max = max;
    this.current = Math.min(this.current, max);
  }

  /** `n` jobs were handed out. */
  note(n: number): void {
    this.count += n;
    this.total += n;
  }

  /** The lookahead now (re-measured at most once per window). */
  size(): number {
    if (this.max === 0 || this.total < LOOKAHEAD_WARMUP_JOBS) return 0;
    const now = performance.now();
    const elapsed = now - this.start;
    if (elapsed >= RATE_WINDOW_MS) {
      const r = (this.count * 1000) / elapsed;
      this.rate = this.rate === 0 ? r : 0.5 * this.rate + 0.5 * r;
      this.count = 0;
      this.start = now;
      // Rounded down: below 100 jobs/s a worker parks nothing.
      this.current = Math.min(this.max, Math.floor((this.rate * LOOKAHEAD_MS) / 1000));
    }
    return this.current;
  }

  /** The consumer stopped keeping up: no lookahead until hand-outs show a rate again. */
  reset(): void {
    this.rate = 0;
    this.count = 0;
    this.current = 0;
    this.start = performance.now();
  }
}
