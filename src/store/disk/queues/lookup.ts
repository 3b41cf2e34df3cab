// SPDX-License-Identifier: Apache-2.0
/**
 * `getJob(id)` of the disk engine: a live job from its row (and its payload from the message
 * log), a completed or dead-lettered one from the retained outcomes (retained.ts). Reads only:
 * nothing is written or created.
 */
import type { StoredChildOutcome, StoredJobInfo } from "../../queue-store.js";
import type { JobState } from "./job-state.js";
import type { PayloadCache } from "./payload-cache.js";
import { St } from "./table.js";

/** The offset a job id names, or -1 when it names none (ids are decimal offsets). */
export function offsetOfId(id: unknown): number {
  if (typeof id !== "string" || !/^(0|[1-9][0-9]{0,15})$/.test(id)) return -1;
  const off = Number(id);
  return Number.isSafeInteger(off) ? off : -1;
}

export function liveState(s: number, moving: boolean): StoredJobInfo["state"] | null {
  switch (s) {
    case St.READY:
    case St.BLOCKED:
      return "waiting";
    case St.DELAYED:
      return "delayed";
    case St.WAITING:
      return "waiting-children";
    case St.INFLIGHT:
      return "active";
    case St.MOVING:
      // Being dead-lettered (a durable intent), or being redriven out of a dead-letter queue.
      return moving ? "dead" : "waiting";
    case St.DEAD:
      return "dead";
    default:
      // DONE without a retained outcome: acked or purged, nothing left to report.
      return null;
  }
}

export async function lookupJob(st: JobState, cache: PayloadCache, id: string, now: number): Promise<StoredJobInfo | null> {
  const off = offsetOfId(id);
  if (off < 0) return null;
  const kept = st.retained.get(off, now);
  if (kept !== undefined) {
    const out: StoredJobInfo = { id, state: kept.state, attempts: kept.attempts, completedAt: kept.at };
    if (kept.result !== undefined) out.result = kept.result;
    if (kept.lastError !== undefined) out.lastError = kept.lastError;
    return out;
  }
  const t = st.table;
  if (!t.has(off)) return null;
  const i = t.idx(off);
  const state = liveState(t.status[i], st.moving.has(off));
  if (state === null) return null;
  const out: StoredJobInfo = { id, state, attempts: t.attempts[i] };
  const last = st.history.get(off)?.at(-1) ?? st.moving.get(off);
  if (last !== undefined) out.lastError = last.error || last.errorClass;
  if (st.flows !== null) flowInfo(st, off, out);
  if (state === "dead") return out; // the payload went to the dead-letter queue
  const rec = (await cache.fetch([off])).get(off);
  // The job may have settled while its record was read: report the state it had.
  if (rec !== undefined && !(rec instanceof Error)) out.record = { value: rec.value, valueKind: rec.valueKind };
  return out;
}

/** A flow job's parent and, for a parent, its children's outcomes so far (FLOW-2). */
function flowInfo(st: JobState, off: number, out: StoredJobInfo): void {
  const flows = st.flows!;
  const p = flows.parentIdOf(off);
  if (p !== undefined) out.parentId = String(p);
  const kids = flows.children(off);
  if (kids === undefined) return;
  const children: Record<string, StoredChildOutcome> = {};
  for (const [c, o] of kids) children[String(c)] = o ?? { state: "pending" };
  out.children = children;
}
