// SPDX-License-Identifier: Apache-2.0
/**
 * Failed logins per source address: a small token bucket each (AUTH-4). A source that has
 * used its bucket is refused before any key derivation, so guessing passwords costs the
 * guesser time and the server almost nothing. The table is bounded; the oldest entries go.
 */

export interface FailureLimitOptions {
  /** Failures allowed in a burst. Default 5. */
  burst?: number;
  /** One more failure allowed per this many ms. Default 2000. */
  refillMs?: number;
  /** Sources tracked at most. Default 10 000. */
  maxSources?: number;
}

interface Bucket {
  tokens: number;
  at: number;
}

export class FailureLimiter {
  private readonly buckets = new Map<string, Bucket>();
  private readonly burst: number;
  private readonly refillMs: number;
  private readonly maxSources: number;

  constructor(opts: FailureLimitOptions = {}, private readonly now: () => number = Date.now) {
    this.burst = opts.burst ?? 5;
    this.refillMs = opts.refillMs ?? 2000;
    this.maxSources = opts.maxSources ?? 10_000;
  }

  private bucket(source: string): Bucket {
    const t = this.now();
    let b = this.buckets.get(source);
    if (!b) {
      b = { tokens: this.burst, at: t };
      if (this.buckets.size >= this.maxSources) this.buckets.delete(this.buckets.keys().next().value as string);
      this.buckets.set(source, b);
    }
    const refill = Math.floor((t - b.at) / this.refillMs);
    if (refill > 0) {
      b.tokens = Math.min(this.burst, b.tokens + refill);
      b.at += refill * this.refillMs;
    }
    return b;
  }

  /** False when `source` has no failures left to spend: refuse it without trying. */
  allowed(source: string): boolean {
    return this.bucket(source).tokens > 0;
  }

  failed(source: string): void {
    const b = this.bucket(source);
    b.tokens = Math.max(0, b.tokens - 1);
  }
}
