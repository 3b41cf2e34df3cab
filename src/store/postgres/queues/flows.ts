// SPDX-License-Identifier: Apache-2.0
/**
 * Flows on PostgreSQL (FLOW-1, FLOW-2): parent jobs that wait for their children
 * (`queue.enqueueFlow`), as columns of the job rows.
 *
 * Why columns: a flow's jobs are inserted by one enqueue transaction (stored whole or not at
 * all, FLOW-1). A parent row is in state `children` (never granted) with `pending_children`
 * and a `children` document mapping each child id to its outcome (`pending` until it
 * finishes); each child row names its `parent_id`. A child's terminal transition (ack,
 * dead-letter, removal, expiry) updates its parent in the same transaction, so the outcome
 * (the ack's result as JSON text, the failure) is durable with the child's end, and the parent
 * becomes `waiting` exactly once, when its last child finished. A child dead-lettered under
 * `onChildFailure: "fail"` makes the caller dead-letter the parent too (moves.ts), in the same
 * transaction, which its own parent then sees as a failed child.
 */
import type pg from "pg";
import type { NewJob, StoredChildOutcome } from "../../queue-store.js";
import type { LockedQueue, QueueCtx } from "./rows.js";

/** Flow columns of jobs inserted with ids `first ..` (enqueue.ts). */
export interface FlowColumns {
  parent: (number | null)[];
  pending: (number | null)[];
  policy: (string | null)[];
  children: (string | null)[];
}

export function flowColumns(jobs: readonly NewJob[], first: number): FlowColumns | null {
  if (!jobs.some((j) => j.flow)) return null;
  const cols: FlowColumns = { parent: [], pending: [], policy: [], children: [] };
  const kids = new Map<number, Record<string, StoredChildOutcome>>();
  jobs.forEach((j, i) => {
    const f = j.flow;
    const parent = f && f.parentDelta > 0 ? first + i - f.parentDelta : null;
    if (parent !== null) kids.get(parent)![String(first + i)] = { state: "pending" };
    if (f && f.children > 0) kids.set(first + i, {});
    cols.parent.push(parent);
    cols.pending.push(f && f.children > 0 ? f.children : null);
    cols.policy.push(f && f.children > 0 ? f.onChildFailure : null);
  });
  jobs.forEach((_, i) => {
    const k = kids.get(first + i);
    cols.children.push(k === undefined ? null : JSON.stringify(k));
  });
  return cols;
}

/** A parent a failed child fails (the caller dead-letters it). */
export interface FailedParent {
  id: string;
  child: string;
  error: string;
}

/**
 * Child `childId` of `parentId` finished with `outcome` (in the caller's transaction). Returns
 * the parent to dead-letter when the child failed under "fail", else null; a parent whose
 * last child finished becomes waiting (visible now).
 */
export async function childFinished(c: pg.ClientBase, ctx: QueueCtx, q: LockedQueue, parentId: string, childId: string, outcome: StoredChildOutcome): Promise<FailedParent | null> {
  const r = await c.query<{ pending_children: number; child_policy: string }>(
    `UPDATE ${ctx.t.jobs} SET children = jsonb_set(children, ARRAY[$3::text], $4::jsonb), pending_children = pending_children - 1
     WHERE queue_id = $1 AND id = $2 AND state = 'children' AND children -> $3::text ->> 'state' = 'pending'
     RETURNING pending_children, child_policy`,
    [ctx.queueId, parentId, childId, JSON.stringify(outcome)],
  );
  const p = r.rows[0];
  if (p === undefined) return null; // the parent already finished (or is failing): nobody to tell
  if (outcome.state === "failed" && p.child_policy === "fail") return { id: parentId, child: childId, error: outcome.error ?? "failed" };
  if (p.pending_children <= 0) {
    await c.query(`UPDATE ${ctx.t.jobs} SET state = 'waiting', visible_at = $3 WHERE queue_id = $1 AND id = $2`, [ctx.queueId, parentId, ctx.now()]);
    q.notify();
  }
  return null;
}
