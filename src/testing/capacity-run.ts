// SPDX-License-Identifier: Apache-2.0
/**
 * A capacity run for a consumer handler: on an embedded broker in a temp dir, each step
 * publishes at a paced rate (records/s) with a record size and a key skew, while `concurrency`
 * members of a group run the handler, which first awaits an injected dependency latency. Per
 * step it reports what an operator watches: publish latency, depth (group lag in records),
 * the oldest unprocessed record's age, redeliveries, and storage growth.
 *
 * Everything is bounded: each step's duration, rate and record count, the publishes in
 * flight, the records a step can publish (so the latency samples), and the handler's delay.
 * Each step gets its own topic and group, deleted after it, so steps do not see each other's
 * backlog.
 */
import { mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { openBroker } from "../broker/broker.js";
import { ValidationError } from "../errors.js";
import type { Broker, Message } from "../types.js";
import { prng, withTimeout } from "./helpers.js";

const STOP_MS = 10_000;

export interface CapacityStep {
  /** Shown in the report. Default "step N". */
  name?: string;
  /** Records per second the producer publishes (paced, one `publish` call per record). */
  ratePerSec: number;
  /** Value size in bytes. */
  recordBytes: number;
  /** Share of records on one hot key (0..1); the rest spread evenly over `keys`. Default 0. */
  hotKeyShare?: number;
  /** Other keys. Default 32. */
  keys?: number;
  /** Members of the group running the handler, each one message at a time. */
  concurrency: number;
  /** What the handler awaits per record before the user's handler runs (a dependency's latency). */
  dependencyLatencyMs: number;
  /** How long the producer publishes. */
  durationMs: number;
}

export interface CapacityRunOptions {
  steps: CapacityStep[];
  /** Runs per record after the dependency latency; the run commits after it returns. */
  handler?: (msg: Message, step: CapacityStep) => Promise<void>;
  /** Partitions of each step's topic. Default the larger of 4 and the highest concurrency. */
  partitions?: number;
  /** How often depth and age are sampled during a step. Default 50 ms. */
  sampleIntervalMs?: number;
  /** Publishes in flight at most; a producer held back by it publishes fewer. Default 256. */
  maxInFlightPublishes?: number;
  /** Key choice seed. Default 1. */
  seed?: number;
}

export interface CapacityStepResult {
  step: Required<CapacityStep>;
  /** Records published, and per second over the step's duration (below the rate: the producer fell behind). */
  published: number;
  publishedPerSec: number;
  publishErrors: number;
  /** Records the handler finished (first deliveries), and per second. */
  consumed: number;
  consumedPerSec: number;
  /** `publish` call latency, ms. */
  publishLatencyMs: { p50: number; p99: number; max: number };
  /** Group lag in records: at the end of the step, and the highest sample. */
  depth: { end: number; peak: number };
  /** Now minus the timestamp of the oldest unprocessed record, ms (lag in time): end and peak. */
  oldestAgeMs: { end: number; peak: number };
  /** Depth at the end divided by the consume rate: how long the backlog would take (null: nothing consumed). */
  timeToDrainMs: number | null;
  /** Messages the handler was given again (after a rebalance between members). */
  redeliveries: number;
  /** Bytes: the data dir (segments with preallocated space, indexes, offsets) and the records stored. */
  storage: { dataDirBefore: number; dataDirAfter: number; dataDirGrowth: number; logBytes: number };
}

export interface CapacityResult {
  partitions: number;
  steps: CapacityStepResult[];
}

/** Limits of a run (a capacity run is a test, not a load generator). */
export const CAPACITY_LIMITS = {
  steps: 50,
  durationMs: 60_000,
  ratePerSec: 50_000,
  recordsPerStep: 1_000_000,
  recordBytes: 1024 * 1024,
  concurrency: 64,
  dependencyLatencyMs: 10_000,
  maxInFlightPublishes: 10_000,
} as const;

/** Runs every step in order; see the file comment. */
export async function capacityRun(opts: CapacityRunOptions): Promise<CapacityResult> {
  const steps = validate(opts);
  const partitions = opts.partitions ?? Math.max(4, ...steps.map((s) => s.concurrency));
  if (!Number.isInteger(partitions) || partitions < 1 || partitions > 1024) throw new ValidationError("partitions must be an integer in [1, 1024]");
  const dir = mkdtempSync(join(tmpdir(), "sluice-capacity-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const results: CapacityStepResult[] = [];
  try {
    for (let i = 0; i < steps.length; i++) results.push(await runStep(broker, dir, `capacity-${i}`, steps[i], partitions, opts));
  } finally {
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return { partitions, steps: results };
}

function validate(opts: CapacityRunOptions): Required<CapacityStep>[] {
  const L = CAPACITY_LIMITS;
  if (!Array.isArray(opts.steps) || opts.steps.length === 0 || opts.steps.length > L.steps) throw new ValidationError(`steps: 1 to ${L.steps}`);
  const inRange = (v: unknown, lo: number, hi: number, what: string, int = true): void => {
    if (typeof v !== "number" || !(int ? Number.isInteger(v) : Number.isFinite(v)) || v < lo || v > hi) throw new ValidationError(`${what} must be ${int ? "an integer" : "a number"} in [${lo}, ${hi}]`);
  };
  inRange(opts.sampleIntervalMs ?? 50, 5, 10_000, "sampleIntervalMs");
  inRange(opts.maxInFlightPublishes ?? 256, 1, L.maxInFlightPublishes, "maxInFlightPublishes");
  return opts.steps.map((s, i) => {
    const step: Required<CapacityStep> = { name: `step ${i + 1}`, hotKeyShare: 0, keys: 32, ...s };
    inRange(step.ratePerSec, 1, L.ratePerSec, `${step.name}: ratePerSec`);
    inRange(step.durationMs, 1, L.durationMs, `${step.name}: durationMs`);
    inRange(step.recordBytes, 0, L.recordBytes, `${step.name}: recordBytes`);
    inRange(step.concurrency, 1, L.concurrency, `${step.name}: concurrency`);
    inRange(step.dependencyLatencyMs, 0, L.dependencyLatencyMs, `${step.name}: dependencyLatencyMs`);
    inRange(step.hotKeyShare, 0, 1, `${step.name}: hotKeyShare`, false);
    inRange(step.keys, 1, 100_000, `${step.name}: keys`);
    if ((step.ratePerSec * step.durationMs) / 1000 > L.recordsPerStep) throw new ValidationError(`${step.name}: ratePerSec × durationMs allows at most ${L.recordsPerStep} records`);
    return step;
  });
}

/** One step on its own topic and group; see the file comment. */
async function runStep(broker: Broker, dir: string, topic: string, step: Required<CapacityStep>, partitions: number, opts: CapacityRunOptions): Promise<CapacityStepResult> {
  await broker.createTopic(topic, { partitions });
  const dataDirBefore = dirBytes(dir);
  const group = `${topic}-group`;
  const consumers = startMembers(broker, topic, group, step, opts.handler);
  const started = performance.now();
  const deadline = started + step.durationMs;
  const sampling = sampleLag(broker, group, topic, deadline, opts.sampleIntervalMs ?? 50);
  const produced = await produce(broker, topic, step, deadline, opts.maxInFlightPublishes ?? 256, opts.seed ?? 1);
  const elapsedS = Math.max(step.durationMs, performance.now() - started) / 1000;
  const peaks = await sampling;
  const end = await broker.groupLag(group, topic);
  const consumed = consumers.consumed();
  await consumers.stop();
  const logBytes = (await broker.describeTopic(topic)).partitions.reduce((n, p) => n + p.sizeBytes, 0);
  const dataDirAfter = dirBytes(dir);
  await broker.deleteTopic(topic); // keeps a long run's disk use to one step's
  const lat = produced.latencies.sort();
  const consumedPerSec = consumed / elapsedS;
  return {
    step,
    published: produced.published,
    publishedPerSec: produced.published / elapsedS,
    publishErrors: produced.errors,
    consumed,
    consumedPerSec,
    publishLatencyMs: { p50: quantile(lat, 0.5), p99: quantile(lat, 0.99), max: lat.length > 0 ? lat[lat.length - 1] : 0 },
    depth: { end: end.totalRecords, peak: Math.max(peaks.depth, end.totalRecords) },
    oldestAgeMs: { end: end.maxLagMs, peak: Math.max(peaks.ageMs, end.maxLagMs) },
    timeToDrainMs: consumedPerSec > 0 ? (end.totalRecords / consumedPerSec) * 1000 : null,
    redeliveries: consumers.redeliveries(),
    storage: { dataDirBefore, dataDirAfter, dataDirGrowth: dataDirAfter - dataDirBefore, logBytes },
  };
}

/**
 * Publishes at `ratePerSec` until `deadline`, one `publish` per record, at most `maxInFlight`
 * at once (a slow broker makes the producer fall behind rather than queue without bound).
 */
async function produce(broker: Broker, topic: string, step: Required<CapacityStep>, deadline: number, maxInFlight: number, seed: number): Promise<{ published: number; errors: number; latencies: Float64Array }> {
  const total = Math.floor((step.ratePerSec * step.durationMs) / 1000);
  const latencies = new Float64Array(total);
  const value = Buffer.alloc(step.recordBytes, 0x61); // shared and never written to
  const rnd = prng(seed);
  const inFlight = new Set<Promise<void>>();
  const t0 = performance.now();
  let sent = 0;
  let published = 0;
  let errors = 0;
  while (sent < total && performance.now() < deadline) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) * step.ratePerSec) / 1000) + 1);
    while (sent < due && inFlight.size < maxInFlight) {
      const key = rnd() < step.hotKeyShare ? "hot" : `k-${Math.floor(rnd() * step.keys)}`;
      const t = performance.now();
      sent++;
      const p: Promise<void> = broker.publish(topic, value, { key }).then(
        () => void (latencies[published++] = performance.now() - t),
        () => void errors++,
      );
      inFlight.add(p);
      void p.then(() => inFlight.delete(p));
    }
    if (inFlight.size >= maxInFlight) await Promise.race(inFlight);
    else await sleep(Math.max(1, Math.min(deadline - performance.now(), t0 + (sent * 1000) / step.ratePerSec - performance.now())));
  }
  await Promise.all(inFlight);
  return { published, errors, latencies: latencies.subarray(0, published) };
}

/** The highest depth and oldest age seen until `deadline`, one `groupLag` per interval. */
async function sampleLag(broker: Broker, group: string, topic: string, deadline: number, intervalMs: number): Promise<{ depth: number; ageMs: number }> {
  const peak = { depth: 0, ageMs: 0 };
  while (performance.now() < deadline) {
    const lag = await broker.groupLag(group, topic);
    peak.depth = Math.max(peak.depth, lag.totalRecords);
    peak.ageMs = Math.max(peak.ageMs, lag.maxLagMs);
    await sleep(Math.max(1, Math.min(intervalMs, deadline - performance.now())));
  }
  return peak;
}

/**
 * `concurrency` members of `group`, each: the dependency latency, the user's handler, an
 * un-awaited commit (the subscription bounds commits not yet durable). A message at or below
 * the highest offset its partition delivered before is a redelivery.
 */
function startMembers(broker: Broker, topic: string, group: string, step: Required<CapacityStep>, handler: CapacityRunOptions["handler"]) {
  const stop = new AbortController();
  const highest = new Map<number, number>();
  let consumed = 0;
  let redeliveries = 0;
  const loops = Array.from({ length: step.concurrency }, async () => {
    const sub = broker.subscribe(topic, { group, start: "earliest", signal: stop.signal, drainTimeoutMs: 0 });
    try {
      for await (const msg of sub) {
        const again = msg.offset <= (highest.get(msg.partition) ?? -1);
        if (again) redeliveries++;
        else highest.set(msg.partition, msg.offset);
        if (step.dependencyLatencyMs > 0) await sleep(step.dependencyLatencyMs, undefined, { signal: stop.signal });
        await handler?.(msg, step);
        if (!again) consumed++;
        void msg.commit();
      }
    } catch (e) {
      if (!stop.signal.aborted) throw e;
    } finally {
      await sub.close();
    }
  });
  const done = Promise.all(loops);
  done.catch(() => {}); // reported by stop()
  return {
    consumed: () => consumed,
    redeliveries: () => redeliveries,
    /** Ends the members; a handler still running 10 s after the step ended is an error, not a hang. */
    async stop(): Promise<void> {
      stop.abort();
      await withTimeout(done, STOP_MS, `${step.name}: the handler returns after the step ended`);
    },
  };
}

function quantile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

/** Apparent size of every file under `dir`. */
function dirBytes(dir: string): number {
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    try {
      if (e.isDirectory()) n += dirBytes(p);
      else if (e.isFile()) n += statSync(p).size;
    } catch {
      // removed meanwhile (a segment deleted, a temp file renamed): not there to count
    }
  }
  return n;
}

/** A readable table of a run, one row per step. */
export function formatCapacityReport(result: CapacityResult): string {
  const head = ["step", "rate/s", "sent/s", "bytes", "hot", "conc", "dep ms", "pub p50/p99 ms", "depth end/peak", "oldest age end/peak", "drain", "redeliv", "log bytes", "dir growth"];
  const ms = (v: number): string => (v >= 10_000 ? `${(v / 1000).toFixed(0)}s` : v >= 1000 ? `${(v / 1000).toFixed(1)}s` : `${v.toFixed(v < 10 ? 1 : 0)}ms`);
  const rows = result.steps.map((r) => [
    r.step.name,
    String(r.step.ratePerSec),
    r.publishedPerSec.toFixed(0),
    String(r.step.recordBytes),
    `${Math.round(r.step.hotKeyShare * 100)}%`,
    String(r.step.concurrency),
    String(r.step.dependencyLatencyMs),
    `${r.publishLatencyMs.p50.toFixed(2)}/${r.publishLatencyMs.p99.toFixed(2)}`,
    `${r.depth.end}/${r.depth.peak}`,
    `${ms(r.oldestAgeMs.end)}/${ms(r.oldestAgeMs.peak)}`,
    r.timeToDrainMs === null ? "-" : ms(r.timeToDrainMs),
    String(r.redeliveries),
    String(r.storage.logBytes),
    String(r.storage.dataDirGrowth),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cells: string[]): string => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ");
  return [`capacity run, ${result.partitions} partitions`, line(head), line(widths.map((w) => "-".repeat(w))), ...rows.map(line)].join("\n");
}
