// SPDX-License-Identifier: Apache-2.0
/**
 * `connect({ url })`: a `Broker` backed by a sluice server (or by any of several servers in
 * front of one storage, with failover). Same interface and error classes as the embedded
 * `openBroker()`; see docs/protocol.md for what travels on the wire.
 *
 * @example
 * await using broker = await connect({ url: "sluice://127.0.0.1:7070" });
 * await broker.publish("orders", { id: 1 }, { key: "customer-7" });
 */
import type { SchemaRegistry } from "../contracts/schemas.js";
import { ValidationError } from "../errors.js";
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
  TopicConfig,
  TopicDescription,
  TopicAlteration,
} from "../types.js";
import { Op, decodeConsumedRecords, decodeReceipts, encodePublishRecords } from "../wire/index.js";
import { Producer } from "./producer.js";
import { RemoteSubscription } from "./subscription.js";
import { drainEnqueues, RemoteWorker } from "./queue.js";
import { RemoteQueue } from "./queue-handle.js";
import type { Queue, QueueConfig } from "../queues/types.js";
import { Transport, type Endpoint } from "./transport.js";
import { clientTlsOptions, type ClientTlsOptions } from "./tls.js";
import type { ClientAuth } from "./auth.js";
import { loadTracing, tracing } from "../observability/tracing.js";

export interface ConnectOptions {
  /**
   * `sluice://host:port`, or `sluice+tls://host:port` for TLS (port defaults to 7070).
   *
   * An array lists several servers of one deployment (stateless nodes sharing one storage):
   * the client connects to one of them and, when that connection is lost, reconnects to the
   * next one in the list, with nothing acknowledged lost and idempotent publishes never
   * stored twice (docs/protocol.md, "Several servers and failover"). All URLs must use the
   * same scheme (all `sluice://` or all `sluice+tls://`), and one `tls` option applies to all.
   * The order is shuffled first unless `randomizeUrls` is false.
   */
  url: string | string[];
  /**
   * With several URLs, start from a random order (default true), so that clients spread over
   * the nodes and the clients of a lost node spread over the rest. False: try them in the
   * order given (e.g. a preferred node first).
   */
  randomizeUrls?: boolean;
  /**
   * TLS settings for a `sluice+tls://` url: the CA to trust (default: Node's CA store),
   * `servername`, a client certificate. docs/security.md.
   */
  tls?: ClientTlsOptions;
  /**
   * Credentials for a server with users or tokens (docs/security.md#authentication): a
   * SCRAM-SHA-256 `{ username, password }` or a bearer `{ token }`. Refused credentials fail
   * `connect()` with `AuthenticationError`.
   */
  auth?: ClientAuth;
  /** Aborts the initial connection attempt. */
  signal?: AbortSignal;
  /** Per-request deadline. Default 30 000 ms. */
  requestTimeoutMs?: number;
  connectTimeoutMs?: number;
  reconnectMinDelayMs?: number;
  reconnectMaxDelayMs?: number;
  /**
   * Fail pending requests (with `ConnectionClosedError`, naming the URLs) after being
   * disconnected this long, every URL having failed. Default 60 000 ms.
   */
  reconnectTimeoutMs?: number;
  /** How long publish() waits to gather a batch. Default 0 (end of the current event-loop turn). */
  lingerMs?: number;
  maxBatchRecords?: number;
  maxBatchBytes?: number;
  /** Idempotent producing (default true): retries after reconnects never duplicate. */
  idempotent?: boolean;
  /**
   * How long an idempotent publish keeps being retried (connection losses, timeouts, storage
   * errors) before it fails with the last error. Default 120 000 ms. Such a failure is the only
   * one after which the records may or may not be stored (docs/protocol.md §5).
   */
  deliveryTimeoutMs?: number;
  maxBufferedRecords?: number;
  maxPendingRequests?: number;
  /** Group session timeout: a member silent this long loses its partitions. Default 10 000 ms. */
  sessionTimeoutMs?: number;
  /** Messages buffered per subscription (the credit window). Default 2000. */
  subscriptionWindowMessages?: number;
  /** Protocol versions to announce (testing). */
  protocolVersions?: { min: number; max: number };
  /**
   * Message schemas per topic and queue (src/contracts/schemas.ts): publish(), publishBatch()
   * and enqueues validate each value in this process before sending, and refuse with
   * `SchemaViolationError`.
   */
  schemas?: SchemaRegistry;
}

/** `sluice://` (or `tcp://`) is plain TCP; `sluice+tls://` is TLS on the same kind of port. */
export function parseUrl(url: string): { host: string; port: number; tls: boolean } {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new ValidationError(`invalid sluice url ${JSON.stringify(url)}; expected sluice://host:port or sluice+tls://host:port`);
  }
  if (u.protocol !== "sluice:" && u.protocol !== "tcp:" && u.protocol !== "sluice+tls:") {
    throw new ValidationError(`unsupported url scheme ${JSON.stringify(u.protocol)}; expected sluice://host:port or sluice+tls://host:port`);
  }
  const port = u.port === "" ? 7070 : Number(u.port);
  let host = u.hostname || "127.0.0.1";
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return { host, port, tls: u.protocol === "sluice+tls:" };
}

class RemoteBroker implements Broker {
  private readonly producer: Producer;
  private readonly subs = new Map<number, RemoteSubscription<unknown>>();
  private readonly allSubs = new Set<RemoteSubscription<unknown>>();
  private readonly workers = new Map<number, RemoteWorker<unknown>>();
  private closed = false;

  constructor(
    readonly transport: Transport,
    private readonly o: ConnectOptions,
  ) {
    this.producer = new Producer(
      transport,
      {
        lingerMs: o.lingerMs ?? 0,
        maxBatchRecords: o.maxBatchRecords ?? 5000,
        maxBatchBytes: o.maxBatchBytes ?? 1024 * 1024,
        idempotent: o.idempotent ?? true,
        maxBufferedRecords: o.maxBufferedRecords ?? 200_000,
        deliveryTimeoutMs: o.deliveryTimeoutMs ?? 120_000,
        requestTimeoutMs: o.requestTimeoutMs ?? 30_000,
      },
      (topic) => this.describeTopic(topic),
    );
    transport.onPush = (f) => {
      if (f.op === Op.PushJobs || f.op === Op.PushJobBatch || f.op === Op.PushLeaseLost || f.op === Op.PushWorkerEnded) {
        this.workers.get(Number(f.meta.worker))?.onPush(f);
        return;
      }
      const sub = this.subs.get(Number(f.meta.sub));
      sub?.onPush(f);
    };
    transport.onDisconnect = () => {
      for (const w of this.workers.values()) w.connectionLost();
    };
    transport.onReconnect = () => {
      // Members and workers of the previous connection are gone server-side: join again.
      for (const s of this.allSubs) queueMicrotask(() => s.onReconnect());
      for (const w of [...this.workers.values()]) queueMicrotask(() => void w.register());
    };
  }

  private get rpc() {
    return this.transport.rpc;
  }

  async createTopic(name: string, config: TopicConfig = {}): Promise<TopicDescription> {
    const f = await this.rpc.CreateTopic({ name, config });
    this.producer.invalidate(name);
    this.producer.resetSequences(name);
    return f.meta.topic as TopicDescription;
  }
  async deleteTopic(name: string): Promise<void> {
    await this.rpc.DeleteTopic({ name });
    this.producer.invalidate(name);
    this.producer.resetSequences(name);
  }
  async listTopics(): Promise<string[]> {
    return (await this.rpc.ListTopics({})).meta.topics as string[];
  }
  async describeTopic(name: string): Promise<TopicDescription> {
    return (await this.rpc.DescribeTopic({ name })).meta.topic as TopicDescription;
  }
  async alterTopic(name: string, changes: TopicAlteration): Promise<TopicDescription> {
    return (await this.rpc.AlterTopic({ name, changes })).meta.topic as TopicDescription;
  }

  publish(topic: string, value: PublishValue, opts?: PublishOptions): Promise<PublishReceipt> {
    if (opts?.transaction !== undefined) return Promise.reject(notOverTheNetwork());
    if (this.o.schemas !== undefined) {
      try {
        this.o.schemas.validate("topic", topic, value, opts?.headers);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    // Tracing off: this one branch (src/observability/tracing.ts).
    if (tracing !== null) return tracing.publishOne(topic, opts, (o) => this.producer.publishOne(topic, value, o));
    // One object and one promise per record when the topic and producer id are known.
    return this.producer.publishOne(topic, value, opts);
  }

  publishBatch(topic: string, records: PublishRecord[], opts: PublishBatchOptions = {}): Promise<PublishReceipt[]> {
    if (opts.transaction !== undefined) return Promise.reject(notOverTheNetwork());
    if (tracing !== null && Array.isArray(records)) return tracing.publishBatch(topic, records, (rs) => this.sendBatch(topic, rs, opts));
    return this.sendBatch(topic, records, opts);
  }

  private async sendBatch(topic: string, records: PublishRecord[], opts: PublishBatchOptions): Promise<PublishReceipt[]> {
    // The whole batch is refused when one record is invalid: nothing of it is sent.
    if (this.o.schemas !== undefined && Array.isArray(records)) for (const r of records) this.o.schemas.validate("topic", topic, r?.value, r?.headers);
    if (opts.producerId === undefined) return this.producer.send(topic, records);
    // Caller-managed idempotence: send as one batch, exactly as given; safe to retry.
    const f = await this.rpc.Publish(
      { topic, producerId: opts.producerId, producerEpoch: opts.producerEpoch, baseSequence: opts.baseSequence },
      { body: encodePublishRecords(records), retry: true, signal: opts.signal },
    );
    return decodeReceipts(topic, f.body);
  }

  async initProducer(producerId?: number): Promise<ProducerIdentity> {
    // A fresh id may be allocated twice harmlessly; bumping a given id's epoch twice may not be.
    const f = await this.rpc.InitProducer(producerId === undefined ? {} : { producerId }, { retry: producerId === undefined });
    return { producerId: Number(f.meta.producerId), producerEpoch: Number(f.meta.producerEpoch) };
  }

  async fetch(topic: string, partition: number, offset: number, opts: FetchOptions = {}): Promise<FetchResult> {
    const f = await this.rpc.Fetch(
      { topic, partition, offset, maxBytes: opts.maxBytes, maxWaitMs: opts.maxWaitMs },
      { signal: opts.signal, extraTimeoutMs: opts.maxWaitMs ?? 0 },
    );
    return {
      records: decodeConsumedRecords(topic, f.body),
      nextOffset: Number(f.meta.nextOffset),
      highWatermark: Number(f.meta.highWatermark),
      logStartOffset: Number(f.meta.logStartOffset),
    };
  }

  async offsetForTimestamp(topic: string, partition: number, timestamp: number): Promise<number> {
    return Number((await this.rpc.OffsetForTimestamp({ topic, partition, timestamp })).meta.offset);
  }

  subscribe<T = unknown>(topic: string, opts: SubscribeOptions): Subscription<T> {
    if (!opts || typeof opts.group !== "string") throw new ValidationError("subscribe() needs a group");
    const sessionTimeoutMs = this.o.sessionTimeoutMs ?? 10_000;
    const sub = new RemoteSubscription<T>(this.transport, this.subs, topic, opts, {
      windowMessages: this.o.subscriptionWindowMessages ?? 2000,
      sessionTimeoutMs,
    });
    this.allSubs.add(sub as RemoteSubscription<unknown>);
    this.transport.setHeartbeat(Math.max(100, Math.floor(sessionTimeoutMs / 4)));
    const close = sub.close.bind(sub);
    sub.close = async () => {
      this.allSubs.delete(sub as RemoteSubscription<unknown>);
      await close();
    };
    return sub;
  }

  /** A work queue on the server (same API as the embedded `broker.queue()`). */
  queue<T = unknown>(name: string, config?: QueueConfig): Queue<T> {
    if (typeof name !== "string" || name.length === 0) throw new ValidationError("queue name must be a non-empty string");
    return new RemoteQueue<T>(this.transport, this.workers, name, config, { deliveryTimeoutMs: this.o.deliveryTimeoutMs, schemas: this.o.schemas });
  }

  async listQueues(): Promise<string[]> {
    return (await this.rpc.QueueAdmin({ action: "list" }, { retry: true })).meta.queues as string[];
  }

  async deleteQueue(name: string): Promise<void> {
    await this.rpc.QueueAdmin({ action: "delete", queue: name }, { retry: false });
  }

  async resetGroup(group: string, topic: string, to: ResetTarget, opts: { dryRun?: boolean } = {}): Promise<ResetResult> {
    // A dry run changes nothing, so only it may be sent again.
    const dryRun = opts.dryRun === true;
    return (await this.rpc.ResetGroup({ group, topic, to, dryRun }, { retry: dryRun })).meta.result as ResetResult;
  }

  async listGroups(opts: { topic?: string } = {}): Promise<GroupListing[]> {
    return (await this.rpc.ListGroups(opts.topic === undefined ? {} : { topic: opts.topic })).meta.groups as GroupListing[];
  }

  async groupLag(group: string, topic: string): Promise<GroupLag> {
    return (await this.rpc.GroupLag({ group, topic })).meta.lag as GroupLag;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Publishes and enqueues already accepted are sent and answered before the connection
    // closes (cutting them off would leave their outcome unknown).
    await Promise.all([this.producer.drain(10_000), drainEnqueues(this.transport, 10_000)]);
    await Promise.all([...this.allSubs].map((s) => s.close().catch(() => {})));
    await Promise.all([...this.workers.values()].map((w) => w.close().catch(() => {})));
    await this.transport.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

export type RemoteBrokerHandle = Broker & {
  /** Work queues over the network. */
  queue<T = unknown>(name: string, config?: QueueConfig): Queue<T>;
  listQueues(): Promise<string[]>;
  deleteQueue(name: string): Promise<void>;
  /** Implementation detail for tests: the underlying transport. */
  readonly transport: Transport;
};

/** `transaction` needs the broker in the application's process: a server cannot join its transaction. */
function notOverTheNetwork(): ValidationError {
  return new ValidationError("publishing inside a transaction works only with the embedded broker on the PostgreSQL engine (openBroker({ engine: postgresEngine(...) })): a server cannot join the application's transaction");
}

/**
 * The `url` option as endpoints, every URL checked up front, in the order to try them. Random
 * by default, like the server lists of NATS and Kafka's bootstrap servers: with the same list
 * everywhere, clients in list order would all crowd onto the first node, and all of a lost
 * node's clients onto the one after it.
 */
export function parseUrls(url: string | string[], randomize = true): { endpoints: Endpoint[]; tls: boolean } {
  const urls = typeof url === "string" ? [url] : url;
  if (!Array.isArray(urls) || urls.length === 0) throw new ValidationError("url must be a sluice url or a non-empty array of them");
  const endpoints = urls.map((u) => {
    const { host, port, tls } = parseUrl(u);
    return { host, port, tls, url: u };
  });
  const tls = endpoints[0].tls;
  // One `tls` option (CA, client certificate) serves every URL, and a deployment whose nodes
  // disagree on TLS is a mistake to report now, not at the first failover.
  if (endpoints.some((e) => e.tls !== tls)) {
    throw new ValidationError(`all urls must use the same scheme, sluice:// or sluice+tls://; got ${urls.map((u) => JSON.stringify(u)).join(", ")}`);
  }
  if (randomize) shuffle(endpoints);
  return { endpoints: endpoints.map(({ host, port, url: u }) => ({ host, port, url: u })), tls };
}

/** Fisher–Yates, in place. */
function shuffle<T>(a: T[]): void {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
}

export async function connect(opts: ConnectOptions): Promise<RemoteBrokerHandle> {
  const { endpoints, tls: secure } = parseUrls(opts.url, opts.randomizeUrls ?? true);
  const tls = clientTlsOptions(secure, opts.tls);
  await loadTracing(); // once per process: @opentelemetry/api when installed (tracing.ts)
  const transport = new Transport({
    endpoints,
    requestTimeoutMs: opts.requestTimeoutMs ?? 30_000,
    reconnectMinDelayMs: opts.reconnectMinDelayMs ?? 50,
    reconnectMaxDelayMs: opts.reconnectMaxDelayMs ?? 2000,
    reconnectTimeoutMs: opts.reconnectTimeoutMs ?? 60_000,
    maxPendingRequests: opts.maxPendingRequests ?? 4096,
    connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
    tls,
    auth: opts.auth ?? null,
    minVersion: opts.protocolVersions?.min,
    maxVersion: opts.protocolVersions?.max,
  });
  const broker = new RemoteBroker(transport, opts);
  try {
    await transport.start(opts.signal);
  } catch (err) {
    await transport.close();
    throw err;
  }
  return broker;
}
