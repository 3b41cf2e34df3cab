// SPDX-License-Identifier: Apache-2.0
/**
 * What applying a topology would change on a broker (`planTopology`), and applying it
 * (`applyTopology`), through the Broker API only, so it works embedded and through a server.
 *
 * - Topics: created when missing; a different retention (`retentionMs`, `retentionBytes`) is
 *   changed with `alterTopic`. A different partition count is an error that stops the whole
 *   apply (consumers key on partitions); any other difference (segments, durability) is fixed
 *   at creation: reported as refused and left as it is.
 * - Queues: declared (`broker.queue(name, config)`) when missing or when their stored config,
 *   defaults filled in, differs from the file's. Declaring replaces the whole stored config, so
 *   a field the file leaves out returns to its default.
 * - Groups: a group exists once it has committed offsets (or members). Declaring one commits
 *   its start position (`resetGroup` to `latest`, or `earliest`) on every partition, so its
 *   members later start there.
 * Nothing is ever deleted. Applying the same file twice: the second plan is empty.
 */
import { GroupActiveError, ValidationError } from "../errors.js";
import { resolveQueueConfig, type ResolvedQueueConfig } from "../queues/config.js";
import type { QueueConfig } from "../queues/types.js";
import { resolveTopicConfig } from "../store/topic-config.js";
import type { Broker, TopicAlteration, TopicConfig } from "../types.js";
import type { Topology } from "./parse.js";

export interface FieldChange {
  field: string;
  from: unknown;
  to: unknown;
}

export type PlanEntry =
  | { op: "create"; kind: "topic"; name: string; config: TopicConfig }
  | { op: "create"; kind: "queue"; name: string; config: QueueConfig; /** Its dead-letter queue, created with it. */ deadLetter: string | null }
  | { op: "change"; kind: "queue"; name: string; config: QueueConfig; changes: FieldChange[] }
  /** Retention, the part of a topic's config that can change (`alterTopic`). */
  | { op: "change"; kind: "topic"; name: string; retention: TopicAlteration; changes: FieldChange[] }
  | { op: "create"; kind: "group"; name: string; topic: string; start: "earliest" | "latest" }
  /** A difference apply will not make. `fatal`: apply changes nothing while it remains. */
  | { op: "refuse"; kind: "topic"; name: string; changes: FieldChange[]; reason: string; fatal: boolean };

export interface TopologyPlan {
  entries: PlanEntry[];
  /** Why apply would change nothing (the fatal refusals); empty when it can run. */
  errors: string[];
}

export interface ApplyResult {
  /** Entries applied (every create and change; refusals are not). */
  applied: number;
  /** Groups left alone because members joined them meanwhile (they have a position then). */
  skippedGroups: string[];
}

/** Only the queue handles of both implementations read the stored config (QUEUE_ADMIN settings). */
type SettingsReader = { settings?: () => Promise<ResolvedQueueConfig> };

/** The config `name` has now, defaults filled in. */
export async function readQueueSettings(broker: Broker, name: string): Promise<ResolvedQueueConfig> {
  const q = broker.queue(name) as unknown as SettingsReader;
  if (typeof q.settings !== "function") throw new ValidationError("this broker cannot report a queue's config (needed to compare it with the file)");
  return q.settings();
}

/** `a` and `b` flattened to dotted fields (`backoff.minDelayMs`), the ones that differ. */
export function diffFields(from: object, to: object, prefix = ""): FieldChange[] {
  const out: FieldChange[] = [];
  const a = from as Record<string, unknown>;
  const b = to as Record<string, unknown>;
  for (const k of [...new Set([...Object.keys(a), ...Object.keys(b)])].sort()) {
    const x = a[k];
    const y = b[k];
    const plain = (v: unknown): v is object => v !== null && typeof v === "object" && !Array.isArray(v);
    if (plain(x) && plain(y)) out.push(...diffFields(x, y, `${prefix}${k}.`));
    else if (JSON.stringify(x) !== JSON.stringify(y)) out.push({ field: `${prefix}${k}`, from: x ?? null, to: y ?? null });
  }
  return out;
}

/** The changes applying `topology` would make on `broker` (reads only). */
export async function planTopology(broker: Broker, topology: Topology): Promise<TopologyPlan> {
  const entries: PlanEntry[] = [];
  const errors: string[] = [];
  const topics = new Set(await broker.listTopics());
  for (const t of topology.topics) {
    const desired = resolveTopicConfig(t.config);
    let existingGroups = new Set<string>();
    if (!topics.has(t.name)) entries.push({ op: "create", kind: "topic", name: t.name, config: t.config });
    else {
      const current = (await broker.describeTopic(t.name)).config;
      const changes = diffFields(current, desired);
      const parts = changes.find((c) => c.field === "partitions");
      if (parts !== undefined) {
        const reason = `cannot change partitions of an existing topic: ${t.name} has ${current.partitions}, file says ${desired.partitions}`;
        entries.push({ op: "refuse", kind: "topic", name: t.name, changes: [parts], reason, fatal: true });
        errors.push(reason);
      }
      const retention = changes.filter((c) => c.field === "retentionMs" || c.field === "retentionBytes");
      if (retention.length > 0) {
        const alteration: TopicAlteration = Object.fromEntries(retention.map((c) => [c.field, c.to]));
        entries.push({ op: "change", kind: "topic", name: t.name, retention: alteration, changes: retention });
      }
      const rest = changes.filter((c) => c.field !== "partitions" && c.field !== "retentionMs" && c.field !== "retentionBytes");
      if (rest.length > 0) {
        const reason = "only retention can change on an existing topic; left as it is";
        entries.push({ op: "refuse", kind: "topic", name: t.name, changes: rest, reason, fatal: false });
      }
      const listed = await broker.listGroups({ topic: t.name });
      existingGroups = new Set(listed.filter((g) => g.committedPartitions > 0 || g.members > 0).map((g) => g.group));
    }
    for (const g of t.groups) if (!existingGroups.has(g.name)) entries.push({ op: "create", kind: "group", name: g.name, topic: t.name, start: g.start });
  }
  const queues = new Set(await broker.listQueues());
  const declared = new Set(topology.queues.map((q) => q.name));
  for (const q of topology.queues) {
    const desired = resolveQueueConfig(q.name, q.config);
    if (!queues.has(q.name)) {
      const dl = desired.deadLetter;
      const deadLetter = dl !== null && !queues.has(dl) && !declared.has(dl) ? dl : null;
      entries.push({ op: "create", kind: "queue", name: q.name, config: q.config, deadLetter });
      continue;
    }
    const changes = diffFields(await readQueueSettings(broker, q.name), desired);
    if (changes.length > 0) entries.push({ op: "change", kind: "queue", name: q.name, config: q.config, changes });
  }
  return { entries, errors };
}

/** True when applying the plan would change nothing. */
export function planIsEmpty(plan: TopologyPlan): boolean {
  return plan.entries.every((e) => e.op === "refuse") && plan.errors.length === 0;
}

/**
 * Applies a plan: topics, then their groups, then queues, in the file's order. Refuses to start
 * (ValidationError, nothing changed) while the plan has errors.
 */
export async function applyTopology(broker: Broker, plan: TopologyPlan): Promise<ApplyResult> {
  if (plan.errors.length > 0) throw new ValidationError(`${plan.errors.join("; ")} (nothing was applied)`);
  const result: ApplyResult = { applied: 0, skippedGroups: [] };
  for (const e of plan.entries) {
    if (e.op === "refuse") continue;
    if (e.kind === "topic" && e.op === "change") await broker.alterTopic(e.name, e.retention);
    else if (e.kind === "topic") await broker.createTopic(e.name, e.config);
    else if (e.kind === "group") {
      try {
        await broker.resetGroup(e.name, e.topic, e.start);
      } catch (err) {
        if (!(err instanceof GroupActiveError)) throw err;
        result.skippedGroups.push(`${e.name} (${e.topic})`);
        continue;
      }
    } else {
      // A declaring handle stores its config at once; stats() waits for that to be durable.
      await broker.queue(e.name, e.config).stats();
    }
    result.applied++;
  }
  return result;
}
