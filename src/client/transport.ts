// SPDX-License-Identifier: Apache-2.0
/**
 * Client side of the wire protocol: one TCP connection with handshake, correlation ids,
 * pipelining, server pushes, and reconnection with exponential backoff and jitter.
 *
 * Failover: the transport knows one or more server endpoints (stateless nodes in front of one
 * storage). Each reconnect attempt goes to the next endpoint in the list, so losing a node costs
 * one failed attempt, not a whole backoff. Everything that survives a reconnect (re-handshake,
 * re-login, rejoining members, re-sending idempotent requests) is the same whichever node
 * answers, because the state it relies on (producer ids and sequences, groups, leases) lives
 * in the shared storage, not in the node.
 *
 * Retry contract: a request sent with `retry: true` is idempotent (reads, and publishes that
 * carry producerId/epoch/sequence, which the broker deduplicates). When the connection drops,
 * such requests are re-sent on the next connection *in their original order* (per-partition
 * sequence order matters to the broker). Other requests fail with `ConnectionClosedError`
 * (retriable), because re-sending them could apply them twice.
 *
 * Bounds: at most `maxPendingRequests` requests wait or fly at a time; further callers wait
 * for a slot (backpressure instead of an unbounded queue).
 */
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect, type ConnectionOptions as TlsConnectionOptions } from "node:tls";
import { handshakeError } from "./tls.js";
import { DirectFrameReader } from "./direct-reader.js";
import {
  AbortedError,
  BrokerClosedError,
  BrokerError,
  ConnectionClosedError,
  ProtocolError,
  TimeoutError,
  ValidationError,
} from "../errors.js";
import {
  DEFAULT_MAX_FRAME_BYTES,
  FLAG_ERROR,
  FLAG_PUSH,
  MIN_PROTOCOL_VERSION,
  Op,
  PROTOCOL_VERSION,
  decodeFrame,
  encodeFrame,
  encodeFrameParts,
  encodePreamble,
  retryByDefault,
  wireToError,
  type Frame,
  type WireError,
} from "../wire/index.js";
import { stubs, type Rpc } from "./rpc.js";
import { ClientLogin, type ClientAuth } from "./auth.js";

/** One server to connect to; `url` is how the user wrote it (used in errors). */
export interface Endpoint {
  host: string;
  port: number;
  url: string;
}

export interface TransportOptions {
  /** Servers, tried in this order (connect() shuffles them unless asked not to). Non-empty. */
  endpoints: Endpoint[];
  /** Per-request deadline (excluding long-poll wait, which callers add). Default 30 s. */
  requestTimeoutMs: number;
  /**
   * Backoff between reconnect attempts: starts at min, doubles after each full pass over the
   * endpoints that fails, capped at max, full jitter.
   */
  reconnectMinDelayMs: number;
  reconnectMaxDelayMs: number;
  /** Give up (fail everything pending) after being disconnected this long. Default 60 s. */
  reconnectTimeoutMs: number;
  maxPendingRequests: number;
  connectTimeoutMs: number;
  /** Connect with TLS using these options (src/client/tls.ts); absent or null: plain TCP. */
  tls?: TlsConnectionOptions | null;
  /** Credentials sent in the handshake of every (re)connection (src/client/auth.ts). */
  auth?: ClientAuth | null;
  /** Protocol versions announced in the preamble (tests use this to speak a future version). */
  minVersion?: number;
  maxVersion?: number;
}

interface Pending {
  id: number;
  frame: [Buffer, Buffer | null];
  retry: boolean;
  deadline: number;
  resolve(f: Frame): void;
  reject(e: unknown): void;
  sent: boolean;
  onAbort?: () => void;
  signal?: AbortSignal;
}

export type PushHandler = (frame: Frame) => void;

export class Transport {
  private socket: Socket | null = null;
  private reader = new DirectFrameReader(DEFAULT_MAX_FRAME_BYTES);
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private ready = false;
  private closed = false;
  private connecting: Promise<void> | null = null;
  private disconnectedSince = 0;
  private slotWaiters: (() => void)[] = [];
  /** Slots freed and handed to a waiter that has not resumed yet (counted as taken). */
  private reservedSlots = 0;
  private timer: NodeJS.Timeout;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  /** A frame went out since the last heartbeat tick: the server already heard from us. */
  private sentSinceHeartbeat = false;
  private fatal: BrokerError | null = null;
  /** Index in `opts.endpoints` of the current (or last) connection. */
  private current = 0;
  onPush: PushHandler = () => {};
  /** Called after every successful (re)connection before queued requests are re-sent. */
  onReconnect: () => void = () => {};
  onDisconnect: () => void = () => {};
  serverInfo: Record<string, unknown> = {};
  reconnects = 0;
  /** One stub per request op (src/client/rpc.ts); each goes through `request()`. */
  readonly rpc: Rpc = stubs((op, meta, body, o) => this.request(op, meta, body, o));

  constructor(private readonly opts: TransportOptions) {
    this.timer = setInterval(() => this.checkDeadlines(), 250);
    this.timer.unref();
  }

  get isReady(): boolean {
    return this.ready;
  }

  /** close() was called: requests fail with BrokerClosedError and nothing is retried. */
  get isClosed(): boolean {
    return this.closed;
  }

  /** The URL of the server of the current connection (the last one while reconnecting). */
  get url(): string {
    return this.opts.endpoints[this.current].url;
  }

  /**
   * First connection: one pass over the endpoints, no retry, so a wrong URL is reported at
   * once. Only a connection failure (refused, dropped, timed out) moves on to the next
   * endpoint; any other error (credentials, TLS, protocol version, abort) would be the same on
   * every node of one deployment and is thrown as it is.
   */
  async start(signal?: AbortSignal): Promise<void> {
    const { endpoints } = this.opts;
    const failures: string[] = [];
    let last: unknown;
    for (let i = 0; i < endpoints.length; i++) {
      try {
        await this.open(i, signal);
        return;
      } catch (err) {
        if (endpoints.length === 1 || !(err instanceof ConnectionClosedError || err instanceof TimeoutError)) throw err;
        failures.push(`${endpoints[i].url}: ${err.message}`);
        last = err;
      }
    }
    throw new ConnectionClosedError(`cannot connect to any of the ${endpoints.length} sluice servers given (${failures.join("; ")})`, last);
  }

  /** Connects to `opts.endpoints[index]`; on success it becomes the current connection. */
  private open(index: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      const reader = new DirectFrameReader(DEFAULT_MAX_FRAME_BYTES);
      // Reads land in the reader's memory (src/client/direct-reader.ts); `onBytes` is the
      // handshake until it completes, then the attached connection's frame loop.
      let onBytes = (): void => {};
      const onread = {
        buffer: () => reader.readBuffer(),
        callback: (n: number) => {
          reader.wrote(n);
          onBytes();
          return true;
        },
      };
      const { host, port } = this.opts.endpoints[index];
      const { tls } = this.opts;
      // With TLS the reads still land in the reader's memory: tls.connect takes `onread` too
      // (node's typings leave it out of ConnectionOptions).
      const tlsOpts: TlsConnectionOptions & { onread: typeof onread } = { ...tls, host, port, onread };
      const socket: Socket = tls ? tlsConnect(tlsOpts) : netConnect({ host, port, noDelay: true, onread });
      if (tls) socket.setNoDelay(true);
      let answered = false;
      let helloId = this.nextId++;
      const login = this.opts.auth ? new ClientLogin(this.opts.auth) : null;
      const fail = (err: unknown): void => {
        if (settled) return;
        settled = true;
        clearTimeout(to);
        signal?.removeEventListener("abort", onAbort);
        socket.destroy();
        reject(err);
      };
      const onAbort = (): void => fail(new AbortedError("connect aborted", signal?.reason));
      signal?.addEventListener("abort", onAbort, { once: true });
      const to = setTimeout(
        () => fail(new TimeoutError(`connecting to ${host}:${port} timed out after ${this.opts.connectTimeoutMs} ms`)),
        this.opts.connectTimeoutMs,
      );
      socket.on("error", (err) =>
        fail((tls ? handshakeError(err, `${host}:${port}`) : null) ?? new ConnectionClosedError(`cannot connect to sluice at ${host}:${port}: ${err.message}`, err)),
      );
      socket.on("close", () =>
        fail(
          new ConnectionClosedError(
            // A TLS server closes a plain connection without a word: say so rather than nothing.
            answered
              ? "connection closed during handshake"
              : tls
                ? `the server at ${host}:${port} closed the TLS connection without answering the handshake (a server that requires client certificates does this when it refuses the one given)`
                : `the server at ${host}:${port} closed the connection without answering the handshake (a server that requires TLS does this: use a sluice+tls:// url)`,
          ),
        ),
      );
      socket.on(tls ? "secureConnect" : "connect", () => {
        socket.write(encodePreamble(this.opts.minVersion ?? MIN_PROTOCOL_VERSION, this.opts.maxVersion ?? PROTOCOL_VERSION));
        socket.write(encodeFrame(Op.Hello, 0, helloId, { client: "sluice-ts", version: PROTOCOL_VERSION, ...(login ? { auth: login.first() } : {}) }));
      });
      onBytes = (): void => {
        answered = true;
        if (settled) return;
        let raw: Buffer | null;
        try {
          raw = reader.next();
        } catch (err) {
          return fail(err);
        }
        if (raw === null) return;
        let f: Frame;
        try {
          f = decodeFrame(raw);
        } catch (err) {
          return fail(err);
        }
        if (f.flags & FLAG_ERROR) {
          const e = wireToError(f.meta as unknown as WireError);
          this.fatal = isFatal(e) ? e : null;
          return fail(e);
        }
        if (f.op !== Op.Hello || f.correlationId !== helloId) return fail(new ProtocolError("unexpected handshake reply"));
        try {
          const next = nextHello(f, login, this.nextId);
          if (next) {
            helloId = this.nextId++;
            socket.write(next);
            return onBytes();
          }
        } catch (err) {
          if (err instanceof BrokerError && isFatal(err)) this.fatal = err;
          return fail(err);
        }
        settled = true;
        clearTimeout(to);
        signal?.removeEventListener("abort", onAbort);
        socket.removeAllListeners("error");
        socket.removeAllListeners("close");
        this.serverInfo = f.meta;
        this.current = index;
        onBytes = () => {
          if (this.socket === socket) this.drainReader();
        };
        this.attach(socket, reader);
        resolve();
      };
    });
  }

  private attach(socket: Socket, reader: DirectFrameReader): void {
    this.socket = socket;
    this.reader = reader;
    this.ready = true;
    this.disconnectedSince = 0;
    socket.on("error", () => {});
    socket.on("close", () => this.onClose(socket));
    this.onReconnect();
    // Re-send everything still pending, in the original order (Map keeps insertion order).
    for (const p of this.pending.values()) {
      p.sent = true;
      socket.write(p.frame[0]);
      if (p.frame[1] !== null) socket.write(p.frame[1]);
    }
    // Frames already buffered in the handshake reader (server pushes right after HELLO).
    this.drainReader();
  }

  private drainReader(): void {
    try {
      for (;;) {
        const raw = this.reader.next();
        if (raw === null) return;
        this.onFrame(decodeFrame(raw));
      }
    } catch (err) {
      // A broken server stream: drop the connection; retriable requests go again.
      this.socket?.destroy(err as Error);
    }
  }

  private onFrame(f: Frame): void {
    if (f.flags & FLAG_PUSH) {
      this.onPush(f);
      return;
    }
    if (f.correlationId === 0 && f.flags & FLAG_ERROR) {
      // Connection-level error: the server is closing this connection.
      const e = wireToError(f.meta as unknown as WireError);
      if (isFatal(e)) this.fatal = e;
      return;
    }
    const p = this.pending.get(f.correlationId);
    if (!p) return;
    this.settle(p);
    if (f.flags & FLAG_ERROR) p.reject(wireToError(f.meta as unknown as WireError));
    else p.resolve(f);
  }

  private settle(p: Pending): void {
    this.pending.delete(p.id);
    if (p.onAbort) p.signal?.removeEventListener("abort", p.onAbort);
    const w = this.slotWaiters.shift();
    if (w) {
      // The freed slot is handed to the oldest waiter, so requests go out in call order (an
      // idempotent producer's batches of one partition must not overtake each other).
      this.reservedSlots++;
      w();
    }
  }

  private onClose(socket: Socket): void {
    if (this.socket !== socket) return;
    this.socket = null;
    this.ready = false;
    this.disconnectedSince = Date.now();
    for (const p of [...this.pending.values()]) {
      if ((p.sent && !p.retry) || this.closed) {
        this.settle(p);
        p.reject(new ConnectionClosedError("connection to the sluice server was lost; the request may or may not have been applied"));
      } else {
        p.sent = false;
      }
    }
    this.onDisconnect();
    if (!this.closed) void this.reconnectLoop();
  }

  /**
   * Reconnects until it succeeds, close() is called, or a fatal error. Each attempt goes to the
   * next endpoint, starting after the one that was lost (it is the one most likely down): with
   * several nodes the first attempt usually succeeds. The jittered sleep between attempts only
   * grows after a full pass over the endpoints has failed, so a dead node in the list does not
   * slow down reaching a live one; with one endpoint this is plain exponential backoff.
   */
  private async reconnectLoop(): Promise<void> {
    if (this.connecting) return this.connecting;
    this.connecting = (async () => {
      const n = this.opts.endpoints.length;
      let delay = this.opts.reconnectMinDelayMs;
      let next = (this.current + 1) % n;
      let attemptsInPass = 0;
      while (!this.closed) {
        if (this.fatal) {
          this.failAll(this.fatal);
          return;
        }
        try {
          await this.open(next);
          this.reconnects++;
          return;
        } catch (err) {
          if (this.fatal) continue;
          if (Date.now() - this.disconnectedSince > this.opts.reconnectTimeoutMs) {
            this.failAll(new ConnectionClosedError(`could not reconnect to ${this.urlList()} within ${this.opts.reconnectTimeoutMs} ms (last error: ${(err as Error).message})`, err));
            this.disconnectedSince = Date.now();
          }
        }
        next = (next + 1) % n;
        const sleep = Math.random() * delay;
        await new Promise((r) => setTimeout(r, sleep));
        if (++attemptsInPass >= n) {
          attemptsInPass = 0;
          delay = Math.min(delay * 2, this.opts.reconnectMaxDelayMs);
        }
      }
    })().finally(() => {
      this.connecting = null;
    });
    return this.connecting;
  }

  /** "sluice://a:7070", or "any of sluice://a:7070, sluice://b:7070" for errors. */
  private urlList(): string {
    const urls = this.opts.endpoints.map((e) => e.url);
    return urls.length === 1 ? urls[0] : `any of ${urls.join(", ")}`;
  }

  private failAll(err: unknown): void {
    for (const p of [...this.pending.values()]) {
      this.settle(p);
      p.reject(err);
    }
  }

  private checkDeadlines(): void {
    const now = Date.now();
    for (const p of [...this.pending.values()]) {
      if (now > p.deadline) {
        this.settle(p);
        p.reject(new TimeoutError(`request timed out after ${this.opts.requestTimeoutMs} ms`));
      }
    }
  }

  /**
   * Sends a request and resolves with the response frame; rejects with the server's typed
   * error. `retry` defaults to the operation table's rule (src/wire/ops.ts).
   */
  async request(
    op: Op,
    meta: unknown,
    body: Buffer | null = null,
    o: { retry?: boolean; signal?: AbortSignal; extraTimeoutMs?: number } = {},
  ): Promise<Frame> {
    if (this.closed) throw new BrokerClosedError("client is closed");
    if (o.signal?.aborted) throw new AbortedError("operation aborted", o.signal.reason);
    if (this.pending.size + this.reservedSlots >= this.opts.maxPendingRequests || this.slotWaiters.length > 0) {
      // First come, first served: wait behind earlier callers for a slot handed over by settle().
      await new Promise<void>((r) => this.slotWaiters.push(r));
      this.reservedSlots--;
      if (this.closed) throw new BrokerClosedError("client is closed");
    }
    const id = this.nextId++;
    if (this.nextId > 0xfffffff0) this.nextId = 1;
    // The body (a record batch) is not copied: it goes out after the head in one writev.
    const frame = encodeFrameParts(op, 0, id, meta, body);
    const frameBytes = frame[0].length + (frame[1]?.length ?? 0);
    const maxFrame = Number(this.serverInfo.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES);
    if (frameBytes - 4 > maxFrame) {
      throw new ValidationError(`request of ${frameBytes} bytes exceeds the server's frame limit of ${maxFrame} bytes`);
    }
    return new Promise<Frame>((resolve, reject) => {
      const p: Pending = {
        id,
        frame,
        retry: o.retry ?? retryByDefault(op),
        deadline: Date.now() + this.opts.requestTimeoutMs + (o.extraTimeoutMs ?? 0),
        resolve,
        reject,
        sent: false,
      };
      if (o.signal) {
        p.signal = o.signal;
        p.onAbort = () => {
          this.settle(p);
          reject(new AbortedError("operation aborted", o.signal?.reason));
        };
        o.signal.addEventListener("abort", p.onAbort, { once: true });
      }
      this.pending.set(id, p);
      // While reconnecting, the request waits (unsent, so safe to send later) until the
      // connection is back, its deadline passes, or the reconnect timeout fails everything.
      if (this.ready && this.socket) {
        p.sent = true;
        this.write(this.socket, frame);
      }
    });
  }

  private corkedSocket: Socket | null = null;
  /** Frames written in one tick leave in one syscall (pipelined publishes, settles, credits). */
  private write(socket: Socket, frame: Buffer | [Buffer, Buffer | null]): void {
    this.sentSinceHeartbeat = true;
    if (this.corkedSocket !== socket) {
      this.corkedSocket = socket;
      socket.cork();
      process.nextTick(() => {
        this.corkedSocket = null;
        socket.uncork();
      });
    }
    if (Buffer.isBuffer(frame)) socket.write(frame);
    else {
      socket.write(frame[0]);
      if (frame[1] !== null) socket.write(frame[1]);
    }
  }

  /** Fire-and-forget frame (credit, heartbeat): dropped while disconnected, by design. */
  sendOneWay(op: Op, meta: unknown): void {
    if (this.ready && this.socket) this.write(this.socket, encodeFrame(op, 0, 0, meta));
  }

  setHeartbeat(intervalMs: number | null): void {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = null;
    if (intervalMs === null) return;
    // Any frame counts as a heartbeat for the server: a tick after other frames went out sends
    // nothing, so a busy connection carries no heartbeats and the server is not woken for
    // them. The longest silence the server sees is below two intervals.
    this.heartbeatTimer = setInterval(() => {
      if (!this.sentSinceHeartbeat) this.sendOneWay(Op.Heartbeat, {});
      this.sentSinceHeartbeat = false;
    }, intervalMs);
    this.heartbeatTimer.unref();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.failAll(new BrokerClosedError("client is closed"));
    for (const w of this.slotWaiters.splice(0)) {
      this.reservedSlots++;
      w();
    }
    const s = this.socket;
    this.socket = null;
    this.ready = false;
    if (s) {
      await new Promise<void>((resolve) => {
        s.once("close", () => resolve());
        s.end();
        setTimeout(() => {
          s.destroy();
          resolve();
        }, 1000).unref();
      });
    }
  }

  /** Test hook: drop the TCP connection as if the network failed. */
  destroySocketForTest(): void {
    this.socket?.destroy();
  }
}

/** Errors that another connection attempt would only repeat: reconnecting stops. */
function isFatal(e: BrokerError): boolean {
  return e.code === "UNSUPPORTED_VERSION" || e.code === "AUTHENTICATION_FAILED" || e.code.startsWith("PROTOCOL");
}

/**
 * A HELLO reply during the handshake: SCRAM's second HELLO to send (with correlation `id`), or
 * null when the handshake is complete (the server's signature checked). Throws when refused.
 */
function nextHello(f: Frame, login: ClientLogin | null, id: number): Buffer | null {
  if (f.meta.continue === true) {
    if (!login) throw new ProtocolError("the server sent an authentication challenge to a client without credentials");
    return encodeFrame(Op.Hello, 0, id, { auth: login.challenge((f.meta.auth as { message?: unknown } | undefined)?.message) });
  }
  login?.finish(f.meta);
  return null;
}
