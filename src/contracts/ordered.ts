// SPDX-License-Identifier: Apache-2.0
/**
 * Parallel ordered processing inside a partition (as Confluent's parallel consumer does):
 * records of different keys run concurrently, the records of one key one at a time in offset
 * order, and the group's position only ever moves over a *contiguous prefix* of finished
 * records (invariant ORD-1 in docs/ARCHITECTURE.md): if 42 finishes before 41, nothing is
 * committed past 40 until 41 finishes, so a crash or a failure at 41 never skips it.
 *
 * A failing handler is retried with jittered exponential backoff, blocking only its key; when
 * its attempts are spent, `onExhausted` decides: "stop" (default: processing ends with the
 * error and the position stays before the record) or "skip" (the application has dealt with
 * it, e.g. sent it to a dead-letter topic, so it counts as finished).
 *
 * Memory is bounded by `maxInFlight` records taken from the subscription and not yet committed.
 */
import { AbortedError, ValidationError } from "../errors.js";
import type { Message } from "../types.js";
import { tracing } from "../observability/tracing.js";
import { attemptRecord, classifyFailure, deadLetterRecord, type AttemptRecord, type DeadLetterTopicOptions, type FailureClass } from "./poison.js";

/** What to do with failures by class (poison.ts). Without it: retries, then `onExhausted`. */
export interface PoisonPolicy {
  classify?: (error: unknown) => FailureClass;
  /** Where permanent failures go; without it they pause their key like defects. */
  deadLetter?: DeadLetterTopicOptions;
}

export interface PausedKey {
  key: string;
  partition: number;
  offset: number;
  reason: FailureClass;
  error: string;
  since: number;
  attempts: number;
}

/** A running `orderedProcessor`: its end, and the keys paused by its poison policy. */
export interface OrderedProcessor {
  readonly done: Promise<void>;
  /** Keys held by a defect, a missing predecessor or an undeliverable permanent failure. */
  paused(): PausedKey[];
  /** Tries the key's held record again (attempts start over). */
  resume(key: string): boolean;
  /** Counts the key's held record as finished (you handled it by hand); the key goes on. */
  skip(key: string): boolean;
}

export interface OrderedOptions<T> {
  /** Handlers running at once, over all keys. Default 16. */
  concurrency?: number;
  /** Records taken from the subscription and not yet behind the committed position. Default 1,000. */
  maxInFlight?: number;
  /**
   * The ordering key of a record. Default: its record key; records without a key are not
   * ordered among themselves (each is its own key).
   */
  keyOf?: (msg: Message<T>) => string | null;
  /** Attempts per record before `onExhausted` (1 = no retry). Default 5. */
  maxAttempts?: number;
  /** Backoff between attempts: min(maxDelayMs, minDelayMs * 2^(attempt-1)), with full jitter. */
  minDelayMs?: number;
  maxDelayMs?: number;
  /** After the last failed attempt: "stop" (default) ends processing with the error; "skip" counts the record as finished. */
  onExhausted?: (error: unknown, msg: Message<T>, attempts: number) => "stop" | "skip" | Promise<"stop" | "skip">;
  /** Classified failures (see poison.ts); when set, `onExhausted` is not used. */
  poison?: PoisonPolicy;
  signal?: AbortSignal;
}

interface Entry<T> {
  msg: Message<T>;
  key: string;
  done: boolean;
  attempts: number;
  history: AttemptRecord[];
  progress: PartitionProgress<T>;
}

/** Delivered records of one partition in delivery order; commits the finished prefix (ORD-1). */
class PartitionProgress<T> {
  private readonly entries: Entry<T>[] = [];
  private head = 0;
  constructor(readonly signal: AbortSignal) {}

  get size(): number {
    return this.entries.length - this.head;
  }

  push(e: Entry<T>): void {
    this.entries.push(e);
  }

  /**
   * Marks `e` finished (or dropped, when its partition was revoked) and moves the position over
   * the finished prefix; returns how many records left the window.
   */
  finish(e: Entry<T>): number {
    e.done = true;
    const from = this.head;
    while (this.head < this.entries.length && this.entries[this.head].done) this.head++;
    const passed = this.head - from;
    if (passed > 0 && !this.signal.aborted) {
      // ORD-1: every record delivered before this one in this partition has finished.
      void this.entries[this.head - 1].msg.commit();
    }
    if (this.head > 1024 && this.head * 2 > this.entries.length) {
      this.entries.splice(0, this.head);
      this.head = 0;
    }
    return passed;
  }
}

/** Runs `handler` over `source` with per-key order and contiguous-prefix commits. */
export async function processOrdered<T>(source: AsyncIterable<Message<T>>, handler: (msg: Message<T>) => unknown, opts: OrderedOptions<T> = {}): Promise<void> {
  return orderedProcessor(source, handler, opts).done;
}

/** `processOrdered` with a handle on its paused keys (poison policy). */
export function orderedProcessor<T>(source: AsyncIterable<Message<T>>, handler: (msg: Message<T>) => unknown, opts: OrderedOptions<T> = {}): OrderedProcessor {
  // A CONSUMER span around each handler call when tracing is on (src/observability/tracing.ts).
  const runner = new OrderedRunner(tracing === null ? handler : tracing.messageHandler(handler), opts);
  return { done: runner.run(source), paused: () => runner.pausedKeys(), resume: (k) => runner.resume(k), skip: (k) => runner.skip(k) };
}

class OrderedRunner<T> {
  private readonly concurrency: number;
  private readonly maxInFlight: number;
  private readonly maxAttempts: number;
  private readonly lanes = new Map<string, Entry<T>[]>();
  private readonly ready: string[] = [];
  private readonly progress = new Map<number, PartitionProgress<T>>();
  private running = 0;
  private inFlight = 0;
  private failure: { error: unknown } | null = null;
  private wake: (() => void) | null = null;
  private readonly timers = new Set<NodeJS.Timeout>();
  private unkeyed = 0;
  private readonly held = new Map<string, { entry: Entry<T>; info: PausedKey }>();

  constructor(
    private readonly handler: (msg: Message<T>) => unknown,
    private readonly opts: OrderedOptions<T>,
  ) {
    this.concurrency = opts.concurrency ?? 16;
    this.maxInFlight = opts.maxInFlight ?? 1000;
    this.maxAttempts = opts.maxAttempts ?? 5;
    if (!Number.isSafeInteger(this.concurrency) || this.concurrency < 1) throw new ValidationError("concurrency must be an integer >= 1");
    if (!Number.isSafeInteger(this.maxInFlight) || this.maxInFlight < this.concurrency) throw new ValidationError("maxInFlight must be an integer >= concurrency");
    if (!Number.isSafeInteger(this.maxAttempts) || this.maxAttempts < 1) throw new ValidationError("maxAttempts must be an integer >= 1");
  }

  async run(source: AsyncIterable<Message<T>>): Promise<void> {
    const signal = this.opts.signal;
    const onAbort = () => this.poke();
    signal?.addEventListener("abort", onAbort, { once: true });
    const it = source[Symbol.asyncIterator]();
    try {
      while (!this.failure && !signal?.aborted) {
        await this.until(() => this.inFlight < this.maxInFlight || this.failure !== null || signal?.aborted === true);
        if (this.failure || signal?.aborted) break;
        const next = await it.next();
        if (next.done) break;
        this.accept(next.value);
      }
      // Let what was taken finish (and commit) before returning: the caller's close() then leaves
      // the group with every finished record committed.
      await this.until(() => this.running === 0 && this.timers.size === 0);
    } finally {
      signal?.removeEventListener("abort", onAbort);
      for (const t of this.timers) clearTimeout(t);
      await it.return?.();
    }
    if (this.failure) throw this.failure.error;
  }

  private accept(msg: Message<T>): void {
    let p = this.progress.get(msg.partition);
    // A new ownership period of the partition has a new signal: what the old one holds is
    // redelivered to whoever owns the partition now, so its prefix is not ours to commit.
    if (!p || p.signal !== msg.signal) this.progress.set(msg.partition, (p = new PartitionProgress<T>(msg.signal)));
    const key = this.keyOf(msg);
    const e: Entry<T> = { msg, key, done: false, attempts: 0, history: [], progress: p };
    p.push(e);
    this.inFlight++;
    const lane = this.lanes.get(key);
    if (lane) lane.push(e);
    else {
      this.lanes.set(key, [e]);
      this.ready.push(key);
      this.pump();
    }
  }

  private keyOf(msg: Message<T>): string {
    const k = this.opts.keyOf ? this.opts.keyOf(msg) : msg.key === null ? null : Buffer.from(msg.key).toString("latin1");
    return k === null ? `\u0000unkeyed:${this.unkeyed++}` : k;
  }

  private pump(): void {
    while (this.running < this.concurrency && this.ready.length > 0 && !this.failure) {
      const key = this.ready.shift()!;
      const e = this.lanes.get(key)![0];
      this.running++;
      void this.attempt(e);
    }
  }

  private async attempt(e: Entry<T>): Promise<void> {
    let error: unknown = null;
    if (e.msg.signal.aborted && e.attempts === 0) {
      // Revoked before it started: the new owner gets it; drop it without running.
      this.settle(e);
      return;
    }
    e.attempts++;
    try {
      await this.handler(e.msg);
    } catch (err) {
      error = err ?? new Error("handler failed");
    }
    if (error === null) return this.settle(e);
    if (this.opts.poison) return this.applyPolicy(e, error, this.opts.poison);
    if (e.attempts < this.maxAttempts && !e.msg.signal.aborted && !this.opts.signal?.aborted) return this.retryLater(e);
    let decision: "stop" | "skip" = "stop";
    try {
      decision = (await this.opts.onExhausted?.(error, e.msg, e.attempts)) ?? "stop";
    } catch (err) {
      error = err;
    }
    if (decision === "skip") return this.settle(e);
    this.failure ??= { error: e.msg.signal.aborted || this.opts.signal?.aborted ? new AbortedError("processing stopped while a record was failing", error) : error };
    this.running--;
    this.poke();
  }

  /** A failure under the poison policy: retry, dead-letter, or hold the key (poison.ts). */
  private async applyPolicy(e: Entry<T>, error: unknown, policy: PoisonPolicy): Promise<void> {
    const cls = (policy.classify ?? classifyFailure)(error);
    e.history.push(attemptRecord(e.attempts, error));
    if (e.msg.signal.aborted || this.opts.signal?.aborted) {
      // Revoked or stopping: leave it uncommitted for whoever reads it next.
      this.running--;
      return this.poke();
    }
    if (cls === "transient" && e.attempts < this.maxAttempts) return this.retryLater(e);
    if (cls === "permanent" && policy.deadLetter) {
      const dl = policy.deadLetter;
      try {
        // Durable in the dead-letter topic before the record counts as finished.
        const r = deadLetterRecord(e.msg, cls, e.history, dl);
        await dl.broker.publish(dl.topic, r.value, { key: r.key, headers: r.headers, timestamp: r.timestamp });
        return this.settle(e);
      } catch (dlqError) {
        e.history.push(attemptRecord(e.attempts, dlqError));
        return this.hold(e, "defect", dlqError);
      }
    }
    return this.hold(e, cls === "transient" ? "defect" : cls, error);
  }

  /** Holds the key at this record: never committed past, never dropped, until resume or skip. */
  private hold(e: Entry<T>, reason: FailureClass, error: unknown): void {
    const err = error as { message?: unknown } | null;
    this.held.set(e.key, { entry: e, info: { key: e.key, partition: e.msg.partition, offset: e.msg.offset, reason, error: typeof err?.message === "string" ? err.message : String(error), since: Date.now(), attempts: e.attempts } });
    this.running--;
    this.pump();
    this.poke();
  }

  pausedKeys(): PausedKey[] {
    return [...this.held.values()].map((h) => ({ ...h.info }));
  }

  resume(key: string): boolean {
    const h = this.held.get(key);
    if (!h) return false;
    this.held.delete(key);
    h.entry.attempts = 0;
    this.ready.unshift(key);
    this.pump();
    return true;
  }

  skip(key: string): boolean {
    const h = this.held.get(key);
    if (!h) return false;
    this.held.delete(key);
    this.running++; // settle() releases a slot
    this.settle(h.entry);
    return true;
  }

  private retryLater(e: Entry<T>): void {
    const min = this.opts.minDelayMs ?? 100;
    const max = this.opts.maxDelayMs ?? 30_000;
    const delay = Math.random() * Math.min(max, min * 2 ** (e.attempts - 1));
    this.running--; // a key waiting out its backoff does not hold a handler slot
    const t = setTimeout(() => {
      this.timers.delete(t);
      this.ready.unshift(e.key);
      this.pump();
      this.poke();
    }, delay);
    this.timers.add(t);
    this.pump();
  }

  /** The head of its key's lane finished (or was dropped): advance the lane and the partition. */
  private settle(e: Entry<T>): void {
    const lane = this.lanes.get(e.key)!;
    lane.shift();
    if (lane.length > 0) this.ready.push(e.key);
    else this.lanes.delete(e.key);
    this.running--;
    // A dropped record's partition was revoked: finish() moves past it without committing.
    this.inFlight -= e.progress.finish(e);
    this.pump();
    this.poke();
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private async until(cond: () => boolean): Promise<void> {
    while (!cond()) await new Promise<void>((r) => (this.wake = r));
  }
}
