// SPDX-License-Identifier: Apache-2.0
/** Test helpers: temp data dirs and condition waits with deadlines (no sleeping for luck). */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export function tempDir(prefix = "sluice-test-"): { dir: string; cleanup(): void; [Symbol.dispose](): void } {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), prefix));
  const cleanup = (): void => rmSync(dir, { recursive: true, force: true });
  return { dir, cleanup, [Symbol.dispose]: cleanup };
}

/** Polls `cond` until it returns a truthy value or the deadline passes (then throws with `what`, computed then if a function). */
export async function waitUntil<T>(cond: () => T | Promise<T>, what: string | (() => string), timeoutMs = 10_000, intervalMs = 5): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === "function" ? what() : what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** `p`, or a rejection "timed out after `ms` ms: `what`" if it has not settled by then. */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Deterministic seeded PRNG (mulberry32): the same seed gives the same sequence in [0, 1). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
