// SPDX-License-Identifier: Apache-2.0
/**
 * The authorization model (docs/security.md#authorization): operations, resource types, rules,
 * tenants, and the one decision function every entry point uses (ACL-1..ACL-3 in
 * docs/ARCHITECTURE.md).
 *
 * - Default deny: a principal may do only what a rule allows (ACL-1).
 * - A deny rule that matches wins over every allow (ACL-1).
 * - `admin` allows every operation on the resources its rule covers; `admin` on `cluster`
 *   covers every resource (a super user).
 * - Any allowed operation on a resource implies `describe` of it (seeing what one may use),
 *   unless `describe` itself is denied.
 * - A principal of a tenant reaches only names that start with `<tenant>.`, whatever its rules
 *   say, and nothing of type `cluster` (ACL-2). Names are checked against the strict name
 *   allow-list before they get here ([a-zA-Z0-9._-], FS-1), and tenant names are lower case
 *   letters, digits and `-`, so no spelling, case or encoding of a name reaches another
 *   tenant's prefix.
 */
import { ValidationError } from "../../errors.js";
import type { QuotaSpec } from "./quotas.js";

export const OPERATIONS = ["publish", "consume", "commit", "ack", "describe", "create", "alter", "delete", "reset-offsets", "purge", "redrive", "admin"] as const;
export type Operation = (typeof OPERATIONS)[number];

export const RESOURCE_TYPES = ["topic", "queue", "group", "dlq", "cluster"] as const;
export type ResourceType = (typeof RESOURCE_TYPES)[number];

/** The one resource of type `cluster`. */
export const CLUSTER = "cluster";

export type Effect = "allow" | "deny";
export type PatternType = "literal" | "prefix";

export interface AclRule {
  /** Short id naming the rule in lists and `sluice acl remove`. */
  id: string;
  /** A principal name, `group:NAME` for every member of a principal group, or `*` for every authenticated principal. */
  principal: string;
  effect: Effect;
  operation: Operation;
  resourceType: ResourceType;
  pattern: PatternType;
  /** The resource name (literal) or the start of names (prefix; "" covers every name). */
  name: string;
}

/** What a request needs: one operation on one resource. */
export interface Need {
  op: Operation;
  type: ResourceType;
  name: string;
}

export interface Tenant {
  principals: string[];
}

export interface AclPolicy {
  rules: AclRule[];
  /** Principal groups: name -> members. */
  groups: Record<string, string[]>;
  /** Tenants: name -> members; a tenant's resources are the names starting with `<tenant>.`. */
  tenants: Record<string, Tenant>;
  /** Quotas by principal or `tenant:NAME` (src/security/acl/quotas.ts). */
  quotas: Record<string, QuotaSpec>;
}

export const emptyPolicy = (): AclPolicy => ({ rules: [], groups: {}, tenants: {}, quotas: {} });

const TENANT_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
const PRINCIPAL_RE = /^(?:\*|group:[A-Za-z0-9._@-]{1,128}|[A-Za-z0-9._@-]{1,128})$/;
const RESOURCE_NAME_RE = /^[a-zA-Z0-9._-]{0,249}$/;

export function validateTenantName(name: string): string {
  if (!TENANT_RE.test(name)) throw new ValidationError(`tenant name ${JSON.stringify(name)}: 1-63 characters of [a-z0-9-], starting with a letter or digit`);
  return name;
}

/** Checks one rule's fields (the policy file and the CLI both go through this). */
export function validateRule(r: Omit<AclRule, "id"> & { id?: string }): void {
  if (!PRINCIPAL_RE.test(r.principal)) throw new ValidationError(`rule principal ${JSON.stringify(r.principal)}: a name, group:NAME or *`);
  if (r.effect !== "allow" && r.effect !== "deny") throw new ValidationError(`rule effect must be allow or deny, not ${JSON.stringify(r.effect)}`);
  if (!OPERATIONS.includes(r.operation)) throw new ValidationError(`unknown operation ${JSON.stringify(r.operation)} (one of ${OPERATIONS.join(", ")})`);
  if (!RESOURCE_TYPES.includes(r.resourceType)) throw new ValidationError(`unknown resource type ${JSON.stringify(r.resourceType)} (one of ${RESOURCE_TYPES.join(", ")})`);
  if (r.pattern !== "literal" && r.pattern !== "prefix") throw new ValidationError(`rule pattern must be literal or prefix, not ${JSON.stringify(r.pattern)}`);
  if (typeof r.name !== "string" || !RESOURCE_NAME_RE.test(r.name)) throw new ValidationError(`rule resource name ${JSON.stringify(r.name)}: at most 249 characters of [a-zA-Z0-9._-]`);
  if (r.pattern === "literal" && r.name === "" && r.resourceType !== "cluster") throw new ValidationError("a literal rule needs a resource name (use --prefix '' for every name)");
}

const MAX_CACHED = 10_000;

/**
 * Decisions for one policy. Immutable: a policy change makes a new Authorizer, so a decision
 * cache never outlives the rules it came from (ACL-3).
 */
export class Authorizer {
  private readonly tenantByPrincipal = new Map<string, string>();
  private readonly groupsOf = new Map<string, string[]>();
  private readonly cache = new Map<string, boolean>();

  constructor(readonly policy: AclPolicy) {
    for (const [tenant, t] of Object.entries(policy.tenants)) for (const p of t.principals) this.tenantByPrincipal.set(p, tenant);
    for (const [group, members] of Object.entries(policy.groups)) {
      for (const p of members) this.groupsOf.set(p, [...(this.groupsOf.get(p) ?? []), `group:${group}`]);
    }
  }

  /** The tenant a principal belongs to, or null. */
  tenantOf(principal: string): string | null {
    return this.tenantByPrincipal.get(principal) ?? null;
  }

  /**
   * The entities `principal` is counted under, itself and its tenant, with their quotas ({}
   * for none): connections are counted even without a quota, so one set later bounds them
   * from the first login on (QUO-1).
   */
  quotasOf(principal: string): { entity: string; spec: QuotaSpec }[] {
    const q = this.policy.quotas;
    const spec = (key: string): QuotaSpec => (Object.hasOwn(q, key) ? q[key] : {});
    const tenant = this.tenantOf(principal);
    return [{ entity: principal, spec: spec(principal) }, ...(tenant === null ? [] : [{ entity: `tenant:${tenant}`, spec: spec(`tenant:${tenant}`) }])];
  }

  /** Whether `principal` may do `need` (ACL-1, ACL-2). */
  allows(principal: string, need: Need): boolean {
    const key = `${principal}\u0000${need.op}\u0000${need.type}\u0000${need.name}`;
    let v = this.cache.get(key);
    if (v === undefined) {
      v = this.decide(principal, need);
      if (this.cache.size >= MAX_CACHED) this.cache.clear();
      this.cache.set(key, v);
    }
    return v;
  }

  /** Whether the principal may see the resource (describe, or any operation on it). */
  canSee(principal: string, type: ResourceType, name: string): boolean {
    return this.allows(principal, { op: "describe", type, name });
  }

  private decide(principal: string, need: Need): boolean {
    // ACL-2: a tenant's principal never reaches outside its prefix, whatever the rules say.
    const tenant = this.tenantOf(principal);
    if (tenant !== null && (need.type === "cluster" || !need.name.startsWith(`${tenant}.`))) return false;
    const who = [principal, "*", ...(this.groupsOf.get(principal) ?? [])];
    const rules = this.policy.rules.filter((r) => who.includes(r.principal) && covers(r, need.type, need.name));
    if (ruling(rules, need.op)) return true;
    // Describe is implied by any other operation allowed on the same resource (unless denied itself).
    if (need.op !== "describe" || rules.some((r) => r.effect === "deny" && (r.operation === "describe" || r.operation === "admin"))) return false;
    return OPERATIONS.some((op) => op !== "describe" && ruling(rules, op));
  }
}

/** ACL-1: allowed when an allow rule matches and no deny rule does (deny wins); `admin` matches every operation. */
function ruling(rules: readonly AclRule[], op: Operation): boolean {
  const matches = (r: AclRule): boolean => r.operation === op || r.operation === "admin";
  if (rules.some((r) => r.effect === "deny" && matches(r))) return false;
  return rules.some((r) => r.effect === "allow" && matches(r));
}

/** Whether a rule's resource covers (type, name): `cluster` rules cover every resource. */
function covers(r: AclRule, type: ResourceType, name: string): boolean {
  if (r.resourceType === "cluster") return r.operation === "admin" || type === "cluster";
  if (r.resourceType !== type) return false;
  return r.pattern === "literal" ? r.name === name : name.startsWith(r.name);
}
