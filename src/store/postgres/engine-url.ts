// SPDX-License-Identifier: Apache-2.0
/**
 * `--engine postgres://user@host:5432/db?schema=NAME`: the PostgreSQL engine from one URL, as
 * `sluice serve` takes it. The `schema` parameter is sluice's (default "sluice") and is taken
 * out before the rest goes to `pg` as its connection string; anything else in the URL
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
  return { connectionString: u.toString(), schema, description: `postgres://${u.host}${u.pathname} schema ${schema}` };
}

/** The engine for a URL (not opened: `openBroker({ engine })` opens it). Loads `pg`. */
export async function postgresEngineFromUrl(v: string, opts: Omit<PostgresEngineOptions, "connectionString" | "schema" | "pool"> = {}): Promise<PostgresEngine> {
  const p = parseEngineUrl(v);
  const { PostgresEngine } = await import("./postgres-engine.js");
  return new PostgresEngine({ ...opts, connectionString: p.connectionString, schema: p.schema });
}
