// SPDX-License-Identifier: Apache-2.0
/**
 * What each request needs to be allowed (docs/security.md#authorization): the binary
 * protocol's table, one entry per request op (the compiler rejects a missing one), and the
 * helpers the HTTP route table uses, so both ports ask the same questions of the same
 * Authorizer (src/security/acl/model.ts).
 *
 * A denied request is answered as if the resource were absent when the caller may not even
 * see it (ACL-4: "absent" and "forbidden" look the same), and with FORBIDDEN otherwise. Creating
 * is always FORBIDDEN: the check comes before any existence check, so it reveals nothing.
 */
import { ForbiddenError, NotFoundError, QueueNotFoundError, TopicNotFoundError, ValidationError } from "../errors.js";
import { CLUSTER, type Authorizer, type Need, type ResourceType } from "../security/acl/model.js";
import type { QueueConfig } from "../queues/types.js";
import { allOps, type Frame, type RequestOpName } from "../wire/index.js";
import type { Session } from "./session.js";

type Needs = (s: Session, f: Frame) => Need[];

const topic = (op: Need["op"], name: unknown): Need => ({ op, type: "topic", name: nameOf(name) });
const queue = (op: Need["op"], name: unknown): Need => ({ op, type: "queue", name: nameOf(name) });
const group = (op: Need["op"], name: unknown): Need => ({ op, type: "group", name: nameOf(name) });
const cluster = (op: Need["op"]): Need => ({ op, type: "cluster", name: CLUSTER });

function nameOf(v: unknown): string {
  // The handler validates the name fully; an absent or non-string one is refused there.
  if (typeof v !== "string") throw new ValidationError("a resource name must be a string");
  return v;
}

/** A queue declared with a config may name its dead-letter queue: writing there needs create on it. */
export function queueConfigNeeds(name: unknown, config: unknown): Need[] {
  if (config === undefined || config === null) return [];
  const out = [queue("create", name)];
  const dlq = (config as QueueConfig).deadLetter;
  if (typeof dlq === "string") out.push(queue("create", dlq));
  return out;
}

const NONE: Needs = () => [];

function queueAdminNeeds(_s: Session, f: Frame): Need[] {
  const m = f.meta;
  const q = m.queue;
  switch (m.action) {
    case "list":
      return []; // filtered: only what the caller can see is listed
    case "declare":
      return queueConfigNeeds(q, m.config ?? {});
    case "stats":
    case "settings":
      return [queue("describe", q)];
    case "purge":
      return [queue("purge", q)];
    case "remove":
      // Removing a waiting job destroys it unrun, as a purge does.
      return [queue("purge", q)];
    case "delete":
      return [queue("delete", q)];
    case "redrive": {
      const target = (m.opts as { target?: unknown } | undefined)?.target;
      return [{ op: "redrive", type: "dlq", name: nameOf(q) }, ...(typeof target === "string" ? [queue("publish", target)] : [])];
    }
    default:
      return [queue("alter", q)];
  }
}

function scheduleNeeds(_s: Session, f: Frame): Need[] {
  const q = f.meta.queue;
  if (f.meta.action === "list") return [queue("describe", q)];
  // A schedule enqueues jobs: it is a publish to the queue, and changing one alters it.
  return [queue("publish", q), queue("alter", q), ...queueConfigNeeds(q, f.meta.config)];
}

function memberNeeds(s: Session, f: Frame): Need[] {
  const m = s.members.get(typeof f.meta.sub === "number" ? f.meta.sub : -1);
  return m ? [group("commit", m.group)] : [];
}

function workerNeeds(s: Session, f: Frame): Need[] {
  const w = s.workers.get(typeof f.meta.worker === "number" ? f.meta.worker : -1);
  return w ? [queue("ack", w.queueName)] : [];
}

/** The binary protocol: what each request op needs (HELLO is the handshake's). */
export const OP_NEEDS: { readonly [N in Exclude<RequestOpName, "Hello">]: Needs } = {
  Ping: NONE,
  CreateTopic: (_s, f) => [topic("create", f.meta.name)],
  DeleteTopic: (_s, f) => [topic("delete", f.meta.name)],
  ListTopics: NONE, // filtered
  DescribeTopic: (_s, f) => [topic("describe", f.meta.name)],
  AlterTopic: (_s, f) => [topic("alter", f.meta.name)],
  // A producer id is an allocation, harmless; what it writes is checked per publish.
  InitProducer: NONE,
  Publish: (_s, f) => [topic("publish", f.meta.topic)],
  PublishEncoded: (_s, f) => [topic("publish", f.meta.topic)],
  Fetch: (_s, f) => [topic("consume", f.meta.topic)],
  OffsetForTimestamp: (_s, f) => [topic("consume", f.meta.topic)],
  Subscribe: (_s, f) => [topic("consume", f.meta.topic), group("consume", f.meta.group)],
  Commit: memberNeeds,
  Unsubscribe: NONE, // the caller's own subscription
  ResetGroup: (_s, f) => (f.meta.dryRun === true ? [group("describe", f.meta.group), topic("describe", f.meta.topic)] : [group("reset-offsets", f.meta.group), topic("describe", f.meta.topic)]),
  GroupLag: (_s, f) => [group("describe", f.meta.group), topic("describe", f.meta.topic)],
  ListGroups: NONE, // filtered
  QueueEnqueue: (_s, f) => [queue("publish", f.meta.queue), ...queueConfigNeeds(f.meta.queue, f.meta.config)],
  QueueWork: (_s, f) => [queue("consume", f.meta.queue), ...queueConfigNeeds(f.meta.queue, f.meta.config)],
  QueueSettle: workerNeeds,
  QueueSettleBatch: workerNeeds,
  QueueStop: NONE, // the caller's own worker
  QueueAdmin: queueAdminNeeds,
  // Reading a job or browsing returns payloads: that is consuming, not describing.
  QueueGetJob: (_s, f) => [queue("consume", f.meta.queue)],
  QueueBrowse: (_s, f) => [queue("consume", f.meta.queue)],
  QueueProgress: workerNeeds,
  QueueEvents: (_s, f) => [queue("describe", f.meta.queue)],
  QueueSchedule: scheduleNeeds,
};

export { topic as topicNeed, queue as queueNeed, group as groupNeed, cluster as clusterNeed };

/** The error for a denied need (ACL-4). */
export function deniedError(authz: Authorizer, principal: string, need: Need): Error {
  if (need.op === "create" || authz.canSee(principal, need.type, need.name)) {
    return new ForbiddenError(`not allowed: ${need.op} on ${need.type} ${JSON.stringify(need.name)} for ${principal}`);
  }
  return absentError(need.type, need.name);
}

/** Exactly what the broker says for a resource that does not exist. */
export function absentError(type: ResourceType, name: string): Error {
  switch (type) {
    case "topic":
      return new TopicNotFoundError(name);
    case "queue":
    case "dlq":
      return new QueueNotFoundError(name);
    default:
      return new NotFoundError(`${type} ${JSON.stringify(name)} does not exist`);
  }
}

/** The first need of `needs` that `principal` is not allowed, or null. */
export function firstDenied(authz: Authorizer, principal: string, needs: readonly Need[]): Need | null {
  for (const n of needs) if (!authz.allows(principal, n)) return n;
  return null;
}

const NEEDS_BY_CODE: ReadonlyMap<number, Needs> = new Map(
  allOps()
    .filter((o) => o.kind === "request" && o.name !== "Hello")
    .map((o) => [o.code, OP_NEEDS[o.name as keyof typeof OP_NEEDS]]),
);

/** What a request frame needs (nothing for an opcode without a table entry: it is refused as unknown). */
export function needsOf(s: Session, f: Frame): Need[] {
  const fn = NEEDS_BY_CODE.get(f.op);
  return fn === undefined ? [] : fn(s, f);
}
