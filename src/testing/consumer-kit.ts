// SPDX-License-Identifier: Apache-2.0
/**
 * A test kit for users' own consumer handlers: runs a handler against a record set on an
 * embedded broker, with crashes injected at the points where at-least-once delivery bites
 * (before a side effect, after it and before the commit, after the commit), a replay from the
 * start, and compares every run with a crash-free reference run. It reports:
 *
 * - lost work: the projection (the handler's database, a `KitStore`) differs from the
 *   reference, or an effect the reference performed is missing;
 * - repeated effects: an external effect performed twice (the `KitEffects` sink plays the
 *   external system: a call with an idempotency key it has seen is ignored, as a payment
 *   provider does; one without a key is performed every time).
 *
 * The handler gets `(msg, world)`: `world.store` (atomic `transaction(fn)`; committed state
 * survives a crash, an interrupted transaction does not) and `world.effects`.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../broker/broker.js";
import type { Message, PublishRecord } from "../types.js";
import { projectionChecksum } from "../contracts/rebuild.js";

/** The application's database, in memory: rows by key; transactions are all or nothing. */
export class KitStore {
  private rows = new Map<string, unknown>();
  /** Runs `fn` on a copy; the copy becomes the state only if `fn` completes. */
  async transaction<R>(fn: (tx: Map<string, unknown>) => Promise<R> | R): Promise<R> {
    const copy = new Map(this.rows);
    const r = await fn(copy);
    crashPoint(this.world, "before-commit-of-transaction");
    this.rows = copy;
    return r;
  }
  get(key: string): unknown {
    return this.rows.get(key);
  }
  snapshot(): Record<string, unknown> {
    return Object.fromEntries([...this.rows].sort(([a], [b]) => (a < b ? -1 : 1)));
  }
  /** @internal */
  world: KitWorld | null = null;
}

/** The external system: performs effects; deduplicates by idempotency key when one is given. */
export class KitEffects {
  /** Every effect performed, by its logical id, with how many times. */
  readonly performed = new Map<string, number>();
  private readonly keys = new Set<string>();
  /** @internal */
  world: KitWorld | null = null;
  /**
   * Performs the effect `id` (e.g. "email:order-7"). With `idempotencyKey`, a second call with
   * the same key is ignored by the external system.
   */
  async send(id: string, opts: { idempotencyKey?: string } = {}): Promise<void> {
    crashPoint(this.world, "before-effect");
    if (opts.idempotencyKey !== undefined && this.keys.has(opts.idempotencyKey)) return;
    if (opts.idempotencyKey !== undefined) this.keys.add(opts.idempotencyKey);
    this.performed.set(id, (this.performed.get(id) ?? 0) + 1);
    crashPoint(this.world, "after-effect");
  }
}

export type KitCrashPoint = "before-effect" | "after-effect" | "before-commit-of-transaction" | "after-commit";
export const KIT_CRASH_POINTS: readonly KitCrashPoint[] = ["before-effect", "after-effect", "before-commit-of-transaction", "after-commit"];

export interface KitWorld {
  store: KitStore;
  effects: KitEffects;
  /** @internal the crash to inject: at the `nth` time `point` is reached; `fired` once it did. */
  crash: { point: KitCrashPoint; nth: number; seen: number; fired: boolean } | null;
  /** @internal how often each point was reached. */
  reached: Map<KitCrashPoint, number>;
}

class KitCrash extends Error {
  constructor(readonly point: KitCrashPoint) {
    super(`injected crash at ${point}`);
  }
}

function crashPoint(world: KitWorld | null, point: KitCrashPoint): void {
  if (!world) return;
  world.reached.set(point, (world.reached.get(point) ?? 0) + 1);
  const c = world.crash;
  if (!c || c.fired || c.point !== point) return;
  if (++c.seen === c.nth) {
    // Marked as well as thrown: a handler that catches it still "died" here.
    c.fired = true;
    throw new KitCrash(point);
  }
}

export type KitHandler = (msg: Message, world: KitWorld) => Promise<void>;

export interface VerifyOptions {
  handler: KitHandler;
  records: PublishRecord[];
  partitions?: number;
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
}

export interface KitReport {
  runs: KitRunReport[];
  /** Runs that lost work (projection differs from the reference, or effects missing). */
  lostWork: string[];
  /** Runs in which an effect was performed more than once. */
  repeatedEffects: string[];
  ok: boolean;
}

/** Runs the reference, the crash runs and a replay; see the file comment. */
export async function verifyConsumer(o: VerifyOptions): Promise<KitReport> {
  const reference = await runOnce(o, null, false);
  const expected = projectionChecksum(reference.world.store.snapshot());
  const runs: KitRunReport[] = [];
  let seed = o.seed ?? 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const points = KIT_CRASH_POINTS.filter((p) => reference.reached.get(p));
  for (const point of points) {
    for (let i = 0; i < (o.crashesPerPoint ?? 3); i++) {
      const nth = 1 + Math.floor(rnd() * reference.reached.get(point)!);
      const r = await runOnce(o, { point, nth, seen: 0, fired: false }, false);
      runs.push(compare(`crash at ${point} #${nth}`, r.world, reference.world, expected));
    }
  }
  const replayed = await runOnce(o, null, true);
  runs.push(compare("replay from the start", replayed.world, reference.world, expected));
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
 * `replay`, reset the group to the start and consume everything again.
 */
async function runOnce(o: VerifyOptions, crash: KitWorld["crash"], replay: boolean): Promise<{ world: KitWorld; reached: Map<KitCrashPoint, number> }> {
  const dir = mkdtempSync(join(tmpdir(), "sluice-kit-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const world: KitWorld = { store: new KitStore(), effects: new KitEffects(), crash, reached: new Map() };
  world.store.world = world;
  world.effects.world = world;
  try {
    await broker.createTopic("kit", { partitions: o.partitions ?? 3 });
    await broker.publishBatch("kit", o.records);
    const passes = replay ? 2 : 1;
    for (let pass = 0; pass < passes; pass++) {
      if (pass === 1) await broker.resetGroup("kit-consumer", "kit", "earliest");
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
      const wrapped: Message = Object.create(msg, {
        commit: {
          value: () => {
            const p = (async () => {
              await msg.commit(); // durable before the crash point, as after a real commit
              crashPoint(world, "after-commit");
            })();
            p.catch(() => {}); // a commit left un-awaited must not become an unhandled rejection: the loop sees `fired`
            return p;
          },
        },
      });
      try {
        await handler(wrapped, world);
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
