// SPDX-License-Identifier: Apache-2.0
/**
 * `queue.events()` for embedded and remote queues alike: an async iterable over pages of
 * lifecycle events that a `pull` function reads (the engine's `readEvents` embedded, the
 * QUEUE_EVENTS long-poll through a client). At most one page (MAX_EVENTS_PER_PAGE events) is
 * held at a time, and nothing is read before the reader asks: a reader that stops reading
 * costs the broker nothing (EVT-1). `from: "now"` is resolved when `events()` is called.
 */
import { AbortedError, StorageError, ValidationError } from "../errors.js";
import { MAX_EVENTS_PER_READ, MAX_EVENTS_WAIT_MS } from "./config.js";
import type { QueueEvent, QueueEvents, QueueEventsOptions } from "./types.js";

/** Events asked for per read. */
export const MAX_EVENTS_PER_PAGE = 256;
/** A read that failed with StorageError (the queue reopening after a fault, Q-7) is tried again after this, doubling to 5 s. */
const RETRY_MIN_MS = 100;
const RETRY_MAX_MS = 5000;

export interface EventsPage {
  events: QueueEvent[];
  position: string;
}

/** Reads one page after `from` (waiting up to `maxWaitMs` while there is none). */
export type EventsPull = (from: string, max: number, maxWaitMs: number, signal: AbortSignal) => Promise<EventsPage>;

/** The `from` option checked (ValidationError when it is not a string). */
export function eventsFrom(opts: QueueEventsOptions | undefined): string {
  const from = opts?.from ?? "now";
  if (typeof from !== "string" || from.length === 0 || from.length > 200) throw new ValidationError(`events: from must be "now", "earliest" or an event's position`);
  return from;
}

/** `max` and `maxWaitMs` of one read, bounded (requests from the network). */
export function eventsBounds(max: unknown, maxWaitMs: unknown): { max: number; maxWaitMs: number } {
  const m = typeof max === "number" && Number.isInteger(max) ? Math.min(Math.max(max, 1), MAX_EVENTS_PER_READ) : MAX_EVENTS_PER_PAGE;
  const w = typeof maxWaitMs === "number" && Number.isFinite(maxWaitMs) ? Math.min(Math.max(maxWaitMs, 0), MAX_EVENTS_WAIT_MS) : 0;
  return { max: m, maxWaitMs: w };
}

const RETRY = "\u0000retry";

export class QueueEventStream implements QueueEvents {
  private readonly ac = new AbortController();
  private buffer: QueueEvent[] = [];
  private position: Promise<string>;
  /** Where the next read starts (the last page's position). */
  private from: string;
  private retryMs = RETRY_MIN_MS;
  private closed = false;
  private readonly onAbort = (): void => void this.close();

  constructor(
    private readonly pull: EventsPull,
    opts: QueueEventsOptions = {},
  ) {
    const from = eventsFrom(opts);
    this.from = from;
    this.signal = opts.signal;
    if (this.signal?.aborted) this.closed = true;
    else this.signal?.addEventListener("abort", this.onAbort, { once: true });
    // "now" is taken now: a read that waits nothing resolves it (and keeps what it found).
    this.position = from === "now" && !this.closed ? this.read(from, 0) : Promise.resolve(from);
    this.position.catch(() => {});
  }

  private readonly signal: AbortSignal | undefined;

  private async read(from: string, maxWaitMs: number): Promise<string> {
    const page = await this.pull(from, MAX_EVENTS_PER_PAGE, maxWaitMs, this.ac.signal);
    this.buffer = page.events;
    this.from = page.position;
    this.retryMs = RETRY_MIN_MS;
    return page.position;
  }

  [Symbol.asyncIterator](): AsyncIterator<QueueEvent> {
    return { next: () => this.next(), return: async () => (await this.close(), { done: true, value: undefined }) };
  }

  private async next(): Promise<IteratorResult<QueueEvent>> {
    for (;;) {
      if (this.closed) return { done: true, value: undefined };
      const from = await this.position.catch((e: unknown) => this.failed(e));
      if (from === null) return { done: true, value: undefined };
      if (from === RETRY) {
        this.position = this.read(this.from, MAX_EVENTS_WAIT_MS);
        continue;
      }
      const e = this.buffer.shift();
      if (e !== undefined) return { done: false, value: e };
      this.position = this.read(from, MAX_EVENTS_WAIT_MS);
    }
  }

  /**
   * A read failed: the end when closing (null); after a pause, RETRY for a StorageError (the
   * queue is reopening after a storage fault: the same position is read again); else the error.
   */
  private async failed(e: unknown): Promise<string | null> {
    if (this.closed || this.ac.signal.aborted || e instanceof AbortedError) return null;
    if (!(e instanceof StorageError)) throw e;
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, this.retryMs);
      const signal = this.ac.signal;
      signal.addEventListener("abort", done, { once: true });
      function done(): void {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        resolve();
      }
    });
    this.retryMs = Math.min(RETRY_MAX_MS, this.retryMs * 2);
    return this.closed ? null : RETRY;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.buffer = [];
    this.signal?.removeEventListener("abort", this.onAbort);
    this.ac.abort();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
