// SPDX-License-Identifier: Apache-2.0
/**
 * Schedule definitions: user options validated into the stored form (ValidationError before
 * anything is stored), the stored form back into `ScheduleInfo`, and a tick into the `NewJob`
 * it enqueues (with the tick's dedupe id, SCHED-2).
 */
import { ValidationError } from "../../errors.js";
import { decodeValue, prepareValue, recordSize, type ValueKind } from "../../log/record-batch.js";
import { SCHEDULE_DEDUPE_PREFIX, SCHEDULE_HEADERS, type NewJob } from "../../store/queue-store.js";
import type { StoredSchedule } from "../../store/schedule-store.js";
import { readableHeaders } from "../results.js";
import { prepareRaw } from "../prepare.js";
import { MAX_DELAY_MS } from "../config.js";
import type { ScheduleInfo, ScheduleOptions } from "../types.js";
import { nextCronTick, parseCron, validateTimeZone, type CronSpec } from "./cron.js";

/** Shortest `everyMs`. */
export const MIN_EVERY_MS = 10;
/** Longest `everyMs`: one year. */
export const MAX_EVERY_MS = 365 * 86_400_000;
/** Longest schedule name, in bytes. */
export const MAX_SCHEDULE_NAME_BYTES = 128;
/** Schedules per broker (all queues): the timer and the stored document stay small. */
export const MAX_SCHEDULES = 10_000;

const OWN_HEADERS: readonly string[] = Object.values(SCHEDULE_HEADERS);

export function validateScheduleName(name: unknown): string {
  if (typeof name !== "string" || name.length === 0 || Buffer.byteLength(name) > MAX_SCHEDULE_NAME_BYTES) {
    throw new ValidationError(`schedule name must be a non-empty string of at most ${MAX_SCHEDULE_NAME_BYTES} bytes`);
  }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(name)) throw new ValidationError("schedule name must not contain control characters");
  return name;
}

/** The dedupe id of one tick: deterministic, so a tick enqueued again after a crash is a duplicate. */
export function tickDedupeId(name: string, tick: number): string {
  return `${SCHEDULE_DEDUPE_PREFIX}${name}:${tick}`;
}

/**
 * Validates `opts` into a stored schedule (without tick state). `maxMessageBytes` and the
 * reserved-header rules are checked by building one job now, so a schedule whose jobs the
 * queue would refuse is refused at upsert.
 */
export function buildSchedule(queue: string, name: string, opts: ScheduleOptions, now: number, maxMessageBytes: number): StoredSchedule {
  validateScheduleName(name);
  if (opts === null || typeof opts !== "object") throw new ValidationError("upsertSchedule needs options { cron | everyMs, ... }");
  const hasCron = opts.cron !== undefined && opts.cron !== null;
  const hasEvery = opts.everyMs !== undefined && opts.everyMs !== null;
  if (hasCron === hasEvery) throw new ValidationError("a schedule needs exactly one of cron or everyMs");
  const tz = opts.tz === undefined || opts.tz === null ? "UTC" : validateTimeZone(opts.tz);
  if (hasEvery) {
    if (opts.tz !== undefined && opts.tz !== null) throw new ValidationError("tz applies to cron schedules only");
    const e = opts.everyMs;
    if (typeof e !== "number" || !Number.isSafeInteger(e) || e < MIN_EVERY_MS || e > MAX_EVERY_MS) {
      throw new ValidationError(`everyMs must be an integer in [${MIN_EVERY_MS}, ${MAX_EVERY_MS}] ms`);
    }
  } else {
    const spec = parseCron(opts.cron as string);
    if (nextCronTick(spec, tz, now) === null) throw new ValidationError(`cron expression ${JSON.stringify(opts.cron)} never matches`);
  }
  const catchUp = opts.catchUp ?? "skip";
  if (catchUp !== "skip" && catchUp !== "once") throw new ValidationError('catchUp must be "skip" or "once"');
  const delayMs = opts.delayMs ?? 0;
  if (typeof delayMs !== "number" || !Number.isFinite(delayMs) || delayMs < 0 || delayMs > MAX_DELAY_MS) throw new ValidationError("delayMs must be a number in [0, 1 year]");
  for (const h of OWN_HEADERS) if (opts.headers && Object.hasOwn(opts.headers, h)) throw new ValidationError(`header ${JSON.stringify(h)} is set by the schedule itself`);
  const { value, valueKind } = prepareValue(opts.data === undefined ? null : opts.data);
  // The enqueue path's own checks (key, headers, size), on the job the schedule will enqueue.
  const job = prepareRaw(value, valueKind, { key: opts.key, headers: opts.headers, delayMs }, maxMessageBytes, 0, now);
  const s: StoredSchedule = {
    queue,
    name,
    cron: hasCron ? (opts.cron as string).trim() : null,
    everyMs: hasEvery ? (opts.everyMs as number) : null,
    tz,
    catchUp,
    value: value === null ? null : value.toString("base64"),
    valueKind,
    key: job.key,
    headers: (job.record.headers ?? []).map(([k, v]) => [k, v.toString("base64")]),
    delayMs,
    paused: false,
    since: now,
    anchor: now,
    createdAt: now,
    updatedAt: now,
    lastTick: null,
    pending: [],
  };
  return s;
}

const cronCache = new Map<string, CronSpec>();

function cronOf(expr: string): CronSpec {
  let c = cronCache.get(expr);
  if (c === undefined) {
    c = parseCron(expr);
    if (cronCache.size > 10_000) cronCache.clear();
    cronCache.set(expr, c);
  }
  return c;
}

/** The schedule's first tick strictly after `after`, or null (a cron that never matches again). */
export function nextTick(s: StoredSchedule, after: number): number | null {
  if (s.everyMs !== null) {
    const k = Math.floor((after - s.anchor) / s.everyMs) + 1;
    return s.anchor + Math.max(k, 1) * s.everyMs;
  }
  return nextCronTick(cronOf(s.cron as string), s.tz, after);
}

/** The job of one tick (`covered`: how many ticks it stands for, above 1 for a catch-up). */
export function tickJob(s: StoredSchedule, tick: number, covered: number, maxMessageBytes: number, now: number): NewJob {
  const value = s.value === null ? null : Buffer.from(s.value, "base64");
  const headers: Record<string, Uint8Array> = {};
  for (const [k, v] of s.headers) headers[k] = Buffer.from(v, "base64");
  const job = prepareRaw(value, s.valueKind as ValueKind, { key: s.key, headers, delayMs: s.delayMs }, maxMessageBytes, 0, now);
  const own: [string, Buffer][] = [
    [SCHEDULE_HEADERS.schedule, Buffer.from(s.name, "utf8")],
    [SCHEDULE_HEADERS.tick, Buffer.from(String(tick), "utf8")],
    [SCHEDULE_HEADERS.ticks, Buffer.from(String(covered), "utf8")],
  ];
  job.record.headers = [...(job.record.headers ?? []), ...own];
  job.size = recordSize(job.record);
  job.dedupeId = tickDedupeId(s.name, tick);
  return job;
}

export function toScheduleInfo<T>(s: StoredSchedule, next: number | null): ScheduleInfo<T> {
  const value = s.value === null ? null : Buffer.from(s.value, "base64");
  return {
    name: s.name,
    cron: s.cron,
    everyMs: s.everyMs,
    tz: s.tz,
    catchUp: s.catchUp,
    paused: s.paused,
    data: decodeValue(value, s.valueKind as ValueKind) as T,
    key: s.key,
    headers: readableHeaders(s.headers.map(([k, v]) => [k, Buffer.from(v, "base64")] as [string, Uint8Array])),
    delayMs: s.delayMs,
    nextRunAt: s.paused ? null : next,
    lastRunAt: s.lastTick,
    createdAt: s.createdAt,
    updatedAt: s.updatedAt,
  };
}

