// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice tail TOPIC`: prints records as they arrive. Without `--group` it reads with fetch
 * (no group, nothing committed) from `--from`; with `--group G` it joins the group as a member
 * and commits what it printed. Stops after `--max N` records, at the end with `--no-follow`
 * (group-less only), or on SIGINT/SIGTERM, closing cleanly (a member's commits are written).
 */
import { AbortedError, BrokerClosedError } from "../errors.js";
import type { ConsumedRecord } from "../types.js";
import { TARGET_OPTIONS, TARGET_USAGE, UsageError, intValue, isoTime, need, optInt, parse, partitionList } from "./args.js";
import { exitQuietlyOnClosedStdout, printJsonLine, say } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const TAIL_USAGE = `Usage: sluice tail TOPIC [options] (--url URL | --data DIR)

Options:
  --from WHERE       earliest | latest (default) | OFFSET | ISO time (e.g. 2026-12-01T10:00:00Z)
  --partition P      only these partitions (repeat, or a comma list); group-less reads only
  --group G          consume as a member of group G, committing each record printed
                     (--from earliest|latest applies when G has no committed offset yet)
  --max N            stop after N records
  --no-follow        stop at the end of each partition instead of waiting (group-less reads)
  --json             one JSON object per line: topic, partition, offset, timestamp, key, value, headers
Stops cleanly on Ctrl-C.

${TARGET_USAGE}`;

const OPTS = {
  ...TARGET_OPTIONS,
  from: { type: "string" },
  partition: { type: "string", multiple: true },
  group: { type: "string" },
  max: { type: "string" },
  "no-follow": { type: "boolean" },
  json: { type: "boolean" },
} as const;

type From = "earliest" | "latest" | { offset: number } | { timestamp: number };

function parseFrom(raw: string | undefined): From {
  if (raw === undefined || raw === "latest") return "latest";
  if (raw === "earliest") return "earliest";
  if (/^[+-]?\d+$/.test(raw)) return { offset: intValue(raw, "--from", { min: 0 }) };
  if (/^\d{4}-\d{2}-\d{2}/.test(raw)) return { timestamp: isoTime(raw, "--from") };
  throw new UsageError(`--from must be earliest, latest, an offset or an ISO time, got ${JSON.stringify(raw)}`);
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Bytes as UTF-8 text when they are valid UTF-8, else base64 (flagged by the caller). */
function text(b: Uint8Array): { s: string; base64: boolean } {
  try {
    return { s: utf8.decode(b), base64: false };
  } catch {
    return { s: Buffer.from(b).toString("base64"), base64: true };
  }
}

function printRecord(r: ConsumedRecord, json: boolean | undefined): void {
  const key = r.key === null ? null : text(r.key).s;
  const bin = r.value instanceof Uint8Array ? text(r.value) : null;
  const value = bin ? bin.s : r.value;
  if (json) {
    const headers = Object.fromEntries(Object.entries(r.headers).map(([k, v]) => [k, text(v).s]));
    printJsonLine({ topic: r.topic, partition: r.partition, offset: r.offset, timestamp: r.timestamp, key, value, ...(bin?.base64 ? { valueEncoding: "base64" } : {}), headers });
    return;
  }
  const shown = typeof value === "string" ? value : JSON.stringify(value);
  say(`${r.partition}:${r.offset}  ${new Date(r.timestamp).toISOString()}  ${key === null ? "" : `key=${key}  `}${shown}`);
}

export async function tailCommand(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: TAIL_USAGE, options: OPTS, maxPositionals: 1 });
  const topic = need(positionals, 0, "topic name", "sluice tail TOPIC [--from earliest]");
  const from = parseFrom(values.from);
  const max = optInt(values.max, "--max", { min: 1 });
  const only = partitionList(values.partition);
  if (values.group !== undefined) {
    if (typeof from === "object") throw new UsageError("with --group, --from is earliest or latest (where a new group starts); move a group with sluice groups reset");
    if (only) throw new UsageError("--partition is for group-less reads; a group member reads the partitions assigned to it");
    if (values["no-follow"]) throw new UsageError("--no-follow is for group-less reads");
  }
  exitQuietlyOnClosedStdout();
  const ac = new AbortController();
  const onSignal = (): void => {
    if (ac.signal.aborted) process.exit(130); // a second Ctrl-C: do not wait
    ac.abort();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    await withBroker(values, { readOnly: true }, async (b) => {
      const d = await b.describeTopic(topic);
      if (values.group !== undefined) return tailGroup(b, topic, values.group, from as "earliest" | "latest", max, values.json, ac);
      const parts = only ?? d.partitions.map((p) => p.partition);
      for (const p of parts) if (p >= d.partitions.length) throw new UsageError(`topic ${topic} has no partition ${p} (it has ${d.partitions.length})`);
      return tailFetch(b, topic, parts, from, { max, json: values.json, follow: !values["no-follow"] }, ac);
    });
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

async function startOffset(b: CliBroker, topic: string, p: number, from: From): Promise<number> {
  if (from === "earliest" || from === "latest") {
    const d = (await b.describeTopic(topic)).partitions[p];
    return from === "earliest" ? d.logStartOffset : d.highWatermark;
  }
  if ("timestamp" in from) return b.offsetForTimestamp(topic, p, from.timestamp);
  return from.offset;
}

/** One reader per partition (long polls), sharing the `--max` budget. */
async function tailFetch(b: CliBroker, topic: string, parts: number[], from: From, o: { max?: number; json?: boolean; follow: boolean }, ac: AbortController): Promise<void> {
  let printed = 0;
  const one = async (p: number): Promise<void> => {
    let off = await startOffset(b, topic, p, from);
    while (!ac.signal.aborted) {
      const r = await b.fetch(topic, p, off, { maxWaitMs: o.follow ? 1000 : 0, signal: ac.signal });
      for (const rec of r.records) {
        if (ac.signal.aborted) return;
        printRecord(rec, o.json);
        if (o.max !== undefined && ++printed >= o.max) return ac.abort();
      }
      off = r.nextOffset;
      if (!o.follow && off >= r.highWatermark) return;
    }
  };
  await Promise.all(parts.map((p) => one(p).catch((e: unknown) => stopped(e, ac))));
}

/** An abort (Ctrl-C, `--max` reached) ends a reader quietly; other errors are raised. */
function stopped(e: unknown, ac: AbortController): void {
  if (ac.signal.aborted && (e instanceof AbortedError || e instanceof BrokerClosedError || (e as Error)?.name === "AbortError")) return;
  ac.abort();
  throw e;
}

async function tailGroup(b: CliBroker, topic: string, group: string, start: "earliest" | "latest", max: number | undefined, json: boolean | undefined, ac: AbortController): Promise<void> {
  // drainTimeoutMs 0: on Ctrl-C leave at once; what was printed is committed on close.
  const sub = b.subscribe(topic, { group, start, signal: ac.signal, drainTimeoutMs: 0 });
  let printed = 0;
  try {
    for await (const msg of sub) {
      printRecord(msg, json);
      void msg.commit();
      if (max !== undefined && ++printed >= max) break;
    }
  } catch (e) {
    stopped(e, ac);
  } finally {
    await sub.close();
  }
}
