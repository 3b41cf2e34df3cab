// SPDX-License-Identifier: Apache-2.0
/**
 * Cross-node wake-ups of PostgreSQL queues: one LISTEN connection per engine on the
 * `sluice_queue` channel, whose payload is the id of a queue that may have grantable jobs and
 * the id of the store that committed it (sent by `pg_notify` inside the committing
 * transaction, rows.ts; a store ignores its own, having woken its queues directly, but not
 * those of enqueues in an application's transaction, whose commit it does not see: APP_ORIGIN).
 *
 * The connection is a ListenConnection (listen-connection.ts): notifications are only the fast
 * path, and an open queue whose workers wait also polls (pg-queue.ts, GRANT_POLL_MS).
 */
import type pg from "pg";
import { ListenConnection } from "../listen-connection.js";
import { QUEUE_CHANNEL } from "./rows.js";

export class QueueWakeups {
  private readonly listener: ListenConnection;

  constructor(clientConfig: pg.ClientConfig, onWake: (queueId: string, origin: string) => void) {
    this.listener = new ListenConnection(clientConfig, QUEUE_CHANNEL, (payload) => {
      const i = payload.indexOf(":");
      if (i > 0) onWake(payload.slice(0, i), payload.slice(i + 1));
    });
  }

  /** Opens the listener connection (a failure falls back to polling and is retried). */
  start(): Promise<void> {
    return this.listener.start();
  }

  close(): Promise<void> {
    return this.listener.close();
  }
}
