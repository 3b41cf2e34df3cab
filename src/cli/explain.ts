// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice explain queue|group|topic NAME`: walks the troubleshooting order of docs/cli.md and
 * prints one finding per step (`ok`, `warn` or `info`), or the findings as data with --json.
 * It only reads: browsing leases nothing, and nothing is created. Exit 1 when the thing does
 * not exist (the first step fails), else 0 whatever was found.
 */
import type { GroupLag, TopicDescription } from "../types.js";
import type { BrowsedJob, QueueStats } from "../queues/types.js";
import { TARGET_OPTIONS, TARGET_USAGE, parse, subcommand, need } from "./args.js";
import { printJson, say, seconds } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const EXPLAIN_USAGE = `Usage: sluice explain <queue|group|topic> NAME [options]

Walks the troubleshooting order and prints what it found, one line per step (ok / warn / info):
  queue NAME [--dlq D]   exists; dead-letter queue; backlog (waiting, delayed, in flight, oldest
                         waiting); completion; retries and redeliveries; dead-letter depth and
                         its most common error class; keys blocked behind a failing (poison) job
  group NAME [--topic T] exists; members; lag per partition (records, seconds); a partition
                         whose committed offset does not move in 1 s while it has lag (stuck:
                         the record at that offset is the likely poison record); key skew
  topic NAME             partitions; retention; sizes; skew (share of the hottest partition)

Options: --json (the findings as data), --sample-ms N (group: time between the two lag
samples, default 1000).

${TARGET_USAGE}`;

export type Status = "ok" | "warn" | "info";
export interface Finding {
  step: string;
  status: Status;
  message: string;
  data?: Record<string, unknown>;
}

const OPTS = { ...TARGET_OPTIONS, json: { type: "boolean" }, topic: { type: "string" }, dlq: { type: "string" }, "sample-ms": { type: "string" } } as const;
/** DLQ entries read for the error-class count, and source jobs read to find poison jobs. */
const DLQ_SAMPLE = 1000;
const POISON_SCAN_PAGES = 20;

export async function explainCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "explain", ["queue", "group", "topic"], EXPLAIN_USAGE);
  const { values, positionals } = parse(rest, { usage: EXPLAIN_USAGE, options: OPTS, maxPositionals: 1 });
  const name = need(positionals, 0, `${verb} name`, `sluice explain ${verb} NAME`);
  const sampleMs = values["sample-ms"] === undefined ? 1000 : Math.max(0, Math.min(60_000, Number(values["sample-ms"]) || 0));
  const findings = await withBroker(values, { readOnly: true }, (b) =>
    verb === "queue" ? explainQueue(b, name, values.dlq) : verb === "group" ? explainGroup(b, name, values.topic, sampleMs) : explainTopic(b, name),
  );
  if (values.json) printJson({ kind: verb, name, findings });
  else for (const f of findings) say(`${f.status.padEnd(4)}  ${f.step}: ${f.message}`);
  if (findings[0]?.status === "warn" && findings[0].step === "exists") process.exitCode = 1;
}

const plural = (n: number, one: string, many = `${one}s`): string => `${n} ${n === 1 ? one : many}`;

// ─────────────────────────────── queue ───────────────────────────────

export async function explainQueue(b: CliBroker, name: string, dlqName?: string): Promise<Finding[]> {
  const out: Finding[] = [];
  const all = await b.listQueues();
  if (!all.includes(name)) return [{ step: "exists", status: "warn", message: `no queue ${name} (queues: ${all.slice(0, 10).join(", ") || "none"})` }];
  const q = b.queue(name);
  const s = await q.stats();
  out.push({ step: "exists", status: "ok", message: `queue ${name}, depth ${s.depth}` });
  const dlq = dlqName ?? `${name}.dlq`;
  const hasDlq = all.includes(dlq);
  out.push({
    step: "config",
    status: "info",
    message: `dead-letter queue ${hasDlq ? dlq : `${dlq} (not found: deadLetter may be null or another name; --dlq NAME)`}; maxAttempts and visibility timeout are not readable through the broker API (defaults 5 and 30 s)`,
    data: { deadLetter: hasDlq ? dlq : null },
  });
  out.push(backlog(s), completion(s), retries(s));
  if (hasDlq) out.push(await dlqFinding(b, dlq));
  out.push(...(await blockedKeys(q, s)));
  return out;
}

function backlog(s: QueueStats): Finding {
  const old = s.oldestWaitingAgeMs;
  const stale = s.waiting > 0 && old > 60_000;
  return {
    step: "backlog",
    status: stale ? "warn" : "ok",
    message: `${s.waiting} waiting, ${s.delayed} delayed, ${s.inFlight} in flight, ${s.blockedByKey} held behind their key; oldest waiting ${seconds(old)} s${stale ? " (jobs wait over a minute: too few workers, or none)" : ""}`,
    data: { waiting: s.waiting, delayed: s.delayed, inFlight: s.inFlight, blockedByKey: s.blockedByKey, oldestWaitingAgeMs: old },
  };
}

function completion(s: QueueStats): Finding {
  const idle = s.waiting > 0 && s.completionRatePerSec === 0;
  return {
    step: "completion",
    status: idle ? "warn" : "ok",
    message: `${s.completed} completed, ${s.completionRatePerSec.toFixed(1)}/s over the last ~10 s${idle ? " (jobs are waiting but none completes)" : ""}`,
    data: { completed: s.completed, completionRatePerSec: s.completionRatePerSec },
  };
}

function retries(s: QueueStats): Finding {
  const n = s.retries + s.redeliveries;
  return {
    step: "retries",
    status: n > 0 ? "warn" : "ok",
    message: `${plural(s.retries, "retry", "retries")} (failed attempts), ${plural(s.redeliveries, "redelivery", "redeliveries")} (lease expired or given back)`,
    data: { retries: s.retries, redeliveries: s.redeliveries },
  };
}

async function dlqFinding(b: CliBroker, dlq: string): Promise<Finding> {
  const q = b.queue(dlq);
  const depth = (await q.stats()).depth;
  if (depth === 0) return { step: "dead letters", status: "ok", message: `${dlq} is empty`, data: { queue: dlq, depth } };
  const classes = new Map<string, number>();
  let sampled = 0;
  let after: string | undefined;
  while (sampled < DLQ_SAMPLE) {
    const page = await q.browse({ limit: Math.min(1000, DLQ_SAMPLE - sampled), after });
    for (const j of page.jobs) classes.set(j.deadLetter?.errorClass ?? "?", (classes.get(j.deadLetter?.errorClass ?? "?") ?? 0) + 1);
    sampled += page.jobs.length;
    if (page.next === null) break;
    after = page.next;
  }
  const top = [...classes].sort((x, y) => y[1] - x[1])[0];
  const common = top === undefined ? "" : `; most common error class ${top[0]} (${top[1]} of ${sampled} read)`;
  return {
    step: "dead letters",
    status: "warn",
    message: `${plural(depth, "entry", "entries")} in ${dlq}${common} (sluice dlq list)`,
    data: { queue: dlq, depth, errorClasses: Object.fromEntries(classes), sampled },
  };
}

/** Keys held behind a failing head job: the head (lowest id with that key) is the poison job. */
async function blockedKeys(q: ReturnType<CliBroker["queue"]>, s: QueueStats): Promise<Finding[]> {
  if (s.blockedKeys.length === 0) return [{ step: "blocked keys", status: "ok", message: "no key is held behind a failing job" }];
  const wanted = new Map(s.blockedKeys.slice(0, 10).map((k) => [k.key, k]));
  const heads = new Map<string, BrowsedJob>();
  let after: string | undefined;
  for (let i = 0; i < POISON_SCAN_PAGES && heads.size < wanted.size; i++) {
    const page = await q.browse({ limit: 1000, after });
    for (const j of page.jobs) if (j.key !== null && wanted.has(j.key) && !heads.has(j.key)) heads.set(j.key, j);
    if (page.next === null) break;
    after = page.next;
  }
  const out: Finding[] = [];
  for (const [key, k] of wanted) {
    const head = heads.get(key);
    const info = head === undefined ? null : await q.getJob(head.id);
    const err = info?.lastError === undefined ? "" : `, last error: ${info.lastError}`;
    out.push({
      step: "blocked keys",
      status: "warn",
      message:
        head === undefined
          ? `key ${key} blocked for ${seconds(k.ageMs)} s behind a job that failed ${plural(k.attempts, "time")}`
          : `key ${key} blocked for ${seconds(k.ageMs)} s behind poison job ${head.id} (${plural(k.attempts, "attempt")}${err})`,
      data: { key, ageMs: k.ageMs, attempts: k.attempts, poisonJob: head?.id ?? null, lastError: info?.lastError ?? null },
    });
  }
  if (s.blockedKeys.length > wanted.size) out.push({ step: "blocked keys", status: "warn", message: `${s.blockedKeys.length - wanted.size} more blocked keys (sluice queues stats)` });
  return out;
}

// ─────────────────────────────── group ───────────────────────────────

export async function explainGroup(b: CliBroker, group: string, topic: string | undefined, sampleMs: number): Promise<Finding[]> {
  const listings = (await b.listGroups(topic === undefined ? {} : { topic })).filter((g) => g.group === group);
  if (listings.length === 0) return [{ step: "exists", status: "warn", message: `no group ${group}${topic === undefined ? "" : ` on topic ${topic}`} (no committed offsets and no members)` }];
  const out: Finding[] = [{ step: "exists", status: "ok", message: `group ${group} reads ${listings.map((l) => l.topic).join(", ")}` }];
  for (const l of listings) {
    out.push({ step: "members", status: l.members > 0 ? "ok" : "warn", message: `${plural(l.members, "member")} on ${l.topic}${l.members === 0 ? " (nobody consumes: lag will only grow)" : ""}`, data: { topic: l.topic, members: l.members } });
    const first = await b.groupLag(group, l.topic);
    out.push(lagFinding(first));
    if (sampleMs > 0) await new Promise((r) => setTimeout(r, sampleMs));
    const second = await b.groupLag(group, l.topic);
    out.push(...(await stuck(b, first, second, sampleMs)));
    out.push(skew(await b.describeTopic(l.topic)));
    out.push(resetsFinding(second));
  }
  return out;
}

/** Resets within the last day warn (a replay or a skip an operator made); older ones inform. */
function resetsFinding(g: GroupLag): Finding {
  const r = g.recentResets;
  if (r.length === 0) return { step: "resets", status: "ok", message: `no offset reset of ${g.group} on ${g.topic} remembered (the last 10 are kept)` };
  const moves = (x: GroupLag["recentResets"][number]) => x.partitions.map((p) => `p${p.partition} ${p.from ?? "none"}→${p.to}`).join(", ");
  const recent = Date.now() - r[0].at < 86_400_000;
  const list = r.slice(0, 3).map((x) => `${new Date(x.at).toISOString()} (${moves(x)})`).join("; ");
  return {
    step: "resets",
    status: recent ? "warn" : "info",
    message: `${plural(r.length, "reset")} of ${g.group} on ${g.topic} remembered, newest first: ${list}${recent ? " — records below the old positions are replays (msg.replay)" : ""}`,
    data: { topic: g.topic, resets: r },
  };
}

function lagFinding(g: GroupLag): Finding {
  const parts = g.partitions.map((p) => `p${p.partition} ${p.lagRecords} (${seconds(p.lagMs)} s)`).join(", ");
  return {
    step: "lag",
    status: g.totalRecords > 0 && g.maxLagMs > 60_000 ? "warn" : "ok",
    message: `${g.totalRecords} records behind on ${g.topic}, oldest ${seconds(g.maxLagMs)} s; per partition: ${parts}`,
    data: { topic: g.topic, totalRecords: g.totalRecords, maxLagMs: g.maxLagMs, partitions: g.partitions.map((p) => ({ partition: p.partition, lagRecords: p.lagRecords, lagMs: p.lagMs })) },
  };
}

/** Partitions with lag whose committed position did not move between the samples. */
async function stuck(b: CliBroker, a: GroupLag, c: GroupLag, sampleMs: number): Promise<Finding[]> {
  const out: Finding[] = [];
  let moving = 0;
  for (const p of c.partitions) {
    const before = a.partitions.find((x) => x.partition === p.partition);
    if (p.lagRecords === 0) continue;
    if (before === undefined || before.committedOffset !== p.committedOffset) {
      moving++;
      continue;
    }
    const offset = p.committedOffset ?? p.logStartOffset;
    let detail = "";
    try {
      const r = await b.fetch(c.topic, p.partition, offset, { maxBytes: 64 * 1024 });
      const rec = r.records.find((x) => x.offset === offset);
      if (rec !== undefined) detail = `, key ${rec.key === null ? "null" : Buffer.from(rec.key).toString("utf8")}, published ${new Date(rec.timestamp).toISOString()}`;
    } catch {
      // The record is only a detail: the partition and offset are the finding.
    }
    out.push({
      step: "stuck",
      status: "warn",
      message: `partition ${p.partition} of ${c.topic} did not move in ${seconds(sampleMs)} s with ${p.lagRecords} records behind: committed position ${offset}; the record at offset ${offset} is the likely poison record${detail} (sluice tail ${c.topic} --partition ${p.partition} --from ${offset} --max 1)`,
      data: { topic: c.topic, partition: p.partition, offset, lagRecords: p.lagRecords },
    });
  }
  if (out.length === 0) out.push({ step: "stuck", status: "ok", message: `no partition with lag is standing still (${moving} with lag moved in ${seconds(sampleMs)} s)` });
  return out;
}

// ─────────────────────────────── topic ───────────────────────────────

function skew(d: TopicDescription): Finding {
  const counts = d.partitions.map((p) => Math.max(0, p.highWatermark - p.logStartOffset));
  const total = counts.reduce((x, y) => x + y, 0);
  if (d.partitions.length < 2 || total === 0) return { step: "skew", status: "ok", message: `${d.name}: ${d.partitions.length < 2 ? "one partition" : "no records"}, no skew to measure` };
  const hot = counts.indexOf(Math.max(...counts));
  const share = counts[hot] / total;
  const fair = 1 / d.partitions.length;
  const skewed = share > 2 * fair && share > 0.5 * (1 + fair);
  return {
    step: "skew",
    status: skewed ? "warn" : "ok",
    message: `hottest partition of ${d.name} is ${hot} with ${(share * 100).toFixed(0)}% of its ${total} records (an even share is ${(fair * 100).toFixed(0)}%)${skewed ? ": a hot key; consumers of that partition fall behind first" : ""}`,
    data: { topic: d.name, hottestPartition: hot, share, records: counts },
  };
}

export async function explainTopic(b: CliBroker, name: string): Promise<Finding[]> {
  const topics = await b.listTopics();
  if (!topics.includes(name)) return [{ step: "exists", status: "warn", message: `no topic ${name}` }];
  const d = await b.describeTopic(name);
  const c = d.config;
  const size = d.partitions.reduce((x, p) => x + p.sizeBytes, 0);
  const records = d.partitions.reduce((x, p) => x + Math.max(0, p.highWatermark - p.logStartOffset), 0);
  const keepsAll = c.retentionMs < 0 && c.retentionBytes < 0;
  return [
    { step: "exists", status: "ok", message: `topic ${name}` },
    { step: "partitions", status: "ok", message: `${d.partitions.length}`, data: { partitions: d.partitions.length } },
    {
      step: "retention",
      status: keepsAll ? "info" : "ok",
      message: keepsAll ? "keeps everything (no retentionMs or retentionBytes): the log only grows" : `retentionMs ${c.retentionMs}, retentionBytes ${c.retentionBytes} per partition`,
      data: { retentionMs: c.retentionMs, retentionBytes: c.retentionBytes },
    },
    {
      step: "sizes",
      status: "ok",
      message: `${records} records, ${size} bytes; per partition: ${d.partitions.map((p) => `p${p.partition} ${p.sizeBytes} B`).join(", ")}`,
      data: { records, sizeBytes: size },
    },
    skew(d),
  ];
}
