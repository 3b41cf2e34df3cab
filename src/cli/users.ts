// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice users add|remove|list --data DIR`: the SCRAM-SHA-256 users of a data directory's
 * credential store (docs/security.md#authentication). The password is read from
 * `--password-file`, env SLUICE_PASSWORD or the first line of stdin; it is never a flag.
 */
import { readFileSync } from "node:fs";
import { ValidationError } from "../errors.js";
import { CredentialStore } from "../security/auth/credential-store.js";
import { UsageError, need, parse, subcommand } from "./args.js";
import { printJson, printTable, say } from "./output.js";

export const USERS_USAGE = `Usage: sluice users add NAME --data DIR [--password-file FILE] [--iterations N]
       sluice users remove NAME --data DIR
       sluice users list --data DIR [--json]

Users log in with SCRAM-SHA-256 (connect({ auth: { username, password } }), --user on the CLI,
HTTP Basic). Only a salt and derived keys are stored, in DIR/security/. The password comes from
--password-file, env SLUICE_PASSWORD, or the first line of stdin. A server re-reads the users
on the next login; once any user or token exists, every client must log in.`;

const OPTIONS = { data: { type: "string" }, "password-file": { type: "string" }, iterations: { type: "string" }, json: { type: "boolean" } } as const;

export async function dataDirOf(v: { data?: string }): Promise<CredentialStore> {
  const dir = v.data ?? process.env.SLUICE_DATA;
  if (!dir) throw new UsageError("give the data directory: --data DIR (or env SLUICE_DATA)");
  return CredentialStore.open(dir);
}

function readPassword(file: string | undefined): string {
  const text = file !== undefined ? readFileSync(file, "utf8") : (process.env.SLUICE_PASSWORD ?? readFileSync(0, "utf8"));
  const line = text.split(/\r?\n/)[0];
  if (!line) throw new ValidationError("no password given (--password-file, env SLUICE_PASSWORD or stdin)");
  return line;
}

export async function usersCommand(argv: string[]): Promise<void> {
  const { verb, rest } = subcommand(argv, "users", ["add", "remove", "list"], USERS_USAGE);
  const { values, positionals } = parse(rest, { usage: USERS_USAGE, options: OPTIONS, maxPositionals: verb === "list" ? 0 : 1 });
  const store = await dataDirOf(values);
  if (verb === "list") {
    const users = store.listUsers();
    if (values.json) return printJson(users);
    return printTable(["USER", "ITERATIONS", "CREATED"], users.map((u) => [u.name, u.iterations, new Date(u.createdAt).toISOString()]));
  }
  const name = need(positionals, 0, "user name", USERS_USAGE);
  if (verb === "add") {
    const iterations = values.iterations === undefined ? undefined : Number(values.iterations);
    await store.addUser(name, readPassword(values["password-file"]), iterations);
    return say(`user ${name} saved`);
  }
  if (!(await store.removeUser(name))) throw new ValidationError(`no user ${JSON.stringify(name)}`);
  say(`user ${name} removed`);
}
