// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice dlq list|show|redrive|purge QUEUE`: the dead-letter queue of QUEUE, read with
 * `queue.browse()` (no lease, so looking never counts an attempt), redriven with
 * `queue.redrive()` on the dead-letter queue. Reading never creates a queue.
 */
import { NotFoundError, QueueNotFoundError } from "../errors.js";
import { MAX_BROWSE_LIMIT } from "../queues/config.js";
import type { BrowsedJob, Queue, RedriveOptions } from "../queues/types.js";
import { TARGET_OPTIONS, TARGET_USAGE, intValue, need, parse, subcommand } from "./args.js";
import { printJson, printPairs, printTable, requireConfirmation, say } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

const DLQ_NOTE = `QUEUE is the source queue; its dead-letter queue is --dlq NAME, else QUEUE.dlq (the default
deadLetter of a queue; QUEUE itself when QUEUE.dlq does not exist and QUEUE ends in .dlq).`;

export const DLQ_USAGE = `Usage: sluice dlq <command> QUEUE [options]

Commands:
  list QUEUE [--limit N] [--after ID]      entries of the dead-letter queue (no attempt counted)
  show QUEUE ID                            one entry: metadata, attempt history, payload
  redrive QUEUE [--id ID ...] [--error-class C] [--limit N] [--yes]
                                           move entries back to their source queue
  purge QUEUE [--yes]                      drop every entry of the dead-letter queue

${DLQ_NOTE}

${TARGET_USAGE}

Read commands take --json. Run "sluice dlq <command> --help" for one command.`;

const LIST_USAGE = `Usage: sluice dlq list QUEUE [--limit N] [--after ID] [--dlq NAME] [--json] (--url URL | --data DIR)

Entries of QUEUE's dead-letter queue in id order: id, source job id, error class, error,
attempts, when it was dead-lettered. Browsing leases nothing and counts no attempt.
  --limit N      entries per page, 1..${MAX_BROWSE_LIMIT} (default 50)
  --after ID     the page after this entry id (the "next" a previous page printed)

${DLQ_NOTE}

${TARGET_USAGE}`;

const SHOW_USAGE = `Usage: sluice dlq show QUEUE ID [--dlq NAME] [--json] (--url URL | --data DIR)

One entry of QUEUE's dead-letter queue: source queue and job, key, error, every recorded
attempt (time, consumer, error class, error), headers and the payload (JSON pretty-printed).
Leases nothing: showing an entry counts no attempt.

${DLQ_NOTE}

${TARGET_USAGE}`;

const REDRIVE_USAGE = `Usage: sluice dlq redrive QUEUE [--id ID ...] [--error-class C] [--limit N] [--include-repeats] [--yes] [--json]

Moves entries of QUEUE's dead-letter queue back to their source queue (all of them, or those
matching --id / --error-class, at most --limit). Entries marked repeat (dead-lettered again
after maxRedrives redrives) are skipped unless --include-repeats. On a terminal it asks first;
otherwise --yes is required (exit 2 without it).

${DLQ_NOTE}

${TARGET_USAGE}`;

const PURGE_USAGE = `Usage: sluice dlq purge QUEUE [--yes] [--dlq NAME] [--json] (--url URL | --data DIR)

Durably drops every entry of QUEUE's dead-letter queue. On a terminal it asks first; otherwise
--yes is required (exit 2 without it).

${DLQ_NOTE}

${TARGET_USAGE}`;

const READ_OPTS = { ...TARGET_OPTIONS, json: { type: "boolean" }, dlq: { type: "string" } } as const;

export async function dlqCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "dlq", ["list", "show", "redrive", "purge"], DLQ_USAGE);
  if (verb === "list") return list(rest);
  if (verb === "show") return show(rest);
  if (verb === "redrive") return redrive(rest);
  return purge(rest);
}

/** The dead-letter queue of `queue` (it must exist: a handle on a missing one would create it on a write). */
export async function dlqOf(b: CliBroker, queue: string, explicit?: string): Promise<{ name: string; q: Queue<unknown> }> {
  const all = await b.listQueues();
  let name = explicit ?? `${queue}.dlq`;
  if (explicit === undefined && !all.includes(name) && queue.endsWith(".dlq") && all.includes(queue)) name = queue;
  if (!all.includes(name)) throw new QueueNotFoundError(name);
  return { name, q: b.queue(name) };
}

function iso(ms: number | undefined): string {
  return ms === undefined || !Number.isFinite(ms) ? "-" : new Date(ms).toISOString();
}

function oneLine(s: string, max: number): string {
  const flat = s.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

/** A browsed entry as JSON (bytes as base64). */
export function entryJson(j: BrowsedJob): Record<string, unknown> {
  const headers: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(j.headers)) headers[k] = typeof v === "string" ? v : { base64: Buffer.from(v).toString("base64") };
  const data = j.data instanceof Uint8Array ? { base64: Buffer.from(j.data).toString("base64") } : j.data;
  return { ...j, headers, data };
}

async function list(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: LIST_USAGE, options: { ...READ_OPTS, limit: { type: "string" }, after: { type: "string" } }, maxPositionals: 1 });
  const queue = need(positionals, 0, "queue name", "sluice dlq list QUEUE");
  const limit = values.limit === undefined ? undefined : intValue(values.limit, "--limit", { min: 1, max: MAX_BROWSE_LIMIT });
  await withBroker(values, { readOnly: true }, async (b) => {
    const { name, q } = await dlqOf(b, queue, values.dlq);
    const page = await q.browse({ limit, after: values.after });
    if (values.json) return printJson({ queue, dlq: name, jobs: page.jobs.map(entryJson), next: page.next });
    if (page.jobs.length === 0) say(`(no entries in ${name})`);
    else
      printTable(
        ["ID", "SOURCE-ID", "ERROR-CLASS", "ERROR", "ATTEMPTS", "DEAD-LETTERED"],
        page.jobs.map((j) => {
          const d = j.deadLetter;
          return [j.id, d?.sourceId, d?.errorClass, d === null ? null : oneLine(d.error, 60), d?.attempts, iso(d?.deadLetteredAt)];
        }),
      );
    if (page.next !== null) say(`more: sluice dlq list ${queue} --after ${page.next}`);
  });
}

/** The entry `id`, read without leasing: ids are in order, so one page starting just before it. */
async function findEntry(q: Queue<unknown>, dlq: string, id: string): Promise<BrowsedJob> {
  const n = /^\d{1,16}$/.test(id) ? Number(id) : -1;
  if (n >= 0) {
    const page = await q.browse({ limit: 1, after: n === 0 ? undefined : String(n - 1) });
    const j = page.jobs[0];
    if (j !== undefined && j.id === id) return j;
  }
  throw new NotFoundError(`dead-letter queue ${JSON.stringify(dlq)} has no entry ${JSON.stringify(id)}`);
}

async function show(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: SHOW_USAGE, options: READ_OPTS, maxPositionals: 2 });
  const queue = need(positionals, 0, "queue name", "sluice dlq show QUEUE ID");
  const id = need(positionals, 1, "entry id", "sluice dlq show QUEUE ID");
  await withBroker(values, { readOnly: true }, async (b) => {
    const { name, q } = await dlqOf(b, queue, values.dlq);
    const j = await findEntry(q, name, id);
    if (values.json) return printJson({ queue, dlq: name, job: entryJson(j) });
    const d = j.deadLetter;
    printPairs([
      ["id", j.id],
      ["dead-letter queue", name],
      ["source queue", d?.sourceQueue],
      ["source id", d?.sourceId],
      ["key", j.key],
      ["error class", d?.errorClass],
      ["error", d?.error],
      ["attempts", d?.attempts],
      ["first enqueued", iso(d?.firstEnqueuedAt)],
      ["dead-lettered", iso(d?.deadLetteredAt)],
      ["redrive count", d?.redriveCount],
      ["repeat", d?.repeat],
      ["duplicate", d?.duplicate],
      ["code version", d?.codeVersion],
      ["redacted headers", d === null || d.redacted.length === 0 ? null : d.redacted.join(", ")],
    ]);
    if (d !== null && d.history.length > 0) {
      say("\nattempt history:");
      printTable(
        ["ATTEMPT", "AT", "CONSUMER", "ERROR-CLASS", "ERROR"],
        d.history.map((h) => [h.attempt, iso(h.at), h.consumer, h.errorClass, oneLine(h.error, 80)]),
      );
    }
    const hs = Object.entries(j.headers);
    if (hs.length > 0) {
      say("\nheaders:");
      printPairs(hs.map(([k, v]) => [k, typeof v === "string" ? v : `(${v.length} bytes, base64 ${Buffer.from(v).toString("base64")})`]));
    }
    say("\npayload:");
    const data = j.data;
    say(data instanceof Uint8Array ? `(${data.length} bytes, base64) ${Buffer.from(data).toString("base64")}` : typeof data === "string" ? data : JSON.stringify(data, null, 2));
  });
}

async function redrive(argv: string[]): Promise<void> {
  const options = {
    ...READ_OPTS,
    id: { type: "string", multiple: true },
    "error-class": { type: "string" },
    limit: { type: "string" },
    "include-repeats": { type: "boolean" },
    yes: { type: "boolean", short: "y" },
  } as const;
  const { values, positionals } = parse(argv, { usage: REDRIVE_USAGE, options, maxPositionals: 1 });
  const queue = need(positionals, 0, "queue name", "sluice dlq redrive QUEUE --yes");
  const limit = values.limit === undefined ? undefined : intValue(values.limit, "--limit", { min: 1 });
  const ids = values.id?.flatMap((s) => s.split(",")).filter((s) => s !== "");
  const opts: RedriveOptions = { filter: {} };
  if (ids !== undefined && ids.length > 0) opts.filter!.ids = ids;
  if (values["error-class"] !== undefined) opts.filter!.errorClass = values["error-class"];
  if (limit !== undefined) opts.limit = limit;
  if (values["include-repeats"]) opts.includeRepeats = true;
  const what = ids?.length ? `${ids.length} entr${ids.length === 1 ? "y" : "ies"}` : "every matching entry";
  // Refuse before opening anything: a script without --yes learns it at once (exit 2).
  if (!values.yes) await requireConfirmation(false, `redrive ${what} of ${queue}'s dead-letter queue back to their source queue?`, `dlq redrive ${queue}`);
  await withBroker(values, { readOnly: true }, async (b) => {
    const { name, q } = await dlqOf(b, queue, values.dlq);
    const r = await q.redrive(opts);
    if (values.json) return printJson({ queue, dlq: name, ...r });
    say(`redrove ${r.moved} job${r.moved === 1 ? "" : "s"} from ${name}${r.skippedRepeats > 0 ? ` (skipped ${r.skippedRepeats} marked repeat; --include-repeats moves them)` : ""}`);
  });
}

async function purge(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: PURGE_USAGE, options: { ...READ_OPTS, yes: { type: "boolean", short: "y" } }, maxPositionals: 1 });
  const queue = need(positionals, 0, "queue name", "sluice dlq purge QUEUE --yes");
  if (!values.yes) await requireConfirmation(false, `purge the dead-letter queue of ${queue}? every entry is dropped.`, `dlq purge ${queue}`);
  await withBroker(values, { readOnly: true }, async (b) => {
    const { name, q } = await dlqOf(b, queue, values.dlq);
    const n = await q.purge();
    if (values.json) printJson({ queue, dlq: name, purged: n });
    else say(`purged ${n} entr${n === 1 ? "y" : "ies"} from ${name}`);
  });
}
