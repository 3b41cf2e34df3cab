// SPDX-License-Identifier: Apache-2.0
/** `sluice topics create|list|describe|alter|delete`. */
import type { TopicAlteration, TopicConfig, TopicDescription } from "../types.js";
import { TARGET_OPTIONS, TARGET_USAGE, UsageError, need, optInt, parse, subcommand } from "./args.js";
import { bytes, printJson, printPairs, printTable, requireConfirmation, say } from "./output.js";
import { withBroker } from "./target.js";

export const TOPICS_USAGE = `Usage: sluice topics <command> [options]

Commands:
  list                      topics with partitions, records and size
  describe NAME             configuration and partitions of one topic
  create NAME [--partitions N] [--retention-ms N] [--retention-bytes N]
              [--segment-bytes N] [--max-message-bytes N] [--durability always|interval|never]
              [--cleanup-policy delete|compact|compact,delete] [--encrypted]
  alter NAME [--retention-ms N] [--retention-bytes N]
                            change a topic's retention (applies at the next retention check)
  delete NAME [--yes]       delete a topic and its data (asks on a terminal, else needs --yes)

${TARGET_USAGE}

Read commands take --json. Run "sluice topics <command> --help" for one command.`;

const LIST_USAGE = `Usage: sluice topics list [--json] (--url URL | --data DIR)

Lists every topic: partitions, records held (high watermark - log start, summed) and bytes.

${TARGET_USAGE}`;

const DESCRIBE_USAGE = `Usage: sluice topics describe NAME [--json] (--url URL | --data DIR)

Prints the topic's id, creation time, configuration and, per partition, the log start offset,
high watermark, size and segment count.

${TARGET_USAGE}`;

const CREATE_USAGE = `Usage: sluice topics create NAME [options] (--url URL | --data DIR)

Options:
  --partitions N            1..10000 (default 1)
  --retention-ms N          delete sealed segments older than this (-1 = keep forever, default)
  --retention-bytes N       per partition size limit (-1 = none, default)
  --segment-bytes N         roll segments at this size (default 256 MiB)
  --max-message-bytes N     largest record accepted (default 1 MiB)
  --durability MODE         always (default) | interval | never
  --archive-dir DIR         (absolute) archive sealed segments here before retention deletes them, and
                            serve reads below the online log start from there (tiered storage)
  --archive-retention-ms N  delete archived segments older than this (-1 = keep forever, default)
  --cleanup-policy P        delete (default) | compact | compact,delete (key compaction: docs/topics.md)
  --encrypted               store records encrypted (needs the broker's keyring: docs/security.md)
  --json                    print the created topic as JSON

${TARGET_USAGE}`;

const ALTER_USAGE = `Usage: sluice topics alter NAME [--retention-ms N] [--retention-bytes N] (--url URL | --data DIR)

Changes a topic's retention durably; the next retention check applies it (a shorter retention
then deletes sealed segments: records a group has not read yet go with them). Partitions,
segment size and durability are fixed when a topic is created.

Options:
  --retention-ms N          delete sealed segments older than this (-1 = keep forever)
  --retention-bytes N       per partition size limit (-1 = none)
  --json                    print the topic as JSON

${TARGET_USAGE}`;

const DELETE_USAGE = `Usage: sluice topics delete NAME [--yes] (--url URL | --data DIR)

Deletes the topic and all its records. On a terminal it asks first; otherwise --yes is required.

${TARGET_USAGE}`;

const READ_OPTS = { ...TARGET_OPTIONS, json: { type: "boolean" } } as const;

export async function topicsCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "topics", ["list", "describe", "create", "alter", "delete"], TOPICS_USAGE);
  if (verb === "list") return list(rest);
  if (verb === "describe") return describe(rest);
  if (verb === "create") return create(rest);
  if (verb === "alter") return alter(rest);
  return remove(rest);
}

async function list(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: LIST_USAGE, options: READ_OPTS, maxPositionals: 0 });
  await withBroker(values, { readOnly: true }, async (b) => {
    const rows: { name: string; partitions: number; records: number; sizeBytes: number }[] = [];
    for (const name of await b.listTopics()) {
      const d = await b.describeTopic(name).catch(() => null); // deleted meanwhile
      if (!d) continue;
      rows.push({
        name,
        partitions: d.partitions.length,
        records: d.partitions.reduce((s, p) => s + (p.highWatermark - p.logStartOffset), 0),
        sizeBytes: d.partitions.reduce((s, p) => s + p.sizeBytes, 0),
      });
    }
    if (values.json) return printJson(rows);
    if (rows.length === 0) return say("(no topics)");
    printTable(["TOPIC", "PARTITIONS", "RECORDS", "SIZE"], rows.map((r) => [r.name, r.partitions, r.records, bytes(r.sizeBytes)]));
  });
}

function printDescription(d: TopicDescription): void {
  const c = d.config;
  printPairs([
    ["topic", d.name],
    ["id", d.topicId],
    ["created", new Date(d.createdAt).toISOString()],
    ["partitions", d.partitions.length],
    ["retention", c.retentionMs < 0 ? "forever" : `${c.retentionMs} ms`],
    ["retention bytes", c.retentionBytes < 0 ? "no limit" : bytes(c.retentionBytes)],
    ["segment", `${bytes(c.segmentBytes)} / ${c.segmentMs} ms`],
    ["max message", bytes(c.maxMessageBytes)],
    ["durability", c.durability === "interval" ? `interval (${c.flushIntervalMs} ms)` : c.durability],
    ["archive", c.archive ? `${c.archive.dir} (keep ${c.archiveRetentionMs < 0 ? "forever" : `${c.archiveRetentionMs} ms`})` : "none"],
    ...(c.encrypted === true ? [["encrypted", "yes (AES-256-GCM at rest)"] as [string, string]] : []),
    ...(c.cleanupPolicy !== undefined && c.cleanupPolicy !== "delete" ? [["cleanup", `${c.cleanupPolicy} (lag ${c.minCompactionLagMs} ms, tombstones ${c.deleteRetentionMs} ms)`] as [string, string]] : []),
  ]);
  say("");
  printTable(
    ["PARTITION", "LOG-START", "HIGH-WATERMARK", "RECORDS", "SIZE", "SEGMENTS"],
    d.partitions.map((p) => [p.partition, p.logStartOffset, p.highWatermark, p.highWatermark - p.logStartOffset, bytes(p.sizeBytes), p.segments]),
  );
  printStorageFigures(d);
}

/** The cleaner's figures of a compacted topic and the archive's of an archived one (since the broker opened). */
function printStorageFigures(d: TopicDescription): void {
  const ps = d.partitions;
  if (ps.some((p) => p.cleanerDirtyRatio !== undefined)) {
    say("");
    printTable(
      ["PARTITION", "DIRTY", "RECLAIMED", "PASSES", "LAST-CLEANED", "PASS"],
      ps.map((p) => [p.partition, `${Math.round((p.cleanerDirtyRatio ?? 0) * 100)}%`, bytes(p.bytesReclaimed ?? 0), p.cleanerPasses ?? 0, p.lastCleanedAt == null ? "never" : new Date(p.lastCleanedAt).toISOString(), p.cleanerPassProgress == null ? "idle" : `${Math.round(p.cleanerPassProgress * 100)}%`]),
    );
  }
  if (ps.some((p) => p.archivedBytes !== undefined)) {
    say("");
    printTable(
      ["PARTITION", "ARCHIVE-START", "ARCHIVED", "ARCHIVED-SEGMENTS", "ARCHIVE-LAG", "ARCHIVE-READ"],
      ps.map((p) => [p.partition, p.archiveStartOffset ?? "none", bytes(p.archivedBytes ?? 0), p.archivedSegments ?? 0, bytes(p.archiveLagBytes ?? 0), bytes(p.archiveReadBytes ?? 0)]),
    );
  }
}

async function describe(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: DESCRIBE_USAGE, options: READ_OPTS, maxPositionals: 1 });
  const name = need(positionals, 0, "topic name", "sluice topics describe NAME");
  await withBroker(values, { readOnly: true }, async (b) => {
    const d = await b.describeTopic(name);
    if (values.json) printJson(d);
    else printDescription(d);
  });
}

const CREATE_OPTS = {
  ...READ_OPTS,
  partitions: { type: "string" },
  "retention-ms": { type: "string" },
  "retention-bytes": { type: "string" },
  "segment-bytes": { type: "string" },
  "max-message-bytes": { type: "string" },
  durability: { type: "string" },
  "archive-dir": { type: "string" },
  "archive-retention-ms": { type: "string" },
  "cleanup-policy": { type: "string" },
  encrypted: { type: "boolean" },
} as const;

async function create(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: CREATE_USAGE, options: CREATE_OPTS, maxPositionals: 1 });
  const name = need(positionals, 0, "topic name", "sluice topics create NAME [--partitions N]");
  const durability = values.durability;
  if (durability !== undefined && !["always", "interval", "never"].includes(durability)) {
    throw new UsageError(`--durability must be always, interval or never, got ${JSON.stringify(durability)}`);
  }
  const config: TopicConfig = {
    partitions: optInt(values.partitions, "--partitions", { min: 1, max: 10_000 }),
    retentionMs: optInt(values["retention-ms"], "--retention-ms", { min: -1 }),
    retentionBytes: optInt(values["retention-bytes"], "--retention-bytes", { min: -1 }),
    segmentBytes: optInt(values["segment-bytes"], "--segment-bytes", { min: 1 }),
    maxMessageBytes: optInt(values["max-message-bytes"], "--max-message-bytes", { min: 1 }),
    durability: durability as TopicConfig["durability"],
    archive: values["archive-dir"] === undefined ? undefined : { dir: values["archive-dir"] },
    archiveRetentionMs: optInt(values["archive-retention-ms"], "--archive-retention-ms", { min: -1 }),
    cleanupPolicy: values["cleanup-policy"] as TopicConfig["cleanupPolicy"],
    encrypted: values.encrypted === true ? true : undefined,
  };
  for (const k of Object.keys(config) as (keyof TopicConfig)[]) if (config[k] === undefined) delete config[k];
  await withBroker(values, { readOnly: false }, async (b) => {
    const d = await b.createTopic(name, config);
    if (values.json) printJson(d);
    else say(`created topic ${d.name} (${d.partitions.length} partition${d.partitions.length === 1 ? "" : "s"}, id ${d.topicId})`);
  });
}

async function alter(argv: string[]): Promise<void> {
  const opts = { ...READ_OPTS, "retention-ms": { type: "string" }, "retention-bytes": { type: "string" } } as const;
  const { values, positionals } = parse(argv, { usage: ALTER_USAGE, options: opts, maxPositionals: 1 });
  const name = need(positionals, 0, "topic name", "sluice topics alter NAME --retention-ms N");
  const changes: TopicAlteration = {};
  const ms = optInt(values["retention-ms"], "--retention-ms", { min: -1 });
  const size = optInt(values["retention-bytes"], "--retention-bytes", { min: -1 });
  if (ms !== undefined) changes.retentionMs = ms;
  if (size !== undefined) changes.retentionBytes = size;
  if (ms === undefined && size === undefined) throw new UsageError("nothing to change: give --retention-ms and/or --retention-bytes");
  await withBroker(values, { readOnly: true }, async (b) => {
    const before = (await b.describeTopic(name)).config;
    const d = await b.alterTopic(name, changes);
    if (values.json) return printJson(d);
    for (const k of Object.keys(changes) as (keyof TopicAlteration)[]) say(`${name}: ${k} ${before[k]} -> ${d.config[k]}`);
  });
}

async function remove(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: DELETE_USAGE, options: { ...TARGET_OPTIONS, yes: { type: "boolean", short: "y" } }, maxPositionals: 1 });
  const name = need(positionals, 0, "topic name", "sluice topics delete NAME --yes");
  await withBroker(values, { readOnly: true }, async (b) => {
    const d = await b.describeTopic(name); // TOPIC_NOT_FOUND before asking
    const records = d.partitions.reduce((s, p) => s + (p.highWatermark - p.logStartOffset), 0);
    await requireConfirmation(values.yes, `delete topic ${name} and its ${records} records?`, `topics delete ${name}`);
    await b.deleteTopic(name);
    say(`deleted topic ${name}`);
  });
}
