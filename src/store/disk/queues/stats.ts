// SPDX-License-Identifier: Apache-2.0
/**
 * `stats()` of a disk queue: counts from the state (O(1)), the oldest lease (one pass over the
 * leases) and the keys whose head job is failing (a bounded scan of the chains).
 */
import type { QueueStats } from "../../../queues/types.js";
import type { JobState } from "./job-state.js";
import { St } from "./table.js";

/** Keys listed in stats().blockedKeys, and chains examined for them. */
const MAX_BLOCKED_KEYS = 100;
const MAX_BLOCKED_SCAN = 100_000;

export function queueStats(name: string, st: JobState, now: number, mono: number): QueueStats {
  const t = st.table;
  let oldestLease = 0;
  for (const l of st.leases.values()) oldestLease = Math.max(oldestLease, mono - l.startedMono);
  const blockedKeys: QueueStats["blockedKeys"] = [];
  let scanned = 0;
  for (const c of st.chains.entries()) {
    if (blockedKeys.length >= MAX_BLOCKED_KEYS || scanned++ > MAX_BLOCKED_SCAN) break;
    const h = c.offs[c.h];
    if (h === undefined || !t.has(h)) continue;
    const i = t.idx(h);
    if (t.attempts[i] > 0 && t.status[i] !== St.INFLIGHT) blockedKeys.push({ key: c.key, ageMs: Math.max(0, now - t.enqueuedAt[i]), attempts: t.attempts[i] });
  }
  return {
    name,
    waiting: st.counts[St.READY],
    delayed: st.counts[St.DELAYED],
    inFlight: st.counts[St.INFLIGHT],
    blockedByKey: st.counts[St.BLOCKED],
    waitingChildren: st.counts[St.WAITING],
    deadLettered: st.deadLettered,
    depth: st.live,
    bytes: st.liveBytes,
    oldestWaitingAgeMs: st.oldestWaitingAge(now),
    oldestLeaseAgeMs: Math.round(oldestLease),
    redeliveries: st.redeliveries,
    retries: st.retries,
    completed: st.completed,
    completionRatePerSec: st.completionRate(mono),
    blockedKeys,
    unreadable: st.unreadable,
  };
}
