// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice acl add|remove|list|group|tenant --data DIR`: the authorization policy of a data
 * directory (docs/security.md#authorization). A running server applies a change within a
 * second, to live connections too.
 */
import { ValidationError } from "../errors.js";
import { OPERATIONS, RESOURCE_TYPES, type Effect, type Operation, type ResourceType } from "../security/acl/model.js";
import { PolicyStore } from "../security/acl/policy-store.js";
import type { QuotaSpec } from "../security/acl/quotas.js";
import { UsageError, need, parse, subcommand } from "./args.js";
import { printJson, printTable, say } from "./output.js";

export const ACL_USAGE = `Usage: sluice acl add (--allow | --deny) PRINCIPAL --op OP[,OP...] RESOURCE --data DIR
       sluice acl remove RULE-ID --data DIR
       sluice acl list --data DIR [--json]
       sluice acl group NAME [MEMBER...] --data DIR       (no members: removes the group)
       sluice acl tenant NAME [PRINCIPAL...] --data DIR   (no principals: removes the tenant)
       sluice acl quota (PRINCIPAL | tenant:NAME) [--publish-bytes-per-sec N] [--consume-bytes-per-sec N]
                  [--requests-per-sec N] [--connections N] [--storage-bytes N (tenants only)]
                  --data DIR   (no limits: removes the quota)

PRINCIPAL: a user or token principal, group:NAME, or * (every logged-in principal).
OP: ${OPERATIONS.join(", ")} (admin: every operation).
RESOURCE: --topic NAME | --queue NAME | --group NAME | --dlq NAME | --cluster, with --prefix to
match every name that starts with NAME (--prefix '' matches all).

Nothing is allowed that no rule allows; a matching deny wins over any allow. Allowing admin on
--cluster makes a super user. A tenant's principals reach only names starting with "NAME.".`;

const OPTIONS = {
  data: { type: "string" },
  allow: { type: "string" },
  deny: { type: "string" },
  op: { type: "string" },
  topic: { type: "string" },
  queue: { type: "string" },
  group: { type: "string" },
  dlq: { type: "string" },
  cluster: { type: "boolean" },
  prefix: { type: "boolean" },
  json: { type: "boolean" },
  "publish-bytes-per-sec": { type: "string" },
  "consume-bytes-per-sec": { type: "string" },
  "requests-per-sec": { type: "string" },
  connections: { type: "string" },
  "storage-bytes": { type: "string" },
} as const;

type Values = { [K in keyof typeof OPTIONS]?: (typeof OPTIONS)[K]["type"] extends "boolean" ? boolean : string };

function resourceOf(v: Values): { resourceType: ResourceType; name: string } {
  const given = RESOURCE_TYPES.filter((t) => v[t] !== undefined && v[t] !== false);
  if (given.length !== 1) throw new UsageError(`give exactly one resource: --topic, --queue, --group, --dlq or --cluster\n\n${ACL_USAGE}`);
  const resourceType = given[0];
  return { resourceType, name: resourceType === "cluster" ? "" : String(v[resourceType]) };
}

export async function aclCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "acl", ["add", "remove", "list", "group", "tenant", "quota"], ACL_USAGE);
  const { values, positionals } = parse(rest, { usage: ACL_USAGE, options: OPTIONS, maxPositionals: verb === "group" || verb === "tenant" ? 1000 : verb === "remove" || verb === "quota" ? 1 : 0 });
  const dir = values.data ?? process.env.SLUICE_DATA;
  if (!dir) throw new UsageError("give the data directory: --data DIR (or env SLUICE_DATA)");
  const store = await PolicyStore.open(dir);
  if (verb === "list") return listPolicy(store, values.json === true);
  if (verb === "remove") {
    const id = need(positionals, 0, "rule id", ACL_USAGE);
    if (!(await store.removeRule(id))) throw new ValidationError(`no rule ${JSON.stringify(id)} (sluice acl list shows the ids)`);
    return say(`rule ${id} removed`);
  }
  if (verb === "quota") {
    const key = need(positionals, 0, "principal or tenant:NAME", ACL_USAGE);
    const spec: QuotaSpec = {};
    const num = (flag: string): number | undefined => (values[flag as keyof Values] === undefined ? undefined : Number(values[flag as keyof Values]));
    const fields: [keyof QuotaSpec, string][] = [["publishBytesPerSec", "publish-bytes-per-sec"], ["consumeBytesPerSec", "consume-bytes-per-sec"], ["requestsPerSec", "requests-per-sec"], ["connections", "connections"], ["storageBytes", "storage-bytes"]];
    for (const [field, flag] of fields) {
      const v = num(flag);
      if (v !== undefined) spec[field] = v;
    }
    await store.setQuota(key, spec);
    return say(Object.keys(spec).length === 0 ? `quota of ${key} removed` : `quota of ${key}: ${JSON.stringify(spec)}`);
  }
  if (verb === "group" || verb === "tenant") {
    const name = need(positionals, 0, `${verb} name`, ACL_USAGE);
    const members = positionals.slice(1);
    await (verb === "group" ? store.setGroup(name, members) : store.setTenant(name, members));
    return say(members.length === 0 ? `${verb} ${name} removed` : `${verb} ${name}: ${members.join(", ")}`);
  }
  if ((values.allow === undefined) === (values.deny === undefined)) throw new UsageError(`give one of --allow PRINCIPAL or --deny PRINCIPAL\n\n${ACL_USAGE}`);
  const effect: Effect = values.allow !== undefined ? "allow" : "deny";
  const principal = (values.allow ?? values.deny)!;
  if (values.op === undefined) throw new UsageError(`give --op\n\n${ACL_USAGE}`);
  const { resourceType, name } = resourceOf(values);
  for (const op of values.op.split(",").map((o) => o.trim())) {
    const rule = await store.addRule({ principal, effect, operation: op as Operation, resourceType, pattern: values.prefix ? "prefix" : "literal", name });
    say(`rule ${rule.id}: ${effect} ${principal} ${op} on ${resourceType}${resourceType === "cluster" ? "" : ` ${rule.pattern} ${JSON.stringify(name)}`}`);
  }
}

function listPolicy(store: PolicyStore, json: boolean): void {
  const p = store.policy;
  if (json) return printJson(p);
  printTable(
    ["ID", "PRINCIPAL", "EFFECT", "OPERATION", "RESOURCE", "PATTERN", "NAME"],
    p.rules.map((r) => [r.id, r.principal, r.effect, r.operation, r.resourceType, r.resourceType === "cluster" ? "-" : r.pattern, r.resourceType === "cluster" ? "-" : r.name]),
  );
  for (const [g, members] of Object.entries(p.groups)) say(`group ${g}: ${members.join(", ")}`);
  for (const [k, q] of Object.entries(p.quotas)) say(`quota ${k}: ${JSON.stringify(q)}`);
  for (const [t, v] of Object.entries(p.tenants)) say(`tenant ${t}: ${v.principals.join(", ")} (names starting with "${t}.")`);
}
