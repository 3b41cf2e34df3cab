// SPDX-License-Identifier: Apache-2.0
/**
 * What each call of an embedded principal view needs to be allowed (`broker.as(principal)`,
 * src/broker/principal-view.ts): one entry per `Broker` method, per `Queue` method, and per
 * settling method of the objects they hand out. Each entry maps its call onto the shared table
 * of needs by operation (src/security/acl/needs.ts), which the server's wire table maps onto
 * too, so a call asks the same questions embedded as over the network (ACL-5).
 *
 * The mapped types make the compiler reject a method without an entry: a method added to
 * `Broker` or `Queue` cannot reach a view unchecked.
 */
import type { Need } from "../security/acl/model.js";
import { NEEDS } from "../security/acl/needs.js";
import type { Broker } from "../types.js";
import type { Job, Queue, QueueConfig } from "../queues/types.js";

/** An entry: the needs of a call with these arguments. */
type Entry<F> = F extends (...args: infer A) => unknown ? (...args: A) => Need[] : never;

/**
 * Lists need nothing: they show only what the principal may see (ACL-4). `queue()` needs
 * nothing: it returns a handle whose every call is checked (QUEUE_NEEDS). `close()` ends only
 * what the view opened.
 */
export const BROKER_NEEDS: { readonly [M in keyof Broker]-?: Entry<Broker[M]> } = {
  createTopic: (name) => NEEDS.createTopic(name),
  deleteTopic: (name) => NEEDS.deleteTopic(name),
  listTopics: () => [],
  describeTopic: (name) => NEEDS.describeTopic(name),
  alterTopic: (name) => NEEDS.alterTopic(name),
  publish: (topic) => NEEDS.publish(topic),
  publishBatch: (topic) => NEEDS.publish(topic),
  // A producer id is an allocation, harmless; what it writes is checked per publish.
  initProducer: () => [],
  fetch: (topic) => NEEDS.consume(topic),
  offsetForTimestamp: (topic) => NEEDS.consume(topic),
  subscribe: (topic, opts) => NEEDS.subscribe(topic, opts?.group),
  resetGroup: (group, topic, _to, opts) => NEEDS.resetGroup(group, topic, opts?.dryRun === true),
  queue: () => [],
  listQueues: () => [],
  groupLag: (group, topic) => NEEDS.groupLag(group, topic),
  listGroups: (opts) => NEEDS.listGroups(opts?.topic),
  close: () => [],
  [Symbol.asyncDispose]: () => [],
};

/** The queue a handle names, and the config it declares (every call of such a handle carries it, as a client's does). */
export interface QueueRef {
  name: string;
  config: QueueConfig | undefined;
}

type QueueEntry<F> = F extends (...args: infer A) => unknown ? (q: QueueRef, ...args: A) => Need[] : never;

export const QUEUE_NEEDS: { readonly [M in Exclude<keyof Queue, "name">]-?: QueueEntry<Queue[M]> } = {
  enqueue: (q) => NEEDS.enqueue(q.name, q.config),
  enqueueBatch: (q) => NEEDS.enqueue(q.name, q.config),
  enqueueFlow: (q) => NEEDS.enqueue(q.name, q.config),
  work: (q) => NEEDS.work(q.name, q.config),
  process: (q) => NEEDS.work(q.name, q.config),
  stats: (q) => NEEDS.describeQueue(q.name),
  purge: (q) => NEEDS.purgeQueue(q.name),
  remove: (q) => NEEDS.removeJob(q.name),
  redrive: (q, opts) => NEEDS.redrive(q.name, opts?.target),
  getJob: (q) => NEEDS.readJobs(q.name),
  browse: (q) => NEEDS.readJobs(q.name),
  events: (q) => NEEDS.queueEvents(q.name),
  upsertSchedule: (q) => NEEDS.changeSchedule(q.name, q.config),
  listSchedules: (q) => NEEDS.listSchedules(q.name),
  pauseSchedule: (q) => NEEDS.changeSchedule(q.name, q.config),
  resumeSchedule: (q) => NEEDS.changeSchedule(q.name, q.config),
  removeSchedule: (q) => NEEDS.changeSchedule(q.name, q.config),
};

/** What a live subscription or worker must still be allowed after a policy change (ACL-3), as the server re-checks its members and workers. */
export const LIVE_NEEDS = {
  subscription: (topic: string, group: string): Need[] => NEEDS.subscribe(topic, group),
  worker: (queue: string): Need[] => NEEDS.work(queue, undefined),
  events: (queue: string): Need[] => NEEDS.queueEvents(queue),
};

/** The methods of a delivered job that change it: settling and progress (the job's own data and `childResults()` need nothing more). */
export const JOB_SETTLES: ReadonlySet<keyof Job> = new Set<keyof Job>(["ack", "nack", "extend", "retryAfter", "progress"]);
