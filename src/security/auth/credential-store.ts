// SPDX-License-Identifier: Apache-2.0
/**
 * The credential store: `<dataDir>/security/credentials.json`, holding SCRAM-SHA-256 users
 * (salt, iterations, StoredKey, ServerKey) and bearer tokens (SHA-256 hash, principal, expiry).
 * Nothing stored gives back a password or a token (AUTH-2). Every change is written with
 * writeFileAtomic (META-1) into a directory only the owner can read. The server re-reads the
 * file when it changed on disk, so `sluice users` / `sluice tokens` take effect for the next
 * login without a restart.
 */
import { chmod, stat } from "node:fs/promises";
import { createHash, randomBytes } from "node:crypto";
import { NodeFileSystem, join, readJsonFile, writeFileAtomic, type FileSystem } from "../../log/io.js";
import { ValidationError } from "../../errors.js";
import { DEFAULT_ITERATIONS, MIN_ITERATIONS, deriveKeys, type ScramKeys } from "./scram.js";

export const SECURITY_DIR = "security";
export const CREDENTIALS_FILE = "credentials.json";
/** Bearer tokens start with this, so a leaked one is recognisable (and greppable) as sluice's. */
export const TOKEN_PREFIX = "slt_";

interface StoredUser {
  salt: string;
  iterations: number;
  storedKey: string;
  serverKey: string;
  createdAt: number;
}

interface StoredToken {
  /** First 12 hex digits of the hash: names the token in lists and `revoke`. */
  id: string;
  principal: string;
  sha256: string;
  createdAt: number;
  expiresAt: number | null;
}

interface CredentialsFile {
  version: 1;
  users: Record<string, StoredUser>;
  tokens: StoredToken[];
}

export interface UserInfo {
  name: string;
  iterations: number;
  createdAt: number;
}

export interface TokenInfo {
  id: string;
  principal: string;
  createdAt: number;
  expiresAt: number | null;
}

const NAME = /^[A-Za-z0-9._@-]{1,128}$/;
const empty = (): CredentialsFile => ({ version: 1, users: {}, tokens: [] });
export const hashToken = (token: string): string => createHash("sha256").update(token, "utf8").digest("hex");

export class CredentialStore {
  private data: CredentialsFile = empty();
  /** mtime and size of the file last read, to re-read it only when it changed. */
  private seen = "";
  private readonly dir: string;
  private readonly path: string;

  private constructor(dataDir: string, private readonly fs: FileSystem, private readonly now: () => number) {
    this.dir = join(dataDir, SECURITY_DIR);
    this.path = join(this.dir, CREDENTIALS_FILE);
  }

  static async open(dataDir: string, opts: { fs?: FileSystem; now?: () => number } = {}): Promise<CredentialStore> {
    const s = new CredentialStore(dataDir, opts.fs ?? new NodeFileSystem(), opts.now ?? Date.now);
    await s.refresh();
    return s;
  }

  /** Re-reads the file if it changed since the last read (cheap: one stat). */
  async refresh(): Promise<void> {
    const st = await stat(this.path).catch(() => null);
    const key = st ? `${st.mtimeMs}:${st.size}:${st.ino}` : "";
    if (key === this.seen) return;
    this.data = (await readJsonFile<CredentialsFile>(this.fs, this.path)) ?? empty();
    this.seen = key;
  }

  /** True when any user or token exists: then every connection must authenticate (AUTH-3). */
  configured(): boolean {
    return Object.keys(this.data.users).length > 0 || this.data.tokens.length > 0;
  }

  user(name: string): ScramKeys | null {
    const u = Object.hasOwn(this.data.users, name) ? this.data.users[name] : undefined;
    if (!u) return null;
    return { salt: Buffer.from(u.salt, "base64"), iterations: u.iterations, storedKey: Buffer.from(u.storedKey, "base64"), serverKey: Buffer.from(u.serverKey, "base64") };
  }

  /** The principal a bearer token names, or null (unknown, revoked or expired). */
  tokenPrincipal(token: string): string | null {
    const h = hashToken(token);
    const t = this.data.tokens.find((x) => x.sha256 === h);
    if (!t || (t.expiresAt !== null && t.expiresAt <= this.now())) return null;
    return t.principal;
  }

  listUsers(): UserInfo[] {
    return Object.entries(this.data.users).map(([name, u]) => ({ name, iterations: u.iterations, createdAt: u.createdAt }));
  }

  listTokens(): TokenInfo[] {
    return this.data.tokens.map(({ id, principal, createdAt, expiresAt }) => ({ id, principal, createdAt, expiresAt }));
  }

  async addUser(name: string, password: string, iterations = DEFAULT_ITERATIONS): Promise<void> {
    checkName(name, "user");
    if (password.length < 8) throw new ValidationError("a password must have at least 8 characters");
    if (!Number.isSafeInteger(iterations) || iterations < MIN_ITERATIONS) throw new ValidationError(`iterations must be an integer >= ${MIN_ITERATIONS}`);
    const k = deriveKeys(password, iterations);
    await this.change((d) => {
      d.users[name] = { salt: k.salt.toString("base64"), iterations, storedKey: k.storedKey.toString("base64"), serverKey: k.serverKey.toString("base64"), createdAt: this.now() };
    });
  }

  async removeUser(name: string): Promise<boolean> {
    let found = false;
    await this.change((d) => {
      found = Object.hasOwn(d.users, name);
      delete d.users[name];
    });
    return found;
  }

  /** Creates a token for `principal`; the token itself is returned here once and never stored. */
  async createToken(principal: string, opts: { ttlMs?: number } = {}): Promise<{ token: string; info: TokenInfo }> {
    checkName(principal, "principal");
    if (opts.ttlMs !== undefined && (!Number.isSafeInteger(opts.ttlMs) || opts.ttlMs <= 0)) throw new ValidationError("ttlMs must be a positive integer");
    const token = TOKEN_PREFIX + randomBytes(32).toString("base64url");
    const sha256 = hashToken(token);
    const createdAt = this.now();
    const t: StoredToken = { id: sha256.slice(0, 12), principal, sha256, createdAt, expiresAt: opts.ttlMs === undefined ? null : createdAt + opts.ttlMs };
    await this.change((d) => void d.tokens.push(t));
    return { token, info: { id: t.id, principal, createdAt, expiresAt: t.expiresAt } };
  }

  /** Revokes by id (from `listTokens`); false when no token has it. */
  async revokeToken(id: string): Promise<boolean> {
    let found = false;
    await this.change((d) => {
      const before = d.tokens.length;
      d.tokens = d.tokens.filter((t) => t.id !== id);
      found = d.tokens.length !== before;
    });
    return found;
  }

  private async change(fn: (d: CredentialsFile) => void): Promise<void> {
    this.seen = "";
    await this.refresh();
    const next: CredentialsFile = structuredClone(this.data);
    fn(next);
    await this.fs.mkdir(this.dir);
    // Hashes only, but still nobody else's business (docs/security.md).
    await chmod(this.dir, 0o700);
    await writeFileAtomic(this.fs, this.path, JSON.stringify(next, null, 2) + "\n");
    this.data = next;
    this.seen = "";
    await this.refresh();
  }
}

function checkName(name: string, kind: string): void {
  if (!NAME.test(name)) throw new ValidationError(`invalid ${kind} name ${JSON.stringify(name.slice(0, 200))}: use 1-128 letters, digits, ".", "_", "@" or "-"`);
}
