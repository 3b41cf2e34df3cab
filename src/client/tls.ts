// SPDX-License-Identifier: Apache-2.0
/**
 * The client's side of TLS: the `tls` option of `connect()` turned into `tls.connect` options
 * (files read once, at connect time, so a missing CA file is a `TlsConfigError` at once), and
 * handshake failures told apart from network failures: an untrusted certificate or a shared
 * version that does not exist will not get better by reconnecting, so they are
 * `TlsHandshakeError` (not retriable) rather than `ConnectionClosedError`.
 */
import { readFileSync } from "node:fs";
import type { ConnectionOptions } from "node:tls";
import { TlsConfigError, TlsHandshakeError } from "../errors.js";

/** The `tls` option of `connect()`, for `sluice+tls://` URLs. */
export interface ClientTlsOptions {
  /** PEM CA certificate(s) the server's certificate must chain to. Default: Node's CA store. */
  ca?: string | Buffer;
  /** The same, read from a file. */
  caFile?: string;
  /** Host name the server certificate must name (and SNI). Default: the URL's host. */
  servername?: string;
  /** Refuse a server whose certificate is not trusted. Default true; false only for tests. */
  rejectUnauthorized?: boolean;
  /** PEM client certificate, for servers that ask for one (mutual TLS). */
  cert?: string | Buffer;
  certFile?: string;
  /** PEM private key of `cert`. */
  key?: string | Buffer;
  keyFile?: string;
  /** Oldest TLS version to offer. Default "TLSv1.2" (what the server accepts). */
  minVersion?: ConnectionOptions["minVersion"];
  /** Newest TLS version to offer (testing). Default: Node's (TLS 1.3). */
  maxVersion?: ConnectionOptions["maxVersion"];
}

function read(file: string, what: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new TlsConfigError(`cannot read the TLS ${what} file ${file}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * `tls.connect` options for a URL (`secure` = `sluice+tls://`), or null for plain TCP.
 * Throws `TlsConfigError` for unreadable files or `tls` options given with a plain URL.
 */
export function clientTlsOptions(secure: boolean, o: ClientTlsOptions | undefined): ConnectionOptions | null {
  if (!secure) {
    if (o !== undefined) throw new TlsConfigError("tls options were given for a sluice:// url; use sluice+tls://host:port to connect with TLS");
    return null;
  }
  const opts: ConnectionOptions = {
    rejectUnauthorized: o?.rejectUnauthorized ?? true,
    minVersion: o?.minVersion ?? "TLSv1.2",
  };
  if (o?.maxVersion !== undefined) opts.maxVersion = o.maxVersion;
  const ca = o?.ca ?? (o?.caFile === undefined ? undefined : read(o.caFile, "CA"));
  if (ca !== undefined) opts.ca = ca;
  const cert = o?.cert ?? (o?.certFile === undefined ? undefined : read(o.certFile, "certificate"));
  const key = o?.key ?? (o?.keyFile === undefined ? undefined : read(o.keyFile, "key"));
  if ((cert === undefined) !== (key === undefined)) throw new TlsConfigError("a TLS client certificate needs its key (and a key its certificate)");
  if (cert !== undefined) opts.cert = cert;
  if (key !== undefined) opts.key = key;
  if (o?.servername !== undefined) opts.servername = o.servername;
  return opts;
}

/** Network errors: the peer is away or went away, which a reconnect may fix. */
const NETWORK_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND", "EAI_AGAIN", "EPIPE"]);

/**
 * A TLS socket's error before `secureConnect` as a `TlsHandshakeError`, or null for a network
 * error (left to the caller's `ConnectionClosedError`).
 */
export function handshakeError(err: Error & { code?: string; reason?: string }, where: string): TlsHandshakeError | null {
  if (err.code !== undefined && NETWORK_CODES.has(err.code)) return null;
  // OpenSSL's `reason` ("tlsv13 alert certificate required") reads better than its message,
  // which carries the library's file and line; the whole error stays as the cause.
  return new TlsHandshakeError(`TLS handshake with ${where} failed: ${err.reason ?? err.message}${hintFor(err.code ?? "")}`, { cause: err });
}

/** What to do about a handshake failure, from OpenSSL's code (alerts are the server's word). */
function hintFor(code: string): string {
  if (code === "ERR_SSL_WRONG_VERSION_NUMBER" || code === "ERR_SSL_PACKET_LENGTH_TOO_LONG") return " (the server does not speak TLS on this port: use a sluice:// url, or enable TLS on the server)";
  if (code === "ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION" || code === "ERR_SSL_UNSUPPORTED_PROTOCOL") return " (no TLS version in common: the server accepts TLS 1.2 and 1.3)";
  if (code.endsWith("ALERT_CERTIFICATE_REQUIRED")) return " (the server requires a client certificate: give tls.cert and tls.key, or tls.certFile and tls.keyFile)";
  if (code.includes("ALERT") && /CERT|_CA/.test(code)) return " (the server refused this client's certificate)";
  if (/CERT|SIGNATURE|ALTNAME|ISSUER/.test(code)) return " (the server's certificate is not trusted: give its CA as tls.ca / tls.caFile, or --tls-ca to the CLI)";
  return "";
}
