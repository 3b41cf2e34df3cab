// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice groups list|describe|reset` (and the older spellings `sluice group lag|reset`).
 * `reset` is a dry run unless `--execute`: it prints the plan (previous → next per partition)
 * and changes nothing.
 */
import { NotFoundError, PartitionNotFoundError } from "../errors.js";
import type { GroupListing, ResetResult, ResetTarget } from "../types.js";
import { TARGET_OPTIONS, TARGET_USAGE, UsageError, intValue, isoTime, need, parse, partitionList, subcommand } from "./args.js";
import { printJson, printTable, say, seconds } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const GROUPS_USAGE = `Usage: sluice groups <command> [options]

Commands:
  list [--topic T]                 consumer groups per topic: members, lag
  describe GROUP [--topic T]       lag per partition (records and seconds), retention headroom,
                                   generation, members and the partitions each owns
  reset GROUP TOPIC (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO | --shift-by N)
        [--partition P ...] [--execute]
                                   plan (dry run, the default) or apply an offset reset

${TARGET_USAGE}

Read commands take --json. Run "sluice groups <command> --help" for one command.`;

const LIST_USAGE = `Usage: sluice groups list [--topic T] [--json] (--url URL | --data DIR)

Every consumer group with committed offsets or members now, per topic.

${TARGET_USAGE}`;

const DESCRIBE_USAGE = `Usage: sluice groups describe GROUP [--topic T] [--json] (--url URL | --data DIR)

Per topic the group reads (or only --topic T): members now, and per partition the committed
offset, the log range, the lag in records and the age of the oldest unprocessed record (seconds).
A group that has no committed offsets and no members is an error (NOT_FOUND).

${TARGET_USAGE}`;

const RESET_USAGE = `Usage: sluice groups reset GROUP TOPIC <target> [--partition P ...] [--execute] [--json]

Target (exactly one):
  --to-earliest            the log start of each partition
  --to-latest              the high watermark (skip everything published so far)
  --to-offset N            exactly offset N (N >= 0; refused if outside a partition's range)
  --to-datetime ISO        the first record at or after this time (e.g. 2026-12-01T10:00:00Z)
  --shift-by N             move by N records from the committed offset (negative: back)

  --partition P            only these partitions (repeat, or a comma list); others keep theirs
  --execute                apply the reset; without it nothing changes (dry run: the plan only)

The group must have no active members when executed (GROUP_ACTIVE otherwise).

${TARGET_USAGE}`;

export async function groupsCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "groups", ["list", "describe", "reset"], GROUPS_USAGE);
  if (verb === "list") return list(rest);
  if (verb === "describe") return describe(rest);
  return reset(rest);
}

/** The older `sluice group lag GROUP TOPIC | reset GROUP TOPIC --to X [--dry-run]`. */
export async function legacyGroupCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "group", ["lag", "reset"], GROUPS_USAGE);
  if (verb === "lag") {
    // `group lag GROUP TOPIC` = `groups describe GROUP --topic TOPIC`
    const { values, positionals } = parse(rest, { usage: DESCRIBE_USAGE, options: READ_OPTS, maxPositionals: 2 });
    const group = need(positionals, 0, "group name", "sluice group lag GROUP TOPIC");
    return describeGroup(values, group, positionals[1] ?? values.topic);
  }
  const mapped: string[] = [];
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i];
    const to = a === "--to" ? rest[++i] : a.startsWith("--to=") ? a.slice(5) : null;
    if (to === null) {
      if (a !== "--dry-run") mapped.push(a); // dry run is the default now
      continue;
    }
    if (to === undefined) throw new UsageError("--to needs a value: earliest, latest, an offset or an ISO time");
    if (to === "earliest" || to === "latest") mapped.push(`--to-${to}`);
    else if (/^\d{4}-\d{2}-\d{2}/.test(to)) mapped.push(`--to-datetime=${to}`);
    else mapped.push(`--to-offset=${to}`);
  }
  return reset(mapped);
}

const READ_OPTS = { ...TARGET_OPTIONS, json: { type: "boolean" }, topic: { type: "string" } } as const;

async function list(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: LIST_USAGE, options: READ_OPTS, maxPositionals: 0 });
  await withBroker(values, { readOnly: true }, async (b) => {
    const groups = await b.listGroups(values.topic === undefined ? {} : { topic: values.topic });
    if (values.json) return printJson(groups);
    if (groups.length === 0) return say("(no groups)");
    printTable(
      ["GROUP", "TOPIC", "MEMBERS", "COMMITTED-PARTITIONS", "LAG", "MAX-LAG-S"],
      groups.map((g) => [g.group, g.topic, g.members, g.committedPartitions, g.lagRecords, seconds(g.maxLagMs)]),
    );
  });
}

/** The group's listings (one per topic), or NOT_FOUND when it never existed. */
async function groupListings(b: CliBroker, group: string, topic: string | undefined): Promise<GroupListing[]> {
  const all = await b.listGroups(topic === undefined ? {} : { topic });
  const mine = all.filter((g) => g.group === group);
  if (mine.length === 0) {
    const where = topic === undefined ? "" : ` on topic ${JSON.stringify(topic)}`;
    throw new NotFoundError(`group ${JSON.stringify(group)} does not exist${where} (no committed offsets and no members)`);
  }
  return mine;
}

async function describe(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: DESCRIBE_USAGE, options: READ_OPTS, maxPositionals: 1 });
  const group = need(positionals, 0, "group name", "sluice groups describe GROUP [--topic T]");
  return describeGroup(values, group, values.topic);
}

async function describeGroup(values: { url?: string; data?: string; json?: boolean }, group: string, topic: string | undefined): Promise<void> {
  await withBroker(values, { readOnly: true }, async (b) => {
    const out = [];
    for (const l of await groupListings(b, group, topic)) out.push(await b.groupLag(group, l.topic));
    if (values.json) return printJson(out);
    out.forEach((g, i) => {
      if (i > 0) say("");
      const headroom = g.minHeadroomMs === null ? "unlimited" : `${seconds(g.minHeadroomMs)} s`;
      say(`group ${g.group}  topic ${g.topic}  generation ${g.generation}  lag ${g.totalRecords} records  max ${seconds(g.maxLagMs)} s  headroom ${headroom}`);
      const owner = new Map<number, string>();
      for (const m of g.members) for (const p of m.partitions) owner.set(p, m.memberId);
      const last = g.recentResets[0];
      if (last !== undefined) say(`last reset ${new Date(last.at).toISOString()}: ${last.partitions.map((p) => `p${p.partition} ${p.from ?? "none"}→${p.to}`).join(", ")} (${g.recentResets.length} remembered; sluice explain group ${g.group} lists them)`);
      say(g.members.length === 0 ? "members: none" : `members (${g.members.length}): ${g.members.map((m) => `${m.memberId} [${m.partitions.join(",")}]`).join("  ")}`);
      printTable(
        ["PARTITION", "COMMITTED", "LOG-START", "HIGH-WATERMARK", "LAG", "LAG-S", "HEADROOM-S", "OWNER"],
        g.partitions.map((p) => [p.partition, p.committedOffset, p.logStartOffset, p.highWatermark, p.lagRecords, seconds(p.lagMs), p.headroomMs === null ? "-" : seconds(p.headroomMs), owner.get(p.partition) ?? "-"]),
      );
    });
  });
}

const RESET_OPTS = {
  ...TARGET_OPTIONS,
  json: { type: "boolean" },
  "to-earliest": { type: "boolean" },
  "to-latest": { type: "boolean" },
  "to-offset": { type: "string" },
  "to-datetime": { type: "string" },
  "shift-by": { type: "string" },
  partition: { type: "string", multiple: true },
  execute: { type: "boolean" },
  "dry-run": { type: "boolean" },
} as const;

type ResetValues = ReturnType<typeof parse<typeof RESET_OPTS>>["values"];

/** Exactly one target flag → the API's ResetTarget; offsets are checked here, never clamped. */
function resetTarget(v: ResetValues): ResetTarget {
  const given = (["to-earliest", "to-latest", "to-offset", "to-datetime", "shift-by"] as const).filter((k) => v[k] !== undefined && v[k] !== false);
  if (given.length !== 1) {
    throw new UsageError(
      given.length === 0
        ? "say where to: --to-earliest, --to-latest, --to-offset N, --to-datetime ISO or --shift-by N"
        : `give one target, not ${given.map((g) => `--${g}`).join(" and ")}`,
    );
  }
  if (v["to-earliest"]) return "earliest";
  if (v["to-latest"]) return "latest";
  if (v["to-offset"] !== undefined) return { offset: intValue(v["to-offset"], "--to-offset", { min: 0 }) };
  if (v["to-datetime"] !== undefined) return { timestamp: isoTime(v["to-datetime"], "--to-datetime") };
  return { shiftBy: intValue(v["shift-by"]!, "--shift-by") };
}

/**
 * The plan for the chosen partitions: the broker's own dry run (which resolves times, shifts
 * and ranges), narrowed to `--partition`. An exact `--to-offset` is asked per partition, so an
 * offset outside a partition's range is refused rather than clamped.
 */
async function plan(b: CliBroker, group: string, topic: string, target: ResetTarget, only: number[] | undefined): Promise<ResetResult> {
  const d = await b.describeTopic(topic);
  for (const p of only ?? []) if (p >= d.partitions.length) throw new PartitionNotFoundError(topic, p);
  const chosen = only ?? d.partitions.map((p) => p.partition);
  const asked: ResetTarget = typeof target === "object" && "offset" in target ? { partitions: Object.fromEntries(chosen.map((p) => [p, target.offset])) } : target;
  const r = await b.resetGroup(group, topic, asked, { dryRun: true });
  return { ...r, partitions: r.partitions.filter((p) => chosen.includes(p.partition)) };
}

async function reset(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: RESET_USAGE, options: RESET_OPTS, maxPositionals: 2 });
  const group = need(positionals, 0, "group name", "sluice groups reset GROUP TOPIC --to-earliest");
  const topic = need(positionals, 1, "topic name", "sluice groups reset GROUP TOPIC --to-earliest");
  const target = resetTarget(values);
  const only = partitionList(values.partition);
  if (values.execute && values["dry-run"]) throw new UsageError("give --execute or --dry-run, not both");
  await withBroker(values, { readOnly: !values.execute }, async (b) => {
    let result = await plan(b, group, topic, target, only);
    if (values.execute) {
      const exact: ResetTarget = { partitions: Object.fromEntries(result.partitions.map((p) => [p.partition, p.next])) };
      // Without --partition and for a whole-topic target the broker resolves it in one step.
      const whole = only === undefined && !(typeof target === "object" && "offset" in target);
      result = await b.resetGroup(group, topic, whole ? target : exact, { dryRun: false });
    }
    if (values.json) return printJson(result);
    say(`${result.dryRun ? "plan (dry run, nothing changed)" : "reset applied"}: group ${group} topic ${topic}`);
    printTable(
      ["PARTITION", "PREVIOUS", "NEXT", "CHANGE"],
      result.partitions.map((p) => [p.partition, p.previous, p.next, p.previous === null ? "new" : signed(p.next - p.previous)]),
    );
    if (!result.dryRun) return;
    const members = (await b.listGroups({ topic })).find((g) => g.group === group)?.members ?? 0;
    if (members > 0) say(`note: the group has ${members} active member(s); --execute is refused (GROUP_ACTIVE) until they stop`);
    say("add --execute to apply");
  });
}

function signed(n: number): string {
  return n > 0 ? `+${n}` : String(n);
}
