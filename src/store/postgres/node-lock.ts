// SPDX-License-Identifier: Apache-2.0
/**
 * One broker node per schema when the deployment asks for it (`exclusive: true`): a
 * session-level advisory lock, keyed by the schema, held on a connection of its own for as
 * long as the engine is open.
 *
 * Several nodes on one schema are safe without it (consumer groups are coordinated in the
 * database, PG-1 in docs/ARCHITECTURE.md); this is for operators who want exactly one, with a
 * second node refused at open and the holder named, as a second process on a data directory
 * is (DataDirLockedError).
 *
 * Why fence on loss: the lock lives as long as its connection. If that connection drops (a
 * database restart, a network cut), another node may take the lock meanwhile, so the engine
 * refuses every call (a retriable StorageError) until this node holds the lock again; it
 * tries again every RELOCK_INTERVAL_MS.
 */
import { hostname } from "node:os";
import pg from "pg";
import { DataDirLockedError, StorageError } from "../../errors.js";
import { translateError } from "./database.js";

/** How often a node that lost its lock tries to take it again. */
export const RELOCK_INTERVAL_MS = 1000;

/** Recognised in pg_stat_activity to name the holder: `sluice-node <pid>@<host>`. */
const APP_PREFIX = "sluice-node ";

export class SchemaLock {
  private client: pg.Client | null = null;
  private relockTimer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Set while this node does not hold the lock after having held it: every call is refused. */
  lost: StorageError | null = null;
  /** The server process of the lock's connection (operators and tests can find the session by it). */
  backendPid: number | null = null;

  constructor(
    private readonly clientConfig: pg.ClientConfig,
    private readonly schema: string,
  ) {}

  private get key(): string {
    return `sluice-node:${this.schema}`;
  }

  /** Takes the lock or throws DataDirLockedError naming the node that holds it. */
  async acquire(): Promise<void> {
    const client = new pg.Client({ ...this.clientConfig, application_name: `${APP_PREFIX}${process.pid}@${hostname()}` });
    client.on("error", () => this.onLost(client));
    try {
      await client.connect();
      const r = await client.query<{ ok: boolean; pid: number }>("SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ok, pg_backend_pid() AS pid", [this.key]);
      if (!r.rows[0].ok) throw await this.heldError(client);
      this.backendPid = r.rows[0].pid;
    } catch (e) {
      await client.end().catch(() => {});
      throw translateError(e);
    }
    client.on("end", () => this.onLost(client));
    this.client = client;
    this.lost = null;
  }

  private async heldError(client: pg.Client): Promise<DataDirLockedError> {
    // A bigint advisory key shows in pg_locks as classid (high 32 bits) and objid (low 32 bits), objsubid 1.
    const r = await client.query<{ application_name: string | null; backend_start: Date | null }>(
      `SELECT a.application_name, a.backend_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1, 0) LIMIT 1`,
      [this.key],
    );
    const row = r.rows[0];
    const m = row?.application_name?.startsWith(APP_PREFIX) ? /^(\d+)@(.*)$/.exec(row.application_name.slice(APP_PREFIX.length)) : null;
    return new DataDirLockedError(`PostgreSQL schema "${this.schema}"`, m ? Number(m[1]) : null, m ? m[2] : null, row?.backend_start ? row.backend_start.toISOString() : null);
  }

  private onLost(client: pg.Client): void {
    if (this.client !== client || this.closed) return;
    this.client = null;
    client.end().catch(() => {});
    this.lost = new StorageError(`this node lost its lock on PostgreSQL schema "${this.schema}" (the connection holding it closed); refusing requests until it holds it again`);
    this.scheduleRelock();
  }

  private scheduleRelock(): void {
    if (this.closed || this.relockTimer !== null) return;
    this.relockTimer = setTimeout(() => {
      this.relockTimer = null;
      this.acquire().catch(() => this.scheduleRelock());
    }, RELOCK_INTERVAL_MS);
    this.relockTimer.unref();
  }


  async release(): Promise<void> {
    this.closed = true;
    if (this.relockTimer !== null) clearTimeout(this.relockTimer);
    const c = this.client;
    this.client = null;
    // Ending the session releases a session-level advisory lock.
    if (c !== null) await c.end().catch(() => {});
  }
}
