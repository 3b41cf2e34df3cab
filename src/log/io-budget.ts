// SPDX-License-Identifier: Apache-2.0
/**
 * A byte-rate budget for background I/O (the cleaner), so it never starves the writer: a token
 * bucket refilled at `bytesPerSec`, holding at most one second of tokens. `take(n)` waits
 * until the bucket can pay for n bytes (a debt is paid by waiting, so a large take is allowed).
 * Shared by every partition of an engine: the budget is per process, not per partition.
 */

/** Default budget of the cleaner: bytes per second read plus written (declared once). */
export const CLEANER_IO_BYTES_PER_SEC = 32 * 1024 * 1024;

export class IoBudget {
  private tokens: number;
  private last: number;

  constructor(
    readonly bytesPerSec: number = CLEANER_IO_BYTES_PER_SEC,
    private readonly nowMs: () => number = () => performance.now(),
  ) {
    this.tokens = bytesPerSec;
    this.last = nowMs();
  }

  async take(bytes: number): Promise<void> {
    if (!Number.isFinite(this.bytesPerSec)) return;
    const now = this.nowMs();
    this.tokens = Math.min(this.bytesPerSec, this.tokens + ((now - this.last) * this.bytesPerSec) / 1000);
    this.last = now;
    this.tokens -= bytes;
    if (this.tokens >= 0) return;
    const waitMs = Math.ceil((-this.tokens * 1000) / this.bytesPerSec);
    await new Promise<void>((r) => setTimeout(r, waitMs).unref());
  }
}
