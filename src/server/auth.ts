// SPDX-License-Identifier: Apache-2.0
/**
 * The server's side of authentication in the HELLO handshake (docs/protocol.md §1.1):
 * SCRAM-SHA-256 in two HELLO round trips, or a bearer token in the first HELLO. One login
 * attempt per connection; any failure is the one `AuthenticationError` (the reason is logged,
 * never sent), and failures are counted per source address (AUTH-4). Every result, success or
 * failure, goes to the audit log through `AuthAudit` (AUD-4), which bounds what failures cost.
 *
 * An unknown user gets a server-first message with a salt derived from a per-server secret,
 * so the exchange looks the same as for a real user and fails only at the proof.
 */
import { createHmac, randomBytes, type X509Certificate } from "node:crypto";
import type { Socket } from "node:net";
import { TLSSocket } from "node:tls";
import { AuthenticationError } from "../errors.js";
import type { CredentialStore } from "../security/auth/credential-store.js";
import { FailureLimiter, type FailureLimitOptions } from "../security/auth/rate-limit.js";
import {
  CHANNEL_BINDING,
  DEFAULT_ITERATIONS,
  SCRAM_MECHANISM,
  nonce,
  parseAttributes,
  passwordMatchesAsync,
  safeEqual,
  signature,
  storedKeyOf,
  unescapeName,
  xor,
  type ScramKeys,
} from "../security/auth/scram.js";
import type { Logger } from "../observability/telemetry.js";
import type { AuthAudit, AuthAttempt } from "../security/audit/auth-results.js";
import { rfc2253, type CertPrincipalMapper } from "../security/auth/cert-principal.js";

export const BEARER_MECHANISM = "BEARER";
/** HTTP Basic: the mechanism name recorded in the audit log. */
const BASIC_MECHANISM = "BASIC";
/** A verified client certificate mapped to a principal: the mechanism name recorded in the audit log. */
export const TLS_MECHANISM = "TLS";

/**
 * The client certificate of a TLS connection, only when the handshake verified it against the
 * CA (AUTH-6): a plain socket, or one whose certificate was not verified, has none.
 */
function verifiedPeerCertificate(socket: Socket | undefined): X509Certificate | null {
  if (!(socket instanceof TLSSocket) || !socket.authorized) return null;
  return socket.getPeerX509Certificate() ?? null;
}

export interface AuthOptions {
  failureLimit?: FailureLimitOptions;
  /** Clock for the failure buckets (tests). */
  now?: () => number;
}

/** Where a login attempt came from: the interface, the address, and `host:port`. */
export type Peer = Pick<AuthAttempt, "via" | "source" | "remote">;

/** What a HELLO's `auth` field led to: a challenge to send back, or the authenticated principal. */
export type AuthStep = { kind: "challenge"; message: string } | { kind: "done"; principal: string; message?: string };

export class ServerAuth {
  readonly limiter: FailureLimiter;
  private readonly secret = randomBytes(32);
  private on = false;
  /**
   * HTTP Basic logins that succeeded recently, by a keyed hash of user, password and stored
   * key (never the password): a dashboard polling every few seconds must not cost a full key
   * derivation per request. A changed password changes the stored key, so old entries miss.
   */
  private readonly basicOk = new Map<string, number>();

  constructor(
    private readonly store: CredentialStore | null,
    private readonly logger: Logger,
    opts: AuthOptions = {},
    /** Where login results are recorded (AUD-4); null: nowhere (no audit log). */
    private readonly audit: AuthAudit | null = null,
    /** Client certificates to principals (`tls.principalRules`); null: certificates log nobody in. */
    private readonly certs: CertPrincipalMapper | null = null,
  ) {
    this.limiter = new FailureLimiter(opts.failureLimit, opts.now);
  }

  /**
   * True when the store has users or tokens (re-read if it changed), or client certificates
   * are mapped to principals: then HELLO must authenticate (AUTH-3).
   */
  async required(): Promise<boolean> {
    if (this.store) {
      await this.store.refresh();
      // Once on, on until restart: removing the last user and token must not open a running
      // server (perhaps on a public address) to everyone; it then refuses every login (AUTH-3).
      this.on ||= this.store.configured();
    }
    return this.on || this.certs !== null;
  }

  /**
   * A fresh exchange for one connection from `source` (its address, without the port; `remote`
   * with it); `socket` is where its client certificate, if any, is read.
   */
  begin(source: string, remote = source, socket?: Socket): HandshakeAuth {
    return new HandshakeAuth(this, { via: "protocol", source, remote }, socket);
  }

  /**
   * @internal The principal of the verified client certificate of `socket` (AUTH-5, AUTH-6),
   * audited as a `TLS` login; null when mapping is off or there is no verified certificate.
   * A certificate that maps to no principal is a failed login (AuthenticationError).
   */ async certificateLogin(at: Peer, socket: Socket | undefined): Promise<string | null> {
    if (this.certs === null) return null;
    const cert = verifiedPeerCertificate(socket);
    if (cert === null) return null;
    const mapped = this.certs.map(cert);
    // The subject is who tried (not a secret), so an operator can see which certificate it was.
    if (mapped.principal === null) throw this.refuse(at, mapped.reason, rfc2253(cert.subject).slice(0, 256), TLS_MECHANISM);
    await this.succeeded(at, mapped.principal, TLS_MECHANISM);
    return mapped.principal;
  }

  /**
   * The principal for an HTTP `Authorization` header (Bearer token or Basic user:password),
   * else for the request's verified client certificate (`socket`, with `tls.principalRules`),
   * or null when the server runs without credentials. Throws AuthenticationError otherwise.
   */
  async httpPrincipal(header: string | undefined, source: string, remote = source, socket?: Socket): Promise<string | null> {
    if (!(await this.required())) return null;
    const at: Peer = { via: "http", source, remote };
    if (!this.limiter.allowed(source)) throw this.refuse(at, "too many failed attempts from this source");
    // AUTH-7: explicit credentials win; without them, the certificate is the credential.
    if (!header) {
      const principal = await this.certificateLogin(at, socket);
      if (principal !== null) return principal;
    }
    const m = /^(Bearer|Basic) +(\S{1,2048})$/i.exec(header ?? "");
    if (!m) throw this.refuse(at, header ? "unsupported Authorization scheme" : "no credentials");
    if (m[1].toLowerCase() === "bearer") {
      const principal = this.tokenPrincipal(m[2]);
      if (principal === null) throw this.refuse(at, "unknown, revoked or expired token", "anonymous", BEARER_MECHANISM);
      await this.succeeded(at, principal, BEARER_MECHANISM);
      return principal;
    }
    const decoded = Buffer.from(m[2], "base64").toString("utf8");
    const colon = decoded.indexOf(":");
    const user = colon < 0 ? decoded : decoded.slice(0, colon);
    const keys = this.keysFor(user);
    const cacheKey = createHmac("sha256", this.secret).update(`${decoded}\0${keys.storedKey.toString("base64")}`).digest("base64");
    if ((this.basicOk.get(cacheKey) ?? 0) > Date.now()) {
      await this.succeeded(at, user, BASIC_MECHANISM);
      return user;
    }
    // An unknown user costs the same derivation as a known one (keysFor gives fake keys).
    if (colon < 0 || !(await passwordMatchesAsync(decoded.slice(colon + 1), keys))) {
      throw this.refuse(at, "wrong password or unknown user", user, BASIC_MECHANISM);
    }
    if (this.basicOk.size >= 1000) this.basicOk.delete(this.basicOk.keys().next().value as string);
    this.basicOk.set(cacheKey, Date.now() + 60_000);
    await this.succeeded(at, user, BASIC_MECHANISM);
    return user;
  }

  /** @internal */ keysFor(user: string): ScramKeys {
    const keys = this.store?.user(user);
    if (keys) return keys;
    const fake = createHmac("sha256", this.secret).update(user).digest();
    // Random keys: no proof can match them.
    return { salt: fake.subarray(0, 16), iterations: DEFAULT_ITERATIONS, storedKey: randomBytes(32), serverKey: randomBytes(32) };
  }

  /** @internal */ tokenPrincipal(token: string): string | null {
    return this.store?.tokenPrincipal(token) ?? null;
  }

  /**
   * @internal Counts a failure against its source (AUTH-4), logs and audits it (AUD-4). `reason`
   * is a fixed phrase and `principal` the name tried, if any: never a secret.
   */ refuse(at: Peer, reason: string, principal = "anonymous", mechanism = "none"): AuthenticationError {
    this.limiter.failed(at.source);
    this.logger.warn({ source: at.source, via: at.via, reason, ...(principal !== "anonymous" ? { user: principal.slice(0, 128) } : {}) }, "authentication failed");
    this.audit?.failed({ ...at, principal, mechanism }, reason);
    return new AuthenticationError();
  }

  /** @internal A login succeeded: resolves once the audit log has it (AUD-4). */
  succeeded(at: Peer, principal: string, mechanism: string): Promise<void> {
    return this.audit?.succeeded({ ...at, principal, mechanism }) ?? Promise.resolve();
  }

  /** Writes the counts of failures and HTTP logins still being aggregated (at server close). */
  flushAudit(): Promise<void> {
    return this.audit?.flush() ?? Promise.resolve();
  }
}

export class HandshakeAuth {
  private scram: { user: string; keys: ScramKeys; clientFirstBare: string; serverFirst: string; nonce: string } | null = null;

  constructor(
    private readonly auth: ServerAuth,
    private readonly at: Peer,
    private readonly socket?: Socket,
  ) {}

  /**
   * One HELLO's `auth` field (undefined when absent). Throws AuthenticationError on failure;
   * a success is in the audit log before it is returned (AUD-4).
   */
  async step(field: unknown): Promise<AuthStep> {
    if (!this.auth.limiter.allowed(this.at.source)) throw this.auth.refuse(this.at, "too many failed attempts from this source", this.scram?.user);
    // AUTH-7: a HELLO without `auth` logs in with the connection's client certificate, if
    // mapping is on; credentials sent explicitly are checked instead, and win.
    if ((field === undefined || field === null) && this.scram === null) {
      const principal = await this.auth.certificateLogin(this.at, this.socket);
      if (principal !== null) return { kind: "done", principal };
    }
    if (typeof field !== "object" || field === null) throw this.auth.refuse(this.at, "no credentials", this.scram?.user);
    const { mechanism, message, token } = field as Record<string, unknown>;
    if (this.scram) {
      const done = this.final(message);
      await this.auth.succeeded(this.at, done.principal, SCRAM_MECHANISM);
      return done;
    }
    if (mechanism === BEARER_MECHANISM && typeof token === "string" && token.length <= 1024) {
      const principal = this.auth.tokenPrincipal(token);
      if (principal === null) throw this.auth.refuse(this.at, "unknown, revoked or expired token", "anonymous", BEARER_MECHANISM);
      await this.auth.succeeded(this.at, principal, BEARER_MECHANISM);
      return { kind: "done", principal };
    }
    if (mechanism === SCRAM_MECHANISM && typeof message === "string") return this.first(message);
    throw this.auth.refuse(this.at, "unsupported mechanism or malformed auth field");
  }

  private first(clientFirst: string): AuthStep {
    // "n,,n=user,r=nonce": no channel binding, no authzid (scram.ts).
    if (!clientFirst.startsWith("n,,")) throw this.auth.refuse(this.at, "malformed client-first message", "anonymous", SCRAM_MECHANISM);
    const bare = clientFirst.slice(3);
    const attrs = parseAttributes(bare);
    const user = attrs?.get("n");
    const cnonce = attrs?.get("r");
    if (!user || !cnonce || cnonce.length > 256) throw this.auth.refuse(this.at, "malformed client-first message", user ? unescapeName(user) : "anonymous", SCRAM_MECHANISM);
    const keys = this.auth.keysFor(unescapeName(user));
    const full = cnonce + nonce();
    const serverFirst = `r=${full},s=${keys.salt.toString("base64")},i=${keys.iterations}`;
    this.scram = { user: unescapeName(user), keys, clientFirstBare: bare, serverFirst, nonce: full };
    return { kind: "challenge", message: serverFirst };
  }

  private final(clientFinal: unknown): AuthStep & { kind: "done" } {
    const s = this.scram!;
    const attrs = typeof clientFinal === "string" ? parseAttributes(clientFinal) : null;
    const proofB64 = attrs?.get("p");
    const idx = typeof clientFinal === "string" ? clientFinal.lastIndexOf(",p=") : -1;
    if (!attrs || !proofB64 || idx < 0 || attrs.get("c") !== CHANNEL_BINDING || attrs.get("r") !== s.nonce) {
      throw this.auth.refuse(this.at, "malformed client-final message", s.user, SCRAM_MECHANISM);
    }
    const authMessage = `${s.clientFirstBare},${s.serverFirst},${(clientFinal as string).slice(0, idx)}`;
    const proof = Buffer.from(proofB64, "base64");
    const clientKey = xor(proof, signature(s.keys.storedKey, authMessage));
    if (proof.length !== 32 || !safeEqual(storedKeyOf(clientKey), s.keys.storedKey)) {
      throw this.auth.refuse(this.at, "wrong password or unknown user", s.user, SCRAM_MECHANISM);
    }
    return { kind: "done", principal: s.user, message: `v=${signature(s.keys.serverKey, authMessage).toString("base64")}` };
  }
}
