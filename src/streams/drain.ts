// SPDX-License-Identifier: Apache-2.0
/**
 * Graceful drain of a subscription whose signal aborts while the application handles a
 * message: no further message is handed out, the one being handled may finish and commit,
 * and the member leaves the group only when the loop comes back for the next message (or
 * commits the one it holds), or when `drainTimeoutMs` has passed.
 *
 * Shared by the embedded subscription and the network client's: both call `handOut` before
 * giving a message (or batch) to the loop, `back` when the loop asks for the next one or
 * ends, and `committed` from the message's commit.
 */
import { ValidationError } from "../errors.js";

export const DEFAULT_DRAIN_TIMEOUT_MS = 10_000;

export class InFlightGate {
  private out: object | null = null;
  private release: (() => void) | null = null;

  /** The loop now holds `item` (a message or a batch). */
  handOut(item: object): void {
    this.out = item;
  }

  /** The loop came back (asked for the next item, or ended): nothing is held any more. */
  back(): void {
    this.out = null;
    const r = this.release;
    this.release = null;
    r?.();
  }

  /** `item` was committed: the loop has finished with it. */
  committed(item: object): void {
    if (item === this.out) this.back();
  }

  /** Resolves once nothing is held, or after `timeoutMs`. */
  settle(timeoutMs: number): Promise<void> {
    if (this.out === null || timeoutMs <= 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const t = setTimeout(done, timeoutMs);
      const prev = this.release;
      function done(): void {
        clearTimeout(t);
        resolve();
      }
      this.release = () => {
        prev?.();
        done();
      };
    });
  }
}

/** Checks a `drainTimeoutMs` option. */
export function drainTimeoutOption(v: number | undefined): number {
  if (v === undefined) return DEFAULT_DRAIN_TIMEOUT_MS;
  if (!Number.isSafeInteger(v) || v < 0 || v > 600_000) throw new ValidationError("drainTimeoutMs must be an integer in [0, 600000]");
  return v;
}
