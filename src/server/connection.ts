// SPDX-License-Identifier: Apache-2.0
/**
 * One client connection of the binary protocol (docs/protocol.md): handshake, frame decoding,
 * flow control, and dispatch of each request to its handler in the table derived from the
 * operation table (src/server/handlers.ts); the connection is the handlers' `Session`.
 *
 * Limits (all explicit, all per connection):
 * - before the handshake (and its authentication, src/server/auth.ts) completes, only HELLO
 *   frames are accepted, each at most PRE_HANDSHAKE_MAX_FRAME_BYTES, and the whole handshake
 *   must finish within `handshakeTimeoutMs` (AUTH-1);
 * - after it, `maxFrameBytes`; the length prefix is checked before anything is allocated;
 * - at most `maxInFlight` requests are executing; beyond it we stop reading the socket, so
 *   TCP backpressure reaches the client instead of our memory;
 * - while the socket's write buffer exceeds `maxOutputBytes` we stop reading requests and
 *   stop pulling messages for subscriptions.
 * A protocol violation answers with an error frame and closes this connection only.
 */
import { ProcessingLog } from "./processing-log.js";
import type { Socket } from "node:net";
import { BadMagicError, ConnectionClosedError, ForbiddenError, RateLimitedError, ProtocolError, UnsupportedVersionError, ValidationError } from "../errors.js";
import type { BrokerHost } from "../broker/host.js";
import type { QueueConfig } from "../queues/types.js";
import type { HostQueue } from "../queues/host-api.js";
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
  decodeFrame,
  encodeFrame,
  errorToWire,
  type Frame,
} from "../wire/index.js";
import { oneWayHandler, requestHandler } from "./handlers.js";
import type { RemoteMember } from "./remote-member.js";
import type { RemoteWorker } from "./remote-queue.js";
import { str, type ConnectionLimits, type Reply, type Session } from "./session.js";
import type { Logger } from "../observability/telemetry.js";
import type { HandshakeAuth, ServerAuth } from "./auth.js";
import type { AuditActor } from "../security/audit/record.js";
import { ServerAuthorization, type Gate } from "./authorization.js";
import { needsOf } from "./permissions.js";
import { QuotaHold, chargeRequest } from "./quota-hold.js";

export type { ConnectionLimits } from "./session.js";


export { DEFAULT_LIMITS } from "./limits.js";

/** "authenticating": a HELLO's credentials are being checked (reading waits); "auth": waiting
 * for the client's second SCRAM HELLO. */
type State = "preamble" | "hello" | "authenticating" | "auth" | "ready" | "closing" | "closed";

/** Server-wide accounting shared by all connections. */
export interface SharedBudget {
  inFlightBytes: number;
  /** Connections paused because the shared budget was exhausted. */
  paused: Set<Connection>;
}

let nextConnectionId = 1;

export class Connection implements Session {
  readonly id = nextConnectionId++;
  private state: State = "preamble";
  private readonly reader: FrameReader;
  private inFlight = 0;
  private inFlightBytes = 0;
  readonly members = new Map<number, RemoteMember>();
  readonly workers = new Map<number, RemoteWorker>();
  readonly processing: ProcessingLog;
  /** Queue handles by name+config, bounded (a handle is cheap; this only avoids re-validation). */
  private readonly queues = new Map<string, HostQueue>();
  /** The config last declared through this connection, per queue name (bounded like `queues`). */
  private readonly declared = new Map<string, string>();
  /** Ids of members that ended (session expiry etc.), so late commits get a precise error. Bounded. */
  private readonly endedMembers = new Map<number, string>();
  private readonly ac = new AbortController();
  private lastSeen = Date.now();
  private livenessTimer: NodeJS.Timeout | null = null;
  private handshakeTimer: NodeJS.Timeout | null;
  private paused = false;
  private corked = false;
  private readonly uncork = (): void => {
    this.corked = false;
    this.socket.uncork();
  };
  private writableWaiters: (() => void)[] = [];
  private idleWaiters: (() => void)[] = [];
  version = 0;
  /**
   * Who authenticated this connection (a user name or a token's principal); null when the
   * server runs without credentials. Set once, before any request is dispatched.
   */
  principal: string | null = null;
  private login: HandshakeAuth | null = null;
  /** QUO-1: reading stops while this principal pays a quota debt. */
  private readonly quota = new QuotaHold(
    () => {
      if (this.state === "closed" || this.paused) return;
      this.paused = true;
      this.socket.pause();
    },
    () => {
      this.onDrain();
      this.maybeResume();
    },
  );
  /** Gives back this connection's place in its connection quotas. */
  private releaseQuota: (() => void) | null = null;
  /** Removes this connection's policy-change listener (ACL-3). */
  private unlisten: (() => void) | null = null;

  constructor(
    private readonly socket: Socket,
    readonly host: BrokerHost,
    readonly limits: ConnectionLimits,
    private readonly logger: Logger,
    private readonly onClose: (c: Connection) => void,
    private readonly shared: SharedBudget = { inFlightBytes: 0, paused: new Set() },
    private readonly auth: ServerAuth | null = null,
    private readonly authz: ServerAuthorization = new ServerAuthorization(null, logger),
  ) {
    this.reader = new FrameReader(PRE_HANDSHAKE_MAX_FRAME_BYTES);
    this.processing = new ProcessingLog(logger);
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

  /** The peer's address without its port: the unit of failed-login rate limiting (AUTH-4). */
  get source(): string {
    return this.socket.remoteAddress ?? "unknown";
  }

  get remote(): string {
    return `${this.socket.remoteAddress}:${this.socket.remotePort}`;
  }

  /** No authentication yet: every connection is "anonymous", known by its peer address. */
  get actor(): AuditActor {
    return { principal: this.principal ?? "anonymous", source: this.remote };
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
    while (this.state === "hello" || this.state === "auth" || this.state === "ready") {
      if (this.paused) return;
      const raw = this.reader.next();
      if (raw === null) return;
      const frame = decodeFrame(raw);
      if (this.state !== "ready") {
        // AUTH-1: nothing but HELLO reaches the broker before the handshake completes.
        if (frame.op !== Op.Hello) throw new ProtocolError(`expected HELLO during the handshake, got opcode ${frame.op}`);
        this.startHello(frame);
        return;
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

  /** Checks a HELLO's credentials (asynchronously: the store may be re-read), then goes on reading. */
  private startHello(frame: Frame): void {
    const wasAuth = this.state === "auth";
    this.state = "authenticating";
    // Nothing more is read while credentials are checked: a peer cannot pile up input (AUTH-1).
    this.socket.pause();
    void this.handleHello(frame, wasAuth).then(
      () => {
        try {
          if (this.state === "ready" || this.state === "auth") this.socket.resume();
          if (this.state === "ready" || this.state === "auth") this.processBuffered();
        } catch (err) {
          this.fail(err);
        }
      },
      (err: unknown) => this.fail(err),
    );
  }

  private async handleHello(frame: Frame, second: boolean): Promise<void> {
    let principal: string | null = null;
    let serverFinal: string | undefined;
    // A client that sends credentials gets them checked even where they are optional: it
    // expects the server's SCRAM signature (src/client/auth.ts).
    if (second || (this.auth && (frame.meta.auth !== undefined || (await this.auth.required())))) {
      this.login ??= this.auth!.begin(this.source, this.remote, this.socket);
      const step = await this.login.step(frame.meta.auth);
      if (this.state !== "authenticating") return;
      if (step.kind === "challenge") {
        this.state = "auth";
        this.send(encodeFrame(Op.Hello, FLAG_RESPONSE, frame.correlationId, { continue: true, auth: { message: step.message } }));
        return;
      }
      principal = step.principal;
      serverFinal = step.message;
    }
    if (this.state !== "authenticating") return;
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
    this.principal = principal;
    this.login = null;
    this.state = "ready";
    this.reader.maxFrameBytes = this.limits.maxFrameBytes;
    if (principal !== null) {
      this.logger.info({ conn: this.id, remote: this.remote, principal }, "authenticated");
      this.unlisten = this.authz.onChange(() => this.reauthorize());
      this.releaseQuota = this.authz.admitConnection(principal);
      if (this.releaseQuota === null) throw new RateLimitedError(1000, `too many connections for ${principal}: its connection quota is full`);
    }
    this.send(
      encodeFrame(Op.Hello, FLAG_RESPONSE, frame.correlationId, {
        version: this.version,
        server: "sluice",
        connectionId: this.id,
        maxFrameBytes: this.limits.maxFrameBytes,
        maxRecordsPerBatch: this.limits.maxRecordsPerBatch,
        ...(principal !== null ? { principal, ...(serverFinal ? { auth: { message: serverFinal } } : {}) } : {}),
      }),
    );
  }

  /** Sends an error frame (correlation 0 = connection-level) and closes this connection only. */
  private fail(err: unknown): void {
    if (this.state === "closing" || this.state === "closed") return;
    const wire = errorToWire(err);
    this.logger.warn({ conn: this.id, remote: this.remote, code: wire.code, err: wire.message }, "closing connection");
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

  send(buf: Buffer): boolean {
    if (this.state === "closed" || this.socket.destroyed) return false;
    // Coalesce the frames written during one turn of the event loop into one syscall: the
    // completions of one poll phase (durable appends, offset commits, incoming requests) each
    // write responses and pushes, and on loopback every write syscall also runs the peer's
    // receive path and wakes it. The socket is uncorked in the check phase of the same turn,
    // so no frame waits for more I/O or a timer.
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      setImmediate(this.uncork);
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
  sendParts(head: Buffer, body: Buffer): boolean {
    if (this.state === "closed" || this.socket.destroyed) return false;
    this.send(head);
    // Written in the same corked turn as the head: one writev, and never a partial frame.
    this.socket.write(body);
    // Pushed records count against the consume quota: a held connection reports "not
    // writable", so its members wait (waitWritable) until the debt is paid (QUO-1).
    if (this.principal !== null) this.quota.hold(this.authz.throttle(this.principal, "consumeBytesPerSec", body.length));
    const ok = this.socket.writableLength < this.limits.maxOutputBytes && !this.quota.held;
    if (!ok && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
    return ok;
  }

  private onDrain(): void {
    if (this.socket.writableLength >= this.limits.maxOutputBytes || this.quota.held) return;
    const ws = this.writableWaiters;
    this.writableWaiters = [];
    for (const w of ws) w();
    this.maybeResume();
  }

  maybeResume(): void {
    if (!this.paused || this.state !== "ready") return;
    if (this.quota.held) return;
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

  waitWritable(): Promise<void> {
    if ((!this.quota.held && this.socket.writableLength < this.limits.maxOutputBytes) || this.state === "closed") return Promise.resolve();
    return new Promise((resolve) => this.writableWaiters.push(resolve));
  }

  private respondError(frame: Frame, err: unknown): void {
    const wire = errorToWire(err);
    if (wire.code === "INTERNAL") this.logger.error({ conn: this.id, op: frame.op, err }, "request failed");
    this.send(encodeFrame(frame.op, FLAG_RESPONSE | FLAG_ERROR, frame.correlationId, wire));
  }

  private dispatch(frame: Frame, size: number): void {
    if (frame.flags & (FLAG_RESPONSE | FLAG_PUSH)) throw new ProtocolError("clients may only send requests");
    // Frames that need no response and cost nothing are handled inline.
    const oneWay = oneWayHandler.get(frame.op);
    if (oneWay !== undefined) {
      oneWay(this, frame);
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
    const handler = requestHandler.get(frame.op);
    let p: Reply | Promise<Reply>;
    try {
      if (handler === undefined) throw new ProtocolError(`unknown opcode ${frame.op}`);
      // ACL-1: checked against the policy in force before the handler starts (synchronously,
      // so pipelined requests keep their order).
      if (this.principal !== null) {
        this.authz.check(this.principal, needsOf(this, frame), this.actor);
        this.quota.hold(chargeRequest(this.authz, this.principal, frame.op, size));
      }
      // The handler starts its broker call synchronously, so pipelined publishes reach the
      // broker in arrival order.
      p = handler(this, frame);
    } catch (err) {
      p = Promise.reject(err);
    }
    Promise.resolve(p).then(
      (reply) => {
        if (this.principal !== null && frame.op === Op.Fetch && reply.body) this.quota.hold(this.authz.throttle(this.principal, "consumeBytesPerSec", reply.body.length));
        this.send(encodeFrame(frame.op, FLAG_RESPONSE, frame.correlationId, reply.meta, reply.body ?? null));
        this.requestDone(size);
      },
      (err: unknown) => {
        this.respondError(frame, err);
        this.requestDone(size);
      },
    );
  }

  private requestDone(size: number): void {
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
  }

  get signal(): AbortSignal {
    return this.ac.signal;
  }

  queueFor(m: Record<string, unknown>): HostQueue {
    const name = str(m, "queue", 300);
    const config = m.config === undefined || m.config === null ? undefined : (m.config as QueueConfig);
    if (config !== undefined && (typeof config !== "object" || Array.isArray(config))) throw new ValidationError("config must be an object");
    const configKey = config === undefined ? "" : JSON.stringify(config);
    const key = `${name}\u0000${configKey}`;
    // A handle with a config declares it once, when made: a config declared again after another
    // one (A, B, then A) needs a new handle, or the queue would stay on B.
    if (config !== undefined && this.declared.get(name) !== configKey) {
      this.queues.delete(key);
      this.declared.set(name, configKey);
      if (this.declared.size > 1024) this.declared.delete(this.declared.keys().next().value!);
    }
    let q = this.queues.get(key);
    if (!q) {
      q = this.host.queue(name, config, this.actor);
      if (this.queues.size >= 1024) this.queues.delete(this.queues.keys().next().value!);
      this.queues.set(key, q);
    }
    return q;
  }

  forgetQueue(name: string): void {
    for (const k of [...this.queues.keys()]) if (k.startsWith(`${name}\u0000`)) this.queues.delete(k);
    this.declared.delete(name);
  }

  endedReason(id: number): string | undefined {
    return this.endedMembers.get(id);
  }

  rememberEnded(id: number, reason: string): void {
    this.endedMembers.set(id, reason);
    if (this.endedMembers.size > 1024) {
      const first = this.endedMembers.keys().next().value;
      if (first !== undefined) this.endedMembers.delete(first);
    }
  }

  /**
   * Session liveness: any frame from the client counts as a heartbeat (clients send HEARTBEAT
   * frames when otherwise idle). When nothing arrives for the shortest session timeout of this
   * connection's members, they all leave the group, so a frozen (SIGSTOPped) process loses its
   * partitions while its TCP connection is still open.
   *
   * One timer, due when the session would expire if nothing more arrived; when it fires early
   * (frames came meanwhile) it is set again for the new deadline. A busy connection costs one
   * timer wake-up per session timeout, an idle one without members none.
   */
  private sessionTimeoutMs = Infinity;
  armLiveness(timeoutMs: number): void {
    this.sessionTimeoutMs = Math.min(this.sessionTimeoutMs, timeoutMs);
    this.scheduleLiveness(this.sessionTimeoutMs - (Date.now() - this.lastSeen));
  }

  private scheduleLiveness(inMs: number): void {
    if (this.livenessTimer) clearTimeout(this.livenessTimer);
    this.livenessTimer = setTimeout(() => this.checkLiveness(), Math.max(10, inMs + 1));
    this.livenessTimer.unref();
  }

  private checkLiveness(): void {
    this.livenessTimer = null;
    if (this.members.size === 0 || this.state === "closed") return;
    const silentMs = Date.now() - this.lastSeen;
    if (silentMs <= this.sessionTimeoutMs) {
      this.scheduleLiveness(this.sessionTimeoutMs - silentMs);
      return;
    }
    this.logger.warn({ conn: this.id, silentMs }, "group session expired; removing members");
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

  /**
   * ACL-3: after a policy change, subscriptions and workers this principal may no longer use
   * end (with FORBIDDEN); requests are checked against the new policy from now on.
   */
  private reauthorize(): void {
    const p = this.principal;
    if (p === null || this.state === "closed") return;
    const denied = (what: string): ForbiddenError => new ForbiddenError(`not allowed any more: ${what} (the authorization policy changed)`);
    for (const [id, m] of [...this.members]) {
      if (this.authz.allows(p, { op: "consume", type: "topic", name: m.topic }) && this.authz.allows(p, { op: "consume", type: "group", name: m.group })) continue;
      this.members.delete(id);
      this.rememberEnded(id, "forbidden");
      m.end("error", denied(`consume ${m.topic} in group ${m.group}`));
    }
    for (const [id, w] of [...this.workers]) {
      if (this.authz.allows(p, { op: "consume", type: "queue", name: w.queueName })) continue;
      this.workers.delete(id);
      w.end("error", denied(`consume queue ${w.queueName}`));
    }
  }

  /** What requests of this connection are checked against (list filtering in handlers). */
  get gate(): Gate {
    return this.authz;
  }

  private cleanup(): void {
    if (this.state === "closed") return;
    this.state = "closed";
    this.unlisten?.();
    this.unlisten = null;
    this.releaseQuota?.();
    this.releaseQuota = null;
    this.quota.stop();
    this.shared.paused.delete(this);
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    if (this.livenessTimer) clearTimeout(this.livenessTimer);
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

