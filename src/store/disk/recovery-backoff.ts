// SPDX-License-Identifier: Apache-2.0
/**
 * How the disk engine retries reopening something a storage fault left in doubt (a faulted
 * partition, a failed queue): the first attempt after RECOVERY_MIN_DELAY_MS, doubling up to
 * RECOVERY_MAX_DELAY_MS while the disk keeps failing.
 */
export const RECOVERY_MIN_DELAY_MS = 200;
export const RECOVERY_MAX_DELAY_MS = 30_000;

export function nextRecoveryDelay(ms: number): number {
  return Math.min(ms * 2, RECOVERY_MAX_DELAY_MS);
}
