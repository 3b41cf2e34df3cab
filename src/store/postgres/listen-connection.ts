// SPDX-License-Identifier: Apache-2.0
/**
 * A LISTEN session of the PostgreSQL engine: one connection of its own that listens on one
 * channel and hands each notification's payload on, and that comes back after it is lost.
 *
 * Why a connection of its own: LISTEN needs a session that stays open; the pool's connections
 * come and go. Why "comes back" is enough: notifications are not durable (a dropped connection
 * loses those sent meanwhile), so every user of one also polls (notifier.ts, queues/pg-queue.ts):
 * a lost notification only delays a wake-up. A lost connection is re-established after
 * RELISTEN_DELAY_MS.
 */
import pg from "pg";

/** Pause before reconnecting a lost listener connection. */
export const RELISTEN_DELAY_MS = 1000;

export class ListenConnection {
  private client: pg.Client | null = null;
  private relistenTimer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(
    private readonly clientConfig: pg.ClientConfig,
    private readonly channel: string,
    private readonly onPayload: (payload: string) => void,
  ) {}

  /** Connects and listens; a failure is retried after a pause (callers poll meanwhile). */
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
      if (n.channel === this.channel && n.payload) this.onPayload(n.payload);
    });
    this.client = client;
    try {
      await client.connect();
      await client.query(`LISTEN ${this.channel}`);
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
