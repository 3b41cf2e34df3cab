// SPDX-License-Identifier: Apache-2.0
/**
 * The long-lived objects an embedded principal view hands out (src/broker/principal-view.ts):
 * subscriptions, queue workers and event readers. Each is opened only if the principal may
 * (so a refused subscription never joins the group), checks the settling calls of what it
 * delivers (`msg.commit()`, `job.ack()`...), and ends with ForbiddenError when a policy change
 * no longer allows it, as the server ends its members and workers (ACL-3, ACL-5).
 */
import { ForbiddenError } from "../errors.js";
import type { Need } from "../security/acl/model.js";
import type { AuditActor } from "../security/audit/record.js";
import type { Message, MessageBatch, Subscription } from "../types.js";
import type { Job, QueueEvent, QueueEvents, Worker } from "../queues/types.js";
import { JOB_SETTLES } from "./principal-needs.js";

/** What a handle needs of its view. */
export interface ViewContext {
  readonly principal: string;
  readonly actor: AuditActor;
  /** Runs `op` once `needs()` are allowed; otherwise rejects with the denied error (ACL-4) and audits it. */
  run<R>(needs: () => readonly Need[], op: () => Promise<R>): Promise<R>;
  /** Throws the denied error now (the policy is loaded: a handle exists only after a check). */
  checkNow(needs: readonly Need[]): void;
  /** Checks `needs` now if the policy is loaded: null when allowed, the denied error (audited), or undefined when not loaded yet. */
  decideNow(needs: readonly Need[]): Error | null | undefined;
  /** Whether every one of `needs` is allowed by the policy in force. */
  allows(needs: readonly Need[]): boolean;
  /** Re-checks `h` on every policy change until the returned function is called. */
  track(h: LiveHandle): () => void;
}

export interface LiveHandle {
  /** Ends the handle with ForbiddenError if the policy in force no longer allows it. */
  reauthorize(): void;
  /** Ends the handle (the view is closing). */
  close(): Promise<void>;
}

/** Rejects what is pending, and everything later, once revoked. */
class Revocable {
  private reason: Error | null = null;
  private readonly rejecters = new Set<(e: Error) => void>();

  revoke(e: Error): void {
    if (this.reason !== null) return;
    this.reason = e;
    for (const r of this.rejecters) r(e);
    this.rejecters.clear();
  }

  async race<T>(p: Promise<T>): Promise<T> {
    if (this.reason !== null) throw this.reason;
    let reject: (e: Error) => void = () => {};
    const stop = new Promise<never>((_, r) => (reject = r));
    this.rejecters.add(reject);
    try {
      return await Promise.race([p, stop]);
    } finally {
      this.rejecters.delete(reject);
    }
  }
}

/**
 * `obj` with the methods named in `methods` checked first: a refused call returns a rejected
 * promise that is already handled, since settling promises may be left un-awaited and must
 * never cause an unhandled rejection (their contract in src/types.ts and src/queues/types.ts).
 */
export function guardMethods<O extends object>(obj: O, methods: ReadonlySet<PropertyKey>, check: () => void): O {
  return new Proxy(obj, {
    get(target, prop) {
      const v: unknown = Reflect.get(target, prop, target);
      if (typeof v !== "function") return v;
      if (!methods.has(prop)) return (...args: unknown[]): unknown => Reflect.apply(v, target, args);
      return (...args: unknown[]): unknown => {
        try {
          check();
        } catch (e) {
          const refused = Promise.reject(e);
          refused.catch(() => {});
          return refused;
        }
        return Reflect.apply(v, target, args);
      };
    },
  });
}

const COMMIT: ReadonlySet<PropertyKey> = new Set(["commit"]);

/**
 * One long-lived handle of a view: `open` runs once `needs` are allowed; while open, `still`
 * is re-checked on every policy change, and a refusal ends the handle with ForbiddenError.
 */
export class LiveGuard<H extends { close(): Promise<void> }> implements LiveHandle {
  private opening: Promise<H> | null = null;
  private inner: H | null = null;
  private untrack: (() => void) | null = null;
  private readonly revocable = new Revocable();
  private closed = false;

  constructor(
    private readonly ctx: ViewContext,
    private readonly needs: () => readonly Need[],
    private readonly still: () => readonly Need[],
    private readonly what: string,
    private readonly open: () => H,
  ) {
    // Opened at once when the policy is loaded, as the broker's own handle would be: its
    // options are validated now, and `from: "now"` of an event reader means now. A refusal
    // is reported by the first iteration, as an absent topic's or queue's is.
    const now = ctx.decideNow(needs());
    if (now === null) {
      const h = open();
      this.inner = h;
      this.untrack = ctx.track(this);
      this.opening = Promise.resolve(h);
    } else if (now !== undefined) {
      this.opening = Promise.reject(now);
      this.opening.catch(() => {});
    }
  }

  /** The handle, opened on first use; null once closed before it opened. */
  opened(): Promise<H | null> {
    if (this.closed && this.inner === null) return Promise.resolve(null);
    this.opening ??= this.ctx.run(this.needs, async () => {
      const h = this.open();
      this.inner = h;
      this.untrack = this.ctx.track(this);
      if (this.closed) await h.close(); // closed while it opened
      return h;
    });
    return this.revocable.race(this.opening);
  }

  /** The handle if it is open now. */
  get current(): H | null {
    return this.inner;
  }

  /** An iterator over what `of(handle)` yields, each value through `wrap`, ending with the revocation. */
  iterate<V>(of: (h: H) => AsyncIterator<V>, wrap: (v: V) => V): AsyncIterator<V> {
    let it: AsyncIterator<V> | null = null;
    return {
      next: async (): Promise<IteratorResult<V>> => {
        if (it === null) {
          const h = await this.opened();
          if (h === null) return { done: true, value: undefined };
          it = of(h);
        }
        const r = await this.revocable.race(it.next());
        return r.done === true ? r : { done: false, value: wrap(r.value) };
      },
      return: async (): Promise<IteratorResult<V>> => {
        await it?.return?.();
        await this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /** Checks a settling call on what this handle delivered. */
  checkNow(needs: readonly Need[]): void {
    this.ctx.checkNow(needs);
  }

  reauthorize(): void {
    if (this.inner === null || this.ctx.allows(this.still())) return;
    this.revocable.revoke(new ForbiddenError(`not allowed any more: ${this.what} (the authorization policy changed)`));
    void this.close();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.untrack?.();
    this.untrack = null;
    await this.inner?.close();
  }
}

/** A subscription of a view: joins its group only once allowed; `msg.commit()` needs commit on the group. */
export class GuardedSubscription<T> implements Subscription<T> {
  private readonly guard: LiveGuard<Subscription<T>>;

  constructor(
    ctx: ViewContext,
    readonly topic: string,
    readonly group: string,
    needs: () => readonly Need[],
    still: () => readonly Need[],
    private readonly commitNeeds: () => readonly Need[],
    open: () => Subscription<T>,
  ) {
    this.guard = new LiveGuard(ctx, needs, still, `consume ${topic} in group ${group}`, open);
  }

  assignment(): number[] {
    return this.guard.current?.assignment() ?? [];
  }

  private readonly checkCommit = (): void => this.guard.checkNow(this.commitNeeds());

  [Symbol.asyncIterator](): AsyncIterator<Message<T>> {
    return this.guard.iterate(
      (s) => s[Symbol.asyncIterator](),
      (m) => guardMethods(m, COMMIT, this.checkCommit),
    );
  }

  batches(opts?: { maxMessages?: number; maxWaitMs?: number }): AsyncIterable<MessageBatch<T>> {
    const wrap = (b: MessageBatch<T>): MessageBatch<T> => guardMethods({ messages: b.messages.map((m) => guardMethods(m, COMMIT, this.checkCommit)), commit: () => b.commit() }, COMMIT, this.checkCommit);
    return { [Symbol.asyncIterator]: () => this.guard.iterate((s) => s.batches(opts)[Symbol.asyncIterator](), wrap) };
  }

  close(): Promise<void> {
    return this.guard.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A queue worker of a view: leases jobs only once allowed; settling a job needs ack on the queue. */
export class GuardedWorker<T> implements Worker<T> {
  private readonly guard: LiveGuard<Worker<T>>;

  constructor(ctx: ViewContext, queue: string, needs: () => readonly Need[], still: () => readonly Need[], private readonly settleNeeds: () => readonly Need[], open: () => Worker<T>) {
    this.guard = new LiveGuard(ctx, needs, still, `consume queue ${queue}`, open);
  }

  private readonly checkSettle = (): void => this.guard.checkNow(this.settleNeeds());

  [Symbol.asyncIterator](): AsyncIterator<Job<T>> {
    return this.guard.iterate(
      (w) => w[Symbol.asyncIterator](),
      (j) => guardJob(j, this.checkSettle),
    );
  }

  close(): Promise<void> {
    return this.guard.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

export function guardJob<T>(job: Job<T>, check: () => void): Job<T> {
  return guardMethods(job, JOB_SETTLES, check);
}

/** A queue's event reader of a view: opened once describe is allowed, ended when it no longer is. */
export class GuardedEvents implements QueueEvents {
  private readonly guard: LiveGuard<QueueEvents>;

  constructor(ctx: ViewContext, queue: string, needs: () => readonly Need[], still: () => readonly Need[], open: () => QueueEvents) {
    this.guard = new LiveGuard(ctx, needs, still, `read events of queue ${queue}`, open);
  }

  [Symbol.asyncIterator](): AsyncIterator<QueueEvent> {
    return this.guard.iterate(
      (e) => e[Symbol.asyncIterator](),
      (v) => v,
    );
  }

  close(): Promise<void> {
    return this.guard.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
