// SPDX-License-Identifier: Apache-2.0
/**
 * Background upkeep of one open PostgreSQL queue: leases that expired elsewhere, jobs whose
 * `expiresAt` passed (expire.ts), and the deletion of what retention no longer keeps.
 *
 * Why here: a node expires the leases it granted itself on its monotonic clock (pg-queue.ts),
 * but a lease granted by a node that died, or by this node before a restart, has nobody's
 * timer; its stored wall-clock deadline is the rule then (LEASE-1), so every open queue looks
 * for such rows periodically and requeues or dead-letters them (LEASE-3). Finished jobs past
 * `resultRetentionMs`, dedupe entries past their window and old lifecycle events are deleted
 * less often; reads already ignore what retention dropped (inspect.ts), so this only frees space.
 *
 * Why the deletes skip locked rows: they run without the queue row lock, and a row another
 * transaction holds (an expired dedupe entry an enqueue is taking again, possibly in an
 * application's transaction that stays open until the application commits) would otherwise
 * make them wait, holding the rows they already took, which that transaction may want next:
 * a lock cycle. Skipped rows are deleted by a later sweep.
 */
import type { AttemptRecord } from "../../../queues/types.js";
import type { QueueCtx } from "./rows.js";
import { expiredElsewhere, type LeaseRef } from "./settle.js";

/** How often an open queue looks for leases expired elsewhere. */
export const SWEEP_MS = 1000;
/** Retention deletes run every this many sweeps. */
const CLEANUP_EVERY = 10;
/** Leases expired elsewhere handled per sweep. */
const EXPIRE_BATCH = 100;
/** Lifecycle events kept per queue (older ones are deleted; a reader behind them sees a gap). */
export const EVENTS_KEPT = 100_000;

export interface SweepHost {
  /** Tokens of this node's live leases (its own timers handle them). */
  localTokens(): string[];
  /** Requeues or dead-letters the row of an expired lease. */
  expire(ref: LeaseRef, rec: AttemptRecord): void;
  /** Moves out jobs whose `expiresAt` passed unstarted (expire.ts). */
  expireDue(): Promise<unknown>;
  warn(err: unknown, what: string): void;
}

export class Sweeper {
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  private rounds = 0;

  constructor(
    private readonly ctx: QueueCtx,
    private readonly host: SweepHost,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.run(), SWEEP_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  private async run(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      const now = this.ctx.now();
      for (const ref of await expiredElsewhere(this.ctx, this.host.localTokens(), EXPIRE_BATCH)) {
        this.host.expire(ref, { at: now, attempt: ref.attempt, consumer: "(expired lease)", errorClass: "LeaseExpiredError", error: "lease expired before the job was settled" });
      }
      await this.host.expireDue();
      if (++this.rounds % CLEANUP_EVERY === 0) await this.cleanup(now);
    } catch (e) {
      this.host.warn(e, "queue sweep failed");
    } finally {
      this.running = false;
    }
  }

  private async cleanup(now: number): Promise<void> {
    const { db, t, queueId } = this.ctx;
    await db.query(
      `DELETE FROM ${t.jobs} WHERE queue_id = $1 AND id IN (SELECT id FROM ${t.jobs} WHERE queue_id = $1 AND state IN ('done', 'dead') AND finished_at <= $2 FOR UPDATE SKIP LOCKED)`,
      [queueId, now - this.ctx.settings().resultRetentionMs],
    );
    await db.query(`DELETE FROM ${t.queueDedupe} WHERE queue_id = $1 AND dedupe_id IN (SELECT dedupe_id FROM ${t.queueDedupe} WHERE queue_id = $1 AND expires_at <= $2 FOR UPDATE SKIP LOCKED)`, [queueId, now]);
    await db.query(`DELETE FROM ${t.queueEvents} WHERE queue_id = $1 AND seq <= (SELECT next_event FROM ${t.queues} WHERE queue_id = $1) - $2`, [queueId, EVENTS_KEPT]);
  }
}
