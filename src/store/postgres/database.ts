// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine's access to its database: the pool, schema-qualified table names,
 * transactions, and the translation of `pg` failures into sluice errors.
 *
 * Why one place: every query of the engine names its tables through `Db.t` (so the schema,
 * validated once here, is the only thing interpolated into SQL; values always go as
 * parameters), and every failure of the database itself (connection refused or lost, server
 * shutting down, out of resources, serialization failure) reaches the broker as the one
 * retriable storage error of the registry (StorageError), never as a raw `pg` error.
 */
import pg from "pg";
import { BrokerError, StorageError } from "../../errors.js";
import type { SqlTransaction } from "../../types.js";
import { validateSchemaName } from "./schema-name.js";

export { validateSchemaName } from "./schema-name.js";

/** Quotes an identifier already validated by validateSchemaName (defence in depth). */
export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** Schema-qualified table names, the only identifiers the engine's SQL interpolates. */
export interface Tables {
  schema: string;
  topics: string;
  partitions: string;
  batches: string;
  producers: string;
  producerIds: string;
  producerState: string;
  groupOffsets: string;
  offsetResets: string;
  /** Consumer groups across nodes (group-membership.ts). */
  groups: string;
  groupMembers: string;
  groupOwners: string;
  schemaVersion: string;
  /** Work queues (src/store/postgres/queues/). */
  queues: string;
  jobs: string;
  queueDedupe: string;
  queueRequests: string;
  queueEvents: string;
  queueGrants: string;
  queueSchedules: string;
  queueGroupTurns: string;
}

export function tables(schema: string): Tables {
  const s = quoteIdent(validateSchemaName(schema));
  return {
    schema: s,
    topics: `${s}.topics`,
    partitions: `${s}.partitions`,
    batches: `${s}.batches`,
    producers: `${s}.producers`,
    producerIds: `${s}.producer_ids`,
    producerState: `${s}.producer_state`,
    groupOffsets: `${s}.group_offsets`,
    offsetResets: `${s}.offset_resets`,
    groups: `${s}.groups`,
    groupMembers: `${s}.group_members`,
    groupOwners: `${s}.group_owners`,
    schemaVersion: `${s}.schema_version`,
    queues: `${s}.queues`,
    jobs: `${s}.jobs`,
    queueDedupe: `${s}.queue_dedupe`,
    queueRequests: `${s}.queue_requests`,
    queueEvents: `${s}.queue_events`,
    queueGrants: `${s}.queue_grants`,
    queueSchedules: `${s}.queue_schedules`,
    queueGroupTurns: `${s}.queue_group_turns`,
  };
}

/** Node socket errors that mean "the database cannot be reached (now)". */
const NET_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN"]);

/**
 * SQLSTATE classes that are conditions of the server, not of the request: 08 connection
 * exception, 53 insufficient resources, 57 operator intervention (shutdown, cancel), 58
 * system error; and 40 transaction rollback (serialization failure, deadlock), which a retry
 * resolves.
 */
const RETRIABLE_SQLSTATE_CLASSES = new Set(["08", "40", "53", "57", "58"]);

/** A `pg` (or socket) failure as a sluice error; sluice errors pass unchanged. */
export function translateError(e: unknown): unknown {
  if (e instanceof BrokerError) return e;
  const err = e as { code?: unknown; message?: unknown };
  const code = typeof err?.code === "string" ? err.code : "";
  const message = typeof err?.message === "string" ? err.message : String(e);
  const unreachable = NET_CODES.has(code) || /Connection terminated|connection timeout|Client has encountered a connection error|Cannot use a pool after calling end/i.test(message);
  if (unreachable || (code.length === 5 && RETRIABLE_SQLSTATE_CLASSES.has(code.slice(0, 2)))) {
    return new StorageError(`PostgreSQL is unavailable: ${message}${code ? ` (${code})` : ""}`, e);
  }
  return e;
}

/** What a statement runs on: a pooled connection in a transaction, or the application's (a `pg` client fits). */
export type Queryable = SqlTransaction;

export class Db {
  readonly t: Tables;
  constructor(
    readonly pool: pg.Pool,
    readonly schemaName: string,
  ) {
    this.t = tables(schemaName);
  }

  /** One statement on any pooled connection (autocommit). */
  async query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>> {
    try {
      return await this.pool.query<R>(text, values);
    } catch (e) {
      throw translateError(e);
    }
  }

  /**
   * Runs `fn` in one transaction (READ COMMITTED; the engine locks the rows it depends on
   * explicitly). Committed when `fn` resolves, rolled back when it throws. With
   * synchronous_commit on (PostgreSQL's default), COMMIT returns once the WAL record is
   * flushed: a resolved transaction is durable.
   */
  async tx<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (e) {
      throw translateError(e);
    }
    let broken: unknown = undefined;
    try {
      await client.query("BEGIN");
      const r = await fn(client);
      await client.query("COMMIT");
      return r;
    } catch (e) {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackError) {
        broken = rollbackError; // the connection is unusable: drop it from the pool
      }
      throw translateError(e);
    } finally {
      client.release(broken === undefined ? undefined : (broken as Error));
    }
  }
}

/** A bigint column (pg returns int8 as a string) as a number: offsets and times are safe integers. */
export function num(v: unknown): number {
  return typeof v === "number" ? v : Number(v);
}
