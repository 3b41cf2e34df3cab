// SPDX-License-Identifier: Apache-2.0
/**
 * The broker's scheduler: every queue's schedules, one timer for the earliest next tick.
 *
 * Exactly once per tick (SCHED-2): a round first writes the ticks it is about to enqueue into
 * the schedule document as `pending` (durable, SCHED-1), then enqueues each tick's job with the
 * dedupe id `sys:sch:<name>:<tick>` (the queue remembers a schedule's latest tick id for 7 days
 * even with `dedupeWindowMs` 0, and an older tick of the schedule counts as stored), and only
 * then moves `lastTick` (written with the next document). After a crash the pending ticks are
 * enqueued again: the ones already stored are answered as duplicates, so each tick is stored
 * once. Only the process holding the data directory runs a scheduler (FS-3: one process per
 * data dir; network clients run none), so there is never a second scheduler on the same state.
 *
 * Missed ticks: a tick that came due while the broker was down (more than GRACE_MS before this
 * scheduler started) or that is more than MAX_LATE_MS overdue (a blocked process, enqueues
 * failing that long) is missed; `catchUp: "skip"` drops missed ticks, `"once"` enqueues one job
 * (the latest missed tick, `sluice-schedule-ticks` = how many it stands for). Any other due
 * tick gets its own job, however late the round (a slow disk, a busy event loop).
 */
import { BrokerClosedError, NotFoundError, StorageError, ValidationError } from "../../errors.js";
import { silentLogger, systemClock, type Clock, type Logger } from "../../observability/telemetry.js";
import type { NewJob } from "../../store/queue-store.js";
import type { ScheduleStore, StoredSchedule } from "../../store/schedule-store.js";
import type { ScheduleInfo, ScheduleOptions } from "../types.js";
import { buildSchedule, MAX_SCHEDULES, nextTick, tickJob as tickJobOf, toScheduleInfo, validateScheduleName } from "./spec.js";

/** A tick due this long (or more) before the scheduler started counts as missed (downtime). */
export const GRACE_MS = 1000;
/** A tick this much overdue (or more) counts as missed while running. */
export const MAX_LATE_MS = 60_000;
/** Retry delay of a failed tick enqueue or document write. */
export const RETRY_MS = 1000;
/** The timer never waits longer than this (setTimeout's range; clock changes are noticed). */
const MAX_TIMER_MS = 3_600_000;
/** How long the queues remember a schedule's latest tick id (the system dedupe window, 7 days). */
export const TICK_MEMORY_MS = 7 * 86_400_000;
/** Ticks enumerated per schedule and round at most (a long downtime of a per-second cron). */
const MAX_ENUMERATED = 100_000;

interface Entry {
  s: StoredSchedule;
  /** The first tick not yet planned; null when the cron never matches again. */
  next: number | null;
  /** When pending ticks may be tried again after a failure. */
  retryAt: number;
  failing: boolean;
}

export interface SchedulerHost {
  /** Enqueues the jobs `make` builds (given the queue's maxMessageBytes), in order; resolves once durable. */
  enqueueTicks(queue: string, make: (maxMessageBytes: number, now: number) => NewJob[]): Promise<void>;
}

const keyOf = (queue: string, name: string): string => `${queue}\u0000${name}`;

export class Scheduler {
  private readonly entries = new Map<string, Entry>();
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | null = null;
  private timerAt = Infinity;
  /** lastTick moved since the document was written (written at the next save or on close). */
  private dirty = false;
  private closed = false;
  private loadError: Error | null = null;
  /** False: definitions are kept and changed, but no tick fires (a short-lived admin process). */
  private run = true;
  /** When `start` ran: ticks due more than GRACE_MS before it came due while the broker was down. */
  private startedAt = 0;

  constructor(
    private readonly store: ScheduleStore,
    private readonly host: SchedulerHost,
    private readonly clock: Clock = systemClock,
    private readonly logger: Logger = silentLogger,
  ) {}

  /** Serialises document changes and rounds: no two saves overlap, a round sees a stable set. */
  private exclusive<T>(fn: () => Promise<T> | T): Promise<T> {
    const run = this.chain.then(() => {
      if (this.closed) throw new BrokerClosedError();
      if (this.loadError !== null) throw new StorageError(`schedules are unavailable: ${this.loadError.message}`, this.loadError);
      return fn();
    });
    this.chain = run.catch(() => {});
    return run;
  }

  /** Loads the stored schedules and arms the timer; pending ticks and catch-up run in the first round. */
  async start(run = true): Promise<void> {
    this.run = run;
    this.startedAt = this.clock.now();
    let all: StoredSchedule[];
    try {
      all = await this.store.load();
    } catch (e) {
      // A damaged document does not keep the broker from opening; schedule calls report it.
      this.loadError = e as Error;
      this.logger.error({ err: e }, "job schedules could not be loaded; schedules are disabled until the file is repaired or removed");
      return;
    }
    const now = this.clock.now();
    for (const s of all) {
      const last = s.pending.at(-1);
      if (last !== undefined && now - last[0] >= TICK_MEMORY_MS - 3_600_000) {
        // The queue may have forgotten these ticks' dedupe ids: at most once wins over exactly once.
        this.logger.warn({ queue: s.queue, schedule: s.name, ticks: s.pending.length }, "schedule ticks pending for about 7 days dropped (cannot tell whether they were enqueued)");
        s.pending = [];
      }
      this.entries.set(keyOf(s.queue, s.name), { s, next: nextTick(s, baseline(s)), retryAt: 0, failing: false });
    }
    this.arm();
  }

  async upsert(queue: string, name: string, opts: ScheduleOptions, maxMessageBytes: number): Promise<ScheduleInfo<unknown>> {
    return this.exclusive(async () => {
      const now = this.clock.now();
      const built = buildSchedule(queue, name, opts, now, maxMessageBytes);
      const k = keyOf(queue, name);
      const prev = this.entries.get(k);
      if (prev === undefined && this.entries.size >= MAX_SCHEDULES) throw new ValidationError(`at most ${MAX_SCHEDULES} schedules per broker`);
      if (prev !== undefined && sameDefinition(prev.s, built)) return this.info(prev);
      if (prev !== undefined) {
        // No tick fires twice: the last tick and any still pending carry over.
        built.createdAt = prev.s.createdAt;
        built.lastTick = prev.s.lastTick;
        built.pending = prev.s.pending;
        built.paused = prev.s.paused;
      }
      const e: Entry = { s: built, next: nextTick(built, baseline(built)), retryAt: prev?.retryAt ?? 0, failing: false };
      await this.saveWith(k, e);
      return this.info(e);
    }).finally(() => this.arm());
  }

  list(queue: string): Promise<ScheduleInfo<unknown>[]> {
    return this.exclusive(() =>
      [...this.entries.values()]
        .filter((e) => e.s.queue === queue)
        .sort((a, b) => (a.s.name < b.s.name ? -1 : a.s.name > b.s.name ? 1 : 0))
        .map((e) => this.info(e)),
    );
  }

  pause(queue: string, name: string): Promise<void> {
    return this.change(queue, name, (e) => {
      if (e.s.paused) return false;
      e.s.paused = true;
      return true;
    });
  }

  resume(queue: string, name: string): Promise<void> {
    return this.change(queue, name, (e, now) => {
      if (!e.s.paused) return false;
      e.s.paused = false;
      // Ticks while paused are not caught up: counting starts now.
      e.s.since = now;
      e.next = nextTick(e.s, baseline(e.s));
      return true;
    });
  }

  remove(queue: string, name: string): Promise<boolean> {
    validateScheduleName(name);
    return this.exclusive(async () => {
      const k = keyOf(queue, name);
      if (!this.entries.has(k)) return false;
      await this.saveWith(k, null);
      return true;
    }).finally(() => this.arm());
  }

  /** Removes every schedule of a deleted queue. */
  removeQueue(queue: string): Promise<void> {
    return this.exclusive(async () => {
      const gone = [...this.entries.values()].filter((e) => e.s.queue === queue);
      if (gone.length === 0) return;
      for (const e of gone) this.entries.delete(keyOf(queue, e.s.name));
      await this.save();
    }).finally(() => this.arm());
  }

  /** Stops the timer, lets a running round finish and writes the last ticks (a clean restart has nothing pending). */
  async close(): Promise<void> {
    if (this.closed) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const last = this.chain.then(async () => {
      if (this.dirty && this.loadError === null) await this.save().catch((e) => this.logger.warn({ err: e }, "schedule state not written on close"));
    });
    this.closed = true;
    await last;
  }

  private change(queue: string, name: string, fn: (e: Entry, now: number) => boolean): Promise<void> {
    validateScheduleName(name);
    return this.exclusive(async () => {
      const k = keyOf(queue, name);
      const e = this.entries.get(k);
      if (e === undefined) throw new NotFoundError(`schedule ${JSON.stringify(name)} of queue ${JSON.stringify(queue)} does not exist`);
      const now = this.clock.now();
      const prev = { ...e.s };
      if (!fn(e, now)) return;
      e.s.updatedAt = now;
      try {
        await this.save();
      } catch (err) {
        e.s = prev; // not durable: not applied
        throw err;
      }
    }).finally(() => this.arm());
  }

  /** Writes the document with `k` set to `e` (or removed), applying it in memory only once durable. */
  private async saveWith(k: string, e: Entry | null): Promise<void> {
    const before = this.entries.get(k);
    if (e === null) this.entries.delete(k);
    else this.entries.set(k, e);
    try {
      await this.save();
    } catch (err) {
      if (before === undefined) this.entries.delete(k);
      else this.entries.set(k, before);
      throw err;
    }
  }

  private async save(): Promise<void> {
    await this.store.save([...this.entries.values()].map((e) => e.s));
    this.dirty = false;
  }

  private info(e: Entry): ScheduleInfo<unknown> {
    const pending = e.s.pending[0];
    return toScheduleInfo(e.s, pending !== undefined ? pending[0] : e.next);
  }

  /** One timer for the earliest due tick (or retry) of all schedules. */
  private arm(): void {
    if (this.closed || !this.run) return;
    let at = Infinity;
    for (const e of this.entries.values()) {
      if (e.s.pending.length > 0) at = Math.min(at, e.retryAt);
      else if (!e.s.paused && e.next !== null) at = Math.min(at, e.next);
    }
    if (at === this.timerAt && this.timer !== null) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.timerAt = at;
    if (at === Infinity) return;
    const delay = Math.max(0, Math.min(at - this.clock.now(), MAX_TIMER_MS));
    this.timer = setTimeout(() => {
      this.timer = null;
      this.timerAt = Infinity;
      this.exclusive(() => this.round())
        .catch((e) => {
          if (!(e instanceof BrokerClosedError)) this.logger.error({ err: e }, "schedule round failed");
        })
        .finally(() => this.arm());
    }, delay);
    this.timer.unref();
  }

  /** Plans the due ticks of every schedule, makes them durable as pending, then enqueues them. */
  private async round(): Promise<void> {
    const now = this.clock.now();
    const firing: Entry[] = [];
    let planned = false;
    for (const e of this.entries.values()) {
      if (e.s.pending.length > 0) {
        if (e.retryAt <= now) firing.push(e);
      } else if (!e.s.paused && e.next !== null && e.next <= now && this.plan(e, now)) {
        planned = true;
        firing.push(e);
      }
    }
    if (planned) {
      try {
        await this.save(); // SCHED-1: the ticks are durable as pending before any is enqueued
      } catch (err) {
        this.logger.error({ err }, "schedule state could not be written; ticks will be retried");
        for (const e of firing) e.retryAt = now + RETRY_MS;
        return;
      }
    }
    await Promise.all(firing.map((e) => this.fire(e, now)));
  }

  /** Turns the ticks due at `now` into `pending`: missed ones per `catchUp`, on-time ones one job each. */
  private plan(e: Entry, now: number): boolean {
    const s = e.s;
    // Ticks at or before the cutoff are missed: due during the downtime, or very late.
    const cutoff = Math.max(this.startedAt - GRACE_MS, now - MAX_LATE_MS);
    let missed = 0;
    let lastMissed = 0;
    const onTime: number[] = [];
    let t: number | null = e.next;
    if (s.everyMs !== null && t !== null) {
      const n = Math.floor((now - t) / s.everyMs) + 1;
      missed = cutoff < t ? 0 : Math.min(n, Math.floor((cutoff - t) / s.everyMs) + 1);
      lastMissed = t + (missed - 1) * s.everyMs;
      for (let k = missed; k < n; k++) onTime.push(t + k * s.everyMs);
      t += n * s.everyMs;
    } else {
      for (let i = 0; t !== null && t <= now; i++) {
        if (t > cutoff) onTime.push(t);
        else {
          missed++;
          lastMissed = t;
        }
        // A very long downtime of a fast cron: jump close to the cutoff instead of counting every tick.
        t = i === MAX_ENUMERATED ? nextTick(s, Math.max(t, cutoff - 3_600_000)) : nextTick(s, t);
      }
    }
    e.next = t;
    s.pending = [];
    if (missed > 0 && s.catchUp === "once") s.pending.push([lastMissed, missed]);
    for (const tick of onTime) s.pending.push([tick, 1]);
    if (missed > 0 && s.catchUp === "skip") this.logger.debug({ queue: s.queue, schedule: s.name, missed }, "missed schedule ticks skipped");
    return s.pending.length > 0;
  }

  private async fire(e: Entry, now: number): Promise<void> {
    const s = e.s;
    const ticks = s.pending;
    try {
      await this.host.enqueueTicks(s.queue, (max, at) => ticks.map(([tick, n]) => tickJobOf(s, tick, n, max, at)));
      if (s.pending === ticks) {
        s.lastTick = ticks[ticks.length - 1][0];
        s.pending = [];
        this.dirty = true;
      }
      if (e.failing) this.logger.info({ queue: s.queue, schedule: s.name }, "schedule enqueues again");
      e.failing = false;
    } catch (err) {
      // The ticks stay pending (durable) and are tried again; their dedupe ids keep it exact.
      e.retryAt = now + RETRY_MS;
      if (!e.failing) this.logger.warn({ err, queue: s.queue, schedule: s.name }, "schedule tick could not be enqueued; retrying");
      e.failing = true;
    }
  }
}


/** Ticks at or before this are never due: the last stored or pending tick, or when counting (re)started. */
function baseline(s: StoredSchedule): number {
  let b = s.since;
  if (s.lastTick !== null) b = Math.max(b, s.lastTick);
  const p = s.pending.at(-1);
  if (p !== undefined) b = Math.max(b, p[0]);
  return b;
}

function sameDefinition(a: StoredSchedule, b: StoredSchedule): boolean {
  return (
    a.cron === b.cron &&
    a.everyMs === b.everyMs &&
    a.tz === b.tz &&
    a.catchUp === b.catchUp &&
    a.value === b.value &&
    a.valueKind === b.valueKind &&
    a.key === b.key &&
    a.delayMs === b.delayMs &&
    JSON.stringify(a.headers) === JSON.stringify(b.headers)
  );
}
