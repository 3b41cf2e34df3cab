// SPDX-License-Identifier: Apache-2.0
/** `sluice queues list|stats NAME|schedules NAME|purge NAME`. Reading a queue never creates one. */
import { QueueNotFoundError } from "../errors.js";
import type { QueueStats } from "../queues/types.js";
import { TARGET_OPTIONS, TARGET_USAGE, need, parse, subcommand } from "./args.js";
import { bytes, printJson, printPairs, printTable, requireConfirmation, say, seconds } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const QUEUES_USAGE = `Usage: sluice queues <command> [options]

Commands:
  list                 every queue with its backlog (waiting, delayed, in flight, dead-lettered)
  stats NAME           all counters of one queue
  schedules NAME       the queue's job schedules (cron or interval, time zone, next and last tick)
  purge NAME [--yes]   drop every job enqueued so far (asks on a terminal, else needs --yes)

${TARGET_USAGE}

Read commands take --json. Run "sluice queues <command> --help" for one command.`;

const LIST_USAGE = `Usage: sluice queues list [--json] (--url URL | --data DIR)

${TARGET_USAGE}`;

const STATS_USAGE = `Usage: sluice queues stats NAME [--json] (--url URL | --data DIR)

${TARGET_USAGE}`;

const SCHEDULES_USAGE = `Usage: sluice queues schedules NAME [--json] (--url URL | --data DIR)

Lists the queue's job schedules: cron expression or interval, time zone, catch-up policy,
whether paused, the next tick and the last tick whose job was stored (UTC, ISO 8601). With
--data the schedules are read without firing any tick.

${TARGET_USAGE}`;

const PURGE_USAGE = `Usage: sluice queues purge NAME [--yes] [--json] (--url URL | --data DIR)

Durably drops every job enqueued before the call (waiting, delayed and in flight). On a terminal
it asks first; otherwise --yes is required (exit 2 without it).

${TARGET_USAGE}`;

const READ_OPTS = { ...TARGET_OPTIONS, json: { type: "boolean" } } as const;

export async function queuesCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "queues", ["list", "stats", "schedules", "purge"], QUEUES_USAGE);
  if (verb === "list") return list(rest);
  if (verb === "stats") return stats(rest);
  if (verb === "schedules") return schedules(rest);
  return purge(rest);
}

/** A queue handle only for a queue that exists: `broker.queue(name)` would create it. */
async function existing(b: CliBroker, name: string) {
  if (!(await b.listQueues()).includes(name)) throw new QueueNotFoundError(name);
  return b.queue(name);
}

async function list(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: LIST_USAGE, options: READ_OPTS, maxPositionals: 0 });
  await withBroker(values, { readOnly: true }, async (b) => {
    const all: QueueStats[] = [];
    for (const name of (await b.listQueues()).sort()) all.push(await b.queue(name).stats());
    if (values.json) return printJson(all);
    if (all.length === 0) return say("(no queues)");
    printTable(
      ["QUEUE", "WAITING", "DELAYED", "IN-FLIGHT", "DEPTH", "DEAD-LETTERED", "OLDEST-S"],
      all.map((s) => [s.name, s.waiting, s.delayed, s.inFlight, s.depth, s.deadLettered, seconds(s.oldestWaitingAgeMs)]),
    );
  });
}

async function stats(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: STATS_USAGE, options: READ_OPTS, maxPositionals: 1 });
  const name = need(positionals, 0, "queue name", "sluice queues stats NAME");
  await withBroker(values, { readOnly: true }, async (b) => {
    const s = await (await existing(b, name)).stats();
    if (values.json) return printJson(s);
    printPairs([
      ["queue", s.name],
      ["waiting", s.waiting],
      ["delayed", s.delayed],
      ["in flight", s.inFlight],
      ["blocked by key", s.blockedByKey],
      ["waiting for children", s.waitingChildren ?? 0],
      ["depth", s.depth],
      ["bytes", bytes(s.bytes)],
      ["dead-lettered", s.deadLettered],
      ["oldest waiting", `${seconds(s.oldestWaitingAgeMs)} s`],
      ["oldest lease", `${seconds(s.oldestLeaseAgeMs)} s`],
      ["completed", s.completed],
      ["completion rate", `${s.completionRatePerSec.toFixed(1)}/s`],
      ["retries", s.retries],
      ["redeliveries", s.redeliveries],
      ["unreadable", s.unreadable],
    ]);
    if (s.blockedKeys.length > 0) {
      say("");
      printTable(["BLOCKED-KEY", "AGE-S", "ATTEMPTS"], s.blockedKeys.map((k) => [k.key, seconds(k.ageMs), k.attempts]));
    }
  });
}

async function schedules(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: SCHEDULES_USAGE, options: READ_OPTS, maxPositionals: 1 });
  const name = need(positionals, 0, "queue name", "sluice queues schedules NAME");
  await withBroker(values, { readOnly: true }, async (b) => {
    const all = await (await existing(b, name)).listSchedules();
    if (values.json) return printJson(all);
    if (all.length === 0) return say(`(no schedules on queue ${name})`);
    const when = (t: number | null): string => (t === null ? "-" : new Date(t).toISOString());
    printTable(
      ["SCHEDULE", "EVERY", "TZ", "CATCH-UP", "STATE", "NEXT", "LAST"],
      all.map((s) => [s.name, s.cron ?? `${s.everyMs} ms`, s.cron === null ? "-" : s.tz, s.catchUp, s.paused ? "paused" : "active", when(s.nextRunAt), when(s.lastRunAt)]),
    );
  });
}

async function purge(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: PURGE_USAGE, options: { ...READ_OPTS, yes: { type: "boolean", short: "y" } }, maxPositionals: 1 });
  const name = need(positionals, 0, "queue name", "sluice queues purge NAME --yes");
  // Refuse before opening anything: a script without --yes learns it at once (exit 2).
  if (!values.yes) await requireConfirmation(false, `purge queue ${name}? every waiting, delayed and in-flight job is dropped.`, `queues purge ${name}`);
  await withBroker(values, { readOnly: true }, async (b) => {
    const q = await existing(b, name);
    const n = await q.purge();
    if (values.json) printJson({ queue: name, purged: n });
    else say(`purged ${n} job${n === 1 ? "" : "s"} from queue ${name}`);
  });
}
