// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice tokens create|revoke|list --data DIR`: bearer tokens of a data directory's credential
 * store (docs/security.md#authentication). `create` prints the token once; only its hash is kept.
 */
import { ValidationError } from "../errors.js";
import { intValue, need, parse, subcommand } from "./args.js";
import { printJson, printTable, say } from "./output.js";
import { dataDirOf } from "./users.js";

export const TOKENS_USAGE = `Usage: sluice tokens create PRINCIPAL --data DIR [--ttl-ms N] [--json]
       sluice tokens revoke ID --data DIR
       sluice tokens list --data DIR [--json]

A token logs in as PRINCIPAL (connect({ auth: { token } }), --token-file on the CLI, HTTP
"Authorization: Bearer"). It is printed once by create and cannot be shown again: only its
SHA-256 hash is stored, in DIR/security/. --ttl-ms makes it expire. revoke takes the ID that
create and list show.`;

const OPTIONS = { data: { type: "string" }, "ttl-ms": { type: "string" }, json: { type: "boolean" } } as const;

export async function tokensCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "tokens", ["create", "revoke", "list"], TOKENS_USAGE);
  const { values, positionals } = parse(rest, { usage: TOKENS_USAGE, options: OPTIONS, maxPositionals: verb === "list" ? 0 : 1 });
  const store = await dataDirOf(values);
  if (verb === "list") {
    const tokens = store.listTokens();
    if (values.json) return printJson(tokens);
    const when = (t: number | null): string => (t === null ? "never" : new Date(t).toISOString());
    return printTable(["ID", "PRINCIPAL", "CREATED", "EXPIRES"], tokens.map((t) => [t.id, t.principal, when(t.createdAt), when(t.expiresAt)]));
  }
  const arg = need(positionals, 0, verb === "create" ? "principal" : "token id", TOKENS_USAGE);
  if (verb === "create") {
    const ttlMs = values["ttl-ms"] === undefined ? undefined : intValue(values["ttl-ms"], "--ttl-ms", { min: 1 });
    const { token, info } = await store.createToken(arg, { ttlMs });
    if (values.json) return printJson({ ...info, token });
    return say(`${token}\n(id ${info.id}; shown once: store it now)`);
  }
  if (!(await store.revokeToken(arg))) throw new ValidationError(`no token with id ${JSON.stringify(arg)}`);
  say(`token ${arg} revoked`);
}
