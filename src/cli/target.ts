// SPDX-License-Identifier: Apache-2.0
/**
 * Which broker a command talks to: a running server (`--url`, or env SLUICE_URL) through
 * `connect()`, or a data directory opened embedded (`--data`, or env SLUICE_DATA) when no server
 * holds it. Flags beat environment variables. A command that only reads never creates anything:
 * a missing data directory is an error, not a new empty broker.
 */
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Broker } from "../types.js";
import { ValidationError } from "../errors.js";
import { UsageError } from "./args.js";
import { resolveCredentials, type CredentialValues } from "./credentials.js";
import type { ClientAuth } from "../client/auth.js";

/** The Broker interface plus queue listing, which both implementations have. */
export type CliBroker = Broker & { listQueues(): Promise<string[]> };

export interface TargetValues extends CredentialValues {
  url?: string;
  data?: string;
  /** CA file for a `sluice+tls://` url (docs/security.md). */
  "tls-ca"?: string;
  /** Client certificate and key files, for a server that requires one (mutual TLS). */
  "tls-client-cert"?: string;
  "tls-client-key"?: string;
}

/** A client certificate and its key (`--tls-client-cert`, `--tls-client-key`). */
export interface ClientCertFiles {
  certFile: string;
  keyFile: string;
}

export type Target = { kind: "url"; url: string; tlsCa?: string; clientCert?: ClientCertFiles; auth?: ClientAuth } | { kind: "data"; dir: string };

/**
 * The client certificate for `url`: flags always (connect() refuses them with a plain url),
 * the environment only for sluice+tls:// urls, like SLUICE_TLS_CA. Both files or neither.
 */
function clientCert(v: TargetValues, env: NodeJS.ProcessEnv, u: string): ClientCertFiles | undefined {
  const tlsUrl = u.startsWith("sluice+tls:");
  const certFile = v["tls-client-cert"] ?? (tlsUrl ? env.SLUICE_TLS_CLIENT_CERT || undefined : undefined);
  const keyFile = v["tls-client-key"] ?? (tlsUrl ? env.SLUICE_TLS_CLIENT_KEY || undefined : undefined);
  if ((certFile === undefined) !== (keyFile === undefined)) throw new UsageError("--tls-client-cert and --tls-client-key go together");
  return certFile === undefined || keyFile === undefined ? undefined : { certFile, keyFile };
}

export function resolveTarget(v: TargetValues, env: NodeJS.ProcessEnv = process.env): Target {
  if (v.url !== undefined && v.data !== undefined) throw new UsageError("give either --url or --data, not both");
  if (v["tls-ca"] !== undefined && v.url === undefined && (v.data !== undefined || !env.SLUICE_URL)) throw new UsageError("--tls-ca goes with --url sluice+tls://host:port");
  // --tls-ca is always passed on (a plain url with it is refused by connect()); SLUICE_TLS_CA
  // only for sluice+tls:// urls, so a shell that sets it can still reach plain servers.
  const url = (u: string): Target => {
    const tlsCa = v["tls-ca"] ?? (u.startsWith("sluice+tls:") ? env.SLUICE_TLS_CA || undefined : undefined);
    const cert = clientCert(v, env, u);
    return { kind: "url", url: u, ...(tlsCa === undefined ? {} : { tlsCa }), ...(cert === undefined ? {} : { clientCert: cert }) };
  };
  const withAuth = (t: Target): Target => {
    const auth = resolveCredentials(v, env);
    return t.kind === "url" && auth ? { ...t, auth } : t;
  };
  if (v.url !== undefined) return withAuth(url(v.url));
  if (v.data !== undefined) return { kind: "data", dir: v.data };
  if (env.SLUICE_URL) return withAuth(url(env.SLUICE_URL));
  if (env.SLUICE_DATA) return { kind: "data", dir: env.SLUICE_DATA };
  throw new UsageError("no broker given: use --url sluice://host:port (a running server) or --data DIR (or set SLUICE_URL)");
}

/**
 * Opens the target, runs `fn`, closes it. `readOnly` refuses a data directory that does not
 * exist (opening one would create it).
 */
export async function withBroker<T>(v: TargetValues, opts: { readOnly: boolean }, fn: (b: CliBroker) => Promise<T>): Promise<T> {
  const target = resolveTarget(v);
  const b = await open(target, opts.readOnly);
  try {
    return await fn(b);
  } finally {
    await b.close();
  }
}

async function open(t: Target, readOnly: boolean): Promise<CliBroker> {
  if (t.kind === "url") {
    const { connect } = await import("../client/index.js");
    // A CLI run is short: fail fast on a wrong URL or a server that went away.
    const tls = t.tlsCa === undefined && t.clientCert === undefined ? undefined : { ...(t.tlsCa === undefined ? {} : { caFile: t.tlsCa }), ...t.clientCert };
    return connect({ url: t.url, tls, auth: t.auth, connectTimeoutMs: 5000, reconnectTimeoutMs: 10_000, requestTimeoutMs: 30_000 });
  }
  if (readOnly && !existsSync(t.dir)) throw new ValidationError(`data directory ${t.dir} does not exist (nothing to read; this command creates nothing)`);
  if (existsSync(t.dir) && !statSync(t.dir).isDirectory()) throw new ValidationError(`${t.dir} is not a directory`);
  // Opening a directory lays out the broker's subdirectories: a read must not do that to a
  // directory that is not a sluice data directory (a mistyped path such as the home directory).
  if (readOnly && !existsSync(join(t.dir, "topics"))) throw new ValidationError(`${t.dir} is not a sluice data directory (no topics/ in it; this command creates nothing)`);
  const { openBroker } = await import("../broker/broker.js");
  // A short command does not fire the queues' schedules (the server holding the dir does).
  const { encryptionKeysFromEnv } = await import("../log/keyring.js");
  return openBroker({ dataDir: t.dir, retentionCheckIntervalMs: 0, runSchedules: false, encryptionKeys: encryptionKeysFromEnv() });
}
