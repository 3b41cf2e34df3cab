// SPDX-License-Identifier: Apache-2.0
import type { BackoffConfig } from "./types.js";

/**
 * Retry delay for the failure of delivery number `attempt` (1-based): exponential steps
 * (minDelayMs · 2^(attempt-1), capped at maxDelayMs) with full jitter across
 * [minDelayMs, step], so a burst of failures does not retry in lockstep.
 */
export function retryDelayMs(cfg: Required<BackoffConfig>, attempt: number, random: () => number = Math.random): number {
  const min = cfg.minDelayMs;
  const max = Math.max(min, cfg.maxDelayMs);
  if (cfg.type === "fixed") return min;
  const exp = Math.min(Math.max(attempt - 1, 0), 52);
  const step = Math.min(max, min * 2 ** exp);
  return Math.round(min + random() * (step - min));
}
