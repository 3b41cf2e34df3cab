// SPDX-License-Identifier: Apache-2.0
/**
 * `startServer({ broker, host, port, httpPort })`: serves a broker over the binary protocol
 * (docs/protocol.md) and HTTP (health, admin, JSON produce/consume). The broker is anything
 * that implements `BrokerHost` (src/broker/host.ts): the embedded broker, or a test double.
 */
import { createServer, type Server as NetServer, type Socket } from "node:net";
import type { Server as HttpServer } from "node:http";
import { createServer as createTlsServer, type Server as TlsServer } from "node:tls";
import type { BrokerHost } from "../broker/host.js";
import { Connection, type SharedBudget } from "./connection.js";
import { telemetry as makeTelemetry, type Logger, type Telemetry } from "../observability/telemetry.js";
import { DEFAULT_HOST, DEFAULT_LIMITS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS } from "./limits.js";
import type { ConnectionLimits } from "./session.js";
import { createHttpServer, type MetricsEndpoint } from "./http.js";
import { sluiceVersion } from "../observability/build-info.js";
import { ServerTls, type ServerTlsOptions } from "./tls.js";
import { ServerAuth, type AuthOptions } from "./auth.js";
import { CredentialStore } from "../security/auth/credential-store.js";
import { AuthAudit, type AuthAuditOptions } from "../security/audit/auth-results.js";
import { ValidationError } from "../errors.js";
import { PolicyStore } from "../security/acl/policy-store.js";
import { ServerAuthorization, type RecordAudit } from "./authorization.js";
import { watchCredentials } from "./credential-watch.js";
import { ChangeBaseline, credentialFingerprints, policySha } from "../security/audit/change-baseline.js";

export { DEFAULT_LIMITS } from "./limits.js";
export type { Logger } from "../observability/telemetry.js";
export type { ConnectionLimits } from "./session.js";
export type { MetricsEndpoint } from "./http.js";
export type { ServerTlsOptions } from "./tls.js";
export { TLS_MIN_VERSION } from "./tls.js";
export type { AuthOptions } from "./auth.js";
export type { BrokerHost, StreamHost, MemberListener, MemberSubscription, EncodedAppend } from "../broker/host.js";

export interface ServerOptions {
  broker: BrokerHost;
  /** Default 127.0.0.1: never expose a broker on all interfaces by accident. */
  host?: string;
  /** Binary protocol port. Default 7070; 0 picks a free port. */
  port?: number;
  /** HTTP port. Default 7071; 0 picks a free port; null disables HTTP. */
  httpPort?: number | null;
  maxConnections?: number;
  /** Max HTTP request body, enforced while streaming. Default 1 MiB. */
  maxBodyBytes?: number;
  limits?: Partial<ConnectionLimits>;
  /** Any pino-compatible logger (shorthand for `telemetry.logger`); default silent. */
  logger?: Logger;
  /** Logger, metrics sink and clock for the server's connections (no-op defaults). */
  telemetry?: Partial<Telemetry>;
  /**
   * Served on `GET /metrics` of the HTTP port in the Prometheus text format: a prom-client
   * Registry (e.g. the one given to `openBroker({ metrics: { registry } })`). Absent: 404.
   */
  metrics?: MetricsEndpoint;
  /** The broker's data directory, reported by `/healthz` and `/readyz` (default: not reported). */
  dataDir?: string;
  /**
   * Serve both listeners over TLS (1.2 and later): the binary protocol as `sluice+tls://` and
   * HTTP as HTTPS. Bad files fail startup with `TlsConfigError`. docs/security.md.
   */
  tls?: ServerTlsOptions;
  /**
   * Where users and tokens live (docs/security.md#authentication): by default the credential
   * store of `dataDir` (`<dataDir>/security/`). When it has any, every connection and HTTP
   * request (but the probes) must authenticate. `failureLimit` bounds failed logins per source;
   * `audit` sets the windows over which repeated login results share one audit record
   * (`failureWindowMs`, default 1 s; `successWindowMs`, HTTP only, default 60 s).
   */
  auth?: AuthOptions & { store?: CredentialStore; audit?: AuthAuditOptions };
  /**
   * Who may do what (docs/security.md#authorization): by default the policy of `dataDir`
   * (`<dataDir>/security/acl.json`), re-read within a second of a change. Applies to
   * authenticated connections only; with no policy every logged-in principal is denied.
   */
  acl?: { store?: PolicyStore };
  /**
   * Without users or tokens the server refuses to listen on anything but loopback (AUTH-3);
   * true serves such a host open to anyone who can reach it (`--insecure-no-auth`).
   */
  allowUnauthenticated?: boolean;
}

export interface ServerHandle {
  readonly host: string;
  readonly port: number;
  readonly httpPort: number | null;
  /** `sluice://host:port` for `connect({ url })`; `sluice+tls://host:port` with `tls`. */
  readonly url: string;
  /** True when the listeners serve TLS (`tls` was given). */
  readonly tls: boolean;
  /**
   * True when clients must authenticate (the credential store had users or tokens at start,
   * or `tls.principalRules` maps client certificates to principals).
   */
  readonly authRequired: boolean;
  /**
   * Re-reads the TLS certificate, key and CA files and uses them for new handshakes;
   * established connections keep theirs. Throws `TlsConfigError` (and keeps the previous
   * certificate) when the files are unusable; a no-op without `tls`.
   */
  reloadTls(): void;
  connectionCount(): number;
  /**
   * Graceful stop: stop accepting, let in-flight requests finish (bounded by `graceMs`),
   * close subscriptions (members leave their groups), close sockets. Does not close the broker.
   */
  close(opts?: { graceMs?: number }): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

function listen(server: NetServer | HttpServer, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once("error", onError);
    server.listen(port, host, () => {
      server.off("error", onError);
      const addr = server.address();
      resolve(typeof addr === "object" && addr ? addr.port : port);
    });
  });
}

export async function startServer(opts: ServerOptions): Promise<ServerHandle> {
  const startedAt = performance.now();
  const tel = makeTelemetry({ ...opts.telemetry, logger: opts.logger ?? opts.telemetry?.logger });
  const logger = tel.logger;
  const host = opts.host ?? DEFAULT_HOST;
  const limits: ConnectionLimits = { ...DEFAULT_LIMITS, ...opts.limits };
  const maxConnections = opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
  const connections = new Set<Connection>();
  const shared: SharedBudget = { inFlightBytes: 0, paused: new Set() };
  let closing = false;

  // Reads and checks the files (and the principal rules) before anything listens or is
  // started: bad TLS config fails startup.
  const tls = opts.tls ? new ServerTls(opts.tls, logger) : null;
  const certs = tls?.principals ?? null;
  if (certs) logger.info({ rules: certs.describe() }, "client certificates log in as the principal they map to");
  const store = opts.auth?.store ?? (opts.dataDir ? await CredentialStore.open(opts.dataDir) : null);
  // Login results go to the broker's audit log (AUD-4), failures aggregated per source.
  const authAudit = new AuthAudit((actor, target, error) => opts.broker.recordAudit(actor, target, error), logger, opts.auth?.audit);
  // Mapped client certificates are principals too: they need the login check and count for
  // the loopback rule (AUTH-3) even without a credential store.
  const auth = store || certs ? new ServerAuth(store, logger, opts.auth, authAudit, certs) : null;
  const authRequired = auth ? await auth.required() : false;
  const policy = opts.acl?.store ?? (opts.dataDir ? await PolicyStore.open(opts.dataDir) : null);
  const recordAudit: RecordAudit = (actor, target, error) => opts.broker.recordAudit(actor, target, error);
  // Tenants' storage quotas are measured from the broker's own listings (QUO-2).
  // AUD-5: what the audit log last recorded of users, tokens and the policy, so that changes
  // made while no server ran are recorded now (without a data dir: from this start on).
  const baseline = opts.dataDir
    ? await ChangeBaseline.open(opts.dataDir)
    : ChangeBaseline.inMemory({ credentials: store ? credentialFingerprints(store) : {}, policySha: policy ? policySha(policy.policy) : null });
  const authz = new ServerAuthorization(policy, logger, recordAudit, opts.broker, baseline);
  authz.start();
  const credWatch = store ? await watchCredentials(store, recordAudit, logger, baseline) : null;
  if (!authRequired && !opts.allowUnauthenticated && !isLoopback(host)) {
    throw new ValidationError(
      `refusing to listen on ${host} without authentication: add a user or token (sluice users add / sluice tokens create), map client certificates to principals (--tls-client-auth required --tls-principal-rules), or pass --insecure-no-auth (allowUnauthenticated: true) to serve it open`,
    );
  }

  const onSocket = (socket: Socket): void => {
    if (closing || connections.size >= maxConnections) {
      logger.warn({ remote: socket.remoteAddress, connections: connections.size }, "refusing connection");
      socket.destroy();
      return;
    }
    const conn = new Connection(socket, opts.broker, limits, logger, (c) => connections.delete(c), shared, auth, authz);
    connections.add(conn);
  };
  const tcp: NetServer = tls ? createTlsServer(tls.serverOptions(), onSocket) : createServer({ noDelay: true }, onSocket);
  if (tls) {
    tls.attach(tcp as TlsServer);
    // A failed handshake (untrusted or plain-text client, old TLS version) never reaches
    // onSocket; it is only logged.
    tcp.on("tlsClientError", (err: Error & { code?: string }, socket: Socket) => logger.info({ remote: socket.remoteAddress, code: err.code, err: err.message }, "TLS handshake refused"));
  }
  tcp.maxConnections = maxConnections;
  let port: number;
  try {
    port = await listen(tcp, opts.port ?? 7070, host);
  } catch (err) {
    tls?.stop();
    authz.stop();
    credWatch?.stop();
    throw err;
  }

  let http: HttpServer | null = null;
  let httpPort: number | null = null;
  if (opts.httpPort !== null) {
    http = createHttpServer({
      broker: opts.broker,
      maxBodyBytes: opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
      isReady: () => !closing,
      stats: () => ({ connections: connections.size }),
      info: () => ({ version: sluiceVersion(), pid: process.pid, dataDir: opts.dataDir ?? null, uptimeSeconds: Math.round((performance.now() - startedAt) / 1000) }),
      metrics: opts.metrics,
      tls: tls?.serverOptions(),
      auth: auth ?? undefined,
      authz,
    });
    if (tls) tls.attach(http as unknown as TlsServer);
    try {
      httpPort = await listen(http, opts.httpPort ?? 7071, host);
    } catch (err) {
      tls?.stop();
      authz.stop();
      credWatch?.stop();
      tcp.close();
      throw err;
    }
  }
  logger.debug({ host, port, httpPort, tls: tls !== null }, "sluice server listening");

  let closed: Promise<void> | null = null;
  const close = (o: { graceMs?: number } = {}): Promise<void> => {
    if (closed) return closed;
    closing = true;
    tls?.stop();
    authz.stop();
    credWatch?.stop();
    const graceMs = o.graceMs ?? 5000;
    closed = (async () => {
      const tcpClosed = new Promise<void>((resolve) => tcp.close(() => resolve()));
      await Promise.all([...connections].map((c) => c.shutdown(graceMs)));
      await tcpClosed;
      if (http) {
        const h = http;
        const httpClosed = new Promise<void>((resolve) => h.close(() => resolve()));
        h.closeIdleConnections();
        setTimeout(() => h.closeAllConnections(), Math.min(graceMs, 2000)).unref();
        await httpClosed;
      }
      // The counts of failed (and repeated HTTP) logins still being aggregated (AUD-4).
      await auth?.flushAudit();
    })();
    return closed;
  };

  return {
    host,
    port,
    httpPort,
    url: `${tls ? "sluice+tls" : "sluice"}://${host.includes(":") ? `[${host}]` : host}:${port}`,
    tls: tls !== null,
    authRequired,
    reloadTls: () => tls?.reload(),
    connectionCount: () => connections.size,
    close,
    [Symbol.asyncDispose]: () => close(),
  };
}

/** Loopback addresses only: a server there is reachable from this machine alone (AUTH-3). */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h) || /^::ffff:127\.\d+\.\d+\.\d+$/.test(h);
}
