// SPDX-License-Identifier: Apache-2.0
/**
 * The embedded broker: `openBroker({ dataDir })` = a StorageEngine (DiskEngine by default) + GroupCoordinator
 * (membership) + publishing/partitioning + subscriptions. Everything runs in this process;
 * `sluice serve` puts the same object behind the wire protocol.
 */
import type { EncryptionKeys } from "../log/keyring.js";
import { Buffer } from "node:buffer";
import { AbortedError, BrokerClosedError, GroupActiveError, ValidationError, CorruptRecordError } from "../errors.js";
import { NodeFileSystem, type FileSystem } from "../log/io.js";
import { telemetry, type Logger, type Telemetry } from "../observability/telemetry.js";
import { decodeRecords, MAX_BATCH_BYTES, validateEncodedBatch, type PreparedRecord } from "../log/record-batch.js";
import { DiskEngine } from "../store/disk/disk-engine.js";
import { resolveTopicAlteration, resolveTopicConfig } from "../store/topic-config.js";
import type { EngineTopic, StorageEngine } from "../store/engine.js";
import { validateName } from "../store/names.js";
import { GroupCoordinator } from "../streams/group-coordinator.js";
import type { GroupCoordination } from "../store/group-coordination.js";
import { QueueManager } from "../queues/index.js";
import type { QueueConfig } from "../queues/types.js";
import type { HostQueue } from "../queues/host-api.js";
import type { QueueStats } from "../queues/types.js";
import type { PrometheusOptions } from "../observability/prometheus.js";
import { commitFailureCounter } from "../observability/commit-failures.js";
import { loadTracing, tracing } from "../observability/tracing.js";
import { toConsumed } from "../streams/records.js";
import { GroupSubscription } from "../streams/subscription.js";
import type { BrokerHost, EncodedAppend, MemberListener, MemberSubscription } from "./host.js";
import { Publisher } from "./publisher.js";
import type { SchemaRegistry } from "../contracts/schemas.js";
import { TurnYield } from "../turn-yield.js";
import { AuditLog } from "../security/audit/audit-log.js";
import { LogAuditor, NO_AUDIT, type Auditor, type AuditTarget } from "../security/audit/auditor.js";
import type { AuditActor, AuditRecord } from "../security/audit/record.js";
import { listAuditRecords, type ListOptions as AuditListOptions } from "../security/audit/reader.js";
import { PolicyAuthorization } from "../security/acl/authorization.js";
import { PolicyStore } from "../security/acl/policy-store.js";
import { PrincipalBroker } from "./principal-view.js";
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

export interface BrokerOptions {
  /**
   * Directory holding all data, created if missing: the default disk engine's home. Required
   * unless `engine` is given.
   */
  dataDir?: string;
  /**
   * The storage engine (default: the disk engine on `dataDir`). The broker opens it, uses it
   * for everything durable, and closes it on `close()`.
   */
  engine?: StorageEngine;
  /** Any pino-compatible logger; default silent (shorthand for `telemetry.logger`). */
  logger?: Logger;
  /**
   * Logger, metrics sink and clock, handed down to the engine, partitions and queues
   * (src/observability/telemetry.ts). Missing parts are no-ops; the clock defaults to the
   * system's.
   */
  telemetry?: Partial<Telemetry>;
  /** File I/O layer; tests inject faults here. Default: node:fs. */
  fs?: FileSystem;
  /** How often retention runs. Default 5 minutes; 0 disables the timer (call enforceRetention()). */
  retentionCheckIntervalMs?: number;
  /**
   * Whether this broker fires the queues' job schedules (docs/queues.md "Schedules"). Default
   * true; false (short admin tools such as the CLI with --data) still lists and changes them.
   */
  runSchedules?: boolean;
  /**
   * Message schemas per topic and queue (src/contracts/schemas.ts): publish() and
   * publishBatch() to a topic with schemas, and enqueues to a queue with schemas, validate each
   * value before anything is written, and refuse with `SchemaViolationError` naming the field.
   */
  schemas?: SchemaRegistry;
  /**
   * Prometheus metrics (docs/metrics.md): every broker metric is registered on
   * `metrics.registry` (a prom-client Registry, one broker per registry), the scrape-time ones
   * (lag, headroom, queue depth, disk space...) computed when it is read. Caps on the exported
   * label sets can be given here too. Removed from the registry on close().
   */
  metrics?: PrometheusOptions;
  /**
   * Keep the audit log of administrative operations in `<dataDir>/audit/` (docs/security.md
   * "Audit log"): topic and queue creation, changes and deletion, purges, redrives, job
   * removals and group offset resets, each durable before the operation's result is returned.
   * Default true when `dataDir` is given; false turns it off.
   */
  audit?: boolean;
  /**
   * Keys for encryption at rest of `encrypted` topics and queues (docs/security.md,
   * "Encryption at rest"): the path of a key file, or `{ active, keys: { id: base64 } }`, or a
   * `Keyring`. Checked on open (`EncryptionConfigError`); never logged or stored. For the
   * default disk engine only (give a custom engine its own).
   */
  encryptionKeys?: EncryptionKeys;
}

const MAX_FETCH_BYTES = 64 * 1024 * 1024;
const MAX_WAIT_MS = 5 * 60_000;
export class EmbeddedBroker implements Broker, BrokerHost {
  readonly engine: StorageEngine;
  /** The engine's shared group coordination when it has one (PG-1), else one in this process. */
  readonly coordinator: GroupCoordination;
  readonly logger: Logger;
  readonly telemetry: Telemetry;
  readonly dataDir: string;
  readonly fs: FileSystem;
  private subs = new Set<GroupSubscription<unknown>>();
  private retentionTimer: NodeJS.Timeout | null = null;
  private queues!: QueueManager;
  private closed = false;
  private closing: Promise<void> | null = null;
  /** publish() and publishBatch(): validation, partitioning, per-partition order (publisher.ts). */
  private readonly publisher: Publisher;
  /** Makes calls that may complete without waiting yield now and then (turn-yield.ts). */
  private readonly yielder = new TurnYield();
  private readonly schemas: SchemaRegistry | null;
  /** What subscriptions commit through: the engine, counting failed commits per group. */
  private readonly onCommitFailure: ((group: string, topic: string) => void) | undefined;
  private detachMetrics: (() => void) | null = null;
  private auditLog: AuditLog | null = null;
  /** Administrative operations run through it, so their outcome is audited (AUD-1). */
  private auditor: Auditor = NO_AUDIT;
  /** The policy principal views are checked against, opened by the first `as()` (ACL-5). */
  private authorization: Promise<PolicyAuthorization> | null = null;

  private constructor(opts: BrokerOptions) {
    this.telemetry = telemetry({ ...opts.telemetry, logger: opts.logger ?? opts.telemetry?.logger });
    this.logger = this.telemetry.logger;
    this.dataDir = opts.dataDir ?? "";
    this.fs = opts.fs ?? new NodeFileSystem();
    this.engine = opts.engine ?? new DiskEngine({ dataDir: this.dataDir, fs: this.fs, telemetry: this.telemetry, encryptionKeys: opts.encryptionKeys });
    this.coordinator = this.engine.groupCoordination ?? new GroupCoordinator();
    this.publisher = new Publisher(this.engine, () => this.closed);
    this.schemas = opts.schemas ?? null;
    this.onCommitFailure = commitFailureCounter(this.telemetry.metrics);
  }

  static async open(opts: BrokerOptions): Promise<EmbeddedBroker> {
    if (!opts || (opts.engine === undefined && (typeof opts.dataDir !== "string" || opts.dataDir.length === 0)))
      throw new ValidationError("openBroker needs a dataDir (or an engine)");
    if (opts.engine !== undefined && opts.encryptionKeys !== undefined) throw new ValidationError("encryptionKeys is an option of the disk engine: give it to the engine you pass");
    await loadTracing(); // once per process: @opentelemetry/api when installed (tracing.ts)
    // prom-client is loaded only when metrics are asked for.
    const exporter = opts.metrics ? (await import("../observability/prometheus.js")).brokerExporter(opts.metrics, opts.telemetry?.metrics) : null;
    const b = new EmbeddedBroker(exporter ? { ...opts, telemetry: { ...opts.telemetry, metrics: exporter.sink } } : opts);
    await b.engine.open();
    if (exporter) {
      try {
        b.detachMetrics = exporter.attach(b, b.logger);
      } catch (e) {
        await b.engine.close(); // another broker took the registry meanwhile
        throw e;
      }
    }
    if (opts.audit !== false && b.dataDir !== "") {
      // Opened while the engine holds the data dir's lock (FS-3).
      try {
        b.auditLog = await AuditLog.open({ dataDir: b.dataDir, fs: b.fs, logger: b.logger, now: () => b.telemetry.clock.now() });
      } catch (e) {
        b.detachMetrics?.();
        await b.engine.close();
        throw e;
      }
      b.auditor = new LogAuditor(b.auditLog, b.logger);
    }
    // Queues reach storage only through the engine's queue store.
    b.queues = new QueueManager({ store: b.engine.queues, clock: b.telemetry.clock, schemas: opts.schemas, logger: b.logger, auditor: b.auditor, engineKind: b.engine.kind });
    // Job schedules run in the process holding the data dir (FS-3), never in network clients.
    await b.queues.startSchedules(opts.runSchedules ?? true);
    const every = opts.retentionCheckIntervalMs ?? 5 * 60_000;
    if (every > 0) {
      b.retentionTimer = setInterval(() => {
        b.engine.enforceRetention().catch((e) => b.logger.error({ err: e }, "retention failed"));
      }, every);
      b.retentionTimer.unref();
    }
    return b;
  }

  private check(): void {
    if (this.closed) throw new BrokerClosedError();
  }

  /**
   * This broker as `principal` sees it (docs/security.md, "Embedded mode"): every call of the
   * view is checked against `<dataDir>/security/acl.json` as the server checks a logged-in
   * principal's requests (ACL-5). The broker itself keeps full rights, and its calls are not
   * checked: the policy is read, and polled, only once a view exists.
   */
  as(principal: string): PrincipalBroker {
    this.check();
    return new PrincipalBroker(this, principal, (this.authorization ??= this.openAuthorization()));
  }

  private async openAuthorization(): Promise<PolicyAuthorization> {
    // Without a data dir (a custom engine) there is no policy file: views are denied everything.
    const store = this.dataDir === "" ? null : await PolicyStore.open(this.dataDir);
    const audit = this.auditLog === null ? null : (actor: AuditActor, target: AuditTarget, error?: unknown) => this.recordAudit(actor, target, error);
    const authz = new PolicyAuthorization(store, this.logger, audit);
    if (!this.closed) authz.start();
    return authz;
  }

  /** `actor`: who asked, for the audit log (default: this process, "embedded"). */
  async createTopic(name: string, config?: TopicConfig, actor?: AuditActor): Promise<TopicDescription> {
    this.check();
    return this.auditor.run(actor, topicTarget("topic.create", name, config === undefined ? undefined : { config: JSON.stringify(config) }), async () => {
      await this.engine.createTopic(name, resolveTopicConfig(config));
      this.publisher.forget(name);
      return this.engine.describeTopic(name);
    });
  }

  async alterTopic(name: string, changes: TopicAlteration, actor?: AuditActor): Promise<TopicDescription> {
    this.check();
    return this.auditor.run(actor, topicTarget("topic.alter", name, { changes: JSON.stringify(changes) ?? null }), async () => {
      await this.engine.alterTopic(name, resolveTopicAlteration(changes));
      return this.engine.describeTopic(name);
    });
  }

  async deleteTopic(name: string, actor?: AuditActor): Promise<void> {
    this.check();
    return this.auditor.run(actor, topicTarget("topic.delete", name), async () => {
      for (const s of [...this.subs]) if (s.topic === name) await s.close();
      await this.engine.deleteTopic(name);
      this.publisher.forget(name);
    });
  }

  async listTopics(): Promise<string[]> {
    this.check();
    await this.yielder.turn();
    return this.engine.listTopics();
  }

  async describeTopic(name: string): Promise<TopicDescription> {
    this.check();
    await this.yielder.turn();
    return this.engine.describeTopic(name);
  }

  async initProducer(producerId?: number): Promise<ProducerIdentity> {
    this.check();
    return this.engine.allocateProducer(producerId);
  }

  /**
   * One record. Records published while their partition's appends are in flight join the next
   * append (publish-accumulator.ts): one batch, one fdatasync share, one promise per record.
   * Validated completely first, so an invalid or oversized record fails alone.
   */
  publish(topic: string, value: PublishValue, opts?: PublishOptions): Promise<PublishReceipt> {
    if (this.schemas !== null) {
      try {
        this.schemas.validate("topic", topic, value, opts?.headers);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    // Tracing off: this one branch (src/observability/tracing.ts).
    if (tracing !== null) return tracing.publishOne(topic, opts, (o) => this.publisher.publish(topic, value, o));
    return this.publisher.publish(topic, value, opts);
  }

  publishBatch(topic: string, records: PublishRecord[], opts: PublishBatchOptions = {}): Promise<PublishReceipt[]> {
    if (this.schemas !== null && Array.isArray(records)) {
      // The whole batch is refused when one record is invalid: nothing of it is written.
      try {
        for (const r of records) this.schemas.validate("topic", topic, r?.value, r?.headers);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    if (tracing !== null && Array.isArray(records)) return tracing.publishBatch(topic, records, (rs) => this.publisher.publishBatch(topic, rs, opts));
    return this.publisher.publishBatch(topic, records, opts);
  }

  /**
   * Appends one batch a client encoded in the storage format (base offset 0, CRC over it) to
   * one partition: the server's publish path, which stores client bytes without decoding them
   * into objects. Validated completely by the engine first; producer fields come from the
   * batch header. Resolves with the batch's base offset once durable (per the topic's
   * durability).
   */
  async publishEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<EncodedAppend> {
    this.check();
    const t = await this.engine.getTopic(topic);
    if (!Number.isInteger(partition) || partition < 0 || partition >= t.config.partitions)
      throw new ValidationError(`partition ${partition} out of range for ${topic} (0..${t.config.partitions - 1})`);
    if (this.engine.encoded) return this.engine.encoded.appendEncoded(topic, partition, batch, signal);
    // An engine without the encoded-batch capability: verify and decode, then append records.
    // Record sizes are checked by the engine's append, as for any record: recordSize() with a
    // zero timestamp delta (docs/storage-format.md), not the size within this batch.
    const { header: h } = validateEncodedBatch(batch, MAX_BATCH_BYTES);
    const records: PreparedRecord[] = decodeRecords(batch, 0, h).map((r) => ({ key: r.key, value: r.value, valueKind: r.valueKind, timestamp: r.timestamp, headers: r.headers }));
    const producer = h.producerId >= 0 ? { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence } : undefined;
    const r = await this.engine.append(topic, partition, records, producer, signal);
    return { ...r, count: h.count };
  }

  async fetch(topic: string, partition: number, offset: number, opts: FetchOptions = {}): Promise<FetchResult> {
    this.check();
    const maxBytes = opts.maxBytes ?? 1024 * 1024;
    const maxWaitMs = opts.maxWaitMs ?? 0;
    if (!Number.isInteger(maxBytes) || maxBytes < 1 || maxBytes > MAX_FETCH_BYTES) throw new ValidationError(`maxBytes must be in [1, ${MAX_FETCH_BYTES}]`);
    if (!Number.isInteger(maxWaitMs) || maxWaitMs < 0 || maxWaitMs > MAX_WAIT_MS) throw new ValidationError(`maxWaitMs must be in [0, ${MAX_WAIT_MS}]`);
    await this.yielder.turn();
    const o = await this.engine.offsets(topic, partition);
    if (offset === o.highWatermark && maxWaitMs > 0) {
      await this.engine.waitFor(topic, partition, offset, maxWaitMs, opts.signal);
      // The caller gave up: the same AbortedError a client raises for an aborted fetch.
      if (opts.signal?.aborted) throw new AbortedError("fetch aborted", opts.signal.reason);
    }
    const res = await this.engine.read(topic, partition, offset, maxBytes);
    const after = await this.engine.offsets(topic, partition);
    return {
      records: res.records.map((r) => toConsumed(topic, partition, r)),
      nextOffset: res.nextOffset,
      highWatermark: after.highWatermark,
      logStartOffset: after.logStartOffset,
    };
  }

  async offsetForTimestamp(topic: string, partition: number, timestamp: number): Promise<number> {
    this.check();
    if (!Number.isFinite(timestamp)) throw new ValidationError("timestamp must be a number");
    await this.yielder.turn();
    return this.engine.offsetForTimestamp(topic, partition, timestamp);
  }

  subscribe<T = unknown>(topic: string, opts: SubscribeOptions): Subscription<T> {
    return this.join<T>(topic, opts);
  }

  /** A member for a consumer in another process (the server's remote members). */
  subscribeMember(topic: string, opts: SubscribeOptions, listener: MemberListener): MemberSubscription {
    return this.join<unknown>(topic, opts, listener);
  }

  private join<T>(topic: string, opts: SubscribeOptions, listener?: MemberListener): GroupSubscription<T> {
    this.check();
    if (!opts || typeof opts.group !== "string") throw new ValidationError("subscribe needs { group }");
    const sub = new GroupSubscription<T>({ engine: this.engine, coordinator: this.coordinator, logger: this.logger, onCommitFailure: this.onCommitFailure, onClose: (s) => this.subs.delete(s) }, topic, opts, listener);
    this.subs.add(sub as GroupSubscription<unknown>);
    return sub;
  }

  /** A dry run only reads and is not audited; a reset is (AUD-1), failed or not. */
  async resetGroup(group: string, topic: string, to: ResetTarget, opts: { dryRun?: boolean } = {}, actor?: AuditActor): Promise<ResetResult> {
    this.check();
    if (opts.dryRun === true) return this.doResetGroup(group, topic, to, true);
    const target: AuditTarget = { op: "group.reset", resourceType: "group", resource: String(group), details: { topic: String(topic), to: JSON.stringify(to) ?? null } };
    return this.auditor.run(actor, target, () => this.doResetGroup(group, topic, to, false), (r) => ({ partitions: r.partitions.length }));
  }

  private async doResetGroup(group: string, topic: string, to: ResetTarget, dryRun: boolean): Promise<ResetResult> {
    validateName("group", group);
    const t = await this.engine.getTopic(topic);
    await this.yielder.turn();
    if (dryRun) return this.planReset(group, topic, t, to, true);
    // GRP-2: a member joining while the reset is computed and written is assigned only after
    // it, so it starts from the new offsets; one already there refuses the reset.
    return this.coordinator.exclusive(group, topic, async () => {
      if (await this.coordinator.hasMembers(group, topic)) throw new GroupActiveError(group);
      return this.planReset(group, topic, t, to, false);
    });
  }

  /** Resolves `to` per partition against the committed offsets and writes it unless `dryRun`. */
  private async planReset(group: string, topic: string, t: EngineTopic, to: ResetTarget, dryRun: boolean): Promise<ResetResult> {
    const committed = await this.engine.getCommitted(group, topic);
    const partitions: ResetResult["partitions"] = [];
    const next = new Map<number, number>();
    const explicit = explicitOffsets(to, t.config.partitions);
    for (let p = 0; p < t.config.partitions; p++) {
      const { logStartOffset: start, highWatermark: end } = await this.engine.offsets(topic, p);
      const prev = committed.get(p)?.offset ?? null;
      let target: number;
      if (explicit !== null) {
        const want = explicit.get(p);
        if (want === undefined) continue; // not named: keeps its position
        // Named offsets are exact: one outside the readable range is refused, not clamped.
        if (want < start || want > end) throw new ValidationError(`partition ${p}: offset ${want} is outside the readable range [${start}, ${end}]`);
        partitions.push({ partition: p, previous: prev, next: want });
        next.set(p, want);
        continue;
      }
      if (to === "earliest") target = start;
      else if (to === "latest") target = end;
      else if (typeof to === "object" && to !== null && "offset" in to) target = to.offset;
      else if (typeof to === "object" && to !== null && "timestamp" in to) target = await this.engine.offsetForTimestamp(topic, p, to.timestamp);
      else if (typeof to === "object" && to !== null && "shiftBy" in to) target = (prev ?? start) + to.shiftBy;
      else throw new ValidationError("reset target must be earliest, latest, {offset}, {timestamp}, {shiftBy} or {partitions}");
      if (!Number.isFinite(target)) throw new ValidationError("reset target must be a finite number");
      // Clamp into the readable range, as Kafka's reset tool does.
      target = Math.min(Math.max(Math.trunc(target), start), end);
      partitions.push({ partition: p, previous: prev, next: target });
      next.set(p, target);
    }
    // A reset, not a commit: partitions moved back keep a replay mark (`msg.replay`, META-4).
    if (!dryRun) await this.engine.resetOffsets(group, topic, next);
    return { group, topic, dryRun, partitions };
  }

  async listGroups(opts: { topic?: string } = {}): Promise<GroupListing[]> {
    this.check();
    if (opts.topic !== undefined) await this.engine.getTopic(opts.topic); // TOPIC_NOT_FOUND for a typo
    const members = new Map<string, number>();
    for (const a of await this.coordinator.activeGroups()) members.set(`${a.group}\u0000${a.topic}`, a.members);
    const keys = new Set<string>(members.keys());
    for (const c of await this.engine.listCommittedGroups()) keys.add(`${c.group}\u0000${c.topic}`);
    const out: GroupListing[] = [];
    for (const k of [...keys].sort()) {
      const [group, topic] = k.split("\u0000");
      if (opts.topic !== undefined && topic !== opts.topic) continue;
      const lag = await this.groupLag(group, topic).catch(() => null); // a topic deleted meanwhile
      if (!lag) continue;
      out.push({ group, topic, members: members.get(k) ?? 0, committedPartitions: lag.partitions.filter((p) => p.committedOffset !== null).length, lagRecords: lag.totalRecords, maxLagMs: lag.maxLagMs });
    }
    return out;
  }

  async groupLag(group: string, topic: string): Promise<GroupLag> {
    this.check();
    validateName("group", group);
    await this.yielder.turn();
    const t = await this.engine.getTopic(topic);
    const committed = await this.engine.getCommitted(group, topic);
    const now = Date.now();
    const retentionMs = t.config.retentionMs;
    const partitions: GroupLag["partitions"] = [];
    for (let p = 0; p < t.config.partitions; p++) {
      const { logStartOffset, highWatermark } = await this.engine.offsets(topic, p);
      const c = committed.get(p)?.offset ?? null;
      const from = Math.min(Math.max(c ?? logStartOffset, logStartOffset), highWatermark);
      const lagRecords = highWatermark - from;
      let lagMs = 0;
      // Caught up: the next record the group needs gets the whole retention period.
      let headroomMs = retentionMs >= 0 ? retentionMs : null;
      let at = from;
      while (lagRecords > 0 && at < highWatermark) {
        try {
          const r = await this.engine.read(topic, p, at, 1);
          if (r.records.length > 0) {
            lagMs = Math.max(0, now - r.records[0].timestamp);
            if (headroomMs !== null) headroomMs = r.records[0].timestamp + retentionMs - now;
            break;
          }
          if (r.nextOffset <= at) break;
          at = r.nextOffset;
        } catch (e) {
          if (e instanceof CorruptRecordError && e.nextOffset !== undefined && e.nextOffset > at) at = e.nextOffset;
          else throw e;
        }
      }
      partitions.push({ partition: p, committedOffset: c, logStartOffset, highWatermark, lagRecords, lagMs, headroomMs });
    }
    const headrooms = partitions.flatMap((x) => (x.headroomMs === null ? [] : [x.headroomMs]));
    return {
      group,
      topic,
      totalRecords: partitions.reduce((s, x) => s + x.lagRecords, 0),
      maxLagMs: partitions.reduce((s, x) => Math.max(s, x.lagMs), 0),
      minHeadroomMs: headrooms.length === 0 ? null : Math.min(...headrooms),
      generation: await this.coordinator.generation(group, topic),
      members: await this.coordinator.members(group, topic),
      recentResets: (await this.engine.recentResets?.(group, topic)) ?? [],
      partitions,
    };
  }

  /** `actor`: who the handle's administrative operations (purge, redrive, remove, creation) are audited as. */
  queue<T = unknown>(name: string, config?: QueueConfig, actor?: AuditActor): HostQueue<T> {
    this.check();
    return this.queues.queue<T>(name, config, actor);
  }

  /** @internal For scrape-time metrics: a queue's stats and its dead-letter queue. */
  async queueMetrics(name: string): Promise<{ stats: QueueStats; deadLetter: string | null }> {
    this.check();
    const rt = await this.queues.runtime(name);
    return { stats: await rt.stored.stats(), deadLetter: rt.settings.deadLetter };
  }

  async listQueues(): Promise<string[]> {
    this.check();
    await this.yielder.turn();
    return this.queues.listQueues();
  }

  async deleteQueue(name: string, actor?: AuditActor): Promise<void> {
    this.check();
    await this.auditor.run(actor, { op: "queue.delete", resourceType: "queue", resource: String(name) }, () => this.queues.deleteQueue(name));
  }

  /** @internal Audit records (server: `GET /v1/audit`); read from the file, one frame at a time. */
  async listAudit(opts: AuditListOptions = {}): Promise<AuditRecord[]> {
    this.check();
    if (this.auditLog === null) return [];
    return listAuditRecords(this.fs, this.dataDir, opts);
  }

  /** An event the server observed (a login's result), durable when this resolves (AUD-4). */
  async recordAudit(actor: AuditActor, target: AuditTarget, error?: unknown): Promise<void> {
    this.check();
    await this.auditor.record(actor, target, error);
  }

    /** Runs retention now (it also runs on a timer). */
  enforceRetention(now?: number): Promise<void> {
    this.check();
    return this.engine.enforceRetention(now);
  }

  close(): Promise<void> {
    if (!this.closing) {
      this.closing = (async () => {
        if (this.retentionTimer) clearInterval(this.retentionTimer);
        this.detachMetrics?.();
        if (this.authorization !== null) (await this.authorization.catch(() => null))?.stop();
        for (const s of [...this.subs]) await s.close();
        this.closed = true;
        // Publishes accepted before close() are appended and answered first.
        await this.publisher.drain();
        await this.queues.close();
        try {
          await this.engine.close();
        } finally {
          await this.auditLog?.close();
        }
      })();
    }
    return this.closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Opens (creating if needed) an embedded broker on `dataDir`, running recovery first. */
export function openBroker(opts: BrokerOptions): Promise<EmbeddedBroker> {
  return EmbeddedBroker.open(opts);
}

function topicTarget(op: string, name: string, details?: AuditTarget["details"]): AuditTarget {
  return { op, resourceType: "topic", resource: String(name), details };
}

/** The offsets of a `{ partitions: { p: offset } }` reset, validated; null for other targets. */
function explicitOffsets(to: ResetTarget, partitionCount: number): Map<number, number> | null {
  if (typeof to !== "object" || to === null || !("partitions" in to)) return null;
  const entries = typeof to.partitions === "object" && to.partitions !== null ? Object.entries(to.partitions) : [];
  if (entries.length === 0) throw new ValidationError("reset {partitions} must name at least one partition");
  const out = new Map<number, number>();
  for (const [k, v] of entries) {
    const p = Number(k);
    if (!Number.isSafeInteger(p) || p < 0 || p >= partitionCount) throw new ValidationError(`reset names partition ${JSON.stringify(k)}; the topic has partitions 0-${partitionCount - 1}`);
    if (!Number.isSafeInteger(v) || v < 0) throw new ValidationError(`partition ${p}: reset offset must be an integer >= 0`);
    out.set(p, v);
  }
  return out;
}
