// SPDX-License-Identifier: Apache-2.0
/**
 * `browse()` of the disk engine: live jobs in offset order, read without leasing. The
 * job table says which rows qualify (no record is read to decide), then only the chosen
 * records are read: from the tail cache when there, else from the message log, without
 * filling the cache (a browse must not change what deliveries find cached). Reads only.
 */
import { ValidationError } from "../../../errors.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import type { PreparedRecord } from "../../../log/record-batch.js";
import type { JobStatus } from "../../../queues/types.js";
import type { StoredBrowsedJob, StoredBrowsePage, StoredBrowseRequest } from "../../queue-store.js";
import type { JobState } from "./job-state.js";
import { liveState, offsetOfId } from "./lookup.js";
import type { PayloadCache } from "./payload-cache.js";
import { decodeJobFields, groupOf } from "./records.js";

/** Rows examined per call: a page over a long run of jobs in other states ends early (with a cursor). */
const MAX_SCAN_ROWS = 200_000;
/** Bytes per read of the message log for records not in the cache. */
const READ_BYTES = 256 * 1024;

interface Picked {
  off: number;
  state: JobStatus;
  attempts: number;
}

function wanted(state: JobStatus | null, filter: StoredBrowseRequest["state"]): state is JobStatus {
  if (state === null || state === "dead" || state === "completed") return false;
  return filter === "all" || state === filter;
}

/** The rows of the page, from the job table alone; `next` is the last row examined when more follow. */
function pick(st: JobState, req: StoredBrowseRequest): { picked: Picked[]; next: string | null } {
  let after = -1;
  if (req.after !== null) {
    after = offsetOfId(req.after);
    if (after < 0) throw new ValidationError(`browse: after must be a job id (a page's next), got ${JSON.stringify(req.after.slice(0, 64))}`);
  }
  const t = st.table;
  const picked: Picked[] = [];
  let bytes = 0;
  let off = Math.max(t.floor, after + 1);
  for (let scanned = 0; off < t.end && scanned < MAX_SCAN_ROWS; off++, scanned++) {
    const i = t.idx(off);
    const state = liveState(t.status[i], st.moving.has(off));
    if (!wanted(state, req.state)) continue;
    if (picked.length >= req.limit || (picked.length > 0 && bytes + t.size[i] > req.maxBytes)) break;
    picked.push({ off, state, attempts: t.attempts[i] });
    bytes += t.size[i];
  }
  return { picked, next: off < t.end ? String(off - 1) : null };
}

/** Records by offset: cached ones, then the log in forward chunks. A record gone meanwhile (settled and deleted) is left out. */
async function records(cache: PayloadCache, log: PartitionLog, offs: readonly number[]): Promise<Map<number, PreparedRecord>> {
  const out = new Map<number, PreparedRecord>();
  const missing: number[] = [];
  for (const o of offs) {
    const r = cache.get(o);
    if (r !== undefined) out.set(o, r);
    else missing.push(o);
  }
  let k = 0;
  while (k < missing.length) {
    const from = missing[k];
    let got: Awaited<ReturnType<PartitionLog["read"]>>;
    try {
      got = await log.read(from, READ_BYTES);
    } catch {
      k++; // deleted below the log start, or damaged: nothing to show for this job
      continue;
    }
    for (const r of got.records) {
      while (k < missing.length && missing[k] < r.offset) k++;
      if (k < missing.length && missing[k] === r.offset) {
        out.set(r.offset, r);
        k++;
      }
    }
    if (k < missing.length && missing[k] === from) k++; // not in what was read
    if (got.records.length === 0) break;
  }
  return out;
}

/** `{ group }` of a grouped job's record, else nothing (most jobs: one null check). */
function groupField(r: PreparedRecord): { group?: string } {
  const g = r.headers === null ? null : groupOf(r);
  return g === null ? {} : { group: g };
}

export async function browseJobs(st: JobState, cache: PayloadCache, log: PartitionLog, req: StoredBrowseRequest): Promise<StoredBrowsePage> {
  const { picked, next } = pick(st, req);
  const recs = await records(cache, log, picked.map((p) => p.off));
  const jobs: StoredBrowsedJob[] = [];
  for (const p of picked) {
    const r = recs.get(p.off);
    if (r === undefined) continue;
    const f = decodeJobFields(r);
    let deadLetter = f.deadLetter;
    let key = f.key;
    if (deadLetter !== null) {
      // A dead-letter copy keeps the source job's key in its record (for redrive), not as its own.
      const { key: sourceKey, ...info } = deadLetter as typeof deadLetter & { key?: string | null };
      deadLetter = info;
      if (key === null && sourceKey !== undefined) key = sourceKey;
    }
    jobs.push({
      id: String(p.off),
      state: p.state,
      attempts: p.attempts,
      key,
      value: r.value,
      valueKind: r.valueKind,
      headers: f.headers,
      enqueuedAt: r.timestamp,
      redriveCount: f.redriveCount,
      deadLetter,
      ...groupField(r),
    });
  }
  return { jobs, next };
}
