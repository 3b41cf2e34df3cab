// SPDX-License-Identifier: Apache-2.0
// The reference model of the ACL matrix tests (docs/security.md#authorization), written
// independently of src/security/acl: which needs a principal's rules allow, and the matrix of
// principals (one per operation x resource type x literal|prefix x allow|deny rule). Used by
// test/acl-matrix.test.ts (the server's ports) and test/embedded-principal.test.ts (embedded
// principal views).
import { RESOURCE_TYPES, OPERATIONS, type Operation, type ResourceType } from "../src/security/acl/model.js";

export type Need = [Operation, ResourceType, string];
export interface Rule {
  effect: "allow" | "deny";
  op: Operation;
  type: ResourceType;
  pattern: "literal" | "prefix";
  name: string;
}

function covers(r: Rule, type: ResourceType, name: string): boolean {
  if (r.type === "cluster") return r.op === "admin" || type === "cluster";
  return r.type === type && (r.pattern === "literal" ? r.name === name : name.startsWith(r.name));
}
function decided(rules: Rule[], op: Operation, type: ResourceType, name: string): boolean {
  const hit = rules.filter((r) => covers(r, type, name));
  const opMatches = (r: Rule, o: Operation): boolean => r.op === o || r.op === "admin";
  const allowed = (o: Operation): boolean => !hit.some((r) => r.effect === "deny" && opMatches(r, o)) && hit.some((r) => r.effect === "allow" && opMatches(r, o));
  if (allowed(op)) return true;
  if (op !== "describe" || hit.some((r) => r.effect === "deny" && opMatches(r, "describe"))) return false;
  return OPERATIONS.some((o) => o !== "describe" && allowed(o));
}
export const model = (rules: Rule[], needs: Need[]): boolean => needs.every(([op, type, name]) => decided(rules, op, type, name));

/** The resource names every probe runs on: one a literal rule names, one a prefix rule covers, one neither does. */
export const NAMES = ["mx.lit", "mx.pre.a", "mx.zzz"];
const RULE_NAME = { literal: "mx.lit", prefix: "mx.pre" } as const;

/** One principal per (operation x resource type x literal|prefix x allow|deny) of `ops` x `types`, with its rules. */
export function matrixPrincipals(ops: readonly Operation[] = OPERATIONS, types: readonly ResourceType[] = RESOURCE_TYPES): Map<string, Rule[]> {
  const out = new Map<string, Rule[]>();
  for (const op of ops)
    for (const type of types)
      for (const pattern of type === "cluster" ? (["literal"] as const) : (["literal", "prefix"] as const))
        for (const effect of ["allow", "deny"] as const) {
          const rule: Rule = { effect, op, type, pattern, name: type === "cluster" ? "" : RULE_NAME[pattern] };
          // A deny is observable only against an allow: everything else is allowed by prefix "mx".
          const rules: Rule[] = effect === "deny" ? [rule, ...RESOURCE_TYPES.filter((x) => x !== "cluster").map((x): Rule => ({ effect: "allow", op: "admin", type: x, pattern: "prefix", name: "mx" }))] : [rule];
          rules.push(...(effect === "deny" ? [{ effect: "allow" as const, op: "describe" as const, type: "cluster" as const, pattern: "literal" as const, name: "" }] : []));
          out.set(`m-${op}-${type}-${pattern}-${effect}`, rules);
        }
  return out;
}
