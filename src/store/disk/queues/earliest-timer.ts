// SPDX-License-Identifier: Apache-2.0
/**
 * One unref'd timer for the earliest of the moments asked for: asking for an earlier moment
 * replaces it, a later one is ignored (the owner asks again for the next moment when it fires).
 * A queue keeps one per kind of deadline (delays, leases, group windows), never one per job.
 */
const MAX_TIMER_MS = 2 ** 31 - 1;

export class EarliestTimer {
  private timer: NodeJS.Timeout | null = null;
  private at = Infinity;

  /** `now`: the clock `arm`'s moments are on; `fire` runs once the earliest moment passed. */
  constructor(
    private readonly now: () => number,
    private readonly fire: () => void,
  ) {}

  /** Fires at `at` unless armed earlier already (Infinity: nothing to wait for). */
  arm(at: number): void {
    if (at === Infinity || at >= this.at) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.at = at;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        this.at = Infinity;
        this.fire();
      },
      Math.min(MAX_TIMER_MS, Math.max(0, Math.ceil(at - this.now()) + 1)),
    );
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.at = Infinity;
  }
}
