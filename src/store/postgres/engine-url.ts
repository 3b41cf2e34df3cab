// SPDX-License-Identifier: Apache-2.0
/**
 * `--engine postgres://user@host:5432/db?schema=NAME`: the PostgreSQL engine from one URL, as
 * `sluice serve` takes it. The parameters `schema` (default "sluice"), `exclusive` (true:
 * refuse a second node on the schema), `groupSessionTimeoutMs` and `groupHeartbeatMs` are
 * sluice's and are taken out before the rest goes to `pg` as its connection string; anything else in the URL
 * (sslmode, application_name, ...) is `pg`'s. The password, if any, never appears in what
 * `description` (it is logged). Nothing here loads `pg`: a disk server never does.
 */
import { ValidationError } from "../../errors.js";
import type { PostgresEngine, PostgresEngineOptions } from "./postgres-engine.js";
import { DEFAULT_SCHEMA, validateSchemaName } from "./schema-name.js";

export const POSTGRES_URL_SCHEMES: readonly string[] = ["postgres:", "postgresql:"];

export interface ParsedEngineUrl {
  connectionString: string;
  schema: string;
  /** host:port/database and schema, without user or password (for logs). */
  description: string;
  /** The engine options given as URL parameters. */
  options: Pick<PostgresEngineOptions, "exclusive" | "groupSessionTimeoutMs" | "groupHeartbeatMs">;
}

function msParam(u: URL, name: string): number | undefined {
  const v = u.searchParams.get(name);
  u.searchParams.delete(name);
  if (v === null) return undefined;
  if (!/^[0-9]+$/.test(v)) throw new ValidationError(`engine URL parameter ${name} must be a whole number of milliseconds, got ${JSON.stringify(v)}`);
  return Number(v);
}

export function parseEngineUrl(v: string): ParsedEngineUrl {
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw new ValidationError(`invalid PostgreSQL URL: expected postgres://[user[:password]@]host[:port]/database[?schema=NAME]`);
  }
  if (!POSTGRES_URL_SCHEMES.includes(u.protocol)) throw new ValidationError(`unsupported engine URL scheme ${JSON.stringify(u.protocol)}: expected postgres:// or postgresql://`);
  const schema = validateSchemaName(u.searchParams.get("schema") ?? DEFAULT_SCHEMA);
  u.searchParams.delete("schema");
  const exclusive = u.searchParams.get("exclusive");
  u.searchParams.delete("exclusive");
  if (exclusive !== null && exclusive !== "true" && exclusive !== "false") throw new ValidationError(`engine URL parameter exclusive must be true or false, got ${JSON.stringify(exclusive)}`);
  const options: ParsedEngineUrl["options"] = { groupSessionTimeoutMs: msParam(u, "groupSessionTimeoutMs"), groupHeartbeatMs: msParam(u, "groupHeartbeatMs") };
  if (exclusive !== null) options.exclusive = exclusive === "true";
  return { connectionString: u.toString(), schema, description: `postgres://${u.host}${u.pathname} schema ${schema}`, options };
}

/** The engine for a URL (not opened: `openBroker({ engine })` opens it). Loads `pg`. */
export async function postgresEngineFromUrl(v: string, opts: Omit<PostgresEngineOptions, "connectionString" | "schema" | "pool"> = {}): Promise<PostgresEngine> {
  const p = parseEngineUrl(v);
  const { PostgresEngine } = await import("./postgres-engine.js");
  return new PostgresEngine({ ...opts, ...p.options, connectionString: p.connectionString, schema: p.schema });
}
