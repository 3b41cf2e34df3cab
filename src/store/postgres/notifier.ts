// SPDX-License-Identifier: Apache-2.0
/**
 * `waitFor` of the PostgreSQL engine: long polls woken by appends, from this node or another.
 *
 * Why LISTEN/NOTIFY plus polling: every append transaction sends `pg_notify('sluice_append',
 * '<topic_id>:<partition>:<next_offset>')`, delivered at commit to every node listening on
 * one dedicated connection, so a consumer on another node wakes as soon as the records are
 * readable. Notifications are not durable (a dropped listener connection loses them), so
 * while anyone waits the partitions waited on are also polled (POLL_INTERVAL_MS): a lost
 * notification only delays a wake-up. Appends on this node wake local waiters directly.
 */
import type pg from "pg";
import { ListenConnection } from "./listen-connection.js";

export const APPEND_CHANNEL = "sluice_append";
/** Period of the polling fallback while someone waits. */
export const POLL_INTERVAL_MS = 500;

interface Waiter {
  offset: number;
  done(result: boolean): void;
}

/** Reads the log end of the partitions given as "topicId:partition" keys. */
export type EndReader = (keys: string[]) => Promise<Map<string, number>>;

export class AppendNotifier {
  private waiters = new Map<string, Set<Waiter>>();
  private readonly listener: ListenConnection;
  private pollTimer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(
    clientConfig: pg.ClientConfig,
    private readonly readEnds: EndReader,
  ) {
    this.listener = new ListenConnection(clientConfig, APPEND_CHANNEL, (payload) => this.onPayload(payload));
  }

  /** Opens the listener connection (failures fall back to polling and are retried). */
  start(): Promise<void> {
    return this.listener.start();
  }

  private onPayload(payload: string): void {
    const i = payload.lastIndexOf(":");
    if (i < 0) return;
    this.notify(payload.slice(0, i), Number(payload.slice(i + 1)));
  }

  /** The log end of partition `key` ("topicId:partition") is now `end`. */
  notify(key: string, end: number): void {
    const set = this.waiters.get(key);
    if (!set) return;
    for (const w of set) if (w.offset < end) w.done(true);
  }

  /**
   * Resolves true once the log end of `key` passes `offset`, false after `maxWaitMs` or on
   * close or abort (as the StorageEngine contract says). `currentEnd` is read after registering, so an
   * append committed in between is never missed.
   */
  async wait(key: string, offset: number, maxWaitMs: number, currentEnd: () => Promise<number>, signal?: AbortSignal): Promise<boolean> {
    if (this.closed) return false;
    if (signal?.aborted) return false;
    let waiter!: Waiter;
    let timer: NodeJS.Timeout | null = null;
    let onAbort: (() => void) | null = null;
    const result = new Promise<boolean>((resolve) => {
      waiter = {
        offset,
        done: (r) => {
          if (timer !== null) clearTimeout(timer);
          if (onAbort !== null) signal?.removeEventListener("abort", onAbort);
          this.remove(key, waiter);
          resolve(r);
        },
      };
    });
    let set = this.waiters.get(key);
    if (!set) this.waiters.set(key, (set = new Set()));
    set.add(waiter);
    timer = setTimeout(() => waiter.done(false), Math.max(0, maxWaitMs));
    if (signal) {
      onAbort = () => waiter.done(false);
      signal.addEventListener("abort", onAbort, { once: true });
    }
    this.schedulePoll();
    try {
      if ((await currentEnd()) > offset) waiter.done(true);
    } catch (e) {
      waiter.done(false);
      throw e;
    }
    return result;
  }

  private remove(key: string, w: Waiter): void {
    const set = this.waiters.get(key);
    if (!set) return;
    set.delete(w);
    if (set.size === 0) this.waiters.delete(key);
  }

  private schedulePoll(): void {
    if (this.pollTimer !== null || this.closed || this.waiters.size === 0) return;
    this.pollTimer = setTimeout(() => void this.poll(), POLL_INTERVAL_MS);
    this.pollTimer.unref();
  }

  private async poll(): Promise<void> {
    try {
      const keys = [...this.waiters.keys()];
      if (keys.length > 0) for (const [k, end] of await this.readEnds(keys)) this.notify(k, end);
    } catch {
      // The database is unreachable: waiters time out as usual; the next poll tries again.
    } finally {
      this.pollTimer = null;
      this.schedulePoll();
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const set of [...this.waiters.values()]) for (const w of [...set]) w.done(false);
    if (this.pollTimer !== null) clearTimeout(this.pollTimer);
    await this.listener.close();
  }
}
