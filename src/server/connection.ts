// SPDX-License-Identifier: Apache-2.0
/**
 * One client connection of the binary protocol (docs/protocol.md): handshake, frame decoding,
 * request dispatch with pipelining, server pushes for subscriptions.
 *
 * Limits (all explicit, all per connection):
 * - before the handshake a frame may be at most PRE_HANDSHAKE_MAX_FRAME_BYTES;
 * - after it, `maxFrameBytes`; the length prefix is checked before anything is allocated;
 * - at most `maxInFlight` requests are executing; beyond it we stop reading the socket, so
 *   TCP backpressure reaches the client instead of our memory;
 * - while the socket's write buffer exceeds `maxOutputBytes` we stop reading requests and
 *   stop pulling messages for subscriptions.
 * A protocol violation answers with an error frame and closes this connection only.
 */
import type { Socket } from "node:net";
import {
  ConnectionClosedError,
  InvalidBatchError,
  LeaseExpiredError,
  BadMagicError,
  ProtocolError,
  StaleGenerationError,
  UnsupportedVersionError,
  ValidationError,
} from "../errors.js";
import type { Broker, Message, PublishBatchOptions, PublishRecord, PublishValue, ResetTarget, TopicConfig } from "../types.js";
import { decodeRecords, decodeValue as decodeStoredValue, verifyBatch } from "../log/record-batch.js";
import {
  FLAG_ERROR,
  FLAG_PUSH,
  FLAG_RESPONSE,
  FrameReader,
  MAGIC,
  MIN_PROTOCOL_VERSION,
  Op,
  PREAMBLE_BYTES,
  PRE_HANDSHAKE_MAX_FRAME_BYTES,
  PROTOCOL_VERSION,
  Writer,
  decodeFrame,
  decodePublishRecords,
  encodePublishRecords,
  encodeConsumedRecords,
  encodeFrame,
  encodeFrameHead,
  DEFAULT_MAX_FRAME_BYTES,
  errorToWire,
  writeConsumedRecord,
  type Frame,
  type WireError,
} from "../wire/index.js";
import { RemoteMember } from "./remote-member.js";
import { RemoteWorker, enqueueFromWire, queueHost, toWireJob } from "./remote-queue.js";
import { decodeSettleItems, encodeJobBatchFrame } from "../wire/index.js";
import type { Queue, QueueConfig, RedriveOptions } from "../queues/types.js";

export interface Logger {
  info?(obj: unknown, msg?: string): void;
  warn?(obj: unknown, msg?: string): void;
  error?(obj: unknown, msg?: string): void;
  debug?(obj: unknown, msg?: string): void;
}

export interface ConnectionLimits {
  maxFrameBytes: number;
  maxInFlight: number;
  /** Bytes of request frames being executed on one connection; reading pauses above it. */
  maxInFlightBytes: number;
  /** The same across all connections of the server (a pipelining client cannot pin
   * maxInFlight x maxFrameBytes, and many clients together cannot exceed this). */
  maxInFlightBytesTotal: number;
  maxOutputBytes: number;
  maxRecordsPerBatch: number;
  maxSubscriptionsPerConnection: number;
  minSessionTimeoutMs: number;
  maxSessionTimeoutMs: number;
  defaultSessionTimeoutMs: number;
  maxUncommittedPerSubscription: number;
  handshakeTimeoutMs: number;
}

export const DEFAULT_LIMITS: ConnectionLimits = {
  maxFrameBytes: 16 * 1024 * 1024,
  maxInFlight: 1024,
  maxInFlightBytes: 64 * 1024 * 1024,
  maxInFlightBytesTotal: 512 * 1024 * 1024,
  maxOutputBytes: 8 * 1024 * 1024,
  maxRecordsPerBatch: 100_000,
  maxSubscriptionsPerConnection: 256,
  minSessionTimeoutMs: 500,
  maxSessionTimeoutMs: 300_000,
  defaultSessionTimeoutMs: 10_000,
  maxUncommittedPerSubscription: 100_000,
  handshakeTimeoutMs: 10_000,
};

type State = "preamble" | "hello" | "ready" | "closing" | "closed";

/** Server-wide accounting shared by all connections. */
export interface SharedBudget {
  inFlightBytes: number;
  /** Connections paused because the shared budget was exhausted. */
  paused: Set<Connection>;
}

let nextConnectionId = 1;

function str(meta: Record<string, unknown>, key: string, maxLen = 1000): string {
  const v = meta[key];
  if (typeof v !== "string") throw new ValidationError(`field ${key} must be a string`);
  if (v.length > maxLen) throw new ValidationError(`field ${key} is longer than ${maxLen} characters`);
  return v;
}
interface EncodedPublisher {
  publishEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<{ baseOffset: number; count: number; duplicate: boolean; synced: boolean }>;
}
function isEncodedPublisher(b: Broker): b is Broker & EncodedPublisher {
  return typeof (b as Partial<EncodedPublisher>).publishEncoded === "function";
}

/**
 * PublishEncoded against a Broker that only takes record objects (e.g. a test double): decode
 * the verified batch and publish its records to the named partition. Producer fields travel in
 * the batch header.
 */
async function publishDecoded(b: Broker, topic: string, partition: number, batch: Buffer, signal: AbortSignal) {
  const h = verifyBatch(batch, 0, batch.length);
  if (h.length !== batch.length) throw new InvalidBatchError("bytes follow the batch");
  const records: PublishRecord[] = decodeRecords(batch, 0, h).map((r) => ({
    key: r.key,
    value: decodeStoredValue(r.value, r.valueKind) as PublishValue,
    timestamp: r.timestamp,
    partition,
    headers: r.headers ? Object.fromEntries(r.headers) : undefined,
  }));
  const opts: PublishBatchOptions = { signal };
  if (h.producerId >= 0) Object.assign(opts, { producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence });
  const rs = await b.publishBatch(topic, records, opts);
  return { baseOffset: rs[0].offset, count: rs.length, duplicate: rs[0].duplicate, synced: rs[0].synced };
}

function int(meta: Record<string, unknown>, key: string, opt = false): number | undefined {
  const v = meta[key];
  if (v === undefined || v === null) {
    if (opt) return undefined;
    throw new ValidationError(`field ${key} is required`);
  }
  if (typeof v !== "number" || !Number.isSafeInteger(v)) throw new ValidationError(`field ${key} must be an integer`);
  return v;
}

export class Connection {
  readonly id = nextConnectionId++;
  private state: State = "preamble";
  private readonly reader: FrameReader;
  private inFlight = 0;
  private inFlightBytes = 0;
  private readonly members = new Map<number, RemoteMember>();
  private readonly workers = new Map<number, RemoteWorker>();
  /** Queue handles by name+config, bounded (a handle is cheap; this only avoids re-validation). */
  private readonly queues = new Map<string, Queue<unknown>>();
  /** Ids of members that ended (session expiry etc.), so late commits get a precise error. Bounded. */
  private readonly endedMembers = new Map<number, string>();
  private readonly ac = new AbortController();
  private lastSeen = Date.now();
  private livenessTimer: NodeJS.Timeout | null = null;
  private handshakeTimer: NodeJS.Timeout | null;
  private paused = false;
  private corked = false;
  private writableWaiters: (() => void)[] = [];
  private idleWaiters: (() => void)[] = [];
  version = 0;

  constructor(
    private readonly socket: Socket,
    private readonly broker: Broker,
    private readonly limits: ConnectionLimits,
    private readonly logger: Logger | undefined,
    private readonly onClose: (c: Connection) => void,
    private readonly shared: SharedBudget = { inFlightBytes: 0, paused: new Set() },
  ) {
    this.reader = new FrameReader(PRE_HANDSHAKE_MAX_FRAME_BYTES);
    socket.setNoDelay(true);
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", () => {
      // ECONNRESET and friends: the close handler cleans up.
    });
    socket.on("close", () => this.cleanup());
    socket.on("drain", () => this.onDrain());
    this.handshakeTimer = setTimeout(() => {
      this.fail(new ProtocolError(`handshake not completed within ${limits.handshakeTimeoutMs} ms`));
    }, limits.handshakeTimeoutMs);
    this.handshakeTimer.unref();
  }

  get remote(): string {
    return `${this.socket.remoteAddress}:${this.socket.remotePort}`;
  }

  private onData(chunk: Buffer): void {
    if (this.state === "closing" || this.state === "closed") return;
    this.lastSeen = Date.now();
    this.reader.push(chunk);
    try {
      this.processBuffered();
    } catch (err) {
      this.fail(err);
    }
  }

  private processBuffered(): void {
    if (this.state === "preamble") {
      // Reject a wrong magic as soon as the bytes disagree, not after 8 bytes (or a timeout).
      const head = this.reader.peekRaw(MAGIC.length);
      if (!head.equals(MAGIC.subarray(0, head.length))) {
        throw new BadMagicError("not a sluice client: bad preamble (expected the bytes \"SLCE\")");
      }
      const pre = this.reader.takeRaw(PREAMBLE_BYTES);
      if (pre === null) return;
      if (!pre.subarray(0, 4).equals(MAGIC)) {
        throw new BadMagicError("not a sluice client: bad preamble (expected the bytes \"SLCE\")");
      }
      const min = pre.readUInt16BE(4);
      const max = pre.readUInt16BE(6);
      if (min > max || max < MIN_PROTOCOL_VERSION || min > PROTOCOL_VERSION) {
        throw new UnsupportedVersionError(
          `client speaks protocol versions ${min}..${max}; this server speaks ${MIN_PROTOCOL_VERSION}..${PROTOCOL_VERSION}`,
        );
      }
      this.version = Math.min(max, PROTOCOL_VERSION);
      this.state = "hello";
    }
    while (this.state === "hello" || this.state === "ready") {
      if (this.paused) return;
      const raw = this.reader.next();
      if (raw === null) return;
      const frame = decodeFrame(raw);
      if (this.state === "hello") {
        if (frame.op !== Op.Hello) throw new ProtocolError(`expected HELLO as the first frame, got opcode ${frame.op}`);
        this.handleHello(frame);
        continue;
      }
      this.dispatch(frame, raw.length);
    }
  }

  private overBudget(): boolean {
    return (
      this.inFlight >= this.limits.maxInFlight ||
      this.inFlightBytes >= this.limits.maxInFlightBytes ||
      this.shared.inFlightBytes >= this.limits.maxInFlightBytesTotal
    );
  }

  private handleHello(frame: Frame): void {
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    this.state = "ready";
    this.reader.maxFrameBytes = this.limits.maxFrameBytes;
    this.send(
      encodeFrame(Op.Hello, FLAG_RESPONSE, frame.correlationId, {
        version: this.version,
        server: "sluice",
        connectionId: this.id,
        maxFrameBytes: this.limits.maxFrameBytes,
        maxRecordsPerBatch: this.limits.maxRecordsPerBatch,
      }),
    );
  }

  /** Sends an error frame (correlation 0 = connection-level) and closes this connection only. */
  private fail(err: unknown): void {
    if (this.state === "closing" || this.state === "closed") return;
    const wire = errorToWire(err);
    this.logger?.warn?.({ conn: this.id, remote: this.remote, code: wire.code, err: wire.message }, "closing connection");
    this.state = "closing";
    try {
      this.socket.end(encodeFrame(Op.Hello, FLAG_RESPONSE | FLAG_ERROR, 0, wire));
    } catch {
      this.socket.destroy();
    }
    // A peer that never reads must not keep the socket (and its buffers) forever.
    setTimeout(() => this.socket.destroy(), 2000).unref();
    this.cleanup();
  }

  private send(buf: Buffer): boolean {
    if (this.state === "closed" || this.socket.destroyed) return false;
    // Coalesce the frames written during one tick into one syscall (many small responses
    // and pushes are common: queue jobs, receipts).
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(buf);
    const ok = this.socket.writableLength < this.limits.maxOutputBytes;
    if (!ok && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
    return ok;
  }

  /** Sends a frame in parts (head, then a body that is not copied); same result as `send`. */
  private sendParts(head: Buffer, body: Buffer): boolean {
    if (this.state === "closed" || this.socket.destroyed) return false;
    this.send(head);
    // Written in the same corked tick as the head: one writev, and never a partial frame.
    this.socket.write(body);
    const ok = this.socket.writableLength < this.limits.maxOutputBytes;
    if (!ok && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
    return ok;
  }

  private onDrain(): void {
    if (this.socket.writableLength >= this.limits.maxOutputBytes) return;
    const ws = this.writableWaiters;
    this.writableWaiters = [];
    for (const w of ws) w();
    this.maybeResume();
  }

  maybeResume(): void {
    if (!this.paused || this.state !== "ready") return;
    if (this.overBudget()) {
      if (this.shared.inFlightBytes >= this.limits.maxInFlightBytesTotal) this.shared.paused.add(this);
      return;
    }
    if (this.socket.writableLength >= this.limits.maxOutputBytes) return;
    this.shared.paused.delete(this);
    this.paused = false;
    this.socket.resume();
    try {
      this.processBuffered();
    } catch (err) {
      this.fail(err);
    }
  }

  private waitWritable(): Promise<void> {
    if (this.socket.writableLength < this.limits.maxOutputBytes || this.state === "closed") return Promise.resolve();
    return new Promise((resolve) => this.writableWaiters.push(resolve));
  }

  private respond(frame: Frame, meta: unknown, body: Buffer | null = null): void {
    this.send(encodeFrame(frame.op, FLAG_RESPONSE, frame.correlationId, meta, body));
  }

  private respondError(frame: Frame, err: unknown): void {
    const wire = errorToWire(err);
    if (wire.code === "INTERNAL") this.logger?.error?.({ conn: this.id, op: frame.op, err }, "request failed");
    this.send(encodeFrame(frame.op, FLAG_RESPONSE | FLAG_ERROR, frame.correlationId, wire));
  }

  private dispatch(frame: Frame, size: number): void {
    if (frame.flags & (FLAG_RESPONSE | FLAG_PUSH)) throw new ProtocolError("clients may only send requests");
    // Frames that need no response and cost nothing are handled inline.
    if (frame.op === Op.Heartbeat) return;
    if (frame.op === Op.RevokeAck) {
      this.members.get(int(frame.meta, "sub")!)?.revokeAck(int(frame.meta, "ack")!);
      return;
    }
    if (frame.op === Op.Credit) {
      const sub = int(frame.meta, "sub")!;
      const n = int(frame.meta, "credit")!;
      this.members.get(sub)?.addCredit(n);
      return;
    }
    this.inFlight++;
    this.inFlightBytes += size;
    this.shared.inFlightBytes += size;
    if (this.overBudget() && !this.paused) {
      this.paused = true;
      this.socket.pause();
      if (this.shared.inFlightBytes >= this.limits.maxInFlightBytesTotal) this.shared.paused.add(this);
    }
    let p: Promise<void>;
    try {
      // handle() starts the broker call synchronously, so pipelined publishes reach the broker
      // in arrival order.
      p = this.handle(frame);
    } catch (err) {
      p = Promise.reject(err);
    }
    p.catch((err) => this.respondError(frame, err)).finally(() => {
      this.inFlight--;
      this.inFlightBytes -= size;
      this.shared.inFlightBytes -= size;
      // Connections paused on the shared budget may continue now.
      if (this.shared.paused.size > 0 && this.shared.inFlightBytes < this.limits.maxInFlightBytesTotal) {
        for (const c of [...this.shared.paused]) {
          this.shared.paused.delete(c);
          c.maybeResume();
        }
      }
      if (this.inFlight === 0) {
        const ws = this.idleWaiters;
        this.idleWaiters = [];
        for (const w of ws) w();
      }
      this.maybeResume();
    });
  }

  private async handle(frame: Frame): Promise<void> {
    const m = frame.meta;
    const b = this.broker;
    switch (frame.op) {
      case Op.Ping:
        return this.respond(frame, {});
      case Op.CreateTopic: {
        const config = (m.config ?? {}) as TopicConfig;
        if (typeof config !== "object" || Array.isArray(config)) throw new ValidationError("config must be an object");
        return this.respond(frame, { topic: await b.createTopic(str(m, "name"), config) });
      }
      case Op.DeleteTopic:
        await b.deleteTopic(str(m, "name"));
        return this.respond(frame, {});
      case Op.ListTopics:
        return this.respond(frame, { topics: await b.listTopics() });
      case Op.DescribeTopic:
        return this.respond(frame, { topic: await b.describeTopic(str(m, "name")) });
      case Op.InitProducer:
        return this.respond(frame, await b.initProducer(int(m, "producerId", true)));
      case Op.Publish: {
        const topic = str(m, "topic");
        const records = decodePublishRecords(frame.body, this.limits.maxRecordsPerBatch);
        const opts: PublishBatchOptions = { signal: this.ac.signal };
        const pid = int(m, "producerId", true);
        if (pid !== undefined) {
          opts.producerId = pid;
          opts.producerEpoch = int(m, "producerEpoch", true);
          opts.baseSequence = int(m, "baseSequence", true);
        }
        const receipts = await b.publishBatch(topic, records, opts);
        const w = new Writer(8 + receipts.length * 13);
        w.u32(receipts.length);
        for (const r of receipts) {
          w.i32(r.partition);
          w.f64(r.offset);
          w.u8((r.duplicate ? 1 : 0) | (r.synced ? 2 : 0));
        }
        return this.respond(frame, {}, w.finish());
      }
      case Op.PublishEncoded: {
        // The client's batch, in the storage format: stored as is after full validation.
        const topic = str(m, "topic");
        const partition = int(m, "partition")!;
        // The batch is kept until it is durable and counted at its own length (the pending
        // bound). A frame that arrived inside a larger socket chunk is a view into it: copy
        // so the kept bytes are what is counted, not the whole chunk.
        const batch = frame.body.buffer.byteLength <= frame.body.length + 4096 ? frame.body : Buffer.from(frame.body);
        const r = isEncodedPublisher(b)
          ? await b.publishEncoded(topic, partition, batch, this.ac.signal)
          : await publishDecoded(b, topic, partition, batch, this.ac.signal);
        return this.respond(frame, { baseOffset: r.baseOffset, count: r.count, duplicate: r.duplicate, synced: r.synced });
      }
      case Op.Fetch: {
        const topic = str(m, "topic");
        const maxBytes = Math.min(int(m, "maxBytes", true) ?? 1024 * 1024, Math.floor(this.limits.maxFrameBytes / 2));
        const maxWaitMs = Math.min(int(m, "maxWaitMs", true) ?? 0, 300_000);
        const res = await b.fetch(topic, int(m, "partition")!, int(m, "offset")!, {
          maxBytes,
          maxWaitMs,
          signal: this.ac.signal,
        });
        return this.respond(
          frame,
          { nextOffset: res.nextOffset, highWatermark: res.highWatermark, logStartOffset: res.logStartOffset },
          encodeConsumedRecords(res.records),
        );
      }
      case Op.OffsetForTimestamp: {
        const off = await b.offsetForTimestamp(str(m, "topic"), int(m, "partition")!, int(m, "timestamp")!);
        return this.respond(frame, { offset: off });
      }
      case Op.ResetGroup: {
        const res = await b.resetGroup(str(m, "group"), str(m, "topic"), m.to as ResetTarget, {
          dryRun: m.dryRun === true,
        });
        return this.respond(frame, { result: res });
      }
      case Op.GroupLag:
        return this.respond(frame, { lag: await b.groupLag(str(m, "group"), str(m, "topic")) });
      case Op.Subscribe:
        return this.handleSubscribe(frame);
      case Op.QueueEnqueue: {
        const q = this.queueFor(m);
        // producerId + sequence: an idempotent request, possibly a retry of one already stored
        // (answered with the original ids); calls: the client's coalesced enqueue calls, each
        // answered on its own (docs/protocol.md §7).
        const producerId = int(m, "producerId", true);
        const idem = producerId === undefined ? undefined : { producerId, sequence: int(m, "sequence")! };
        // A client that asks for it gets {first, n} instead of one {id, duplicate} per job.
        return this.respond(
          frame,
          await enqueueFromWire(q, frame.body, m.opts, this.limits.maxRecordsPerBatch, this.ac.signal, m.compact === true, { idem, calls: m.calls ?? undefined }),
        );
      }
      case Op.QueueWork:
        return this.handleWork(frame);
      case Op.QueueSettle: {
        // Settles are coalesced by the client: one frame carries many, each answered separately.
        const w = this.workers.get(int(m, "worker")!);
        const items = m.items;
        if (!Array.isArray(items) || items.length > 100_000) throw new ValidationError("items must be an array");
        const results: (WireError | null)[] = new Array(items.length).fill(null);
        const valid: { i: number; receipt: string; action: string; arg: Record<string, unknown> }[] = [];
        items.forEach((it: unknown, i: number) => {
          try {
            if (!w) throw new LeaseExpiredErrorForWorker();
            const o = (it ?? {}) as Record<string, unknown>;
            const arg = (o.arg ?? {}) as Record<string, unknown>;
            if (arg === null || typeof arg !== "object") throw new ValidationError("arg must be an object");
            valid.push({ i, receipt: str(o, "receipt"), action: str(o, "action"), arg });
          } catch (err) {
            results[i] = errorToWire(err);
          }
        });
        if (w && valid.length > 0) {
          const { errors } = await w.settleMany(valid);
          for (const [k, e] of errors) results[valid[k].i] = errorToWire(e);
        }
        return this.respond(frame, { results });
      }
      case Op.QueueSettleBatch: {
        // The binary form of QUEUE_SETTLE (docs/protocol.md §7): every settlement of the frame
        // is applied before the journal batch is written (one fdatasync for all of them and for
        // the jobs granted in their place); only failures are listed in the response.
        const w = this.workers.get(int(m, "worker")!);
        const items = decodeSettleItems(frame.body, this.limits.maxRecordsPerBatch);
        if (!w) {
          const wire = errorToWire(new LeaseExpiredErrorForWorker());
          return this.respond(frame, { errors: items.map((_, i) => [i, wire]) });
        }
        const { errors } = await w.settleMany(items);
        return this.respond(frame, errors.length === 0 ? null : { errors: errors.map(([i, e]) => [i, errorToWire(e)]) });
      }
      case Op.QueueStop: {
        const id = int(m, "worker")!;
        const w = this.workers.get(id);
        if (w && m.drain === true) {
          // Stop sending jobs; the worker stays, so the client can still settle what it holds.
          w.stopDeliveries();
          return this.respond(frame, {});
        }
        if (w) {
          this.workers.delete(id);
          await w.close();
        }
        return this.respond(frame, {});
      }
      case Op.QueueAdmin: {
        if (m.action === "list" || m.action === "delete") {
          const host = queueHost(this.broker) as unknown as { listQueues?(): Promise<string[]>; deleteQueue?(n: string): Promise<void> };
          if (m.action === "list") {
            if (typeof host.listQueues !== "function") throw new ValidationError("this broker cannot list queues");
            return this.respond(frame, { queues: await host.listQueues() });
          }
          if (typeof host.deleteQueue !== "function") throw new ValidationError("this broker cannot delete queues");
          const name = str(m, "queue", 300);
          await host.deleteQueue(name);
          for (const k of [...this.queues.keys()]) if (k.startsWith(`${name}\u0000`)) this.queues.delete(k);
          return this.respond(frame, {});
        }
        const q = this.queueFor(m);
        switch (m.action) {
          case "stats":
            return this.respond(frame, { stats: await q.stats() });
          case "purge":
            return this.respond(frame, { purged: await q.purge() });
          case "redrive":
            return this.respond(frame, { result: await q.redrive((m.opts ?? {}) as RedriveOptions) });
          default:
            throw new ValidationError(`unknown queue action ${JSON.stringify(m.action)}`);
        }
      }
      case Op.Commit: {
        const subId = int(m, "sub")!;
        const offsets = m.offsets;
        if (!Array.isArray(offsets) || offsets.length > 100_000) throw new ValidationError("offsets must be an array");
        const pairs: ([number, number] | [number, number, number])[] = [];
        for (const o of offsets) {
          if (!Array.isArray(o) || (o.length !== 2 && o.length !== 3) || !o.every((v) => Number.isSafeInteger(v))) {
            throw new ValidationError("each offset must be [partition, offset] or [partition, offset, generation]");
          }
          // Optional third element: the generation the records were pushed with (raw pushes).
          if (o.length === 3) pairs.push([o[0], o[1], o[2]]);
          else pairs.push([o[0], o[1]]);
        }
        const member = this.members.get(subId);
        if (!member) {
          const why = this.endedMembers.get(subId);
          throw new StaleGenerationError(
            why
              ? `group member ${subId} ended (${why}); its partitions may belong to another member now`
              : `unknown group member ${subId} on this connection`,
          );
        }
        await member.commit(pairs);
        return this.respond(frame, {});
      }
      case Op.Unsubscribe: {
        const subId = int(m, "sub")!;
        const member = this.members.get(subId);
        if (member) {
          this.members.delete(subId);
          this.rememberEnded(subId, "unsubscribed");
          await member.close("unsubscribed");
        }
        return this.respond(frame, {});
      }
      default:
        throw new ProtocolError(`unknown opcode ${frame.op}`);
    }
  }

  private queueFor(m: Record<string, unknown>): Queue<unknown> {
    const name = str(m, "queue", 300);
    const config = m.config === undefined || m.config === null ? undefined : (m.config as QueueConfig);
    if (config !== undefined && (typeof config !== "object" || Array.isArray(config))) throw new ValidationError("config must be an object");
    const key = `${name}\u0000${config === undefined ? "" : JSON.stringify(config)}`;
    let q = this.queues.get(key);
    if (!q) {
      q = queueHost(this.broker).queue(name, config);
      if (this.queues.size >= 1024) this.queues.delete(this.queues.keys().next().value!);
      this.queues.set(key, q);
    }
    return q;
  }

  private handleWork(frame: Frame): void {
    const m = frame.meta;
    const id = int(m, "worker")!;
    if (this.workers.has(id)) throw new ValidationError(`worker id ${id} is already in use`);
    if (this.workers.size >= this.limits.maxSubscriptionsPerConnection) {
      throw new ValidationError(`at most ${this.limits.maxSubscriptionsPerConnection} workers per connection`);
    }
    const q = this.queueFor(m);
    const prefetch = Math.max(1, Math.min(int(m, "prefetch", true) ?? 16, 10_000));
    // A client that asks for it gets jobs as PUSH_JOB_BATCH (binary, no per-job JSON) and may
    // settle with QUEUE_SETTLE_BATCH; older clients keep PUSH_JOBS.
    const batch = m.batch === true;
    const worker: RemoteWorker = new RemoteWorker({
      id,
      queue: q,
      prefetch,
      visibilityTimeoutMs: int(m, "visibilityTimeoutMs", true),
      consumerId: typeof m.consumerId === "string" ? m.consumerId.slice(0, 200) : `conn-${this.id}-worker-${id}`,
      codeVersion: typeof m.codeVersion === "string" ? m.codeVersion.slice(0, 200) : undefined,
      onUnsettled: m.onUnsettled === "error" ? "error" : "nack",
      byReceipt: !batch,
      push: (jobs, firstTag) => {
        if (batch) return this.send(encodeJobBatchFrame(Op.PushJobBatch, FLAG_PUSH, { worker: id }, firstTag, jobs.map(toWireJob)));
        const metaJobs = jobs.map((j) => ({
          id: j.id,
          key: j.key,
          attempt: j.attempt,
          enqueuedAt: j.enqueuedAt,
          receipt: j.receipt,
          leaseExpiresAt: j.leaseExpiresAt,
          redriveCount: j.redriveCount,
          deadLetter: j.deadLetter,
        }));
        const body = encodePublishRecords(jobs.map((j) => ({ value: j.data as PublishValue, headers: j.headers })));
        return this.send(encodeFrame(Op.PushJobs, FLAG_PUSH, 0, { worker: id, jobs: metaJobs }, body));
      },
      pushLeaseLost: (receipt, tag) => this.send(encodeFrame(Op.PushLeaseLost, FLAG_PUSH, 0, batch ? { worker: id, receipt, tag } : { worker: id, receipt })),
      pushEnded: (reason, error) => {
        if (this.workers.get(id) === worker) this.workers.delete(id);
        this.send(
          encodeFrame(Op.PushWorkerEnded, FLAG_PUSH, 0, { worker: id, reason, error: error === undefined ? undefined : errorToWire(error) }),
        );
      },
      waitWritable: () => this.waitWritable(),
    });
    this.workers.set(id, worker);
    this.respond(frame, batch ? { worker: id, batch: true } : { worker: id });
  }

  private rememberEnded(id: number, reason: string): void {
    this.endedMembers.set(id, reason);
    if (this.endedMembers.size > 1024) {
      const first = this.endedMembers.keys().next().value;
      if (first !== undefined) this.endedMembers.delete(first);
    }
  }

  private handleSubscribe(frame: Frame): void {
    const m = frame.meta;
    if (this.members.size >= this.limits.maxSubscriptionsPerConnection) {
      throw new ValidationError(`at most ${this.limits.maxSubscriptionsPerConnection} subscriptions per connection`);
    }
    const subId = int(m, "sub")!;
    if (this.members.has(subId)) throw new ValidationError(`subscription id ${subId} is already in use`);
    const topic = str(m, "topic");
    const group = str(m, "group");
    const credit = Math.max(1, Math.min(int(m, "credit", true) ?? 1000, 100_000));
    const sessionTimeoutMs = Math.max(
      this.limits.minSessionTimeoutMs,
      Math.min(int(m, "sessionTimeoutMs", true) ?? this.limits.defaultSessionTimeoutMs, this.limits.maxSessionTimeoutMs),
    );
    const pick = <T extends string>(key: string, allowed: readonly T[]): T | undefined => {
      const v = m[key];
      if (v === undefined || v === null) return undefined;
      if (!allowed.includes(v as T)) throw new ValidationError(`${key} must be one of ${allowed.join(", ")}`);
      return v as T;
    };
    const member = new RemoteMember({
      id: subId,
      broker: this.broker,
      topic,
      group,
      start: pick("start", ["earliest", "latest"] as const),
      offsetReset: pick("offsetReset", ["earliest", "latest", "error"] as const),
      assignment: pick("assignment", ["range", "roundrobin"] as const),
      maxBytes: int(m, "maxBytes", true),
      credit,
      maxUncommitted: this.limits.maxUncommittedPerSubscription,
      maxBatchMessages: 1000,
      // The client's frame reader takes DEFAULT_MAX_FRAME_BYTES; keep room for the head.
      maxPushBytes: Math.min(this.limits.maxFrameBytes, DEFAULT_MAX_FRAME_BYTES) - 64 * 1024,
      revokeTimeoutMs: Math.min(sessionTimeoutMs, 10_000),
      // Only for clients that announced PUSH_RECORD_BATCHES (older ones get PUSH_MESSAGES).
      pushRaw:
        m.recordBatches === true
          ? (c) =>
              // Stored batches go out as they are: the head is encoded, the bytes are not copied.
              this.sendParts(
                encodeFrameHead(Op.PushRecordBatches, FLAG_PUSH, 0, { sub: subId, partition: c.partition, generation: c.generation, from: c.from, records: c.records }, c.data.length),
                c.data,
              )
          : undefined,
      push: (msgs) => {
        const w = new Writer(256 + msgs.length * 64);
        w.u32(msgs.length);
        for (const msg of msgs) writeConsumedRecord(w, msg);
        return this.send(encodeFrame(Op.PushMessages, FLAG_PUSH, 0, { sub: subId, topic }, w.finish()));
      },
      pushAssignment: (generation, assigned, revoked, ack) => {
        this.send(encodeFrame(Op.PushAssignment, FLAG_PUSH, 0, { sub: subId, generation, assigned, revoked, ack }));
      },
      pushEnded: (reason, error) => {
        if (this.members.get(subId) === member) {
          this.members.delete(subId);
          this.rememberEnded(subId, reason);
        }
        this.send(
          encodeFrame(Op.PushSubscriptionEnded, FLAG_PUSH, 0, {
            sub: subId,
            reason,
            error: error === undefined ? undefined : errorToWire(error),
          }),
        );
      },
      waitWritable: () => this.waitWritable(),
    });
    this.members.set(subId, member);
    this.armLiveness(sessionTimeoutMs);
    this.respond(frame, { sub: subId, sessionTimeoutMs });
  }

  /**
   * Session liveness: any frame from the client counts as a heartbeat (clients send HEARTBEAT
   * frames when otherwise idle). When nothing arrives for the shortest session timeout of this
   * connection's members, they all leave the group, so a frozen (SIGSTOPped) process loses its
   * partitions while its TCP connection is still open.
   */
  private sessionTimeoutMs = Infinity;
  private armLiveness(timeoutMs: number): void {
    this.sessionTimeoutMs = Math.min(this.sessionTimeoutMs, timeoutMs);
    if (this.livenessTimer) clearInterval(this.livenessTimer);
    this.livenessTimer = setInterval(() => this.checkLiveness(), Math.max(50, Math.floor(this.sessionTimeoutMs / 4)));
    this.livenessTimer.unref();
  }

  private checkLiveness(): void {
    if (this.members.size === 0) return;
    const silentMs = Date.now() - this.lastSeen;
    if (silentMs <= this.sessionTimeoutMs) return;
    this.logger?.warn?.({ conn: this.id, silentMs }, "group session expired; removing members");
    for (const [id, member] of this.members) {
      this.members.delete(id);
      const reason = `session expired: no heartbeat for ${silentMs} ms (sessionTimeoutMs ${this.sessionTimeoutMs})`;
      this.rememberEnded(id, reason);
      void member.close(reason);
      this.send(encodeFrame(Op.PushSubscriptionEnded, FLAG_PUSH, 0, { sub: id, reason: "session-expired", message: reason }));
    }
  }

  /** Graceful: stop reading new requests, wait (bounded) for in-flight ones, then close. */
  async shutdown(graceMs: number): Promise<void> {
    if (this.state === "closed") return;
    this.state = "closing";
    this.socket.pause();
    const members = [...this.members.values()];
    this.members.clear();
    const workers = [...this.workers.values()];
    this.workers.clear();
    await Promise.all([...members.map((mm) => mm.close("server shutting down")), ...workers.map((w) => w.close())]);
    if (this.inFlight > 0) {
      await Promise.race([
        new Promise<void>((resolve) => this.idleWaiters.push(resolve)),
        new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref()),
      ]);
    }
    this.socket.end();
    setTimeout(() => this.socket.destroy(), 500).unref();
    this.cleanup();
  }

  private cleanup(): void {
    if (this.state === "closed") return;
    this.state = "closed";
    this.shared.paused.delete(this);
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    if (this.livenessTimer) clearInterval(this.livenessTimer);
    this.ac.abort(new ConnectionClosedError("client connection closed"));
    for (const member of this.members.values()) void member.close("connection closed");
    this.members.clear();
    // Leases belong to the connection: release in-flight jobs for redelivery now.
    for (const w of this.workers.values()) void w.close();
    this.workers.clear();
    const ws = this.writableWaiters;
    this.writableWaiters = [];
    for (const w of ws) w();
    this.onClose(this);
  }
}


/** Settling on a worker that no longer exists: its leases were released when it ended. */
class LeaseExpiredErrorForWorker extends LeaseExpiredError {
  constructor() {
    super("lease expired: the worker that received this job has ended (connection lost or worker closed); the job was released for redelivery");
  }
}
