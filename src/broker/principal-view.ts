// SPDX-License-Identifier: Apache-2.0
/**
 * `broker.as(principal)`: the embedded broker as one principal sees it (docs/security.md,
 * "Embedded mode"). The broker itself has full rights; a view checks every call against the
 * same policy file and Authorizer as the server (`<dataDir>/security/acl.json`), with the same
 * needs per operation (src/broker/principal-needs.ts, derived from the table the server's wire
 * ops use), and the same answers: lists filtered, a resource the principal may not see answers
 * exactly as an absent one, creating answers FORBIDDEN, tenants confined to their prefix, live
 * subscriptions and workers ended with ForbiddenError when the policy changes (ACL-5).
 *
 * Many views share one broker, so one process can serve many tenants. A view's `close()` ends
 * what it opened (subscriptions, workers, event readers); the broker stays open.
 */
import { BrokerClosedError, ForbiddenError, ValidationError } from "../errors.js";
import type { PolicyAuthorization } from "../security/acl/authorization.js";
import type { Need } from "../security/acl/model.js";
import type { AuditActor } from "../security/audit/record.js";
import type { QueueConfig } from "../queues/types.js";
import type {
  Broker,
  FetchOptions,
  FetchResult,
  GroupLag,
  GroupListing,
  ProducerIdentity,
  PublishBatchOptions,
  PublishOptions,
  PublishReceipt,
  PublishRecord,
  PublishValue,
  ResetResult,
  ResetTarget,
  SubscribeOptions,
  Subscription,
  TopicAlteration,
  TopicConfig,
  TopicDescription,
} from "../types.js";
import type { EmbeddedBroker } from "./broker.js";
import { BROKER_NEEDS, LIVE_NEEDS } from "./principal-needs.js";
import { NEEDS } from "../security/acl/needs.js";
import { GuardedSubscription, type LiveHandle, type ViewContext } from "./principal-handles.js";
import { GuardedQueue } from "./principal-queue.js";

/** Principal names as the policy file spells them. */
const PRINCIPAL_RE = /^[A-Za-z0-9._@-]{1,128}$/;

export class PrincipalBroker implements Broker, ViewContext {
  readonly actor: AuditActor;
  private gate: PolicyAuthorization | null = null;
  private readonly loading: Promise<PolicyAuthorization>;
  private readonly live = new Set<LiveHandle>();
  private unlisten: (() => void) | null = null;
  private closed = false;

  constructor(
    private readonly host: EmbeddedBroker,
    readonly principal: string,
    authorization: Promise<PolicyAuthorization>,
  ) {
    if (typeof principal !== "string" || !PRINCIPAL_RE.test(principal)) throw new ValidationError(`principal ${JSON.stringify(principal)}: 1-128 characters of [A-Za-z0-9._@-]`);
    this.actor = Object.freeze({ principal, source: "embedded" });
    this.loading = authorization.then((g) => (this.gate = g));
    this.loading.catch(() => {}); // reported by the first call
  }

  // ───────────────────────────── checks (ViewContext) ─────────────────────────────

  /**
   * Once the policy is loaded the check is synchronous, so calls reach the broker in the order
   * they were made; a denied one is audited as the server's are (principal, source `embedded`).
   */
  run<R>(needs: () => readonly Need[], op: () => Promise<R>): Promise<R> {
    const g = this.gate;
    if (g === null) return this.loading.then((loaded) => this.checked(loaded, needs, op));
    try {
      return this.checked(g, needs, op);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  private checked<R>(g: PolicyAuthorization, needs: () => readonly Need[], op: () => Promise<R>): Promise<R> {
    if (this.closed) throw new BrokerClosedError();
    g.check(this.principal, needs(), this.actor);
    return op();
  }

  decideNow(needs: readonly Need[]): Error | null | undefined {
    if (this.closed) throw new BrokerClosedError();
    if (this.gate === null) return undefined;
    try {
      this.gate.check(this.principal, needs, this.actor);
      return null;
    } catch (e) {
      return e instanceof Error ? e : new ForbiddenError(String(e));
    }
  }

  checkNow(needs: readonly Need[]): void {
    if (this.gate === null) throw new ForbiddenError("the authorization policy is not loaded yet");
    this.gate.check(this.principal, needs, this.actor);
  }

  allows(needs: readonly Need[]): boolean {
    const g = this.gate;
    return g !== null && needs.every((n) => g.allows(this.principal, n));
  }

  /** Only views with live handles listen for policy changes: a view made per request costs nothing after it. */
  track(h: LiveHandle): () => void {
    this.live.add(h);
    if (this.unlisten === null && this.gate !== null) {
      this.unlisten = this.gate.onChange(() => {
        for (const x of [...this.live]) x.reauthorize();
      });
    }
    return () => {
      this.live.delete(h);
      if (this.live.size === 0) {
        this.unlisten?.();
        this.unlisten = null;
      }
    };
  }

  private visible<T>(type: "topic" | "queue" | "group", items: readonly T[], name: (item: T) => string): T[] {
    return this.gate === null ? [] : this.gate.visible(this.principal, type, items, name);
  }

  // ───────────────────────────────── topics ─────────────────────────────────

  createTopic(name: string, config?: TopicConfig): Promise<TopicDescription> {
    return this.run(() => BROKER_NEEDS.createTopic(name, config), () => this.host.createTopic(name, config, this.actor));
  }

  deleteTopic(name: string): Promise<void> {
    return this.run(() => BROKER_NEEDS.deleteTopic(name), () => this.host.deleteTopic(name, this.actor));
  }

  listTopics(): Promise<string[]> {
    return this.run(
      () => BROKER_NEEDS.listTopics(),
      async () => this.visible("topic", await this.host.listTopics(), (t) => t),
    );
  }

  describeTopic(name: string): Promise<TopicDescription> {
    return this.run(() => BROKER_NEEDS.describeTopic(name), () => this.host.describeTopic(name));
  }

  alterTopic(name: string, changes: TopicAlteration): Promise<TopicDescription> {
    return this.run(() => BROKER_NEEDS.alterTopic(name, changes), () => this.host.alterTopic(name, changes, this.actor));
  }

  publish(topic: string, value: PublishValue, opts?: PublishOptions): Promise<PublishReceipt> {
    return this.run(() => BROKER_NEEDS.publish(topic, value, opts), () => this.host.publish(topic, value, opts));
  }

  publishBatch(topic: string, records: PublishRecord[], opts?: PublishBatchOptions): Promise<PublishReceipt[]> {
    return this.run(() => BROKER_NEEDS.publishBatch(topic, records, opts), () => this.host.publishBatch(topic, records, opts));
  }

  initProducer(producerId?: number): Promise<ProducerIdentity> {
    return this.run(() => BROKER_NEEDS.initProducer(producerId), () => this.host.initProducer(producerId));
  }

  fetch(topic: string, partition: number, offset: number, opts?: FetchOptions): Promise<FetchResult> {
    return this.run(() => BROKER_NEEDS.fetch(topic, partition, offset, opts), () => this.host.fetch(topic, partition, offset, opts));
  }

  offsetForTimestamp(topic: string, partition: number, timestamp: number): Promise<number> {
    return this.run(() => BROKER_NEEDS.offsetForTimestamp(topic, partition, timestamp), () => this.host.offsetForTimestamp(topic, partition, timestamp));
  }

  // ───────────────────────────────── groups ─────────────────────────────────

  /** Joins the group only if allowed; a refusal is the first iteration's error, as an absent topic's is. */
  subscribe<T = unknown>(topic: string, opts: SubscribeOptions): Subscription<T> {
    if (this.closed) throw new BrokerClosedError();
    if (!opts || typeof opts.group !== "string") throw new ValidationError("subscribe needs { group }");
    const group = opts.group;
    return new GuardedSubscription<T>(
      this,
      topic,
      group,
      () => BROKER_NEEDS.subscribe(topic, opts),
      () => LIVE_NEEDS.subscription(topic, group),
      () => NEEDS.commit(group),
      () => this.host.subscribe<T>(topic, opts),
    );
  }

  resetGroup(group: string, topic: string, to: ResetTarget, opts: { dryRun?: boolean } = {}): Promise<ResetResult> {
    return this.run(() => BROKER_NEEDS.resetGroup(group, topic, to, opts), () => this.host.resetGroup(group, topic, to, opts, this.actor));
  }

  groupLag(group: string, topic: string): Promise<GroupLag> {
    return this.run(() => BROKER_NEEDS.groupLag(group, topic), () => this.host.groupLag(group, topic));
  }

  /** A group is listed when the principal may see both it and its topic (ACL-4). */
  listGroups(opts: { topic?: string } = {}): Promise<GroupListing[]> {
    return this.run(
      () => BROKER_NEEDS.listGroups(opts),
      async () => {
        const groups = this.visible("group", await this.host.listGroups(opts), (g) => g.group);
        return this.visible("topic", groups, (g) => g.topic);
      },
    );
  }

  // ───────────────────────────────── queues ─────────────────────────────────

  /** A handle whose every call is checked (src/broker/principal-queue.ts). */
  queue<T = unknown>(name: string, config?: QueueConfig): GuardedQueue<T> {
    if (this.closed) throw new BrokerClosedError();
    return new GuardedQueue<T>(this, name, config, (n, c) => this.host.queue(n, c, this.actor));
  }

  listQueues(): Promise<string[]> {
    return this.run(
      () => BROKER_NEEDS.listQueues(),
      async () => this.visible("queue", await this.host.listQueues(), (q) => q),
    );
  }

  /** Durably deletes a queue and its jobs (needs delete on it). */
  deleteQueue(name: string): Promise<void> {
    return this.run(() => NEEDS.deleteQueue(name), () => this.host.deleteQueue(name, this.actor));
  }

  /** Ends what this view opened (subscriptions, workers, event readers); the broker stays open. */
  async close(): Promise<void> {
    this.closed = true;
    const live = [...this.live];
    this.live.clear();
    this.unlisten?.();
    this.unlisten = null;
    await Promise.all(live.map((h) => h.close()));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
