// SPDX-License-Identifier: Apache-2.0
/**
 * What each request needs to be allowed (docs/security.md#authorization): the binary
 * protocol's table, one entry per request op (the compiler rejects a missing one), each mapped
 * onto the shared table of needs by operation (src/security/acl/needs.ts, which the embedded
 * principal view uses too: ACL-5), and the helpers the HTTP route table uses, so every port
 * asks the same questions of the same Authorizer (src/security/acl/model.ts).
 *
 * Denied requests get `deniedError` (ACL-4, src/security/acl/needs.ts).
 */
import type { Need } from "../security/acl/model.js";
import { NEEDS, clusterNeed, groupNeed, queueConfigNeeds, queueNeed, topicNeed } from "../security/acl/needs.js";
import { allOps, type Frame, type RequestOpName } from "../wire/index.js";
import type { Session } from "./session.js";

type Needs = (s: Session, f: Frame) => Need[];

const NONE: Needs = () => [];

function queueAdminNeeds(_s: Session, f: Frame): Need[] {
  const m = f.meta;
  const q = m.queue;
  switch (m.action) {
    case "list":
      return []; // filtered: only what the caller can see is listed
    case "declare":
      return NEEDS.declareQueue(q, m.config);
    case "stats":
    case "settings":
      return NEEDS.describeQueue(q);
    case "purge":
      return NEEDS.purgeQueue(q);
    case "remove":
      return NEEDS.removeJob(q);
    case "delete":
      return NEEDS.deleteQueue(q);
    case "redrive":
      return NEEDS.redrive(q, (m.opts as { target?: unknown } | undefined)?.target);
    default:
      return NEEDS.alterQueue(q);
  }
}

function scheduleNeeds(_s: Session, f: Frame): Need[] {
  const q = f.meta.queue;
  return f.meta.action === "list" ? NEEDS.listSchedules(q) : NEEDS.changeSchedule(q, f.meta.config);
}

function memberNeeds(s: Session, f: Frame): Need[] {
  const m = s.members.get(typeof f.meta.sub === "number" ? f.meta.sub : -1);
  return m ? NEEDS.commit(m.group) : [];
}

function workerNeeds(s: Session, f: Frame): Need[] {
  const w = s.workers.get(typeof f.meta.worker === "number" ? f.meta.worker : -1);
  return w ? NEEDS.settle(w.queueName) : [];
}

/** The binary protocol: what each request op needs (HELLO is the handshake's). */
export const OP_NEEDS: { readonly [N in Exclude<RequestOpName, "Hello">]: Needs } = {
  Ping: NONE,
  CreateTopic: (_s, f) => NEEDS.createTopic(f.meta.name),
  DeleteTopic: (_s, f) => NEEDS.deleteTopic(f.meta.name),
  ListTopics: NONE, // filtered
  DescribeTopic: (_s, f) => NEEDS.describeTopic(f.meta.name),
  AlterTopic: (_s, f) => NEEDS.alterTopic(f.meta.name),
  // A producer id is an allocation, harmless; what it writes is checked per publish.
  InitProducer: NONE,
  Publish: (_s, f) => NEEDS.publish(f.meta.topic),
  PublishEncoded: (_s, f) => NEEDS.publish(f.meta.topic),
  Fetch: (_s, f) => NEEDS.consume(f.meta.topic),
  OffsetForTimestamp: (_s, f) => NEEDS.consume(f.meta.topic),
  Subscribe: (_s, f) => NEEDS.subscribe(f.meta.topic, f.meta.group),
  Commit: memberNeeds,
  Unsubscribe: NONE, // the caller's own subscription
  ResetGroup: (_s, f) => NEEDS.resetGroup(f.meta.group, f.meta.topic, f.meta.dryRun === true),
  GroupLag: (_s, f) => NEEDS.groupLag(f.meta.group, f.meta.topic),
  ListGroups: (_s, f) => NEEDS.listGroups(f.meta.topic), // and filtered
  QueueEnqueue: (_s, f) => NEEDS.enqueue(f.meta.queue, f.meta.config),
  QueueWork: (_s, f) => NEEDS.work(f.meta.queue, f.meta.config),
  QueueSettle: workerNeeds,
  QueueSettleBatch: workerNeeds,
  QueueStop: NONE, // the caller's own worker
  QueueAdmin: queueAdminNeeds,
  QueueGetJob: (_s, f) => NEEDS.readJobs(f.meta.queue),
  QueueBrowse: (_s, f) => NEEDS.readJobs(f.meta.queue),
  QueueProgress: workerNeeds,
  QueueEvents: (_s, f) => NEEDS.queueEvents(f.meta.queue),
  QueueSchedule: scheduleNeeds,
};

export { topicNeed, queueNeed, groupNeed, clusterNeed, queueConfigNeeds };
export { absentError, deniedError, firstDenied } from "../security/acl/needs.js";

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
