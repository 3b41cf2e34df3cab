// SPDX-License-Identifier: Apache-2.0
/**
 * The client's side of authentication in the HELLO handshake (docs/protocol.md §1.1): the
 * `auth` field of each HELLO, and the check of the server's SCRAM signature, which proves the
 * server holds this user's keys (a server that cannot prove it is refused).
 */
import { AuthenticationError, ValidationError } from "../errors.js";
import {
  CHANNEL_BINDING,
  GS2_HEADER,
  MIN_ITERATIONS,
  SCRAM_MECHANISM,
  clientKeyOf,
  escapeName,
  nonce,
  parseAttributes,
  safeEqual,
  saltedPassword,
  serverKeyOf,
  signature,
  storedKeyOf,
  xor,
} from "../security/auth/scram.js";

/** `connect({ auth })`: a SCRAM-SHA-256 user, or a bearer token from `sluice tokens create`. */
export type ClientAuth = { username: string; password: string } | { token: string };

/** Iterations a server may ask for at most: a hostile server must not make us spin for minutes. */
const MAX_ITERATIONS = 10_000_000;

export class ClientLogin {
  private readonly cnonce = nonce();
  private clientFirstBare = "";
  private expectedServerSignature: Buffer | null = null;

  constructor(private readonly auth: ClientAuth) {
    if ("token" in auth) {
      if (typeof auth.token !== "string" || auth.token.length === 0) throw new ValidationError("auth.token must be a non-empty string");
    } else if (typeof auth.username !== "string" || auth.username.length === 0 || typeof auth.password !== "string") {
      throw new ValidationError("auth needs a non-empty username and a password, or a token");
    }
  }

  /** The first HELLO's `auth` field. */
  first(): Record<string, unknown> {
    if ("token" in this.auth) return { mechanism: "BEARER", token: this.auth.token };
    this.clientFirstBare = `n=${escapeName(this.auth.username)},r=${this.cnonce}`;
    return { mechanism: SCRAM_MECHANISM, message: GS2_HEADER + this.clientFirstBare };
  }

  /** The second HELLO's `auth` field, answering the server-first message. */
  challenge(serverFirst: unknown): Record<string, unknown> {
    if ("token" in this.auth || typeof serverFirst !== "string") throw new AuthenticationError("unexpected authentication challenge from the server");
    const a = parseAttributes(serverFirst);
    const r = a?.get("r");
    const salt = a?.get("s");
    const iterations = Number(a?.get("i"));
    if (!r || !r.startsWith(this.cnonce) || !salt || !Number.isSafeInteger(iterations) || iterations < MIN_ITERATIONS || iterations > MAX_ITERATIONS) {
      throw new AuthenticationError("malformed authentication challenge from the server");
    }
    const salted = saltedPassword(this.auth.password, Buffer.from(salt, "base64"), iterations);
    const clientKey = clientKeyOf(salted);
    const withoutProof = `c=${CHANNEL_BINDING},r=${r}`;
    const authMessage = `${this.clientFirstBare},${serverFirst},${withoutProof}`;
    const proof = xor(clientKey, signature(storedKeyOf(clientKey), authMessage));
    this.expectedServerSignature = signature(serverKeyOf(salted), authMessage);
    return { mechanism: SCRAM_MECHANISM, message: `${withoutProof},p=${proof.toString("base64")}` };
  }

  /** Checks the final HELLO reply: with SCRAM it must carry the server's signature. */
  finish(meta: Record<string, unknown>): void {
    if ("token" in this.auth) return;
    const field = meta.auth as { message?: unknown } | undefined;
    const v = typeof field?.message === "string" ? parseAttributes(field.message)?.get("v") : undefined;
    if (!this.expectedServerSignature || !v || !safeEqual(Buffer.from(v, "base64"), this.expectedServerSignature)) {
      throw new AuthenticationError("the server did not prove it knows this user's keys (no or wrong SCRAM server signature)");
    }
  }
}
