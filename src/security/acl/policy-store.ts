// SPDX-License-Identifier: Apache-2.0
/**
 * The authorization policy of a data directory: `<dataDir>/security/acl.json` (rules, principal
 * groups, tenants; docs/security.md#authorization). Written by `sluice acl` with
 * writeFileAtomic (META-1); a running server re-reads it when it changes (one stat every
 * POLICY_POLL_MS), so a change reaches live connections within a second (ACL-3).
 *
 * A file that cannot be read or does not validate denies everything (fails closed) until it is
 * fixed: a typo must never open the broker.
 */
import { chmod, stat } from "node:fs/promises";
import { createHash } from "node:crypto";
import { NodeFileSystem, join, readJsonFile, writeFileAtomic, type FileSystem } from "../../log/io.js";
import { ValidationError } from "../../errors.js";
import { SECURITY_DIR } from "../auth/credential-store.js";
import { validateQuota, type QuotaSpec } from "./quotas.js";
import { Authorizer, emptyPolicy, validateRule, validateTenantName, type AclPolicy, type AclRule } from "./model.js";

export const ACL_FILE = "acl.json";
/** How often a server looks for a changed policy file (ACL-3: changes apply within a second). */
export const POLICY_POLL_MS = 250;

interface AclFile extends AclPolicy {
  version: 1;
}

const MEMBER_RE = /^[A-Za-z0-9._@-]{1,128}$/;

function validatePolicy(raw: unknown): AclPolicy {
  const f = raw as Partial<AclFile> | null;
  if (f === null || typeof f !== "object" || f.version !== 1) throw new ValidationError(`${ACL_FILE}: unknown version (expected {"version": 1, ...})`);
  const rules = Array.isArray(f.rules) ? f.rules : [];
  for (const r of rules) validateRule(r);
  const groups = f.groups ?? {};
  const tenants = f.tenants ?? {};
  for (const [g, members] of Object.entries(groups)) {
    if (!MEMBER_RE.test(g) || !Array.isArray(members) || !members.every((m) => MEMBER_RE.test(m))) throw new ValidationError(`${ACL_FILE}: bad group ${JSON.stringify(g)}`);
  }
  const owner = new Map<string, string>();
  for (const [t, v] of Object.entries(tenants)) {
    validateTenantName(t);
    if (!Array.isArray(v?.principals) || !v.principals.every((m) => MEMBER_RE.test(m))) throw new ValidationError(`${ACL_FILE}: bad tenant ${JSON.stringify(t)}`);
    for (const p of v.principals) {
      // ACL-2: a principal belongs to at most one tenant.
      if (owner.has(p)) throw new ValidationError(`${ACL_FILE}: principal ${p} is in tenants ${owner.get(p)} and ${t}`);
      owner.set(p, t);
    }
  }
  const quotas = f.quotas ?? {};
  for (const [k, q] of Object.entries(quotas)) validateQuota(k, q);
  return { rules, groups, tenants, quotas };
}

export class PolicyStore {
  private current = new Authorizer(emptyPolicy());
  private seen = "";
  private readonly dir: string;
  private readonly path: string;
  /** Why the file on disk was refused (everything is denied meanwhile), or null. */
  error: string | null = null;

  private constructor(dataDir: string, private readonly fs: FileSystem) {
    this.dir = join(dataDir, SECURITY_DIR);
    this.path = join(this.dir, ACL_FILE);
  }

  static async open(dataDir: string, opts: { fs?: FileSystem } = {}): Promise<PolicyStore> {
    const s = new PolicyStore(dataDir, opts.fs ?? new NodeFileSystem());
    await s.refresh();
    return s;
  }

  get authorizer(): Authorizer {
    return this.current;
  }

  get policy(): AclPolicy {
    return this.current.policy;
  }

  /** Re-reads the file if it changed (one stat); true when the policy in force changed. */
  async refresh(): Promise<boolean> {
    const st = await stat(this.path).catch(() => null);
    const key = st ? `${st.mtimeMs}:${st.size}:${st.ino}` : "";
    if (key === this.seen) return false;
    this.seen = key;
    let next: AclPolicy;
    try {
      next = validatePolicy((await readJsonFile<AclFile>(this.fs, this.path)) ?? { version: 1, ...emptyPolicy() });
      this.error = null;
    } catch (err) {
      // Fails closed: nothing is allowed until the file is fixed.
      next = emptyPolicy();
      this.error = err instanceof Error ? err.message : String(err);
    }
    this.current = new Authorizer(next);
    return true;
  }

  async addRule(r: Omit<AclRule, "id">): Promise<AclRule> {
    validateRule(r);
    const id = createHash("sha256").update(JSON.stringify([r.principal, r.effect, r.operation, r.resourceType, r.pattern, r.name])).digest("hex").slice(0, 10);
    const rule: AclRule = { id, ...r };
    await this.change((p) => {
      if (!p.rules.some((x) => x.id === id)) p.rules.push(rule);
    });
    return rule;
  }

  async removeRule(id: string): Promise<boolean> {
    let found = false;
    await this.change((p) => {
      const before = p.rules.length;
      p.rules = p.rules.filter((r) => r.id !== id);
      found = p.rules.length !== before;
    });
    return found;
  }

  /** Sets a principal group's members (an empty list removes the group). */
  async setGroup(name: string, members: string[]): Promise<void> {
    await this.change((p) => {
      if (members.length === 0) delete p.groups[name];
      else p.groups[name] = [...new Set(members)];
    });
  }

  /** Sets a tenant's principals (an empty list removes the tenant). */
  async setTenant(name: string, principals: string[]): Promise<void> {
    validateTenantName(name);
    await this.change((p) => {
      if (principals.length === 0) delete p.tenants[name];
      else p.tenants[name] = { principals: [...new Set(principals)] };
    });
  }

  /** Sets the quota of a principal or `tenant:NAME` (an empty spec removes it). */
  async setQuota(key: string, spec: QuotaSpec): Promise<void> {
    validateQuota(key, spec);
    await this.change((p) => {
      if (Object.keys(spec).length === 0) delete p.quotas[key];
      else p.quotas[key] = spec;
    });
  }

  /** Changes run one at a time (each re-reads, edits and replaces the file). */
  private changing: Promise<void> = Promise.resolve();

  private change(fn: (p: AclPolicy) => void): Promise<void> {
    const run = this.changing.then(() => this.applyChange(fn));
    this.changing = run.catch(() => {});
    return run;
  }

  private async applyChange(fn: (p: AclPolicy) => void): Promise<void> {
    this.seen = "";
    await this.refresh();
    if (this.error !== null) throw new ValidationError(`${this.path} is damaged (${this.error}); fix or remove it first`);
    const next = structuredClone(this.current.policy);
    fn(next);
    const valid = validatePolicy({ version: 1, ...next });
    await this.fs.mkdir(this.dir);
    await chmod(this.dir, 0o700);
    await writeFileAtomic(this.fs, this.path, JSON.stringify({ version: 1, ...valid }, null, 2) + "\n");
    this.seen = "";
    await this.refresh();
  }
}
