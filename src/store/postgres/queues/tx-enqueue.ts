// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueues inside the application's own transaction (`queue.enqueue(data, { transaction })`,
 * the TransactionalEnqueues capability): the statements of an ordinary enqueue (enqueue.ts)
 * run on the caller's connection, after its BEGIN, and commit or roll back with its writes.
 *
 * Why this is enough:
 *  - Job ids, admission counters, dedupe and singleton keys, group turns and lifecycle events
 *    are all written under the queue row lock (rows.ts), which the caller's transaction then
 *    holds until it ends: nobody allocates ids after these or counts this room meanwhile, and
 *    a rollback undoes every one of them (no id skipped, no key taken, no event, no count).
 *  - A savepoint brackets the statements: a call that fails (a full queue, a deleted queue)
 *    rolls back to it, so the caller's transaction is left as it was and may go on.
 *  - The wake-up is the `pg_notify` in the caller's transaction, which PostgreSQL delivers at
 *    its commit and never after a rollback. Its origin is APP_ORIGIN, which no store ignores,
 *    so workers on this node wake through the LISTEN connection too (the store does not see
 *    the commit, so it cannot wake them itself), and this node's "now" of readEvents is not
 *    moved (those positions may be rolled back and used again).
 *  - It never waits for room: waiting inside the caller's transaction would keep the queue row
 *    locked, and only settlements, which need that lock, free room.
 *
 * Lock order: the queue row is the first row of the engine's the enqueue locks, as in every
 * engine transaction on the queue, so the engine's own transactions (grants, acks, retries,
 * moves, other enqueues, on any node) only wait for the caller's and hold nothing it needs
 * next; upkeep that does not take the queue row skips rows others hold (sweep.ts). What is the
 * application's to keep (docs/queues.md): lock several queues (or queues and partitions) in
 * one order in all its transactions, and never wait, before committing, for another operation
 * on a queue it enqueued to in that transaction.
 */
import { BrokerClosedError, ValidationError } from "../../../errors.js";
import type { EnqueueOutcome, NewJob } from "../../queue-store.js";
import { translateError, type Queryable } from "../database.js";
import { storeRequest } from "./enqueue.js";
import { APP_ORIGIN, lockQueue, type QueueCtx } from "./rows.js";

const SAVEPOINT = "sluice_enqueue";

/** SQLSTATEs that mean the client cannot take the enqueue, with what to do about it. */
const REFUSED: Record<string, string> = {
  "25P01": "transaction must be a client inside a transaction: call BEGIN on it first (outside one, each statement would commit on its own)",
  "25P02": "the transaction has already failed (an earlier statement in it raised an error): roll it back",
  "42P01": "the transaction's client does not see the broker's tables: it must be connected to the broker's database",
  "3F000": "the transaction's client does not see the broker's schema: it must be connected to the broker's database",
};

function refusal(e: unknown): unknown {
  const code = (e as { code?: unknown })?.code;
  if (typeof code === "string" && REFUSED[code] !== undefined) return new ValidationError(REFUSED[code]);
  return translateError(e);
}

/** Stores `jobs` in the queue of `ctx` inside the caller's open transaction `tx`. */
export async function enqueueInTransaction(tx: Queryable, ctx: QueueCtx, jobs: readonly NewJob[]): Promise<EnqueueOutcome> {
  try {
    await tx.query(`SAVEPOINT ${SAVEPOINT}`);
  } catch (e) {
    throw refusal(e);
  }
  try {
    const q = await lockQueue(tx, ctx.t, ctx.queueId, ctx.name, APP_ORIGIN);
    const r = await storeRequest(tx, ctx, q, jobs, null, false, false);
    if (!r.done) throw new Error("an enqueue that may not wait for room came back waiting");
    await q.flush(tx, ctx.t, ctx.now());
    await tx.query(`RELEASE SAVEPOINT ${SAVEPOINT}`);
    return r.outcome;
  } catch (e) {
    // Leaves the caller's transaction as it was before the call (a dead connection: theirs to see).
    // Two statements, not one string: a client may speak only the extended protocol.
    await tx
      .query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`)
      .then(() => tx.query(`RELEASE SAVEPOINT ${SAVEPOINT}`))
      .catch(() => {});
    if (e instanceof BrokerClosedError && (await queueExists(ctx)))
      throw new ValidationError(
        "the transaction does not see this queue: its client must be connected to the broker's database, and under REPEATABLE READ or SERIALIZABLE the queue must exist before the transaction's first statement (use it once beforehand)",
      );
    throw refusal(e);
  }
}

/** The queue row exists for the engine's own connections (its absence in `tx` means another database). */
async function queueExists(ctx: QueueCtx): Promise<boolean> {
  const r = await ctx.db.query(`SELECT 1 FROM ${ctx.t.queues} WHERE queue_id = $1`, [ctx.queueId]).catch(() => null);
  return r !== null && r.rows.length > 0;
}
