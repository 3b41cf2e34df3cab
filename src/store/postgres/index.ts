// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice/postgres`: the PostgreSQL storage engine, for `openBroker({ engine })`. A subpath of
 * its own so that applications on the disk engine never load `pg`.
 *
 * @example
 * import { openBroker } from "sluice";
 * import { postgresEngine } from "sluice/postgres";
 * const broker = await openBroker({ engine: postgresEngine({ connectionString: "postgres://app@db/app", schema: "sluice" }) });
 */
export { postgresEngine, PostgresEngine, DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, type PostgresEngineOptions } from "./postgres-engine.js";
export { parseEngineUrl, postgresEngineFromUrl, type ParsedEngineUrl } from "./engine-url.js";
