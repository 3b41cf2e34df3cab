// SPDX-License-Identifier: Apache-2.0
/**
 * A thin SQL seam for contracts that keep state in the application's database (the version
 * sequencer): statements are written once with `?` placeholders and run on SQLite
 * (better-sqlite3) or PostgreSQL (`pg`, where `?` becomes `$n`). Handlers get the native
 * transaction object (`Database` or the pg client) for their own writes.
 */
import type { SqliteDatabase } from "./sqlite-inbox.js";
import type { PgPool, PgPoolClient } from "./pg-inbox.js";

export interface SqlRunner {
  all(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]>;
  run(sql: string, params?: unknown[]): Promise<number>;
}

export interface SqlDatabase<Tx> {
  readonly dialect: "sqlite" | "pg";
  /** Outside any transaction. */
  readonly runner: SqlRunner;
  /** One transaction: `fn` gets a runner on it and the native transaction object. */
  transaction<R>(fn: (sql: SqlRunner, tx: Tx) => Promise<R>): Promise<R>;
  /** Runs DDL (several statements). */
  exec(ddl: string): Promise<void>;
}

/** SQLite through better-sqlite3. Transactions run one after another on the connection. */
export function sqliteDatabase<D extends SqliteDatabase>(db: D): SqlDatabase<D> {
  const runner: SqlRunner = {
    all: async (sql, params = []) => db.prepare(sql).all(...params) as Record<string, unknown>[],
    run: async (sql, params = []) => Number(db.prepare(sql).run(...params).changes),
  };
  let tail: Promise<unknown> = Promise.resolve();
  return {
    dialect: "sqlite",
    runner,
    exec: async (ddl) => void db.exec(ddl),
    transaction<R>(fn: (sql: SqlRunner, tx: D) => Promise<R>): Promise<R> {
      const run = async (): Promise<R> => {
        db.exec("BEGIN IMMEDIATE");
        try {
          const r = await fn(runner, db);
          db.exec("COMMIT");
          return r;
        } catch (e) {
          db.exec("ROLLBACK");
          throw e;
        }
      };
      const p = tail.then(run, run);
      tail = p.catch(() => {});
      return p;
    },
  };
}

const dollar = (sql: string): string => {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
};

function pgRunner(q: { query(text: string, params?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }> }): SqlRunner {
  return {
    all: async (sql, params = []) => (await q.query(dollar(sql), params)).rows as Record<string, unknown>[],
    run: async (sql, params = []) => (await q.query(dollar(sql), params)).rowCount ?? 0,
  };
}

/** PostgreSQL through a `pg` pool: each transaction on its own client. */
export function pgDatabase(pool: PgPool): SqlDatabase<PgPoolClient> {
  return {
    dialect: "pg",
    runner: pgRunner(pool),
    exec: async (ddl) => {
      const c = await pool.connect();
      try {
        await c.query("BEGIN");
        await c.query("SELECT pg_advisory_xact_lock(hashtext('sluice_contracts_schema'))");
        await c.query(ddl);
        await c.query("COMMIT");
      } catch (e) {
        await c.query("ROLLBACK").catch(() => {});
        throw e;
      } finally {
        c.release();
      }
    },
    async transaction<R>(fn: (sql: SqlRunner, tx: PgPoolClient) => Promise<R>): Promise<R> {
      const c = await pool.connect();
      let broken: Error | undefined;
      try {
        await c.query("BEGIN");
        const r = await fn(pgRunner(c), c);
        await c.query("COMMIT");
        return r;
      } catch (e) {
        await c.query("ROLLBACK").catch((re: Error) => (broken = re));
        throw e;
      } finally {
        c.release(broken);
      }
    },
  };
}
