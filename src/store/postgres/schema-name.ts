// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine's schema name rule, without loading `pg` (the CLI checks a URL's
 * schema before deciding to load the engine).
 */
import { ValidationError } from "../../errors.js";

/** The schema the engine uses when none is named. */
export const DEFAULT_SCHEMA = "sluice";

/** Schema names: a plain lower-case identifier (no quoting surprises, fits in NAMEDATALEN). */
const SCHEMA_RE = /^[a-z_][a-z0-9_]{0,62}$/;

export function validateSchemaName(schema: string): string {
  if (typeof schema !== "string" || !SCHEMA_RE.test(schema)) throw new ValidationError(`invalid PostgreSQL schema name ${JSON.stringify(schema)}: use [a-z_][a-z0-9_]*, at most 63 characters`);
  return schema;
}
