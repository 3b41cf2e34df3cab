// SPDX-License-Identifier: Apache-2.0
// Unit tests of the cron evaluator (src/queues/schedules/cron.ts): syntax, the Vixie
// day-of-month / day-of-week rule, time zones and DST transitions.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ValidationError } from "../src/errors.js";
import { nextCronTick, parseCron, validateTimeZone } from "../src/queues/schedules/cron.js";

const iso = (t: number | null): string | null => (t === null ? null : new Date(t).toISOString());
/** The next `n` ticks after `from` (ISO strings). */
function ticks(expr: string, tz: string, from: string, n: number): string[] {
  const c = parseCron(expr);
  const out: string[] = [];
  let t = Date.parse(from);
  for (let i = 0; i < n; i++) {
    const next = nextCronTick(c, tz, t);
    assert.notEqual(next, null);
    out.push(iso(next) as string);
    t = next as number;
  }
  return out;
}

test("cron: fields, lists, ranges, steps, names", () => {
  assert.deepEqual(ticks("*/15 * * * *", "UTC", "2026-01-01T00:07:00Z", 3), ["2026-01-01T00:15:00.000Z", "2026-01-01T00:30:00.000Z", "2026-01-01T00:45:00.000Z"]);
  assert.deepEqual(ticks("0 9-17/4 * * MON-FRI", "UTC", "2026-01-02T12:00:00Z", 3), ["2026-01-02T13:00:00.000Z", "2026-01-02T17:00:00.000Z", "2026-01-05T09:00:00.000Z"]);
  assert.deepEqual(ticks("30 6 1 jan,Jul *", "UTC", "2026-03-01T00:00:00Z", 2), ["2026-07-01T06:30:00.000Z", "2027-01-01T06:30:00.000Z"]);
  // six fields: leading seconds
  assert.deepEqual(ticks("*/20 * * * * *", "UTC", "2026-01-01T00:00:05Z", 3), ["2026-01-01T00:00:20.000Z", "2026-01-01T00:00:40.000Z", "2026-01-01T00:01:00.000Z"]);
  // 7 is Sunday too; "5/20" runs from 5 to the end of the field
  assert.deepEqual(ticks("0 0 * * 7", "UTC", "2026-01-01T00:00:00Z", 1), ["2026-01-04T00:00:00.000Z"]);
  assert.deepEqual(ticks("5/20 0 * * *", "UTC", "2026-01-01T00:00:00Z", 3), ["2026-01-01T00:05:00.000Z", "2026-01-01T00:25:00.000Z", "2026-01-01T00:45:00.000Z"]);
  // strictly after: a tick exactly at `after` is not returned
  assert.equal(iso(nextCronTick(parseCron("0 * * * *"), "UTC", Date.parse("2026-01-01T05:00:00Z"))), "2026-01-01T06:00:00.000Z");
  // leap day
  assert.deepEqual(ticks("0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", 1), ["2028-02-29T00:00:00.000Z"]);
});

test("cron: day-of-month and day-of-week follow the Vixie OR rule", () => {
  // both restricted: the 13th OR a Friday
  assert.deepEqual(ticks("0 0 13 * FRI", "UTC", "2026-02-01T00:00:00Z", 4), ["2026-02-06T00:00:00.000Z", "2026-02-13T00:00:00.000Z", "2026-02-20T00:00:00.000Z", "2026-02-27T00:00:00.000Z"]);
  assert.deepEqual(ticks("0 0 1,15 * 1", "UTC", "2026-06-01T00:00:01Z", 3), ["2026-06-08T00:00:00.000Z", "2026-06-15T00:00:00.000Z", "2026-06-22T00:00:00.000Z"]);
  // one of them a star (also "*/2"): both must match
  assert.deepEqual(ticks("0 0 * * FRI", "UTC", "2026-02-01T00:00:00Z", 2), ["2026-02-06T00:00:00.000Z", "2026-02-13T00:00:00.000Z"]);
  const c = parseCron("0 0 */10 * MON");
  for (let t = Date.parse("2026-01-01T00:00:00Z"), i = 0; i < 5; i++) {
    t = nextCronTick(c, "UTC", t) as number;
    const d = new Date(t);
    assert.equal(d.getUTCDay(), 1);
    assert.equal((d.getUTCDate() - 1) % 10, 0);
  }
});

test("cron: invalid expressions and zones are ValidationErrors with a clear message", () => {
  for (const [expr, re] of [
    ["* * * *", /expected 5 fields/],
    ["60 * * * *", /minute: 60 is outside 0-59/],
    ["* 24 * * *", /hour: 24/],
    ["* * 0 * *", /day-of-month: 0/],
    ["* * * 13 *", /month: 13/],
    ["* * * * 8", /day-of-week: 8/],
    ["*/0 * * * *", /step/],
    ["5-1 * * * *", /backwards/],
    ["x * * * *", /not a number/],
    ["0 0 30 2 *", /no day/],
  ] as const) {
    assert.throws(() => parseCron(expr), (e: unknown) => e instanceof ValidationError && re.test(e.message) && e.message.includes(expr), expr);
  }
  assert.throws(() => validateTimeZone("Mars/Olympus"), (e: unknown) => e instanceof ValidationError && /unknown time zone "Mars\/Olympus"/.test(e.message));
  assert.equal(validateTimeZone("Europe/Berlin"), "Europe/Berlin");
});

test("cron: Europe/Berlin DST: a skipped local time does not fire, a repeated one fires once", () => {
  // 2026-03-29: 02:00 CET -> 03:00 CEST (02:30 does not exist)
  assert.deepEqual(ticks("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 3), [
    "2026-03-28T01:30:00.000Z", // 02:30 CET
    "2026-03-30T00:30:00.000Z", // 02:30 CEST; 03-29 has no 02:30
    "2026-03-31T00:30:00.000Z",
  ]);
  // hourly across the gap: 01:00 CET, then 03:00 CEST (one hour later in real time)
  assert.deepEqual(ticks("0 * * * *", "Europe/Berlin", "2026-03-28T23:30:00Z", 3), ["2026-03-29T00:00:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-29T02:00:00.000Z"]);
  // 2026-10-25: 03:00 CEST -> 02:00 CET (02:30 happens twice): fires once, at the first
  assert.deepEqual(ticks("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2), ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]);
  // every 30 minutes through the repeated hour: its local times are not fired a second time
  assert.deepEqual(ticks("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 5), [
    "2026-10-25T00:00:00.000Z", // 02:00 CEST
    "2026-10-25T00:30:00.000Z", // 02:30 CEST
    // 02:00 and 02:30 CET (01:00Z, 01:30Z) are repeats
    "2026-10-25T02:00:00.000Z", // 03:00 CET
    "2026-10-25T02:30:00.000Z",
    "2026-10-25T03:00:00.000Z",
  ]);
  // starting inside the repeated hour (a restart there): the repeat is still not fired
  assert.equal(iso(nextCronTick(parseCron("30 2 * * *"), "Europe/Berlin", Date.parse("2026-10-25T01:10:00Z"))), "2026-10-26T01:30:00.000Z");
});

test("cron: America/New_York DST and midnight-based schedules", () => {
  // 2026-03-08: 02:00 EST -> 03:00 EDT
  assert.deepEqual(ticks("15 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 2), ["2026-03-07T07:15:00.000Z", "2026-03-09T06:15:00.000Z"]);
  // 2026-11-01: 02:00 EDT -> 01:00 EST (01:xx twice)
  assert.deepEqual(ticks("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2), ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"]);
  // 9:00 local keeps its local time across the change
  assert.deepEqual(ticks("0 9 * * *", "America/New_York", "2026-03-07T00:00:00Z", 2), ["2026-03-07T14:00:00.000Z", "2026-03-08T13:00:00.000Z"]);
  // seconds field across the gap
  assert.deepEqual(ticks("59 59 1 * * *", "America/New_York", "2026-03-08T00:00:00Z", 1), ["2026-03-08T06:59:59.000Z"]);
});

test("cron: zones without DST and with half-hour offsets", () => {
  assert.deepEqual(ticks("0 0 * * *", "Asia/Kolkata", "2026-01-01T00:00:00Z", 1), ["2026-01-01T18:30:00.000Z"]);
  assert.deepEqual(ticks("0 12 * * *", "UTC", "2026-01-01T00:00:00Z", 1), ["2026-01-01T12:00:00.000Z"]);
});
