// SPDX-License-Identifier: Apache-2.0
/**
 * Credentials for `--url` targets (docs/security.md#authentication): `--user NAME` with
 * `--password-file FILE`, or `--token-file FILE`; else env SLUICE_USER with SLUICE_PASSWORD, or
 * SLUICE_TOKEN. Secrets come from files or the environment, never from flags, so they do not
 * show in `ps` or the shell history. Flags beat environment variables.
 */
import { readFileSync } from "node:fs";
import type { ClientAuth } from "../client/auth.js";
import { UsageError } from "./args.js";

export interface CredentialValues {
  user?: string;
  "password-file"?: string;
  "token-file"?: string;
}

/** The first line of a secret file (a trailing newline from `echo` is not part of it). */
function secretFile(path: string, what: string): string {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new UsageError(`cannot read the ${what} file ${path}: ${(e as Error).message}`);
  }
  const line = text.split(/\r?\n/)[0];
  if (!line) throw new UsageError(`the ${what} file ${path} is empty`);
  return line;
}

export function resolveCredentials(v: CredentialValues, env: NodeJS.ProcessEnv = process.env): ClientAuth | undefined {
  if (v["token-file"] !== undefined && (v.user !== undefined || v["password-file"] !== undefined)) throw new UsageError("give either --token-file or --user with --password-file, not both");
  if (v["token-file"] !== undefined) return { token: secretFile(v["token-file"], "token") };
  if (v["password-file"] !== undefined && v.user === undefined && !env.SLUICE_USER) throw new UsageError("--password-file goes with --user NAME (or env SLUICE_USER)");
  const user = v.user ?? (env.SLUICE_USER || undefined);
  if (user !== undefined) {
    const password = v["password-file"] !== undefined ? secretFile(v["password-file"], "password") : env.SLUICE_PASSWORD;
    if (!password) throw new UsageError(`--user ${user} needs --password-file FILE (or env SLUICE_PASSWORD)`);
    return { username: user, password };
  }
  if (env.SLUICE_TOKEN) return { token: env.SLUICE_TOKEN };
  return undefined;
}
