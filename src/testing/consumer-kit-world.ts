// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer test kit's world (consumer-kit.ts): the handler's database (`KitStore`), the
 * external system (`KitEffects`), the crash points, and the message wrapper every kit run
 * hands to the handler.
 */
import type { Message } from "../types.js";

/** The application's database, in memory: rows by key; transactions are all or nothing. */
export class KitStore {
  private rows = new Map<string, unknown>();
  /** The transaction running now: transactions run one at a time, as a serializable database's. */
  private tail: Promise<unknown> = Promise.resolve();
  /**
   * Runs `fn` on a copy; the copy becomes the state only if `fn` completes. Concurrent calls
   * (two members handling the same redelivered message during a rebalance) run one after the
   * other, so neither overwrites the other's writes (so a transaction started inside another
   * waits for ever: do not nest them).
   */
  transaction<R>(fn: (tx: Map<string, unknown>) => Promise<R> | R): Promise<R> {
    const run = this.tail.then(async () => {
      const copy = new Map(this.rows);
      const r = await fn(copy);
      crashPoint(this.world, "before-commit-of-transaction");
      this.rows = copy;
      return r;
    });
    this.tail = run.catch(() => {});
    return run;
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

export type KitHandler = (msg: Message, world: KitWorld) => Promise<void>;

/** @internal */
export class KitCrash extends Error {
  constructor(readonly point: KitCrashPoint) {
    super(`injected crash at ${point}`);
  }
}

/** @internal A fresh world, with the crash to inject (or none). */
export function newWorld(crash: KitWorld["crash"]): KitWorld {
  const world: KitWorld = { store: new KitStore(), effects: new KitEffects(), crash, reached: new Map() };
  world.store.world = world;
  world.effects.world = world;
  return world;
}

/** @internal */
export function crashPoint(world: KitWorld | null, point: KitCrashPoint): void {
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

/**
 * @internal `msg` as the handler sees it: its `commit()` first awaits `beforeCommit` (where the
 * rebalance run holds a handler in flight), then commits durably, then passes the
 * "after-commit" crash point; `onRefused` hears of a commit that failed.
 */
export function wrapMessage(msg: Message, world: KitWorld, beforeCommit?: () => Promise<void>, onRefused?: (e: unknown) => void): Message {
  return Object.create(msg, {
    commit: {
      value: () => {
        const p = (async () => {
          if (beforeCommit) await beforeCommit();
          await msg.commit(); // durable before the crash point, as after a real commit
          crashPoint(world, "after-commit");
        })();
        // A commit left un-awaited must not become an unhandled rejection: the kit's loop sees
        // `fired`, and the rebalance run counts refused commits.
        p.catch((e: unknown) => onRefused?.(e));
        return p;
      },
    },
  }) as Message;
}
