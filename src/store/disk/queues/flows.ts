// SPDX-License-Identifier: Apache-2.0
/**
 * Flows: parent jobs that wait for their children (`queue.enqueueFlow`). Pure bookkeeping,
 * driven by JobState (no I/O, no timers).
 *
 * FLOW-1: a flow's jobs are stored by one append (all or none), each parent before its
 * children, so while a parent is live the floor is at or below it and every child has a row.
 * Each child's record names its parent (H_FLOW, records.ts), relative to its own offset.
 * FLOW-2: a parent is WAITING (never granted) while any child is unfinished; it becomes
 * visible exactly once, when its last child finishes, and the outcome of every child (the
 * ack's result, a failure, a removal) is kept with it until it finishes itself. Outcomes are
 * durable with the child's terminal event (the ACK carries the result, Q-9; DEAD and the
 * dead-letter intent carry the failure); recovery rebuilds pending counts from the rows.
 * A child dead-lettered under `onChildFailure: "fail"` dead-letters its parent (the queue
 * starts that move, `failing`), which its own parent then sees as a failed child.
 *
 * Memory: one entry per live parent (its children's offsets and finished outcomes) and one
 * per live child; nothing for queues that never stored a flow (`JobState.flows` stays null).
 */
import type { ChildFailurePolicy, FlowLink, StoredChildOutcome } from "../../queue-store.js";

/** A finished child's outcome (never `pending`). */
export type ChildOutcomeRecord = StoredChildOutcome & { state: "completed" | "failed" | "removed" };

interface ParentEntry {
  policy: ChildFailurePolicy;
  /** Children not finished yet. */
  pending: number;
  /** A child failed under "fail": the parent is being dead-lettered, never made visible. */
  failed: boolean;
  /** Child offsets in order. */
  children: number[];
  outcomes: Map<number, ChildOutcomeRecord>;
}

/** A parent to dead-letter because a child failed (FLOW-2, policy "fail"). */
export interface FailingParent {
  parent: number;
  child: number;
  error: string;
}

/** Snapshot form: [parent, policy, failed 0/1, children, outcomes [child, outcome][]]. */
export type FlowRow = [number, ChildFailurePolicy, number, number[], [number, ChildOutcomeRecord][]];

export class Flows {
  private readonly parents = new Map<number, ParentEntry>();
  /** Live children → their parent. */
  private readonly parentOf = new Map<number, number>();
  /** Parents a failed child fails: the queue dead-letters them (drained by the queue). */
  failing: FailingParent[] = [];

  get size(): number {
    return this.parents.size;
  }

  /** A stored flow job (offsets in increasing order: a parent before its children). */
  link(off: number, f: FlowLink): void {
    if (f.children > 0) this.parents.set(off, { policy: f.onChildFailure, pending: f.children, failed: false, children: [], outcomes: new Map() });
    if (f.parentDelta > 0) {
      const p = off - f.parentDelta;
      const e = this.parents.get(p);
      // A parent already finished (possible only after recovery) has nobody to tell.
      if (e === undefined) return;
      e.children.push(off);
      this.parentOf.set(off, p);
    }
  }

  /** Whether `off` is a parent that must wait (FLOW-2). */
  waits(off: number): boolean {
    const e = this.parents.get(off);
    return e !== undefined && (e.pending > 0 || e.failed);
  }

  isChild(off: number): boolean {
    return this.parentOf.has(off);
  }

  parentIdOf(off: number): number | undefined {
    return this.parentOf.get(off);
  }

  /**
   * A job finished: as a parent its entry goes; as a child its outcome is recorded. Returns the
   * parent that may now run (its last child finished, none failed it), else -1.
   */
  finished(off: number, outcome: ChildOutcomeRecord): number {
    const own = this.parents.get(off);
    if (own !== undefined) {
      for (const c of own.children) if (this.parentOf.get(c) === off) this.parentOf.delete(c);
      this.parents.delete(off);
    }
    const p = this.parentOf.get(off);
    if (p === undefined) return -1;
    this.parentOf.delete(off);
    const e = this.parents.get(p);
    if (e === undefined || e.outcomes.has(off)) return -1;
    e.outcomes.set(off, outcome);
    e.pending--;
    if (outcome.state === "failed" && e.policy === "fail" && !e.failed) {
      e.failed = true;
      this.failing.push({ parent: p, child: off, error: outcome.error ?? "failed" });
    }
    return e.pending === 0 && !e.failed ? p : -1;
  }

  /** Replay (JRN-1): a child's outcome as its terminal event recorded it; counts are rebuilt after. */
  replayed(off: number, outcome: ChildOutcomeRecord): void {
    const p = this.parentOf.get(off);
    const e = p === undefined ? undefined : this.parents.get(p);
    if (e !== undefined && !e.outcomes.has(off)) e.outcomes.set(off, outcome);
  }

  /** A parent's children and their outcomes so far (getJob), or undefined for a job that is no parent. */
  children(off: number): Map<number, ChildOutcomeRecord | null> | undefined {
    const e = this.parents.get(off);
    if (e === undefined) return undefined;
    const out = new Map<number, ChildOutcomeRecord | null>();
    for (const c of e.children) out.set(c, e.outcomes.get(c) ?? null);
    return out;
  }

  rows(): FlowRow[] {
    const out: FlowRow[] = [];
    for (const [p, e] of this.parents) out.push([p, e.policy, e.failed ? 1 : 0, e.children, [...e.outcomes]]);
    return out;
  }

  /** Snapshot load (before the jobs stored after it are linked). */
  load(rows: readonly FlowRow[]): void {
    for (const [p, policy, failed, children, outcomes] of rows) {
      const e: ParentEntry = { policy, pending: 0, failed: failed === 1, children: [...children], outcomes: new Map(outcomes) };
      this.parents.set(p, e);
      for (const c of children) if (!e.outcomes.has(c)) this.parentOf.set(c, p);
    }
  }

  /**
   * After recovery replayed the journal (`live(off)`: the row is not terminal): parents that
   * finished are dropped, children that finished without a recorded outcome count as completed
   * (their ACK carried no result), pending counts are recounted, and failed parents not yet
   * being dead-lettered are queued again in `failing`. Returns the live parents with whether
   * they must wait (the caller sets their rows WAITING or visible).
   */
  recover(live: (off: number) => boolean, moving: (off: number) => boolean): Map<number, boolean> {
    const out = new Map<number, boolean>();
    for (const [p, e] of [...this.parents]) {
      if (!live(p)) {
        this.finished(p, { state: "completed" });
        continue;
      }
      e.pending = 0;
      if (e.policy === "fail") for (const o of e.outcomes.values()) if (o.state === "failed") e.failed = true;
      for (const c of e.children) {
        if (e.outcomes.has(c)) continue;
        if (live(c)) e.pending++;
        else {
          e.outcomes.set(c, { state: "completed" });
          this.parentOf.delete(c);
        }
      }
      if (e.failed && !moving(p)) {
        const [child, o] = [...e.outcomes].find(([, x]) => x.state === "failed") ?? [-1, { error: "failed" }];
        this.failing.push({ parent: p, child, error: o.error ?? "failed" });
      }
      out.set(p, e.pending > 0 || e.failed);
    }
    return out;
  }

  clear(): void {
    this.parents.clear();
    this.parentOf.clear();
    this.failing = [];
  }
}
