// SPDX-License-Identifier: Apache-2.0
/**
 * Cross-node wake-ups of PostgreSQL queues: one LISTEN connection per engine on the
 * `sluice_queue` channel, whose payload is the id of a queue that may have grantable jobs and
 * the id of the store that committed it (sent by `pg_notify` inside the committing
 * transaction, rows.ts; a store ignores its own, having woken its queues directly).
 *
 * Why a connection of its own: LISTEN needs a session that stays open; the pool's connections
 * come and go. Notifications are not durable (a dropped connection loses them), so this is
 * only the fast path: an open queue whose workers wait also polls (pg-queue.ts,
 * GRANT_POLL_MS). A lost connection is re-established after a pause.
 */
import pg from "pg";
import { QUEUE_CHANNEL } from "./rows.js";

const RELISTEN_DELAY_MS = 1000;

export class QueueWakeups {
  private client: pg.Client | null = null;
  private relistenTimer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(
    private readonly clientConfig: pg.ClientConfig,
    private readonly onWake: (queueId: string, origin: string) => void,
  ) {}

  /** Opens the listener connection (a failure falls back to polling and is retried). */
  async start(): Promise<void> {
    if (this.closed || this.client !== null) return;
    const client = new pg.Client(this.clientConfig);
    const lost = (): void => {
      if (this.client !== client) return;
      this.client = null;
      client.end().catch(() => {});
      if (!this.closed && this.relistenTimer === null) {
        this.relistenTimer = setTimeout(() => {
          this.relistenTimer = null;
          void this.start();
        }, RELISTEN_DELAY_MS);
        this.relistenTimer.unref();
      }
    };
    client.on("error", lost);
    client.on("end", lost);
    client.on("notification", (n) => {
      if (n.channel !== QUEUE_CHANNEL || !n.payload) return;
      const i = n.payload.indexOf(":");
      if (i > 0) this.onWake(n.payload.slice(0, i), n.payload.slice(i + 1));
    });
    this.client = client;
    try {
      await client.connect();
      await client.query(`LISTEN ${QUEUE_CHANNEL}`);
    } catch {
      lost();
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.relistenTimer !== null) clearTimeout(this.relistenTimer);
    const c = this.client;
    this.client = null;
    await c?.end().catch(() => {});
  }
}
