// SPDX-License-Identifier: Apache-2.0
/**
 * Work-queue figures (the `queues` section): jobs end to end (enqueue, receive, ack) in the same
 * closed loop for every system (`driveQueue`: a producer enqueues batches of 100 while fewer than
 * 5,000 jobs are waiting or active; jobs/s = acks during the run / run time).
 *
 * - Embedded (absolute figures, no peer ratio): `process(fn, { concurrency: 16 })` with a trivial
 *   handler, and the README worker loop exactly as examples/queue.ts writes it (read at run time,
 *   so the row follows the file: whether `job.extend()` / `job.ack()` are awaited).
 * - Over the network, concurrency 50 for every system: sluice server `process()`, BullMQ on Redis
 *   with appendfsync always (and on the in-memory Redis for information), pg-boss; with a
 *   priority on every job, and rate-limited (sluice against BullMQ on fsync'd Redis).
 * - RSS of a process holding one million delayed jobs; p99 enqueue-to-delivery of an idle
 *   embedded worker (absolute).
 *
 * Run alone: `node dist/bench/queues.js [--quick]`.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import type { Broker } from "../src/types.js";
import type { Queue } from "../src/queues/types.js";
import { FULL_LIMITS, QUICK_LIMITS, runGroups, type BenchCase, type BenchGroup, type RunGroupOptions } from "./harness.js";
import { bullmqJobs, BULLMQ_FSYNC_SYSTEM, BULLMQ_SYSTEM, describePostgresDurability, describeRedisDurability, driveQueue, pgbossJobs, PGBOSS_SYSTEM, REDIS_FSYNC_PORT, REDIS_MEMORY_PORT, startRedisFsync, type RedisFsyncServer } from "./peers/index.js";
import { percentile, printByTable, type BenchRow } from "./report.js";
import { serve } from "./server.js";
import { JOB_BACKLOG, JOB_CONCURRENCY, JOB_DATA, JOB_ENQUEUE_BATCH, JOB_ENQUEUE_IN_FLIGHT, JOB_PRODUCER, JOB_WARMUP_MS } from "./shapes.js";
import { SLUICE_DURABILITY } from "./sluice-topics.js";

const EMBEDDED = "sluice-embedded";
const SERVER = "sluice-server";
const PRODUCER = `${JOB_PRODUCER} (enqueueBatch)`;
/** The limit of the rate-limited row: below what BullMQ on fsync'd Redis does unlimited here (~2,300-3,500 jobs/s). */
const RATE_LIMIT = { max: 2000, durationMs: 1000 };

export type Open = { open(): Promise<Broker>; release(b: Broker): Promise<void> };
let seq = 0;

/** Runs `driveQueue` against a sluice queue with `startWorkers` consuming it. */
async function sluiceDrive(
  t: Open,
  limits: RunGroupOptions["limits"],
  config: object,
  work: (q: Queue<typeof JOB_DATA>, onAcked: (n: number) => void, signal: AbortSignal) => Promise<unknown>,
  itemOpts?: (i: number) => Record<string, unknown>,
) {
  const b = await t.open();
  try {
    const q = b.queue<typeof JOB_DATA>(`bench-jobs-${process.pid}-${seq++}`, config);
    const items = Array.from({ length: JOB_ENQUEUE_BATCH }, (_, i) => ({ data: JOB_DATA, ...itemOpts?.(i) }));
    const r = await driveQueue({
      durationMs: limits.maxMs,
      warmupMs: Math.max(limits.warmupMs, JOB_WARMUP_MS),
      enqueueBatch: JOB_ENQUEUE_BATCH,
      enqueueInFlight: JOB_ENQUEUE_IN_FLIGHT,
      maxBacklog: JOB_BACKLOG,
      enqueue: async () => void (await q.enqueueBatch(items)),
      startWorkers: async (onAcked) => {
        const ac = new AbortController();
        const p = work(q, onAcked, ac.signal);
        return async () => {
          ac.abort();
          await p;
        };
      },
    });
    await q.purge().catch(() => {});
    return { values: { rate: r.jobsPerSec }, note: `n=${r.completed.toLocaleString("en-US")} in ${(r.elapsedMs / 1000).toFixed(2)} s` };
  } finally {
    await t.release(b);
  }
}

/** A variant of a jobs row: per-job options (priorities), the queue's config (a rate limit), and how the shape says it. */
interface SluiceVariant {
  shape: string;
  itemOpts?: (i: number) => Record<string, unknown>;
  config?: object;
}

/** `q.process(trivial handler, { concurrency })`: return = ack. Counted when the handler returns (at most `concurrency` acks behind). */
export function processCase(system: string, t: Open, concurrency: number, variant?: SluiceVariant): BenchCase {
  return {
    system,
    durability: SLUICE_DURABILITY,
    shape: `q.process(async () => {}, { concurrency: ${concurrency} }): ack per job on return; ${PRODUCER}${variant ? `; ${variant.shape}` : ""}`,
    run: (limits) =>
      sluiceDrive(
        t,
        limits,
        variant?.config ?? {},
        (q, onAcked, signal) =>
          q.process(
            () => {
              onAcked(1);
            },
            { concurrency, signal },
          ),
        variant?.itemOpts,
      ),
  };
}

/** The worker loop of examples/queue.ts, as the file writes it today (read at run time). */
export function readmeWorkerLoop(): { prefetch: number; extendMs: number | null; extendAwaited: boolean; ackAwaited: boolean; ackText: string; extendText: string; source: string } {
  let src = "";
  try {
    src = readFileSync(new URL("../../examples/queue.ts", import.meta.url), "utf8");
  } catch {
    return { prefetch: 8, extendMs: 60_000, extendAwaited: true, ackAwaited: false, ackText: "void job.ack()", extendText: "await job.extend(60_000)", source: "examples/queue.ts not found: its form at the time of writing" };
  }
  const prefetch = Number(/work\(\{\s*prefetch:\s*(\d+)/.exec(src)?.[1] ?? 16);
  // An extend under an `if` on its line is a branch most jobs do not take: not run per job.
  const found = /(if\s*\(.*\)\s*)?(await\s+|void\s+)?job\.extend\(([\d_]+)\)/.exec(src);
  const ext = found && !found[1] ? [found[0], found[2], found[3]] : null;
  const ack = /(await\s+|void\s+)?job\.ack\(\)/.exec(src);
  return {
    prefetch,
    extendMs: ext ? Number(ext[2].replace(/_/g, "")) : null,
    extendAwaited: ext?.[1]?.startsWith("await") ?? false,
    ackAwaited: ack?.[1]?.startsWith("await") ?? true,
    ackText: ack?.[0] ?? "await job.ack()",
    extendText: ext?.[0] ?? "",
    source: `examples/queue.ts (read at run time; its console.log left out${found?.[1] ? "; its conditional job.extend() not taken" : ""})`,
  };
}

function readmeLoopCase(t: Open): BenchCase {
  const f = readmeWorkerLoop();
  const body = `${f.extendText ? `${f.extendText}; ` : ""}${f.ackText};`;
  // The example's queue config (lease, attempts, backoff, dead-letter queue).
  const config = { visibilityTimeoutMs: 30_000, maxAttempts: 5, backoff: { type: "exponential", minDelayMs: 1_000, maxDelayMs: 60_000 }, deadLetter: `bench-jobs.dlq` };
  return {
    system: `${EMBEDDED} (README worker loop)`,
    durability: SLUICE_DURABILITY,
    shape: `for await (job of q.work({ prefetch: ${f.prefetch} })) { ${body} } as in ${f.source}; ${PRODUCER}`,
    run: (limits) =>
      sluiceDrive(t, limits, config, async (q, onAcked, signal) => {
        for await (const job of q.work({ prefetch: f.prefetch, signal })) {
          if (!job.data.to.includes("@")) {
            await job.nack({ requeue: false, reason: "invalid address" });
          } else {
            if (f.extendMs !== null) {
              if (f.extendAwaited) await job.extend(f.extendMs);
              else void job.extend(f.extendMs);
            }
            if (f.ackAwaited) await job.ack();
            else void job.ack();
          }
          onAcked(1);
        }
      }),
  };
}

/** p99 enqueue-to-delivery of an idle embedded worker (two fdatasyncs in series: enqueue, delivery record). */
async function idleLatency(dir: string, samples: number): Promise<BenchRow> {
  const m = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const q = m.queue("bench-latency");
  const ac = new AbortController();
  let onJob: ((t: number) => void) | null = null;
  const consumer = q.process(() => onJob?.(performance.now()), { concurrency: 1, signal: ac.signal });
  const lat: number[] = [];
  for (let i = 0; i < samples + 20; i++) {
    const got = new Promise<number>((r) => (onJob = r));
    const t0 = performance.now();
    await q.enqueue({ i });
    const t1 = await got;
    if (i >= 20) lat.push(t1 - t0); // the first 20 warm up
  }
  ac.abort();
  await consumer;
  await m.close();
  lat.sort((a, b) => a - b);
  return {
    name: "p99 enqueue-to-delivery, idle worker",
    system: EMBEDDED,
    durability: SLUICE_DURABILITY,
    value: percentile(lat, 99),
    unit: "ms",
    table: "info",
    shape: `await q.enqueue() then wait for the process(concurrency 1) handler, ${samples} in sequence`,
    note: `p50 ${percentile(lat, 50).toFixed(2)} ms`,
  };
}

/** Child process: enqueue `n` delayed jobs, then report RSS (and again after reopening in a fresh process). */
async function delayedChild(dir: string, n: number, mode: "fill" | "reopen"): Promise<void> {
  const m = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const q = m.queue("bench-delayed", { durability: "always", maxDepth: 10_000_000 });
  if (mode === "fill") {
    const batch = 5000;
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < n; i += batch) {
      const items = [];
      for (let k = 0; k < batch && i + k < n; k++) items.push({ data: { i: i + k }, delayMs: 3_600_000 + ((i + k) % 1000) });
      pending.push(q.enqueueBatch(items));
      if (pending.length >= 4) await pending.shift();
    }
    await Promise.all(pending);
  }
  const s = await q.stats();
  (globalThis as { gc?: () => void }).gc?.();
  await new Promise((r) => setTimeout(r, 50));
  (globalThis as { gc?: () => void }).gc?.();
  const mu = process.memoryUsage();
  process.stdout.write(JSON.stringify({ delayed: s.delayed, rss: mu.rss, heapUsed: mu.heapUsed, external: mu.external, arrayBuffers: mu.arrayBuffers }) + "\n");
  await m.close();
}

function runChild(args: string[]): Promise<{ delayed: number; rss: number; heapUsed: number; arrayBuffers: number }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--expose-gc", fileURLToPath(import.meta.url), ...args], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.on("close", (code) => {
      if (code !== 0) return reject(new Error(`delayed-jobs child exited with ${code}`));
      try {
        resolve(JSON.parse(out.trim().split("\n").pop()!));
      } catch (e) {
        reject(e);
      }
    });
  });
}

async function delayedRows(dir: string, n: number): Promise<BenchRow[]> {
  const ddir = join(dir, "delayed");
  const mb = (v: number) => Math.round((v / 1048576) * 10) / 10;
  const fill = await runChild(["--delayed-child", ddir, String(n), "fill"]);
  const re = await runChild(["--delayed-child", ddir, String(n), "reopen"]);
  const name = n.toLocaleString("en-US");
  return [
    { name: `RSS with ${name} delayed jobs (after enqueue)`, system: EMBEDDED, durability: SLUICE_DURABILITY, value: mb(fill.rss), unit: "MB", table: "info", note: `heap ${mb(fill.heapUsed)} MB, array buffers ${mb(fill.arrayBuffers)} MB; goal < 200 MB` },
    { name: `RSS with ${name} delayed jobs (fresh process, after recovery)`, system: EMBEDDED, durability: SLUICE_DURABILITY, value: mb(re.rss), unit: "MB", table: "info", note: `${re.delayed} delayed restored; heap ${mb(re.heapUsed)} MB` },
  ];
}

function groups(emb: Open, srv: Open, bullFsyncDur: string, bullMemDur: string, pgDur: string): BenchGroup[] {
  const metric = (where: string) => [{ key: "rate", name: `queue jobs end to end (enqueue, receive, ack), ${where}`, unit: "jobs/s" }];
  return [
    { id: "jobs-embedded", table: "per-message", metrics: metric("embedded"), cases: [processCase(EMBEDDED, emb, 16), readmeLoopCase(emb)] },
    {
      id: "jobs-network",
      table: "per-message",
      metrics: metric(`over the network, concurrency ${JOB_CONCURRENCY}`),
      cases: [processCase(SERVER, srv, JOB_CONCURRENCY), bullmqJobs(REDIS_FSYNC_PORT, BULLMQ_FSYNC_SYSTEM, bullFsyncDur), pgbossJobs(pgDur), bullmqJobs(REDIS_MEMORY_PORT, BULLMQ_SYSTEM, bullMemDur)],
      ratios: [BULLMQ_FSYNC_SYSTEM, PGBOSS_SYSTEM, BULLMQ_SYSTEM].map((peer) => ({ sluice: SERVER, peer })),
      prime: true,
    },
    {
      // Every job has a priority, ten levels in equal shares; BullMQ's scale runs the other way
      // (1 = its highest), so level p is BullMQ priority 10 - p: the same order of service.
      id: "jobs-priority",
      table: "per-message",
      metrics: metric(`priority jobs, over the network, concurrency ${JOB_CONCURRENCY}`),
      cases: [
        processCase(SERVER, srv, JOB_CONCURRENCY, { shape: "enqueue(data, { priority: i % 10 }) (10 levels, higher first)", itemOpts: (i) => ({ priority: i % 10 }) }),
        bullmqJobs(REDIS_FSYNC_PORT, BULLMQ_FSYNC_SYSTEM, bullFsyncDur, { shape: "opts.priority = 10 - (i % 10) (10 levels, 1 first)", jobOpts: (i) => ({ priority: 10 - (i % 10) }) }),
      ],
      ratios: [{ sluice: SERVER, peer: BULLMQ_FSYNC_SYSTEM }],
      prime: true,
    },
    {
      // A queue-wide limit below what either system does unlimited: both should run at the
      // limit, neither above it (the figure is the rate achieved; the limit is in the shape).
      id: "jobs-ratelimited",
      table: "per-message",
      metrics: metric(`rate-limited to ${RATE_LIMIT.max.toLocaleString("en-US")} per ${RATE_LIMIT.durationMs} ms, over the network, concurrency ${JOB_CONCURRENCY}`),
      cases: [
        processCase(SERVER, srv, JOB_CONCURRENCY, { shape: `queue config rateLimit: { max: ${RATE_LIMIT.max}, durationMs: ${RATE_LIMIT.durationMs} }`, config: { rateLimit: RATE_LIMIT } }),
        bullmqJobs(REDIS_FSYNC_PORT, BULLMQ_FSYNC_SYSTEM, bullFsyncDur, { shape: `Worker limiter: { max: ${RATE_LIMIT.max}, duration: ${RATE_LIMIT.durationMs} }`, workerOpts: { limiter: { max: RATE_LIMIT.max, duration: RATE_LIMIT.durationMs } } }),
      ],
      ratios: [{ sluice: SERVER, peer: BULLMQ_FSYNC_SYSTEM }],
      prime: true,
    },
  ];
}

export async function runQueueBench(opts: { tmpDir: string; quick?: boolean; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const dir = mkdtempSync(join(opts.tmpDir, "queue-bench-"));
  let broker: Broker | undefined;
  let served: Awaited<ReturnType<typeof serve>> | undefined;
  let fsync: RedisFsyncServer | undefined;
  const rows: BenchRow[] = [];
  try {
    broker = await openBroker({ dataDir: join(dir, "embedded"), retentionCheckIntervalMs: 0 });
    served = await serve(join(dir, "server"));
    fsync = await startRedisFsync(REDIS_FSYNC_PORT).catch(() => undefined);
    const b = broker;
    const url = served.url;
    const emb: Open = { open: async () => b, release: async () => {} };
    const srv: Open = { open: () => connect({ url }), release: (c) => c.close() };
    const redisDur = async (port: number) => `Redis ${await describeRedisDurability(port).catch(() => "unreachable")}`;
    const pgDur = await describePostgresDurability().catch(() => "PostgreSQL (unreachable)");
    rows.push(...(await runGroups(groups(emb, srv, await redisDur(REDIS_FSYNC_PORT), `${await redisDur(REDIS_MEMORY_PORT)} (information only)`, pgDur), { ...opts.run, only: opts.only })));
    if (!opts.only || opts.only.has("queue-info")) {
      rows.push(await idleLatency(join(dir, "lat"), opts.quick ? 100 : 1000));
      rows.push(...(await delayedRows(dir, opts.quick ? 100_000 : 1_000_000)));
    }
  } finally {
    await broker?.close().catch(() => {});
    await served?.stop().catch(() => {});
    await fsync?.stop().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}

const isMain = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  const args = process.argv.slice(2);
  if (args[0] === "--delayed-child") {
    await delayedChild(args[1], Number(args[2]), args[3] as "fill" | "reopen");
  } else {
    const quick = args.includes("--quick");
    printByTable(await runQueueBench({ tmpDir: tmpdir(), quick, run: { limits: quick ? QUICK_LIMITS : FULL_LIMITS, reps: quick ? 1 : 3 } }));
    process.exit(0);
  }
}
