// SPDX-License-Identifier: Apache-2.0
/**
 * SCRAM-SHA-256 (RFC 5802 with the SHA-256 hash of RFC 7677): the key derivation both sides
 * share, and the parsing and building of its four messages. No channel binding ("n,,"); the
 * transport's TLS (docs/security.md) protects the exchange from eavesdroppers. Only salt,
 * iteration count, StoredKey and ServerKey are ever stored (AUTH-2): a stolen store lets no one
 * log in without first brute-forcing each password.
 */
import { createHash, createHmac, pbkdf2, pbkdf2Sync, randomBytes, timingSafeEqual } from "node:crypto";

export const SCRAM_MECHANISM = "SCRAM-SHA-256";
/** RFC 7677 asks for at least 4096; stored users never have fewer. */
export const MIN_ITERATIONS = 4096;
export const DEFAULT_ITERATIONS = 16384;

export interface ScramKeys {
  salt: Buffer;
  iterations: number;
  storedKey: Buffer;
  serverKey: Buffer;
}

const hmac = (key: Buffer, data: string | Buffer): Buffer => createHmac("sha256", key).update(data).digest();
const sha256 = (data: Buffer): Buffer => createHash("sha256").update(data).digest();

export function xor(a: Buffer, b: Buffer): Buffer {
  const out = Buffer.alloc(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] ^ b[i];
  return out;
}

/** Hi() of RFC 5802 is PBKDF2 with HMAC and one output block. Passwords are taken as given
 * (no SASLprep): NFC-normalized so one typed password has one byte form. */
export function saltedPassword(password: string, salt: Buffer, iterations: number): Buffer {
  return pbkdf2Sync(Buffer.from(password.normalize("NFC"), "utf8"), salt, iterations, 32, "sha256");
}

export const clientKeyOf = (salted: Buffer): Buffer => hmac(salted, "Client Key");
export const storedKeyOf = (clientKey: Buffer): Buffer => sha256(clientKey);
export const serverKeyOf = (salted: Buffer): Buffer => hmac(salted, "Server Key");
export const signature = (key: Buffer, authMessage: string): Buffer => hmac(key, authMessage);

/** The keys to store for a new password. */
export function deriveKeys(password: string, iterations = DEFAULT_ITERATIONS, salt: Buffer = randomBytes(16)): ScramKeys {
  const salted = saltedPassword(password, salt, iterations);
  return { salt, iterations, storedKey: storedKeyOf(clientKeyOf(salted)), serverKey: serverKeyOf(salted) };
}

/** True when `password` derives `keys.storedKey` (HTTP Basic), compared in constant time. */
export function passwordMatches(password: string, keys: ScramKeys): boolean {
  const stored = storedKeyOf(clientKeyOf(saltedPassword(password, keys.salt, keys.iterations)));
  return stored.length === keys.storedKey.length && timingSafeEqual(stored, keys.storedKey);
}

/** `passwordMatches` off the event loop (HTTP Basic: one derivation per request). */
export function passwordMatchesAsync(password: string, keys: ScramKeys): Promise<boolean> {
  return new Promise((resolve, reject) =>
    pbkdf2(Buffer.from(password.normalize("NFC"), "utf8"), keys.salt, keys.iterations, 32, "sha256", (err, salted) => {
      if (err) return reject(err);
      const stored = storedKeyOf(clientKeyOf(salted));
      resolve(stored.length === keys.storedKey.length && timingSafeEqual(stored, keys.storedKey));
    }),
  );
}

/** Equal lengths compared in constant time; unequal lengths are simply unequal. */
export function safeEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

export const nonce = (): string => randomBytes(18).toString("base64");

/** "a=1,b=2" into {a: "1", b: "2"}; null when malformed. */
export function parseAttributes(msg: string): Map<string, string> | null {
  const out = new Map<string, string>();
  for (const part of msg.split(",")) {
    const m = /^([a-zA-Z])=(.*)$/s.exec(part);
    if (!m) return null;
    out.set(m[1], m[2]);
  }
  return out;
}

/** RFC 5802 saslname escaping of "," and "=". */
export const escapeName = (name: string): string => name.replace(/=/g, "=3D").replace(/,/g, "=2C");
export const unescapeName = (name: string): string => name.replace(/=2C/g, ",").replace(/=3D/g, "=");

/** GS2 header without channel binding or authzid. */
export const GS2_HEADER = "n,,";
export const CHANNEL_BINDING = Buffer.from(GS2_HEADER).toString("base64");
