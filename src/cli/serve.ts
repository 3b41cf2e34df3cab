// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice serve --data ./data`: the broker server.
 *
 * Configuration sources, highest precedence first: command-line flags, `SLUICE_*` environment
 * variables, a JSON config file (`--config FILE` or `SLUICE_CONFIG`), defaults. Every value is
 * validated with a message naming its source, e.g.
 *   sluice: invalid port "abc" (from SLUICE_PORT): expected an integer 0..65535
 *
 * Shutdown on SIGTERM/SIGINT: stop accepting, let in-flight requests (and their fsyncs) finish,
 * close group members, close the broker (which flushes), exit 0, all within
 * `shutdownTimeoutMs` (default 10 s); past it the process exits 1 anyway.
 */
// libuv's 4 default threads are shared by segment reads, appends, fsyncs and the offset
// commits' write-temp/fsync/rename steps; with a busy subscription a commit queued behind reads
// took ~4x longer. More threads cost little memory. Must be set before the pool's first use.
process.env.UV_THREADPOOL_SIZE ??= "16";
import { ENCRYPTION_KEY_FILE_ENV, ENCRYPTION_KEYS_ENV, Keyring } from "../log/keyring.js";
import { pino } from "pino";
import type { Logger } from "../observability/telemetry.js";
import { readFileSync, statSync } from "node:fs";
import { parseArgs } from "node:util";
import { openBroker } from "../broker/broker.js";
import { BrokerError, TlsConfigError, ValidationError } from "../errors.js";
import { applyTopology, formatPlan, loadTopology, planTopology, type Topology } from "../topology/index.js";
import type { Broker } from "../types.js";
import { startServer } from "../server/index.js";
import { CertPrincipalMapper } from "../security/auth/cert-principal.js";
import { parseEngineUrl, postgresEngineFromUrl } from "../store/postgres/engine-url.js";
import {
  DEFAULT_HOST,
  DEFAULT_HTTP_PORT,
  DEFAULT_LIMITS,
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_CONNECTIONS,
  DEFAULT_PORT,
  DEFAULT_SHUTDOWN_TIMEOUT_MS,
} from "../server/limits.js";

export interface ServeConfig {
  data: string;
  /**
   * Where topics and group offsets live: "disk" (default: the data directory) or a
   * postgres:// URL (the PostgreSQL engine; the data directory still holds the server's
   * security files and audit log).
   */
  engine?: string;
  host: string;
  port: number;
  /** null disables the HTTP port. */
  httpPort: number | null;
  maxFrameBytes: number;
  maxConnections: number;
  maxBodyBytes: number;
  sessionTimeoutMs: number;
  shutdownTimeoutMs: number;
  logLevel: "debug" | "info" | "warn" | "error" | "silent";
  /** A topology file (YAML) applied after the broker opens, before listening. */
  topology?: string;
  /** TLS on both ports (docs/security.md): certificate and key files, both or neither. */
  tlsCert?: string;
  tlsKey?: string;
  /** CA bundle: completes the certificate chain sent to clients (and checks client certificates). */
  tlsCa?: string;
  /** "required": refuse clients without a certificate signed by `tlsCa` (mutual TLS). */
  tlsClientAuth?: "required" | "none";
  /** Client certificate → principal rules (docs/security.md); needs `tlsClientAuth: "required"`. */
  tlsPrincipalRules?: string[];
  /** Serve a non-loopback host without users or tokens (docs/security.md#authentication). */
  insecureNoAuth?: boolean;
  /** Keyring file for encryption at rest (docs/security.md); else SLUICE_ENCRYPTION_KEYS, if set. */
  encryptionKeyFile?: string;
}

const DEFAULTS: Omit<ServeConfig, "data"> = {
  host: DEFAULT_HOST,
  port: DEFAULT_PORT,
  httpPort: DEFAULT_HTTP_PORT,
  maxFrameBytes: DEFAULT_LIMITS.maxFrameBytes,
  maxConnections: DEFAULT_MAX_CONNECTIONS,
  maxBodyBytes: DEFAULT_MAX_BODY_BYTES,
  sessionTimeoutMs: DEFAULT_LIMITS.defaultSessionTimeoutMs,
  shutdownTimeoutMs: DEFAULT_SHUTDOWN_TIMEOUT_MS,
  logLevel: "info",
};

type Key = keyof ServeConfig;
/** flag name, env var, config-file key, parser. */
const FIELDS: { key: Key; flag: string; env: string; parse(v: unknown, src: string): unknown; help: string }[] = [
  { key: "data", flag: "data", env: "SLUICE_DATA", parse: str("data"), help: "data directory (required)" },
  { key: "engine", flag: "engine", env: "SLUICE_ENGINE", parse: engineSpec, help: "disk (default) or postgres://user@host/db[?schema=NAME] (docs/scale-out.md)" },
  { key: "host", flag: "host", env: "SLUICE_HOST", parse: str("host"), help: "listen address (default 127.0.0.1)" },
  { key: "port", flag: "port", env: "SLUICE_PORT", parse: intIn("port", 0, 65535), help: "binary protocol port (default 7070; 0 = any free port)" },
  {
    key: "httpPort",
    flag: "http-port",
    env: "SLUICE_HTTP_PORT",
    parse: (v, src) => (v === "off" || v === null || v === false ? null : intIn("http port", 0, 65535)(v, src)),
    help: "HTTP port for health/admin (default 7071; 'off' disables)",
  },
  { key: "maxFrameBytes", flag: "max-frame-bytes", env: "SLUICE_MAX_FRAME_BYTES", parse: intIn("max frame bytes", 1024, 256 * 1024 * 1024), help: "largest protocol frame (default 16 MiB)" },
  { key: "maxConnections", flag: "max-connections", env: "SLUICE_MAX_CONNECTIONS", parse: intIn("max connections", 1, 1_000_000), help: "default 10000" },
  { key: "maxBodyBytes", flag: "max-body-bytes", env: "SLUICE_MAX_BODY_BYTES", parse: intIn("max body bytes", 1024, 256 * 1024 * 1024), help: "largest HTTP request body (default 1 MiB)" },
  { key: "sessionTimeoutMs", flag: "session-timeout-ms", env: "SLUICE_SESSION_TIMEOUT_MS", parse: intIn("session timeout", DEFAULT_LIMITS.minSessionTimeoutMs, DEFAULT_LIMITS.maxSessionTimeoutMs), help: "default group session timeout (default 10000)" },
  { key: "shutdownTimeoutMs", flag: "shutdown-timeout-ms", env: "SLUICE_SHUTDOWN_TIMEOUT_MS", parse: intIn("shutdown timeout", 100, 600_000), help: "default 10000" },
  {
    key: "logLevel",
    flag: "log-level",
    env: "SLUICE_LOG_LEVEL",
    parse: (v, src) => {
      if (typeof v === "string" && ["debug", "info", "warn", "error", "silent"].includes(v)) return v;
      throw new ValidationError(`invalid log level ${JSON.stringify(v)} (from ${src}): expected debug, info, warn, error or silent`);
    },
    help: "debug|info|warn|error|silent (default info)",
  },
  { key: "topology", flag: "topology", env: "SLUICE_TOPOLOGY", parse: str("topology"), help: "topology file (YAML) applied at startup (docs/topology.md)" },
  { key: "tlsCert", flag: "tls-cert", env: "SLUICE_TLS_CERT", parse: str("TLS certificate file"), help: "PEM certificate: serve TLS on both ports (docs/security.md)" },
  { key: "tlsKey", flag: "tls-key", env: "SLUICE_TLS_KEY", parse: str("TLS key file"), help: "PEM private key of --tls-cert" },
  { key: "tlsCa", flag: "tls-ca", env: "SLUICE_TLS_CA", parse: str("TLS CA file"), help: "PEM CA bundle (completes the chain sent to clients; checks client certificates)" },
  {
    key: "tlsClientAuth",
    flag: "tls-client-auth",
    env: "SLUICE_TLS_CLIENT_AUTH",
    parse: (v, src) => {
      if (v === "required" || v === "none") return v;
      throw new ValidationError(`invalid TLS client auth ${JSON.stringify(v)} (from ${src}): expected required or none`);
    },
    help: "required: clients need a certificate signed by --tls-ca (mutual TLS)",
  },
  { key: "tlsPrincipalRules", flag: "tls-principal-rules", env: "SLUICE_TLS_PRINCIPAL_RULES", parse: principalRules, help: "client certificate -> principal, e.g. CN or RULE:^CN=([^,]+),.*$/$1/L" },
  { key: "encryptionKeyFile", flag: "encryption-key-file", env: ENCRYPTION_KEY_FILE_ENV, parse: str("encryption key file"), help: `keyring for encrypted topics/queues (or ${ENCRYPTION_KEYS_ENV} inline)` },
];

function str(what: string) {
  return (v: unknown, src: string): string => {
    if (typeof v !== "string" || v.length === 0) throw new ValidationError(`invalid ${what} ${JSON.stringify(v)} (from ${src}): expected a non-empty string`);
    return v;
  };
}
/** A comma-separated list (flag, variable) or an array of them (config file), checked now: a bad rule stops the start. */
function principalRules(v: unknown, src: string): string[] {
  const lists = typeof v === "string" ? [v] : Array.isArray(v) && v.every((x): x is string => typeof x === "string") ? v : null;
  if (lists === null) throw new ValidationError(`invalid TLS principal rules ${JSON.stringify(v)} (from ${src}): expected a string or an array of strings`);
  try {
    CertPrincipalMapper.parse(lists);
  } catch (err) {
    if (err instanceof TlsConfigError) throw new TlsConfigError(`${err.message} (from ${src})`);
    throw err;
  }
  return lists;
}
/** "disk" or a PostgreSQL URL, checked now (a bad URL stops the start, naming its source). */
function engineSpec(v: unknown, src: string): string {
  if (v === "disk") return v;
  if (typeof v !== "string") throw new ValidationError(`invalid engine ${JSON.stringify(v)} (from ${src}): expected disk or postgres://[user@]host[:port]/database[?schema=NAME]`);
  try {
    parseEngineUrl(v);
  } catch (err) {
    throw new ValidationError(`invalid engine (from ${src}): ${(err as Error).message}`);
  }
  return v;
}
function intIn(what: string, min: number, max: number) {
  return (v: unknown, src: string): number => {
    const n = typeof v === "number" ? v : typeof v === "string" && /^-?\d+$/.test(v.trim()) ? Number(v) : NaN;
    if (!Number.isSafeInteger(n) || n < min || n > max) {
      throw new ValidationError(`invalid ${what} ${JSON.stringify(v)} (from ${src}): expected an integer ${min}..${max}`);
    }
    return n;
  };
}

/** Every flag `serve` takes (the CLI checks a command line against these before starting). */
export const SERVE_FLAGS: readonly string[] = [...FIELDS.map((f) => f.flag), "config", "insecure-no-auth", "help"];
/** The flags that take no value. */
export const SERVE_BOOLEAN_FLAGS: readonly string[] = ["insecure-no-auth", "help"];

export const SERVE_HELP = `Usage: sluice serve --data DIR [options]

${FIELDS.map((f) => `  --${f.flag.padEnd(22)} ${f.env.padEnd(28)} ${f.help}`).join("\n")}
  --config FILE              SLUICE_CONFIG                JSON file with any of: ${FIELDS.map((f) => f.key).join(", ")}
  --insecure-no-auth         SLUICE_INSECURE_NO_AUTH=1    serve a non-loopback --host with no users or
                                                          tokens, open to anyone who can reach it

Precedence: flags > environment > config file > defaults.`;

/** Resolves the configuration from argv, env and the optional file. Throws ValidationError. */
export function resolveServeConfig(argv: string[], env: NodeJS.ProcessEnv = process.env): ServeConfig {
  const options: Record<string, { type: "string" | "boolean" }> = { config: { type: "string" }, help: { type: "boolean" }, "insecure-no-auth": { type: "boolean" } };
  for (const f of FIELDS) options[f.flag] = { type: "string" };
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({ args: argv, options, allowPositionals: false, strict: true }));
  } catch (err) {
    throw new ValidationError(`${(err as Error).message}\n\n${SERVE_HELP}`);
  }
  if (values.help) throw new ValidationError(SERVE_HELP);
  const out: Record<string, unknown> = { ...DEFAULTS };
  const configPath = (values.config as string | undefined) ?? env.SLUICE_CONFIG;
  if (configPath) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(configPath, "utf8"));
    } catch (err) {
      throw new ValidationError(`cannot read config file ${configPath}: ${(err as Error).message}`);
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new ValidationError(`config file ${configPath} must contain a JSON object`);
    }
    for (const [k, v] of Object.entries(parsed)) {
      const f = FIELDS.find((x) => x.key === k);
      if (!f) throw new ValidationError(`unknown key ${JSON.stringify(k)} in config file ${configPath}; known keys: ${FIELDS.map((x) => x.key).join(", ")}`);
      out[k] = f.parse(v, `config file ${configPath}`);
    }
  }
  for (const f of FIELDS) {
    const e = env[f.env];
    if (e !== undefined && e !== "") out[f.key] = f.parse(e, f.env);
  }
  for (const f of FIELDS) {
    const v = values[f.flag];
    if (v !== undefined) out[f.key] = f.parse(v, `--${f.flag}`);
  }
  if (values["insecure-no-auth"] === true || env.SLUICE_INSECURE_NO_AUTH === "1" || env.SLUICE_INSECURE_NO_AUTH === "true") out.insecureNoAuth = true;
  if (out.data === undefined) throw new ValidationError(`--data DIR is required (or SLUICE_DATA, or "data" in the config file)\n\n${SERVE_HELP}`);
  if ((out.tlsCert === undefined) !== (out.tlsKey === undefined)) throw new ValidationError("TLS needs both --tls-cert and --tls-key");
  if (out.tlsCa !== undefined && out.tlsCert === undefined) throw new ValidationError("--tls-ca needs --tls-cert and --tls-key");
  if (out.tlsClientAuth === "required" && out.tlsCa === undefined) throw new ValidationError("--tls-client-auth required needs --tls-ca: the CA that client certificates are checked against");
  if (out.tlsPrincipalRules !== undefined && out.tlsClientAuth !== "required") throw new ValidationError("--tls-principal-rules needs --tls-client-auth required: only a verified client certificate can name a principal");
  if (out.httpPort !== null && out.httpPort !== 0 && out.httpPort === out.port) {
    throw new ValidationError(`the HTTP port and the protocol port must differ (both ${out.port})`);
  }
  return out as unknown as ServeConfig;
}

/** The PostgreSQL engine of `--engine URL` (loaded only then: disk servers never load `pg`). */
async function openEngineSpec(spec: string, logger: Logger) {
  logger.info({ event: "engine", engine: "postgres", where: parseEngineUrl(spec).description }, "storage: PostgreSQL engine");
  // Failures of background queue work (lease expiry, upkeep) go to the server's log.
  return postgresEngineFromUrl(spec, { logger });
}

/**
 * The server's log: pino, JSON lines on stdout with level names (processing lines of
 * src/server/processing-log.ts at debug/info/warn; never payloads).
 */
function jsonLogger(level: ServeConfig["logLevel"]): Logger {
  return pino({ level, base: { pid: process.pid }, formatters: { level: (label) => ({ level: label }) } });
}

/** Applies the topology before the server listens; refuses to start (closing the broker) when it cannot. */
async function applyAtStartup(broker: Broker, topology: Topology, file: string, logger: ReturnType<typeof jsonLogger>): Promise<void> {
  try {
    const plan = await planTopology(broker, topology);
    for (const line of formatPlan(plan, "applied")) logger.info({ event: "topology", file }, line);
    await applyTopology(broker, plan);
  } catch (err) {
    await broker.close();
    throw err instanceof BrokerError ? new ValidationError(`topology ${file}: ${err.message}`) : err;
  }
}

export async function serveCommand(argv: string[]): Promise<void> {
  const cfg = resolveServeConfig(argv);
  const logger = jsonLogger(cfg.logLevel);
  // A rejected promise nobody handled is a bug, but one request's bug must not take down the
  // server for every other client: log it loudly (with its stack) and keep serving. Storage
  // code never relies on this: a fault there fences and reopens the partition on its own.
  process.on("unhandledRejection", (err: unknown) => {
    logger.error({ err, stack: (err as Error)?.stack }, "unhandled promise rejection (a bug); the server keeps running");
  });
  // A bad topology file stops the start before the data directory is even opened.
  const topology = cfg.topology === undefined ? null : await loadTopology(cfg.topology);
  // Prometheus metrics on GET /metrics: the broker's (docs/metrics.md) and the process's.
  const { Registry, collectDefaultMetrics } = await import("prom-client");
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  // Key ids only are logged, never keys (ENC-3).
  const encryptionKeys = cfg.encryptionKeyFile ?? Keyring.fromEnv() ?? undefined;
  const engine = cfg.engine === undefined || cfg.engine === "disk" ? null : await openEngineSpec(cfg.engine, logger);
  const broker = await openBroker({ dataDir: cfg.data, logger, metrics: { registry }, encryptionKeys, ...(engine ? { engine } : {}) });
  if (encryptionKeys !== undefined) logger.info({ event: "encryption", source: typeof encryptionKeys === "string" ? encryptionKeys : ENCRYPTION_KEYS_ENV }, "encryption at rest: keyring loaded");
  if (typeof encryptionKeys === "string" && (statSync(encryptionKeys).mode & 0o077) !== 0) {
    logger.warn({ event: "encryption", file: encryptionKeys }, "the encryption key file can be read by other users: chmod 600 it");
  }
  if (topology !== null) await applyAtStartup(broker, topology, cfg.topology!, logger);
  let server;
  try {
    server = await startServer({
      broker,
      host: cfg.host,
      port: cfg.port,
      httpPort: cfg.httpPort,
      maxConnections: cfg.maxConnections,
      maxBodyBytes: cfg.maxBodyBytes,
      limits: { maxFrameBytes: cfg.maxFrameBytes, defaultSessionTimeoutMs: cfg.sessionTimeoutMs },
      logger,
      metrics: registry,
      dataDir: cfg.data,
      allowUnauthenticated: cfg.insecureNoAuth === true,
      tls:
        cfg.tlsCert === undefined
          ? undefined
          : { certFile: cfg.tlsCert, keyFile: cfg.tlsKey!, caFile: cfg.tlsCa, requestClientCert: cfg.tlsClientAuth === "required", principalRules: cfg.tlsPrincipalRules },
    });
  } catch (err) {
    await broker.close();
    if (err instanceof TlsConfigError) throw err;
    throw new ValidationError(`cannot listen on ${cfg.host}:${cfg.port}/${cfg.httpPort}: ${(err as Error).message}`);
  }
  const srv = server;
  // The test harness and operators parse this line to learn the (possibly ephemeral) ports.
  logger.info({ event: "listening", host: srv.host, port: srv.port, httpPort: srv.httpPort, url: srv.url, data: cfg.data, authRequired: srv.authRequired }, "sluice server listening");
  if (!(logger.isLevelEnabled?.("info") ?? true)) {
    process.stdout.write(JSON.stringify({ event: "listening", port: srv.port, httpPort: srv.httpPort, url: srv.url }) + "\n");
  }

  await new Promise<void>((resolve) => {
    let stopping = false;
    const stop = (sig: string): void => {
      if (stopping) return;
      stopping = true;
      const started = Date.now();
      logger.info({ signal: sig }, "shutting down");
      // Hard deadline: whatever happens, exit within shutdownTimeoutMs.
      const hard = setTimeout(() => {
        logger.error({ afterMs: Date.now() - started }, "shutdown timed out; exiting");
        process.exit(1);
      }, cfg.shutdownTimeoutMs);
      hard.unref();
      (async () => {
        const graceMs = Math.max(100, Math.floor(cfg.shutdownTimeoutMs * 0.6));
        await srv.close({ graceMs });
        await broker.close();
        logger.info({ tookMs: Date.now() - started }, "shutdown complete");
      })()
        .catch((err: unknown) => logger.error({ err }, "error during shutdown"))
        .finally(() => {
          clearTimeout(hard);
          resolve();
        });
    };
    // SIGHUP re-reads the TLS files (a failed reload is logged and keeps the old certificate).
    if (srv.tls) {
      process.on("SIGHUP", () => {
        try {
          srv.reloadTls();
        } catch {
          /* logged by reloadTls(); the previous certificate stays in use */
        }
      });
    }
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
  // A CLI command owns its process: do not wait for stray handles (e.g. clients that never close).
  process.exit(0);
}
