// SPDX-License-Identifier: Apache-2.0
/**
 * Keeps polling loops over the broker's public calls from starving the event loop.
 *
 * Several calls can complete without waiting for anything: a fetch at the log end, a fetch of
 * the live tail (a synchronous pread, LOG-10), offsets, descriptions, lag. Such a call resolves
 * through promise jobs only, so `while (!stop) await broker.fetch(...)` would never let a timer
 * or an I/O callback run (the `stop` flag set by a timer is never seen). Every broker call that
 * may complete that way first passes `turn()`: once YIELD_EVERY of them ran within one turn of
 * the event loop, the next one waits for `setImmediate`, which lets timers and I/O run. Calls
 * made in separate turns (the normal case) never wait; the counter is reset by one
 * `setImmediate` per turn in which such calls were made.
 */

/** Such calls per event-loop turn before one of them yields: a polling loop holds timers and I/O back for at most this many calls. */
export const YIELD_EVERY = 32;

export class TurnYield {
  private calls = 0;
  private armed = false;
  private readonly reset = (): void => {
    this.armed = false;
    this.calls = 0;
  };

  /** null: go on at once; otherwise a promise to await first (a macrotask boundary). */
  turn(): Promise<void> | null {
    if (!this.armed) {
      this.armed = true;
      setImmediate(this.reset);
    }
    if (++this.calls < YIELD_EVERY) return null;
    this.calls = 0;
    return new Promise<void>((resolve) => setImmediate(resolve));
  }
}
