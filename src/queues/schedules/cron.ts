// SPDX-License-Identifier: Apache-2.0
/**
 * Cron expressions evaluated in an IANA time zone, with no dependency: the zone's offsets come
 * from `Intl.DateTimeFormat`.
 *
 * Syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds
 * field. Each field is a comma list of `*`, `N`, `A-B`, with an optional `/STEP` (`*\/15`,
 * `10-40/5`, `7/10` = from 7 to the field's end); months `JAN`..`DEC`, weekdays `SUN`..`SAT`
 * (0 and 7 are Sunday), case-insensitive. Day matching follows Vixie cron: when both
 * day-of-month and day-of-week are restricted (neither starts with `*`), a day matches if
 * EITHER matches; otherwise both must.
 *
 * Time zones and DST: a cron names local wall-clock times. A tick is the *first* instant at
 * which the zone's clock shows a matching local time: a local time skipped by a spring-forward
 * never fires, and a local time repeated by a fall-back fires once (at its first occurrence).
 */
import { ValidationError } from "../../errors.js";

interface Field {
  min: number;
  max: number;
  names?: readonly string[];
}

const SECOND: Field = { min: 0, max: 59 };
const MINUTE: Field = { min: 0, max: 59 };
const HOUR: Field = { min: 0, max: 23 };
const DOM: Field = { min: 1, max: 31 };
const MONTH: Field = { min: 1, max: 12, names: ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"] };
const DOW: Field = { min: 0, max: 7, names: ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"] };

/** How far ahead a search looks before a cron is taken to never match (Feb 29 recurs within 8 years). */
const SEARCH_YEARS = 9;
const DAY_MS = 86_400_000;

/** A parsed cron expression: which seconds, minutes, ... match. */
export interface CronSpec {
  readonly source: string;
  readonly seconds: readonly boolean[];
  readonly minutes: readonly boolean[];
  readonly hours: readonly boolean[];
  readonly dom: readonly boolean[];
  readonly months: readonly boolean[];
  /** Index 0..6, Sunday = 0 (7 folded onto 0). */
  readonly dow: readonly boolean[];
  readonly domStar: boolean;
  readonly dowStar: boolean;
}

function bad(expr: string, why: string): ValidationError {
  return new ValidationError(`invalid cron expression ${JSON.stringify(expr)}: ${why}`);
}

function value(expr: string, f: Field, s: string, what: string): number {
  const upper = s.toUpperCase();
  const named = f.names?.indexOf(upper) ?? -1;
  if (named >= 0) return named + (f === MONTH ? 1 : 0);
  if (!/^\d{1,2}$/.test(s)) throw bad(expr, `${what}: ${JSON.stringify(s)} is not a number${f.names ? " or name" : ""}`);
  const n = Number(s);
  if (n < f.min || n > f.max) throw bad(expr, `${what}: ${n} is outside ${f.min}-${f.max}`);
  return n;
}

function parseField(expr: string, text: string, f: Field, what: string): boolean[] {
  const out = new Array<boolean>(f.max + 1).fill(false);
  if (text === "") throw bad(expr, `${what} is empty`);
  for (const item of text.split(",")) {
    const [range, stepText, extra] = item.split("/");
    if (extra !== undefined) throw bad(expr, `${what}: ${JSON.stringify(item)} has two steps`);
    let step = 1;
    if (stepText !== undefined) {
      if (!/^\d{1,3}$/.test(stepText) || Number(stepText) < 1) throw bad(expr, `${what}: step ${JSON.stringify(stepText)} must be a positive number`);
      step = Number(stepText);
    }
    let lo: number;
    let hi: number;
    if (range === "*" || range === "?") {
      lo = f.min;
      hi = f.max === 7 ? 6 : f.max;
    } else if (range.includes("-")) {
      const [a, b, more] = range.split("-");
      if (more !== undefined) throw bad(expr, `${what}: ${JSON.stringify(range)} is not a range`);
      lo = value(expr, f, a, what);
      hi = value(expr, f, b, what);
      if (hi < lo) throw bad(expr, `${what}: range ${range} runs backwards`);
    } else {
      lo = value(expr, f, range, what);
      hi = stepText !== undefined ? (f.max === 7 ? 6 : f.max) : lo;
    }
    for (let v = lo; v <= hi; v += step) out[v] = true;
  }
  return out;
}

/** Parses a 5- or 6-field cron expression; ValidationError naming the problem. */
export function parseCron(expr: string): CronSpec {
  if (typeof expr !== "string") throw new ValidationError("cron must be a string");
  const parts = expr.trim().split(/\s+/);
  if (parts.length !== 5 && parts.length !== 6) throw bad(expr, `expected 5 fields (minute hour day-of-month month day-of-week) or 6 with leading seconds, got ${parts.length}`);
  const p = parts.length === 6 ? parts : ["0", ...parts];
  const dow = parseField(expr, p[5], DOW, "day-of-week");
  if (dow[7]) dow[0] = true;
  dow.length = 7;
  const dom = parseField(expr, p[3], DOM, "day-of-month");
  const months = parseField(expr, p[4], MONTH, "month");
  // A day-of-month no month has (Feb 30, Apr 31 only) would never fire: say so now.
  const maxDay = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
  const domStar = p[3].startsWith("*") || p[3] === "?";
  const dowStar = p[5].startsWith("*") || p[5] === "?";
  if (dowStar || domStar) {
    const possible = months.some((on, m) => on && dom.some((d, day) => d && day <= maxDay[m]));
    if (!possible) throw bad(expr, "no day of the given months matches day-of-month");
  }
  return {
    source: expr,
    seconds: parseField(expr, p[0], SECOND, "second"),
    minutes: parseField(expr, p[1], MINUTE, "minute"),
    hours: parseField(expr, p[2], HOUR, "hour"),
    dom,
    months,
    dow,
    domStar,
    dowStar,
  };
}

// ---- time zones ----

const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(tz: string): Intl.DateTimeFormat {
  let f = formatters.get(tz);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: tz,
      hourCycle: "h23",
      year: "numeric",
      month: "numeric",
      day: "numeric",
      hour: "numeric",
      minute: "numeric",
      second: "numeric",
    });
    if (formatters.size > 1000) formatters.clear();
    formatters.set(tz, f);
  }
  return f;
}

/** Checks an IANA zone name (ValidationError) and returns its canonical spelling. */
export function validateTimeZone(tz: string): string {
  if (typeof tz !== "string" || tz.length === 0 || tz.length > 64) throw new ValidationError("tz must be an IANA time zone name such as \"Europe/Berlin\"");
  try {
    return formatter(tz).resolvedOptions().timeZone;
  } catch {
    throw new ValidationError(`unknown time zone ${JSON.stringify(tz)} (tz must be an IANA name such as "Europe/Berlin" or "UTC")`);
  }
}

/** The zone's offset from UTC at instant `t`, in ms (local wall time = t + offset). */
export function zoneOffset(tz: string, t: number): number {
  if (tz === "UTC") return 0;
  const parts = formatter(tz).formatToParts(new Date(t));
  let y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  for (const p of parts) {
    switch (p.type) {
      case "year": y = Number(p.value); break;
      case "month": mo = Number(p.value); break;
      case "day": d = Number(p.value); break;
      case "hour": h = Number(p.value); break;
      case "minute": mi = Number(p.value); break;
      case "second": s = Number(p.value); break;
    }
  }
  const wall = Date.UTC(y, mo - 1, d, h, mi, s);
  return wall - (t - (((t % 1000) + 1000) % 1000));
}

/**
 * The first instant at which the zone's clock shows `wall` (a local time written as if UTC), or
 * null when no instant does (skipped by a spring-forward).
 */
export function firstInstant(tz: string, wall: number): number | null {
  if (tz === "UTC") return wall;
  let best: number | null = null;
  // Offsets change at most once within a day around any instant (true of every zone in use).
  for (const probe of [wall - DAY_MS, wall, wall + DAY_MS]) {
    const off = zoneOffset(tz, probe - zoneOffset(tz, probe));
    const u = wall - off;
    if (zoneOffset(tz, u) === off && (best === null || u < best)) best = u;
  }
  return best;
}

// ---- matching ----

function dayMatches(c: CronSpec, d: Date): boolean {
  const dom = c.dom[d.getUTCDate()];
  const dow = c.dow[d.getUTCDay()];
  return c.domStar || c.dowStar ? dom && dow : dom || dow;
}

/** The first local wall time >= `wall` (whole seconds) matching `c`, or null within SEARCH_YEARS. */
function nextLocal(c: CronSpec, wall: number): number | null {
  const d = new Date(Math.ceil(wall / 1000) * 1000);
  const endYear = d.getUTCFullYear() + SEARCH_YEARS;
  while (d.getUTCFullYear() <= endYear) {
    if (!c.months[d.getUTCMonth() + 1]) {
      d.setUTCMonth(d.getUTCMonth() + 1, 1);
      d.setUTCHours(0, 0, 0, 0);
    } else if (!dayMatches(c, d)) {
      d.setUTCDate(d.getUTCDate() + 1);
      d.setUTCHours(0, 0, 0, 0);
    } else if (!c.hours[d.getUTCHours()]) {
      d.setUTCHours(d.getUTCHours() + 1, 0, 0, 0);
    } else if (!c.minutes[d.getUTCMinutes()]) {
      d.setUTCMinutes(d.getUTCMinutes() + 1, 0, 0);
    } else if (!c.seconds[d.getUTCSeconds()]) {
      d.setUTCSeconds(d.getUTCSeconds() + 1, 0);
    } else {
      return d.getTime();
    }
  }
  return null;
}

/**
 * The first tick of `c` in zone `tz` strictly after instant `after` (ms), or null if the cron
 * never matches again within SEARCH_YEARS. A tick is the first instant showing a matching local
 * time (see the file comment for DST).
 */
export function nextCronTick(c: CronSpec, tz: string, after: number): number | null {
  // Every tick after `after` shows a local time >= the local time at `after` (a repeated local
  // time's first instant lies before the repeat), so the search runs forward in local time.
  let wall = after + zoneOffset(tz, after) + 1;
  for (let guard = 0; guard < 10_000; guard++) {
    const local = nextLocal(c, wall);
    if (local === null) return null;
    const u = firstInstant(tz, local);
    if (u !== null && u > after) return u;
    wall = local + 1000;
  }
  return null;
}
