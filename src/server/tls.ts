// SPDX-License-Identifier: Apache-2.0
/**
 * The server's TLS material: reads the certificate, key and CA files, checks that they make a
 * usable secure context (a typed `TlsConfigError` at startup, not a failure at the first
 * handshake), and reloads them into the listening servers without a restart.
 *
 * Reload goes through `tls.Server.setSecureContext()` (the https server is a `tls.Server`
 * too): connections already established keep the session they negotiated; only handshakes
 * after the reload see the new certificate. A reload that cannot build a context (a missing
 * file, a half-written PEM, a key that does not match the certificate yet) leaves the old one
 * in place, so a rotation caught midway never takes the listener down.
 */
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import { createSecureContext, type SecureContextOptions, type Server as TlsServer, type TlsOptions } from "node:tls";
import { X509Certificate } from "node:crypto";
import { TlsConfigError } from "../errors.js";
import type { Logger } from "../observability/telemetry.js";
import { CertPrincipalMapper } from "../security/auth/cert-principal.js";

/** TLS for both listeners (`startServer({ tls })`). */
export interface ServerTlsOptions {
  /** PEM certificate chain presented to clients (leaf first). */
  certFile: string;
  /** PEM private key of the certificate. */
  keyFile: string;
  /** PEM CA bundle that client certificates are checked against (with `requestClientCert`). */
  caFile?: string;
  /**
   * Ask clients for a certificate and refuse a handshake without one signed by `caFile`
   * (mutual TLS). Default false. Needs `caFile`.
   */
  requestClientCert?: boolean;
  /**
   * Log clients in as the principal their certificate maps to (docs/security.md "Client
   * certificates (mutual TLS)"): rules in order, each `RULE:<regex>/<replacement>/[L|U]`,
   * `CN`, `SAN:email`, `SAN:uri` or `SAN:dns` (an element may hold several, comma-separated).
   * Needs `requestClientCert`. A rule that cannot be used is a `TlsConfigError` at startup.
   */
  principalRules?: readonly string[];
  /**
   * How often the files are polled for changes (then reloaded as by `reloadTls()`), in ms.
   * Default 60 000; 0 turns polling off (reload with `reloadTls()` or SIGHUP to `sluice serve`).
   */
  watchIntervalMs?: number;
}

/** The oldest protocol version either listener accepts: TLS 1.0 and 1.1 are refused. */
export const TLS_MIN_VERSION = "TLSv1.2";

const DEFAULT_WATCH_INTERVAL_MS = 60_000;

function readPem(file: string, what: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new TlsConfigError(`cannot read the TLS ${what} file ${file}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Reads the files and checks them by building a secure context once (node only parses PEM
 * and matches the key when a context is created). Throws `TlsConfigError`.
 */
export function loadServerTls(o: ServerTlsOptions): SecureContextOptions {
  if (o.requestClientCert && o.caFile === undefined) throw new TlsConfigError("tls.requestClientCert needs tls.caFile: the CA that client certificates are checked against");
  const ctx: SecureContextOptions = {
    cert: readPem(o.certFile, "certificate"),
    key: readPem(o.keyFile, "key"),
    minVersion: TLS_MIN_VERSION,
  };
  if (o.caFile !== undefined) ctx.ca = readPem(o.caFile, "CA");
  try {
    createSecureContext(ctx);
  } catch (err) {
    throw new TlsConfigError(`unusable TLS certificate/key (${o.certFile}, ${o.keyFile}${o.caFile ? `, ${o.caFile}` : ""}): ${(err as Error).message}`, { cause: err });
  }
  return ctx;
}

/** The SHA-256 fingerprint of the first certificate in a PEM chain (logged on reload). */
function fingerprint(pem: SecureContextOptions["cert"]): string | null {
  try {
    return new X509Certificate(pem as Buffer).fingerprint256;
  } catch {
    return null;
  }
}

export class ServerTls {
  /** Client certificates to principals (`principalRules`), parsed once at startup; null: off. */
  readonly principals: CertPrincipalMapper | null;
  private current: SecureContextOptions;
  private readonly servers: TlsServer[] = [];
  private watching = false;
  private readonly onChange = (): void => {
    try {
      this.reload();
    } catch {
      /* logged by reload(); the old certificate stays */
    }
  };

  /** Throws `TlsConfigError` when the files do not make a usable context. */
  constructor(
    private readonly opts: ServerTlsOptions,
    private readonly logger: Logger,
  ) {
    this.current = loadServerTls(opts);
    // Only a certificate the handshake verified can name a principal (AUTH-6).
    if (opts.principalRules !== undefined && opts.requestClientCert !== true) throw new TlsConfigError("tls.principalRules needs tls.requestClientCert (and tls.caFile): only a verified client certificate can name a principal");
    this.principals = opts.principalRules === undefined ? null : CertPrincipalMapper.parse(opts.principalRules);
  }

  /** Options for `tls.createServer` / `https.createServer` with the current material. */
  serverOptions(): TlsOptions {
    const mutual = this.opts.requestClientCert === true;
    return { ...this.current, requestCert: mutual, rejectUnauthorized: mutual, handshakeTimeout: 10_000 };
  }

  /** Servers whose context a reload replaces; starts polling the files with the first one. */
  attach(server: TlsServer): void {
    this.servers.push(server);
    const interval = this.opts.watchIntervalMs ?? DEFAULT_WATCH_INTERVAL_MS;
    if (this.watching || interval <= 0) return;
    this.watching = true;
    for (const f of this.files()) watchFile(f, { interval, persistent: false }, this.onChange);
  }

  /**
   * Re-reads the files and, when they make a usable context, installs it for new handshakes.
   * Throws `TlsConfigError` (and logs it) otherwise; the previous certificate stays in use.
   */
  reload(): void {
    let next: SecureContextOptions;
    try {
      next = loadServerTls(this.opts);
    } catch (err) {
      this.logger.error({ err, certFile: this.opts.certFile, keyFile: this.opts.keyFile }, "TLS reload failed; still serving the previous certificate");
      throw err;
    }
    // Whether a client certificate is asked for is the server's setting (serverOptions()), not
    // the context's: a reload keeps it.
    for (const s of this.servers) s.setSecureContext(next);
    this.current = next;
    this.logger.info({ certFile: this.opts.certFile, fingerprint256: fingerprint(next.cert) }, "TLS certificate reloaded");
  }

  /** Stops polling the files. */
  stop(): void {
    if (!this.watching) return;
    this.watching = false;
    for (const f of this.files()) unwatchFile(f, this.onChange);
  }

  private files(): string[] {
    return [this.opts.certFile, this.opts.keyFile, ...(this.opts.caFile === undefined ? [] : [this.opts.caFile])];
  }
}
