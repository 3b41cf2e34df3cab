// SPDX-License-Identifier: Apache-2.0
/**
 * What each operation needs to be allowed, and the error a denied one gets
 * (docs/security.md#authorization): the one table both the server's ports
 * (src/server/permissions.ts, keyed by wire op) and the embedded principal view
 * (src/broker/principal-needs.ts, keyed by Broker and Queue method) derive their checks from,
 * so an operation asks the same questions of the same Authorizer however it arrives (ACL-1,
 * ACL-5).
 *
 * A denied request is answered as if the resource were absent when the caller may not even
 * see it (ACL-4: "absent" and "forbidden" look the same), and with FORBIDDEN otherwise.
 * Creating is always FORBIDDEN: the check comes before any existence check, so it reveals
 * nothing.
 */
import { ForbiddenError, NotFoundError, QueueNotFoundError, TopicNotFoundError, ValidationError } from "../../errors.js";
import { CLUSTER, type Authorizer, type Need, type Operation, type ResourceType } from "./model.js";

export const topicNeed = (op: Operation, name: unknown): Need => ({ op, type: "topic", name: nameOf(name) });
export const queueNeed = (op: Operation, name: unknown): Need => ({ op, type: "queue", name: nameOf(name) });
export const groupNeed = (op: Operation, name: unknown): Need => ({ op, type: "group", name: nameOf(name) });
export const clusterNeed = (op: Operation): Need => ({ op, type: "cluster", name: CLUSTER });

function nameOf(v: unknown): string {
  // The operation validates the name fully; an absent or non-string one is refused here.
  if (typeof v !== "string") throw new ValidationError("a resource name must be a string");
  return v;
}

/** A queue declared with a config may name its dead-letter queue: writing there needs create on it. */
export function queueConfigNeeds(name: unknown, config: unknown): Need[] {
  if (config === undefined || config === null) return [];
  const out = [queueNeed("create", name)];
  const dlq = typeof config === "object" && "deadLetter" in config ? config.deadLetter : undefined;
  if (typeof dlq === "string") out.push(queueNeed("create", dlq));
  return out;
}

/**
 * The needs of each operation, by what it does (not by how it is asked): the wire table and
 * the embedded table both map their requests onto these. Lists need nothing: they are filtered
 * (ACL-4).
 */
export const NEEDS = {
  createTopic: (name: unknown): Need[] => [topicNeed("create", name)],
  deleteTopic: (name: unknown): Need[] => [topicNeed("delete", name)],
  describeTopic: (name: unknown): Need[] => [topicNeed("describe", name)],
  alterTopic: (name: unknown): Need[] => [topicNeed("alter", name)],
  publish: (topic: unknown): Need[] => [topicNeed("publish", topic)],
  /** Fetching, and finding an offset by timestamp. */
  consume: (topic: unknown): Need[] => [topicNeed("consume", topic)],
  subscribe: (topic: unknown, group: unknown): Need[] => [topicNeed("consume", topic), groupNeed("consume", group)],
  commit: (group: unknown): Need[] => [groupNeed("commit", group)],
  resetGroup: (group: unknown, topic: unknown, dryRun: boolean): Need[] =>
    dryRun ? [groupNeed("describe", group), topicNeed("describe", topic)] : [groupNeed("reset-offsets", group), topicNeed("describe", topic)],
  groupLag: (group: unknown, topic: unknown): Need[] => [groupNeed("describe", group), topicNeed("describe", topic)],
  /** Filtered; narrowed to a topic the caller may not see, it answers as for an absent one (ACL-4). */
  listGroups: (topic: unknown): Need[] => (topic === undefined ? [] : [topicNeed("describe", topic)]),
  enqueue: (queue: unknown, config: unknown): Need[] => [queueNeed("publish", queue), ...queueConfigNeeds(queue, config)],
  work: (queue: unknown, config: unknown): Need[] => [queueNeed("consume", queue), ...queueConfigNeeds(queue, config)],
  /** Settling (ack, nack, extend, retry-after) and progress of a leased job. */
  settle: (queue: unknown): Need[] => [queueNeed("ack", queue)],
  declareQueue: (queue: unknown, config: unknown): Need[] => queueConfigNeeds(queue, config ?? {}),
  describeQueue: (queue: unknown): Need[] => [queueNeed("describe", queue)],
  purgeQueue: (queue: unknown): Need[] => [queueNeed("purge", queue)],
  // Removing a waiting job destroys it unrun, as a purge does.
  removeJob: (queue: unknown): Need[] => [queueNeed("purge", queue)],
  deleteQueue: (queue: unknown): Need[] => [queueNeed("delete", queue)],
  redrive: (dlq: unknown, target: unknown): Need[] => [{ op: "redrive", type: "dlq", name: nameOf(dlq) }, ...(typeof target === "string" ? [queueNeed("publish", target)] : [])],
  alterQueue: (queue: unknown): Need[] => [queueNeed("alter", queue)],
  // Reading a job or browsing returns payloads: that is consuming, not describing.
  readJobs: (queue: unknown): Need[] => [queueNeed("consume", queue)],
  queueEvents: (queue: unknown): Need[] => [queueNeed("describe", queue)],
  listSchedules: (queue: unknown): Need[] => [queueNeed("describe", queue)],
  // A schedule enqueues jobs: it is a publish to the queue, and changing one alters it.
  changeSchedule: (queue: unknown, config: unknown): Need[] => [queueNeed("publish", queue), queueNeed("alter", queue), ...queueConfigNeeds(queue, config)],
} as const;

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
