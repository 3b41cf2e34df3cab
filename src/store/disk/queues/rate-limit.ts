// SPDX-License-Identifier: Apache-2.0
/**
 * A queue's rate limit (`QueueSettings.rateLimit`, RATE-1): at most `max` leases granted in any
 * `durationMs` window, a sliding window on the monotonic clock. It is counted where leases are
 * granted (`QueueInstance.grant`), which every worker reaches: embedded ones, and every client
 * process's through the server, whose broker holds the queue. A grant counts when it is made,
 * before any worker's lookahead holds it, so lookahead cannot push starts past the limit.
 *
 * Memory: one entry per grant round (time, count), at most `max` entries. The log is not
 * durable: after a reopen (restart, crash, Q-7 recovery) the window starts empty, so up to
 * `max` extra starts may follow a crash. A lease given back without an attempt (`release`
 * with `counted` false) keeps its place in the window: the limit errs on the side of fewer.
 *
 * A full window sets one timer for its next opening, which calls `wake` (the queue's
 * `available`): workers waiting for the limit never poll.
 */
export class RateLimiter {
  /** Grant rounds in the window, oldest first from `head`: monotonic ms and lease count. */
  private times: number[] = [];
  private counts: number[] = [];
  private head = 0;
  /** Leases counted in the window (the sum of `counts` from `head`). */
  private used = 0;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private max: number,
    private durationMs: number,
    private readonly wake: () => void = () => {},
  ) {}

  /** Leases that may be granted at `mono` (drops rounds that left the window). */
  room(mono: number): number {
    const cutoff = mono - this.durationMs;
    while (this.head < this.times.length && this.times[this.head] <= cutoff) {
      this.used -= this.counts[this.head];
      this.head++;
    }
    if (this.head > 1024 && this.head * 2 > this.times.length) {
      this.times = this.times.slice(this.head);
      this.counts = this.counts.slice(this.head);
      this.head = 0;
    }
    return Math.max(0, this.max - this.used);
  }

  /** Counts `n` leases granted at `mono` (the caller asked `room(mono)` first). */
  take(n: number, mono: number): void {
    if (n <= 0) return;
    const last = this.times.length - 1;
    if (last >= this.head && this.times[last] === mono) this.counts[last] += n;
    else {
      this.times.push(mono);
      this.counts.push(n);
    }
    this.used += n;
  }

  /**
   * Counts a grant round's `n` leases at `mono` (`monoNow` reads the clock when the timer is
   * set); a full window schedules the wake-up at its next opening (one timer at a time).
   */
  counted(n: number, mono: number, monoNow: () => number): void {
    this.take(n, mono);
    if (this.timer !== null || this.room(mono) > 0) return;
    const ms = Math.ceil(this.nextOpening() - monoNow()) + 1;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        this.wake();
      },
      Math.min(2 ** 31 - 1, Math.max(0, ms)),
    );
    this.timer.unref();
  }

  /** Stops the wake-up timer (the queue closed or failed). */
  close(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Monotonic ms when the window next gains room (its oldest round leaves it); Infinity if empty. */
  nextOpening(): number {
    return this.head < this.times.length ? this.times[this.head] + this.durationMs : Infinity;
  }

  /** A changed limit applies at once; the grants already counted stay in the window. */
  configure(r: { max: number; durationMs: number }): void {
    this.max = r.max;
    this.durationMs = r.durationMs;
  }
}
