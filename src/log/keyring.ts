// SPDX-License-Identifier: Apache-2.0
/**
 * The keyring of encryption at rest (docs/security.md, "Encryption at rest"): named AES-256
 * keys, one of them active for new writes. Loaded from a key file (`--encryption-key-file`,
 * `openBroker({ encryptionKeys: "/path" })`), from `SLUICE_ENCRYPTION_KEYS` (the same JSON
 * inline), or given as an object:
 *
 *   { "active": "k2", "keys": { "k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>" } }
 *
 * ENC-3: key bytes live only in this object's private field. Nothing here puts them in an
 * error message, a log line, JSON or `util.inspect` output (toJSON / inspect show the ids
 * only), and nothing writes them anywhere.
 */
import { readFile } from "node:fs/promises";
import { inspect } from "node:util";
import { EncryptionConfigError } from "../errors.js";

/** A key id: what each encrypted batch stores to name its key (1..32 of [A-Za-z0-9._-]). */
const KEY_ID_RE = /^[A-Za-z0-9._-]{1,32}$/;
export const KEY_BYTES = 32;
/** Environment variable holding a keyring's JSON (the CLI reads it; openBroker does not). */
export const ENCRYPTION_KEYS_ENV = "SLUICE_ENCRYPTION_KEYS";
/** Environment variable naming a key file (`--encryption-key-file` of `sluice serve`; the CLI with --data). */
export const ENCRYPTION_KEY_FILE_ENV = "SLUICE_ENCRYPTION_KEY_FILE";
/** Refuse absurd files before parsing them. */
const MAX_KEY_FILE_BYTES = 1024 * 1024;

/** The keyring's JSON shape; a key is base64 text (or bytes, from code). */
export interface KeyringSpec {
  active: string;
  keys: Record<string, string | Uint8Array>;
}

/** `encryptionKeys` of openBroker / the DiskEngine: a Keyring, its spec, or a key file path. */
export type EncryptionKeys = Keyring | KeyringSpec | string;

export class Keyring {
  readonly #keys: ReadonlyMap<string, Buffer>;
  /** The id new writes use. */
  readonly activeId: string;

  private constructor(keys: Map<string, Buffer>, active: string) {
    this.#keys = keys;
    this.activeId = active;
  }

  /** Validates a spec (`source` names it in errors: a file path, the env variable). */
  static from(spec: unknown, source = "encryptionKeys"): Keyring {
    const bad = (why: string): EncryptionConfigError => new EncryptionConfigError(`${source}: ${why} (expected { "active": "<id>", "keys": { "<id>": "<base64 of 32 bytes>" } })`);
    if (typeof spec !== "object" || spec === null || Array.isArray(spec)) throw bad("not an object");
    const o = spec as Record<string, unknown>;
    for (const k of Object.keys(o)) if (k !== "active" && k !== "keys") throw bad(`unknown field ${JSON.stringify(k.slice(0, 40))}`);
    if (typeof o.keys !== "object" || o.keys === null || Array.isArray(o.keys)) throw bad(`"keys" must be an object of key id to base64 key`);
    const keys = new Map<string, Buffer>();
    for (const [id, v] of Object.entries(o.keys as Record<string, unknown>)) {
      if (!KEY_ID_RE.test(id)) throw bad(`key id ${JSON.stringify(id.slice(0, 40))} must be 1-32 of [A-Za-z0-9._-]`);
      keys.set(id, keyBytes(v, id, bad));
    }
    if (keys.size === 0) throw bad("no keys");
    if (typeof o.active !== "string" || !keys.has(o.active)) throw bad(`"active" must name one of the keys (${[...keys.keys()].join(", ")})`);
    return new Keyring(keys, o.active);
  }

  /** Reads and validates a key file; a missing or unreadable file is an EncryptionConfigError. */
  static async fromFile(path: string): Promise<Keyring> {
    let text: string;
    try {
      const buf = await readFile(path);
      if (buf.length > MAX_KEY_FILE_BYTES) throw new EncryptionConfigError(`encryption key file ${path} is larger than ${MAX_KEY_FILE_BYTES} bytes`);
      text = buf.toString("utf8");
    } catch (e) {
      if (e instanceof EncryptionConfigError) throw e;
      throw new EncryptionConfigError(`encryption key file ${path} cannot be read: ${(e as NodeJS.ErrnoException).code ?? "error"}`);
    }
    return Keyring.from(parseJson(text, `encryption key file ${path}`), `encryption key file ${path}`);
  }

  /** The keyring in `SLUICE_ENCRYPTION_KEYS`, or null when it is unset or empty. */
  static fromEnv(env: NodeJS.ProcessEnv = process.env): Keyring | null {
    const text = env[ENCRYPTION_KEYS_ENV];
    if (text === undefined || text.trim() === "") return null;
    return Keyring.from(parseJson(text, ENCRYPTION_KEYS_ENV), ENCRYPTION_KEYS_ENV);
  }

  /** The key named `id`, if the keyring has it. */
  key(id: string): Buffer | undefined {
    return this.#keys.get(id);
  }

  /** The active key (always present). */
  activeKey(): Buffer {
    return this.#keys.get(this.activeId)!;
  }

  /** Key ids (never the keys). */
  get ids(): string[] {
    return [...this.#keys.keys()];
  }

  toJSON(): { active: string; keys: string[] } {
    return { active: this.activeId, keys: this.ids };
  }

  toString(): string {
    return `Keyring(active=${this.activeId}, keys=${this.ids.join(",")})`;
  }

  [inspect.custom](): string {
    return this.toString();
  }
}

/** What the CLI's embedded commands (`--data`) use: the key file env variable, else the inline keyring, else none. */
export function encryptionKeysFromEnv(env: NodeJS.ProcessEnv = process.env): EncryptionKeys | undefined {
  const file = env[ENCRYPTION_KEY_FILE_ENV];
  if (file !== undefined && file !== "") return file;
  return Keyring.fromEnv(env) ?? undefined;
}

/** Turns an `encryptionKeys` option into a keyring (null when absent). */
export async function resolveKeyring(opt: EncryptionKeys | null | undefined): Promise<Keyring | null> {
  if (opt === undefined || opt === null) return null;
  if (opt instanceof Keyring) return opt;
  if (typeof opt === "string") return Keyring.fromFile(opt);
  return Keyring.from(opt);
}

function keyBytes(v: unknown, id: string, bad: (why: string) => EncryptionConfigError): Buffer {
  let b: Buffer;
  if (v instanceof Uint8Array) b = Buffer.from(v);
  else if (typeof v === "string") {
    const t = v.trim();
    // Strict base64: Buffer.from(.., "base64") skips junk silently, so a typo would shorten the key.
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(t) || t.length % 4 !== 0) throw bad(`key ${id} is not base64 text`);
    b = Buffer.from(t, "base64");
  } else throw bad(`key ${id} must be base64 text`);
  if (b.length !== KEY_BYTES) throw bad(`key ${id} is ${b.length} bytes, not ${KEY_BYTES} (AES-256)`);
  return b;
}

function parseJson(text: string, source: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    // Not the parser's message: it can quote the text, which may hold key material.
    throw new EncryptionConfigError(`${source} is not valid JSON`);
  }
}
