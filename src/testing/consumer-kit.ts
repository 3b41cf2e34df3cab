// SPDX-License-Identifier: Apache-2.0
/**
 * A test kit for users' own consumer handlers: runs a handler against a record set on an
 * embedded broker, with crashes injected at the points where at-least-once delivery bites
 * (before a side effect, after it and before the commit, after the commit), replays from the
 * start and from the middle, a rebalance while a handler is in flight (consumer-kit-rebalance.ts),
 * and compares every run with a crash-free reference run. It reports:
 *
 * - lost work: the projection (the handler's database, a `KitStore`) differs from the
 *   reference, or an effect the reference performed is missing;
 * - repeated effects: an external effect performed twice (the `KitEffects` sink plays the
 *   external system: a call with an idempotency key it has seen is ignored, as a payment
 *   provider does; one without a key is performed every time).
 *
 * The handler gets `(msg, world)`: `world.store` (atomic `transaction(fn)`; committed state
 * survives a crash, an interrupted transaction does not) and `world.effects`. Without records
 * it uses `kitRecordSet()` (duplicates, conflicting duplicates, a version gap, malformed
 * payloads, several keys and a hot one).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../broker/broker.js";
import type { PublishRecord } from "../types.js";
import { projectionChecksum } from "../contracts/rebuild.js";
import { KIT_CRASH_POINTS, KitCrash, newWorld, wrapMessage, type KitCrashPoint, type KitHandler, type KitWorld } from "./consumer-kit-world.js";
import { kitRecordSet } from "./consumer-kit-records.js";
import { rebalanceRun, type KitRebalanceReport } from "./consumer-kit-rebalance.js";

export { KitStore, KitEffects, KIT_CRASH_POINTS, type KitCrashPoint, type KitWorld, type KitHandler } from "./consumer-kit-world.js";
export { kitRecordSet, type KitEvent, type KitRecordSetOptions } from "./consumer-kit-records.js";
export type { KitRebalanceReport } from "./consumer-kit-rebalance.js";

export interface VerifyOptions {
  handler: KitHandler;
  /** Default `kitRecordSet()`. */
  records?: PublishRecord[];
  /** Default 3. The rebalance run needs at least 2. */
  partitions?: number;
  /** The run with partitions moving between members mid-flight (consumer-kit-rebalance.ts). Default true. */
  rebalance?: boolean;
  /** Crash runs per crash point (at different occurrences). Default 3. */
  crashesPerPoint?: number;
  /** Seed of the occurrence choice. */
  seed?: number;
}

export interface KitRunReport {
  name: string;
  checksumMatches: boolean;
  missingEffects: string[];
  repeatedEffects: string[];
  /** The rebalance run's moves (only on that run). */
  rebalance?: KitRebalanceReport;
}

export interface KitReport {
  runs: KitRunReport[];
  /** Runs that lost work (projection differs from the reference, or effects missing). */
  lostWork: string[];
  /** Runs in which an effect was performed more than once. */
  repeatedEffects: string[];
  ok: boolean;
}

/** Runs the reference, the crash runs, the replays and the rebalance run; see the file comment. */
export async function verifyConsumer(opts: VerifyOptions): Promise<KitReport> {
  const o = { ...opts, records: opts.records ?? kitRecordSet(), partitions: opts.partitions ?? 3 };
  const reference = await runOnce(o, null, null);
  const expected = projectionChecksum(reference.world.store.snapshot());
  const runs: KitRunReport[] = [];
  let seed = o.seed ?? 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const points = KIT_CRASH_POINTS.filter((p) => reference.reached.get(p));
  for (const point of points) {
    for (let i = 0; i < (o.crashesPerPoint ?? 3); i++) {
      const nth = 1 + Math.floor(rnd() * reference.reached.get(point)!);
      const r = await runOnce(o, { point, nth, seen: 0, fired: false }, null);
      runs.push(compare(`crash at ${point} #${nth}`, r.world, reference.world, expected));
    }
  }
  for (const from of ["start", "middle"] as const) {
    const replayed = await runOnce(o, null, from);
    runs.push(compare(`replay from the ${from}`, replayed.world, reference.world, expected));
  }
  if (o.rebalance !== false && o.partitions >= 2) {
    const r = await rebalanceRun(o.handler, o.records, o.partitions);
    runs.push({ ...compare("rebalance during in-flight work", r.world, reference.world, expected), rebalance: r.rebalance });
  }
  const lostWork = runs.filter((r) => !r.checksumMatches || r.missingEffects.length > 0).map((r) => r.name);
  const repeatedEffects = runs.filter((r) => r.repeatedEffects.length > 0).map((r) => r.name);
  return { runs, lostWork, repeatedEffects, ok: lostWork.length === 0 && repeatedEffects.length === 0 };
}

function compare(name: string, w: KitWorld, ref: KitWorld, expected: string): KitRunReport {
  return {
    name,
    checksumMatches: projectionChecksum(w.store.snapshot()) === expected,
    missingEffects: [...ref.effects.performed.keys()].filter((id) => !w.effects.performed.has(id)),
    repeatedEffects: [...w.effects.performed].filter(([, n]) => n > 1).map(([id]) => id),
  };
}

/**
 * One run on a fresh broker: consume everything (restarting the consumer after an injected
 * crash, as a process restart would: it resumes from the last durable commit), and with
 * `replay`, reset the group to the start (or to the middle of each partition) and consume
 * everything from there again.
 */
async function runOnce(
  o: { handler: KitHandler; records: PublishRecord[]; partitions: number },
  crash: KitWorld["crash"],
  replay: "start" | "middle" | null,
): Promise<{ world: KitWorld; reached: Map<KitCrashPoint, number> }> {
  const dir = mkdtempSync(join(tmpdir(), "sluice-kit-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const world = newWorld(crash);
  try {
    await broker.createTopic("kit", { partitions: o.partitions });
    await broker.publishBatch("kit", o.records);
    const passes = replay ? 2 : 1;
    for (let pass = 0; pass < passes; pass++) {
      if (pass === 1) await broker.resetGroup("kit-consumer", "kit", replay === "start" ? "earliest" : await middle(broker));
      for (let restarts = 0; ; restarts++) {
        if (restarts > 100) throw new Error("the handler crashed more than 100 times in a row");
        const crashed = await consumeAll(broker, o.handler, world);
        if (!crashed) break;
      }
    }
  } finally {
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return { world, reached: world.reached };
}

/** The reset target halfway through each partition. */
async function middle(broker: Awaited<ReturnType<typeof openBroker>>): Promise<{ partitions: Record<number, number> }> {
  const lag = await broker.groupLag("kit-consumer", "kit");
  return { partitions: Object.fromEntries(lag.partitions.map((p) => [p.partition, Math.floor(p.highWatermark / 2)])) };
}

/** Consumes until the group has nothing left; returns true if an injected crash ended it. */
async function consumeAll(broker: Awaited<ReturnType<typeof openBroker>>, handler: KitHandler, world: KitWorld): Promise<boolean> {
  if ((await broker.groupLag("kit-consumer", "kit")).totalRecords === 0) return false;
  const ac = new AbortController();
  const sub = broker.subscribe("kit", { group: "kit-consumer", start: "earliest", signal: ac.signal, drainTimeoutMs: 0 });
  // The loop ends when every record is committed (the handler's commits are durable), or after
  // a deadline: a handler that never commits is a finding, not a hang.
  const deadline = Date.now() + 30_000;
  let caughtUp = false;
  const watcher = (async () => {
    while (!ac.signal.aborted) {
      if ((await broker.groupLag("kit-consumer", "kit")).totalRecords === 0) {
        caughtUp = true;
        return ac.abort();
      }
      if (Date.now() > deadline) return ac.abort();
      await new Promise((r) => setTimeout(r, 5));
    }
  })();
  const fired = () => world.crash?.fired === true;
  try {
    for await (const msg of sub) {
      try {
        await handler(wrapMessage(msg, world), world);
      } catch (e) {
        if (!(e instanceof KitCrash) && !fired()) throw e;
      }
      if (fired()) return true; // the process died here; a restart resumes from the last durable commit
    }
    if (!caughtUp && !fired()) throw new Error("the handler did not commit every record within 30 s");
    return fired();
  } finally {
    ac.abort();
    await watcher;
    await sub.close();
  }
}
