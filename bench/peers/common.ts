/**
 * Helpers shared by the peer benchmarks: time bounds, the fixed-rate pacer (also meant for
 * sluice's own latency figure, so every system is paced the same way), payload stamping, and
 * spawning/stopping a throwaway server with a readiness deadline.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";

export type PeerOptions = {
  /** ~1 s per measurement instead of a few seconds. */
  quick?: boolean;
  /** Override the per-measurement time bound (ms). */
  durationMs?: number;
  /** Rate of the latency run (default 2000 msg/s, as in issue 4). */
  latencyRatePerSec?: number;
  /** Record payload size (default 256 B). */
  recordBytes?: number;
  /** Progress lines (default: silent). */
  log?: (line: string) => void;
};

export const DEFAULT_RECORD_BYTES = 256;
export const DEFAULT_LATENCY_RATE = 2000;

export function durationOf(o: PeerOptions): number {
  return o.durationMs ?? (o.quick ? 1000 : 4000);
}

/**
 * Untimed warm-up before a throughput figure: the first second of a fresh process (JIT, the
 * client's first round trips, the peer's new stream/queue) measured ~2x slower than steady
 * state, which would flatter sluice's ratios.
 */
export function warmupOf(o: PeerOptions): number {
  return Math.min(500, Math.floor(durationOf(o) / 2));
}

/** Unique-enough suffix so concurrent or crashed runs never share a stream/queue name. */
export function runId(): string {
  return `${process.pid}-${Date.now().toString(36)}-${Math.floor(Math.random() * 1e6).toString(36)}`;
}

/**
 * A 256 B (or `bytes`) payload whose first 8 bytes carry the send time (performance.now(), ms) so
 * the consumer, in the same process, computes end-to-end latency without clock skew.
 */
export function stampedPayload(bytes: number, sentAtMs: number, template?: Buffer): Buffer {
  // Unpooled: a pooled Buffer shares an 8 KiB ArrayBuffer, and a client that sends `.buffer` would send all of it.
  const b = Buffer.allocUnsafeSlow(Math.max(8, bytes));
  if (template) template.copy(b, 0, 0, b.length);
  else b.fill(0x61);
  b.writeDoubleLE(sentAtMs, 0);
  return b;
}

export function sentAtOf(payload: Uint8Array): number {
  return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength).readDoubleLE(0);
}

/** Polls `check` until it returns true or the deadline passes; never sleeps longer than `stepMs`. */
export async function waitUntil(check: () => Promise<boolean> | boolean, timeoutMs: number, what: string, stepMs = 50): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  let lastErr: unknown;
  for (;;) {
    try {
      if (await check()) return;
    } catch (err) {
      lastErr = err;
    }
    if (performance.now() >= deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastErr ? `: ${(lastErr as Error).message}` : ""}`);
    }
    await delay(stepMs);
  }
}

/** Rejects after `ms` with a clear message; the bench bound for any single call. */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

export type PacerResult = { sent: number; elapsedMs: number; achievedRatePerSec: number };

/**
 * Calls `send(seq)` at `ratePerSec` for `durationMs`. Node timers tick at ~1 ms, so each tick
 * sends every message that is due by then (2 per tick at 2,000/s); the schedule is computed from
 * the start time, so a late tick catches up instead of drifting. The caller stamps each message
 * with the actual send time. The pacer never spins: on a 2-core machine a busy loop would steal
 * the CPU the system under test needs.
 */
export async function runAtFixedRate(ratePerSec: number, durationMs: number, send: (seq: number) => void): Promise<PacerResult> {
  const start = performance.now();
  const total = Math.floor((ratePerSec * durationMs) / 1000);
  let sent = 0;
  while (sent < total) {
    const now = performance.now();
    const due = Math.min(total, Math.floor(((now - start) * ratePerSec) / 1000) + 1);
    while (sent < due) send(sent++);
    if (sent < total) await delay(1);
  }
  const elapsedMs = performance.now() - start;
  return { sent, elapsedMs, achievedRatePerSec: sent / (elapsedMs / 1000) };
}

export type SpawnedServer = {
  child: ChildProcess;
  dir: string;
  /** Last lines of the server's output, for error messages. */
  output(): string;
  stop(): Promise<void>;
};

/**
 * Spawns a server binary with its own temp dir (passed to `argsFor`), waits for `ready` with a
 * deadline, and returns a handle whose stop() kills it (SIGTERM, then SIGKILL after 5 s) and
 * removes the dir. If readiness fails the child is killed before the error propagates.
 */
export async function spawnServer(opts: {
  command: string;
  argsFor: (dir: string) => string[] | Promise<string[]>;
  ready: () => Promise<boolean>;
  readyTimeoutMs?: number;
  dirPrefix: string;
}): Promise<SpawnedServer> {
  const dir = await mkdtemp(join(tmpdir(), opts.dirPrefix));
  const args = await opts.argsFor(dir);
  const child = spawn(opts.command, args, { stdio: ["ignore", "pipe", "pipe"], cwd: dir });
  let out = "";
  const keep = (d: Buffer) => {
    out = (out + d.toString("utf8")).slice(-4000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  let exited = false;
  let spawnError: Error | undefined;
  const exitedP = new Promise<void>((resolve) => {
    child.once("exit", () => {
      exited = true;
      resolve();
    });
    child.once("error", (err) => {
      spawnError = err;
      exited = true;
      resolve();
    });
  });
  const stop = async () => {
    if (!exited) {
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exitedP;
      clearTimeout(t);
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await waitUntil(
      async () => {
        if (exited) throw spawnError ?? new Error(`${opts.command} exited early: ${out.trim().split("\n").slice(-3).join(" | ")}`);
        return opts.ready();
      },
      opts.readyTimeoutMs ?? 15_000,
      `${opts.command} readiness`,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { child, dir, output: () => out, stop };
}

/** Compares dotted versions: negative if a < b. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split(".").map((x) => Number.parseInt(x, 10) || 0);
  const pb = b.split(".").map((x) => Number.parseInt(x, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

export type QueueDriverResult = { completed: number; enqueued: number; elapsedMs: number; jobsPerSec: number };

/**
 * Closed-loop end-to-end queue driver shared by the job-queue peers: one producer enqueues in
 * batches of `enqueueBatch` while the backlog (enqueued - completed) stays under `maxBacklog`,
 * workers started by the caller report each completed (acked) job through `onCompleted`, and
 * jobs/s = jobs completed during the run / run time. The backlog bound keeps memory and storage
 * of the peer bounded whatever the duration; a producer blocked on it waits for a completion
 * (no polling sleep).
 */
export async function driveQueue(opts: {
  durationMs: number;
  /** Completions during the first `warmupMs` are not counted (worker start, JIT). */
  warmupMs?: number;
  enqueueBatch: number;
  /** Enqueue calls in flight at once. Default 1. */
  enqueueInFlight?: number;
  maxBacklog: number;
  enqueue: (count: number, seq: number) => Promise<void>;
  /** Starts workers; returns a stop function. Workers call `onCompleted(n)` after each ack. */
  startWorkers: (onCompleted: (n: number) => void) => Promise<() => Promise<void>>;
}): Promise<QueueDriverResult> {
  let completed = 0;
  let enqueued = 0;
  const inFlight = opts.enqueueInFlight ?? 1;
  const pending = new Set<Promise<void>>();
  let wake: (() => void) | undefined;
  const onCompleted = (n: number) => {
    completed += n;
    const w = wake;
    wake = undefined;
    w?.();
  };
  const stopWorkers = await opts.startWorkers(onCompleted);
  const warmupMs = opts.warmupMs ?? 0;
  const runStart = performance.now();
  let start = runStart;
  let completedAtStart = 0;
  let warming = warmupMs > 0;
  let end = 0;
  let counted = 0;
  // One deadline timer for the whole run, cancelled at the end so it never holds the process.
  const deadlineAc = new AbortController();
  const deadline = delay(warmupMs + opts.durationMs, undefined, { signal: deadlineAc.signal }).catch(() => {});
  try {
    while (warming || performance.now() - start < opts.durationMs) {
      if (warming && performance.now() - runStart >= warmupMs) {
        warming = false;
        start = performance.now();
        completedAtStart = completed;
      }
      // Up to `inFlight` enqueue calls at once, while the backlog (counting calls in flight) has room.
      if (pending.size < inFlight && enqueued + pending.size * opts.enqueueBatch - completed < opts.maxBacklog) {
        const seq = enqueued + pending.size * opts.enqueueBatch;
        const p: Promise<void> = opts.enqueue(opts.enqueueBatch, seq).then(() => {
          pending.delete(p);
          enqueued += opts.enqueueBatch;
          onCompleted(0);
        });
        pending.add(p);
        continue;
      }
      // Bounded wait: a stalled peer must not hang the bench past its time bound.
      await Promise.race([new Promise<void>((r) => (wake = r)), deadline, ...pending]);
    }
    end = performance.now();
    counted = completed - completedAtStart;
  } finally {
    deadlineAc.abort();
    await Promise.allSettled(pending);
    await stopWorkers();
  }
  const elapsedMs = end - start;
  return { completed: counted, enqueued, elapsedMs, jobsPerSec: counted / (elapsedMs / 1000) };
}

/**
 * Keeps up to `window` operations in flight: `next()` starts one (or returns null to stop) and
 * is called again synchronously from each completion, so a burst of acks read in one socket
 * chunk immediately refills the window in the same tick (an `await` per operation measured
 * 4x slower with nats.js). Resolves with the number of operations that completed successfully;
 * rejects with the first error once everything in flight has settled.
 */
export function pumpWindow(window: number, next: () => Promise<unknown> | null): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let inflight = 0;
    let ok = 0;
    let stopped = false;
    let error: unknown;
    const finish = () => {
      if (inflight === 0 && stopped) {
        if (error !== undefined) reject(error);
        else resolve(ok);
      }
    };
    const fill = () => {
      while (!stopped && inflight < window) {
        let p: Promise<unknown> | null;
        try {
          p = next();
        } catch (err) {
          error ??= err;
          p = null;
        }
        if (p === null) {
          stopped = true;
          break;
        }
        inflight++;
        p.then(
          () => {
            inflight--;
            ok++;
            fill();
            finish();
          },
          (err) => {
            inflight--;
            error ??= err;
            stopped = true;
            finish();
          },
        );
      }
      finish();
    };
    fill();
  });
}
