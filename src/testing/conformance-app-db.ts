// SPDX-License-Identifier: Apache-2.0
/**
 * The application's own database for the consumer-contract conformance tests
 * (conformance-contracts.ts): SQLite in a temp dir through better-sqlite3, so the contracts run
 * on every broker target without another service.
 *
 * better-sqlite3 is loaded when a test opens a database, not when this module is imported:
 * `sluice/testing` stays usable without it, and a suite that registers the contract area
 * without it installed fails those tests with an error saying what is missing.
 */
import { join } from "node:path";
import type { SqliteTxDatabase } from "../contracts/stores/sqlite-outbox.js";
import { sqliteDatabase, type SqlDatabase } from "../contracts/stores/sql.js";
import { tempDir } from "./helpers.js";

export interface AppDb {
  /** The better-sqlite3 connection (inbox and outbox stores take it). */
  readonly db: SqliteTxDatabase;
  /** The same connection behind the SQL seam (sequencer, effect gate). */
  readonly sql: SqlDatabase<SqliteTxDatabase>;
  /** Closes the connection and removes the temp dir. */
  close(): void;
}

type Opened = SqliteTxDatabase & { pragma(source: string): unknown; close(): unknown };
type SqliteConstructor = new (file: string) => Opened;

async function loadSqlite(): Promise<SqliteConstructor> {
  try {
    const mod = (await import("better-sqlite3")) as unknown as { default: SqliteConstructor };
    return mod.default;
  } catch (e) {
    throw new Error(`the consumer-contract conformance tests keep the application's state in SQLite: install better-sqlite3 (${(e as Error).message})`);
  }
}

/** A fresh SQLite database in a temp dir, with `schema` (the test's business tables) applied. */
export async function openAppDb(schema = ""): Promise<AppDb> {
  const Database = await loadSqlite();
  const dir = tempDir("sluice-conf-app-");
  const db = new Database(join(dir.dir, "app.db"));
  db.pragma("journal_mode = WAL");
  if (schema) db.exec(schema);
  return {
    db,
    sql: sqliteDatabase(db),
    close() {
      db.close();
      dir.cleanup();
    },
  };
}
