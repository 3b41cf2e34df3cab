// SPDX-License-Identifier: Apache-2.0
/**
 * Jobs that leave a queue without being worked: `remove(id)` (JOB-4), the waiting job a
 * debounce enqueue replaces (JOB-2), and jobs not started by their expiry (JOB-3), which are
 * dead-lettered (Q-4, through the Mover) or dropped. A removal without a copy is a DONE row
 * journaled as DEAD with `{removed: reason}` (events.ts), durable before `remove` resolves.
 */
import { JobActiveError } from "../../../errors.js";
import type { AttemptRecord } from "../../../queues/types.js";
import type { MoveHost, Mover } from "./dead-letters.js";
import { encodeEvent, Ev, type RemovedReason } from "./events.js";
import type { JobState } from "./job-state.js";
import { offsetOfId } from "./lookup.js";
import { isTerminal, St } from "./table.js";

const MAX_TIMER_MS = 2 ** 31 - 1;

export class Removals {
  private timer: NodeJS.Timeout | null = null;
  private timerAt = Infinity;
  private closed = false;

  constructor(
    private readonly q: MoveHost,
    private readonly mover: Mover,
  ) {}

  /**
   * JOB-4: removes a waiting, delayed or key-blocked job; true once that is durable. False for
   * an id that is not a live job (unknown, finished, being dead-lettered or replaced);
   * JobActiveError for a leased job (nothing changes).
   */
  async remove(id: string): Promise<boolean> {
    const st = this.q.state();
    const off = offsetOfId(id);
    if (off < 0) return false;
    if (st.statusOf(off) === St.INFLIGHT) throw new JobActiveError(this.q.name, id);
    if (!st.isWaiting(off)) return false;
    await this.finish(off, this.q.now(), "removed");
    return true;
  }

  /**
   * A debounce enqueue's job is durable: the waiting job it replaces (frozen since the decision,
   * JOB-2) goes. Until that event is durable the new job's record names the replaced one, and
   * recovery removes it again.
   */
  replaced(off: number): void {
    const st = this.q.state();
    if (st.statusOf(off) !== St.MOVING || st.moving.has(off)) return;
    void this.finish(off, this.q.now(), "replaced").catch(() => {});
  }

  /** A live, unleased job leaves the queue: DONE, as a purged job (getJob: null). */
  private finish(off: number, now: number, why: RemovedReason): Promise<void> {
    if (this.q.state().finish(off, St.DONE, now)) this.q.available();
    this.q.settled(off);
    // Versions without `removed` read a terminal DEAD: the job stays gone either way.
    return this.q.journal().event(encodeEvent(Ev.DEAD, off, 0, now, { removed: why }));
  }

  /** (Re)arms the expiry timer for the earliest expiry (JOB-3). */
  schedule(): void {
    const h = this.q.state().expiring;
    if (this.closed || h === null) return;
    const at = h.peekPriority();
    if (at === Infinity || at >= this.timerAt) return;
    if (this.timer) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.timerAt = Infinity;
      if (this.closed || !this.q.alive()) return;
      const now = this.q.now();
      this.expire(dueExpiries(this.q.state(), now), now);
      this.schedule();
    }, Math.min(MAX_TIMER_MS, Math.max(0, at - this.q.now() + 1)));
    this.timer.unref();
  }

  /**
   * JOB-3: jobs not started by their expiry leave the queue: dead-lettered (Q-4: the intent, the
   * copy, DEAD; the failure names JobExpiredError) or, with `onExpire: "drop"`, removed. Never
   * granted meanwhile (JobState.popReady sets them aside).
   */
  expire(offs: readonly number[], now: number): void {
    const st = this.q.state();
    const drop = this.q.settings().onExpire === "drop";
    for (const off of offs) {
      if (!st.isWaiting(off)) continue;
      st.expiry?.delete(off);
      if (drop) {
        void this.finish(off, now, "expired").catch(() => {});
        continue;
      }
      const rec: AttemptRecord = { at: now, attempt: 0, consumer: "(expiry)", errorClass: "JobExpiredError", error: "job expired before it was started" };
      this.q.track(this.mover.deadLetter(off, rec).catch((e) => this.q.logger.error({ err: e, queue: this.q.name }, "dead-letter move failed")));
    }
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
  }
}

/**
 * Jobs whose expiry passed at `now` and that were never started (waiting, delayed or held behind
 * their key). A job started once is past its expiry's reach (dropped from the map).
 */
export function dueExpiries(st: JobState, now: number): number[] {
  const h = st.expiring;
  const out: number[] = [];
  if (h === null || st.expiry === null) return out;
  const t = st.table;
  while (h.size > 0 && h.peekPriority() <= now) {
    const at = h.peekPriority();
    const off = h.pop();
    if (st.expiry.get(off) !== at || !t.has(off)) continue;
    const i = t.idx(off);
    const s = t.status[i];
    if (t.attempts[i] > 0 || isTerminal(s)) st.expiry.delete(off);
    else if (st.isWaiting(off)) out.push(off);
    // MOVING (being dead-lettered or replaced) is left alone.
  }
  return out;
}
