// SPDX-License-Identifier: Apache-2.0
/**
 * What the audit log last recorded of users, tokens and the authorization policy (AUD-5):
 * `sluice users`, `sluice tokens` and `sluice acl` edit their files directly, with or without a
 * server running. A running server records what changes as it sees it; this baseline lets a
 * server that starts record what changed while none ran, and nothing twice.
 *
 * The file (`<data>/security/audited.json`, owner-only like the credentials) holds no secret:
 * user names with a fingerprint of their stored keys (a changed password changes it), token
 * ids with a fingerprint of their expiry, and a hash of the policy. It is written after the
 * audit record it stands for is durable, so a crash between the two repeats a record at the
 * next start rather than losing one.
 */
import { createHash } from "node:crypto";
import { chmod } from "node:fs/promises";
import { NodeFileSystem, join, readJsonFile, writeFileAtomic, type FileSystem } from "../../log/io.js";
import { SECURITY_DIR, type CredentialStore } from "../auth/credential-store.js";
import type { AclPolicy } from "../acl/model.js";

export const AUDITED_FILE = "audited.json";

export interface AuditedState {
  /** `user:NAME` and `token:ID(PRINCIPAL)` -> fingerprint. */
  credentials: Record<string, string>;
  /** Hash of the policy last recorded; null: an empty policy (or none yet). */
  policySha: string | null;
}

/** What can be said of the credential store without a secret (AUD-5). */
export function credentialFingerprints(store: CredentialStore): Record<string, string> {
  const out: Record<string, string> = {};
  for (const u of store.listUsers()) {
    const k = store.user(u.name)!;
    out[`user:${u.name}`] = createHash("sha256").update(k.salt).update(k.storedKey).update(String(k.iterations)).digest("hex").slice(0, 16);
  }
  for (const t of store.listTokens()) out[`token:${t.id}(${t.principal})`] = `${t.createdAt}:${t.expiresAt ?? "never"}`;
  return out;
}

/** The policy's hash, null when it says nothing (no rules, groups, tenants or quotas). */
export function policySha(p: AclPolicy): string | null {
  if (p.rules.length === 0 && Object.keys(p.groups).length === 0 && Object.keys(p.tenants).length === 0 && Object.keys(p.quotas).length === 0) return null;
  return createHash("sha256").update(JSON.stringify(p)).digest("hex").slice(0, 16);
}

/** Differences between two fingerprint maps, as the audit record's details name them. */
export function credentialDiff(before: Record<string, string>, after: Record<string, string>): { added: string[]; removed: string[]; changed: string[] } {
  const added = Object.keys(after).filter((k) => !Object.hasOwn(before, k));
  const removed = Object.keys(before).filter((k) => !Object.hasOwn(after, k));
  const changed = Object.keys(after).filter((k) => Object.hasOwn(before, k) && before[k] !== after[k]);
  return { added, removed, changed };
}

export class ChangeBaseline {
  private writes: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly fs: FileSystem,
    /** Where it is kept; null: in memory only (a server without a data dir). */
    private readonly dir: string | null,
    private current: AuditedState,
  ) {}

  static async open(dataDir: string, fs: FileSystem = new NodeFileSystem()): Promise<ChangeBaseline> {
    const dir = join(dataDir, SECURITY_DIR);
    const raw = await readJsonFile<Partial<AuditedState>>(fs, join(dir, AUDITED_FILE)).catch(() => null); // damaged: everything is recorded again
    const credentials = raw?.credentials !== null && typeof raw?.credentials === "object" ? raw.credentials : {};
    const policy = typeof raw?.policySha === "string" ? raw.policySha : null;
    return new ChangeBaseline(fs, dir, { credentials, policySha: policy });
  }

  /** A baseline that starts at `state` and is never written (no data dir: nothing to compare with at the next start). */
  static inMemory(state: AuditedState): ChangeBaseline {
    return new ChangeBaseline(new NodeFileSystem(), null, state);
  }

  get state(): Readonly<AuditedState> {
    return this.current;
  }

  /** Records that the audit log now holds `next` (call once its record is durable). Writes are serialized. */
  save(next: Partial<AuditedState>): Promise<void> {
    this.current = { ...this.current, ...next };
    const dir = this.dir;
    if (dir === null) return Promise.resolve();
    const snapshot = JSON.stringify({ version: 1, ...this.current });
    const w = this.writes.then(async () => {
      await this.fs.mkdir(dir);
      await chmod(dir, 0o700);
      await writeFileAtomic(this.fs, join(dir, AUDITED_FILE), snapshot);
    });
    this.writes = w.catch(() => {});
    return w;
  }
}
