// SPDX-License-Identifier: Apache-2.0
/**
 * The PostgreSQL engine's queue store (`StorageEngine.queues`): the registry of queues (the
 * `queues` table), the open `PgQueue` objects of this node, and the routing of cross-node
 * wake-ups to them.
 *
 * Why the registry is a table: several nodes share the queues. Creating a queue is an INSERT
 * guarded by the unique name index (a node that loses the race reads the winner's row);
 * replacing its config an UPDATE under the row lock; deleting it a DELETE whose cascade takes
 * the jobs in the same transaction (Q-8: the next open creates a new incarnation, a new
 * `queue_id`, so old jobs never come back). One feature the rows do not hold yet is refused at
 * open with a ValidationError before anything is stored: encryption at rest (`encrypted`).
 *
 * The parts: schema.ts (tables), rows.ts (row types, the queue transaction), enqueue.ts,
 * singletons.ts, flows.ts, groups.ts, grant.ts, rate-limit.ts, settle.ts (settlements),
 * moves.ts (dead letters, redrive), expire.ts (job expiry), inspect.ts (stats, getJob, browse,
 * events), leases.ts (this node's leases), sweep.ts (upkeep), wakeups.ts (LISTEN),
 * schedules.ts (schedule store), tx-enqueue.ts (enqueues in the application's transaction),
 * pg-queue.ts (one open queue).
 */
import { randomUUID } from "node:crypto";
import type pg from "pg";
import { BrokerClosedError, QueueNotFoundError, ValidationError } from "../../../errors.js";
import type { Logger } from "../../../observability/telemetry.js";
import type { QueueConfig } from "../../../queues/types.js";
import type { OpenQueueRequest, QueueSettings, QueueStore, StoredQueue, TransactionalEnqueues } from "../../queue-store.js";
import type { Db } from "../database.js";
import { PgQueue } from "./pg-queue.js";
import { PgScheduleStore } from "./schedules.js";
import { QueueWakeups } from "./wakeups.js";

export interface PgQueueStoreOptions {
  db: Db;
  /** Where the LISTEN connection connects. */
  clientConfig: pg.ClientConfig;
  now(): number;
  /** Failures of background work (lease expiry, sweeps: retried by the next sweep). */
  logger?: Pick<Logger, "warn">;
}

/** Settings this engine cannot honour yet: refused, never ignored. */
function refuseUnsupported(name: string, s: QueueSettings): void {
  const what = s.encrypted === true ? "encrypted (encryption at rest)" : null;
  if (what !== null) throw new ValidationError(`queue ${JSON.stringify(name)}: ${what} is not yet available on the PostgreSQL engine`);
}

/** JSON with sorted keys: jsonb does not keep the key order a config was written with. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object")
    return `{${Object.keys(v)
      .sort()
      .filter((k) => (v as Record<string, unknown>)[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(",")}}`;
  return JSON.stringify(v);
}

export class PgQueueStore implements QueueStore {
  private readonly open_ = new Map<string, Promise<PgQueue>>();
  private readonly byId = new Map<string, PgQueue>();
  private lock: Promise<unknown> = Promise.resolve();
  private readonly wakeups: QueueWakeups;
  private closed = false;
  /** This store's id in NOTIFY payloads: its own commits already woke its queues. */
  private readonly origin = randomUUID();
  /** Job schedules (schedules.ts). */
  readonly schedules: PgScheduleStore;
  /** Enqueues inside the application's transaction (tx-enqueue.ts), on a queue this store opened. */
  readonly transactional: TransactionalEnqueues = {
    enqueue: (tx, queue, jobs) => {
      // By incarnation: the queue may reach us wrapped (the policy's peers, counting stores).
      const q = this.byId.get(queue.incarnation);
      if (q === undefined) return Promise.reject(new BrokerClosedError(`queue ${queue.name} is closed`));
      return q.enqueueInTransaction(tx, jobs);
    },
  };

  constructor(private readonly o: PgQueueStoreOptions) {
    this.schedules = new PgScheduleStore(o.db);
    this.wakeups = new QueueWakeups(o.clientConfig, (id, origin) => {
      if (origin !== this.origin) this.wake(id);
    });
  }

  async start(): Promise<void> {
    await this.wakeups.start();
  }

  /** Queue `queueId` may have grantable jobs: its workers on this node are told. */
  wake(queueId: string): void {
    this.byId.get(queueId)?.notify();
  }

  /** Serialises this node's opens and deletes. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.lock.then(fn, fn);
    this.lock = run.catch(() => {});
    return run;
  }

  open(name: string, req: OpenQueueRequest): Promise<StoredQueue> {
    if (this.closed) return Promise.reject(new BrokerClosedError());
    const cached = this.open_.get(name);
    if (cached !== undefined && req.config === undefined) return cached;
    const p = this.exclusive(async () => {
      if (this.closed) throw new BrokerClosedError();
      const { queueId, settings, change } = await this.register(name, req);
      if (change !== null) req.changed?.(change);
      const q = cached === undefined ? undefined : await cached.catch(() => undefined);
      if (q !== undefined && q.incarnation === queueId) {
        q.configure(settings);
        return q;
      }
      if (q !== undefined) await this.forget(q, new BrokerClosedError(`queue ${name} was deleted`));
      return this.attach(name, queueId, settings, req);
    });
    this.open_.set(name, p);
    p.catch(() => {
      if (this.open_.get(name) === p) this.open_.delete(name);
    });
    return p;
  }

  private attach(name: string, queueId: string, settings: QueueSettings, req: OpenQueueRequest): PgQueue {
    const q = new PgQueue({
      db: this.o.db,
      queueId,
      name,
      origin: this.origin,
      settings,
      now: this.o.now,
      monoNow: () => performance.now(),
      peer: (n) => req.peer(n),
      wake: (id) => this.wake(id),
      warn: (err, what) => this.o.logger?.warn({ err, queue: name }, what),
    });
    this.byId.set(queueId, q);
    return q;
  }

  private async forget(q: PgQueue, reason: Error): Promise<void> {
    if (this.byId.get(q.incarnation) === q) this.byId.delete(q.incarnation);
    await q.close(reason);
  }

  /** The queue's row, created or its config replaced as `req` asks (one transaction). */
  private async register(name: string, req: OpenQueueRequest): Promise<{ queueId: string; settings: QueueSettings; change: "create" | "alter" | null }> {
    const t = this.o.db.t;
    // An existing queue whose config stays is opened without locking its row: an application's
    // transaction that enqueued to it holds that lock until it commits, and may be opening
    // this queue again meanwhile (a second handle declaring the same config).
    const seen = await this.o.db.query<{ queue_id: string; config: QueueConfig }>(`SELECT queue_id, config FROM ${t.queues} WHERE name = $1`, [name]);
    const row = seen.rows[0];
    if (row !== undefined && (req.config === undefined || canonical(req.config) === canonical(row.config))) {
      const settings = req.settings(row.config);
      refuseUnsupported(name, settings);
      if (req.implicit && req.encrypted === true) refuseUnsupported(name, { ...settings, encrypted: true });
      return { queueId: row.queue_id, settings, change: null };
    }
    for (let tries = 0; ; tries++) {
      try {
        return await this.o.db.tx(async (c) => {
          const r = await c.query<{ queue_id: string; config: QueueConfig }>(`SELECT queue_id, config FROM ${t.queues} WHERE name = $1 FOR UPDATE`, [name]);
          const row = r.rows[0];
          let config = row?.config ?? req.config ?? (req.implicit ? { deadLetter: null } : {});
          if (row !== undefined && req.config !== undefined && canonical(req.config) !== canonical(row.config)) config = req.config;
          // Validated (and refused when unsupported) before anything is stored.
          const settings = req.settings(config);
          refuseUnsupported(name, settings);
          if (req.implicit && req.encrypted === true) refuseUnsupported(name, { ...settings, encrypted: true });
          if (row === undefined) {
            const queueId = randomUUID();
            await c.query(`INSERT INTO ${t.queues} (queue_id, name, config, created_at) VALUES ($1, $2, $3, $4)`, [queueId, name, JSON.stringify(config), this.o.now()]);
            return { queueId, settings, change: "create" as const };
          }
          if (config !== row.config) {
            await c.query(`UPDATE ${t.queues} SET config = $2 WHERE queue_id = $1`, [row.queue_id, JSON.stringify(config)]);
            return { queueId: row.queue_id, settings, change: "alter" as const };
          }
          return { queueId: row.queue_id, settings, change: null };
        });
      } catch (e) {
        // Another node created the name first: read its row.
        if ((e as { code?: string }).code === "23505" && tries < 3) continue;
        throw e;
      }
    }
  }

  async list(): Promise<string[]> {
    if (this.closed) throw new BrokerClosedError();
    const r = await this.o.db.query<{ name: string }>(`SELECT name FROM ${this.o.db.t.queues}`);
    return r.rows.map((x) => x.name).sort();
  }

  async delete(name: string): Promise<void> {
    await this.exclusive(async () => {
      if (this.closed) throw new BrokerClosedError();
      const r = await this.o.db.query(`DELETE FROM ${this.o.db.t.queues} WHERE name = $1`, [name]);
      const cached = this.open_.get(name);
      this.open_.delete(name);
      const q = cached === undefined ? undefined : await cached.catch(() => undefined);
      if (q !== undefined) await this.forget(q, new BrokerClosedError(`queue ${name} was deleted`));
      if (r.rowCount === 0) throw new QueueNotFoundError(name);
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.lock;
    this.closed = true;
    const queues = [...this.open_.values()];
    this.open_.clear();
    for (const p of queues) {
      const q = await p.catch(() => undefined);
      if (q !== undefined) await this.forget(q, new BrokerClosedError(`queue ${q.name} is closed`));
    }
    await this.wakeups.close();
  }
}
