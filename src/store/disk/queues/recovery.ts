// SPDX-License-Identifier: Apache-2.0
/**
 * Rebuilds a queue's state on open: the snapshot, then rows for the jobs appended after it
 * (read from the message log: delivery time, key, dedupe id, idempotent request), then the
 * journal replayed from the snapshot's offset (JRN-1: idempotent assignments, terminal rows
 * stay terminal), then the derived structures (JobState.rebuild).
 *
 * Damaged storage (REC-1): a record of the message log after the snapshot that fails its
 * checksum holds jobs that can never be read back; recovery does not refuse to open the queue
 * for it. The jobs of the damaged range get terminal rows (the table stays contiguous, TBL-1),
 * are counted in `stats().unreadable` and the range is logged at error level; every intact job
 * before and after it is recovered. A damaged journal record is skipped the same way (logged):
 * the settlements it held are lost, so those jobs are delivered again (at least once).
 */
import { CorruptRecordError } from "../../../errors.js";
import type { Logger } from "../../../observability/telemetry.js";
import type { FileSystem } from "../../../log/io.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import type { StoredRecord } from "../../../log/record-batch.js";
import type { AttemptRecord } from "../../../queues/types.js";
import { DedupeTable } from "./dedupe.js";
import { decodeEvents, Ev, type JournalEvent } from "./events.js";
import { JobState, type DlqIntent, type LeaseRecord } from "./job-state.js";
import { decodeIdemHeader, EnqueueProducers, H_IDEMPOTENCE } from "./producers.js";
import { Flows } from "./flows.js";
import { dedupeIdOf, deliverAtOf, expiresAtOf, flowOf, getHeader, groupOf, priorityOf, singletonOf, storedSize } from "./records.js";
import { readSnapshot } from "./snapshot.js";
import type { BlobSealer } from "../../../log/batch-crypto.js";
import { isTerminal, JobTable, St } from "./table.js";

/** Bytes per read while scanning the logs on recovery. */
const RECOVERY_READ_BYTES = 4 * 1024 * 1024;

export interface RecoveryContext {
  fs: FileSystem;
  dir: string;
  queue: string;
  msgs: PartitionLog;
  journal: PartitionLog;
  dedupeWindowMs: number;
  /** Retained outcomes older than this at `now` are not restored. */
  resultRetentionMs: number;
  logger: Logger;
  now: number;
  monoNow: number;
  /** An encrypted queue's snapshot sealer (ENC-1); null: the snapshot is in clear. */
  sealer: BlobSealer | null;
}

export interface Recovered {
  state: JobState;
  dedupe: DedupeTable;
  producers: EnqueueProducers;
  /** The last progress (JSON text) of live jobs: the snapshot's, then PROGRESS events replayed. */
  progress: Map<number, string>;
}

export async function recoverQueue(c: RecoveryContext): Promise<Recovered> {
  const dedupe = new DedupeTable(c.dedupeWindowMs);
  const producers = new EnqueueProducers();
  const keyIds = new Map<string, number>();
  const leases = new Map<number, LeaseRecord>();
  const progress = new Map<number, string>();
  let journalFrom = c.journal.logStartOffset;
  let state: JobState;
  const snap = await readSnapshot(c.fs, c.dir, c.queue, c.sealer);
  if (snap !== null) {
    const { meta } = snap;
    state = new JobState(snap.table);
    state.retained.retentionMs = c.resultRetentionMs;
    if (meta.retained !== undefined) state.retained.load(meta.retained);
    for (const [id, key] of meta.chains) keyIds.set(key, id);
    for (const [off, attempt, deadlineWall, consumer] of meta.leases) leases.set(off, { attempt, deadlineWall, consumer });
    for (const [off, h] of meta.history) state.history.set(off, h);
    for (const [off, m] of meta.moving) state.moving.set(off, m);
    dedupe.load(meta.dedupe);
    if (meta.idem !== undefined) producers.load(meta.idem);
    // Absent in snapshots of older versions and when unused (JOB-1, JOB-3).
    for (const [off, p] of meta.priorities ?? []) state.setPriority(off, p);
    for (const [off, at] of meta.expiries ?? []) state.setExpiry(off, at);
    for (const [off, g] of meta.groups ?? []) state.setGroup(off, g);
    state.singletons.load(meta.singletons ?? [], c.now);
    if (meta.flows !== undefined) (state.flows = new Flows()).load(meta.flows);
    if (meta.progress !== undefined) for (const [off, json] of meta.progress) progress.set(off, json);
    state.redeliveries = meta.counters.redeliveries;
    state.retries = meta.counters.retries;
    state.completed = meta.counters.completed;
    state.deadLettered = meta.counters.deadLettered;
    journalFrom = Math.max(journalFrom, meta.journalOffset);
  } else {
    state = new JobState(new JobTable(c.msgs.logStartOffset));
    state.retained.retentionMs = c.resultRetentionMs;
  }
  if (state.table.end > c.msgs.highWatermark) {
    // Only possible with durability "interval"/"never": the log lost an unsynced tail the snapshot had seen.
    c.logger.warn({ queue: c.queue, snapshotEnd: state.table.end, logEnd: c.msgs.highWatermark }, "queue jobs lost with the unsynced log tail");
    state.table.truncate(c.msgs.highWatermark);
    producers.truncate(c.msgs.highWatermark);
  }
  const replacedOffs: number[] = [];
  await scanJobs(c, state, keyIds, dedupe, producers, replacedOffs);
  await replayJournal(c, state, leases, journalFrom, progress);
  removeReplaced(state, replacedOffs, leases);
  state.rebuild(keyIds, leases, c.now, c.monoNow);
  state.retained.prune(c.now);
  // Progress is kept only while its job is live (a later ACK or DEAD replayed drops it).
  const t = state.table;
  for (const off of progress.keys()) if (!t.has(off) || isTerminal(t.status[t.idx(off)])) progress.delete(off);
  return { state, dedupe, producers, progress };
}

/** Rows for the jobs after the snapshot, from the message log (REC-1 for damaged ranges). */
async function scanJobs(c: RecoveryContext, st: JobState, keyIds: Map<string, number>, dedupe: DedupeTable, producers: EnqueueProducers, replaced: number[]): Promise<void> {
  let nextChainId = 0;
  for (const id of keyIds.values()) nextChainId = Math.max(nextChainId, id + 1);
  const chainOf = (key: string): number => {
    let chain = keyIds.get(key);
    if (chain === undefined) keyIds.set(key, (chain = nextChainId++));
    return chain;
  };
  const add = (r: StoredRecord): void => {
    const chain = r.key === null ? -1 : chainOf(r.key.toString("utf8"));
    st.table.add(r.offset, St.READY, deliverAtOf(r), r.timestamp, chain, storedSize(r));
    const dd = dedupeIdOf(r);
    if (dd !== null) dedupe.restore(dd, r.offset, r.timestamp, c.now);
    if (r.headers !== null) restoreJobOptions(c, st, r, replaced);
    // IDEM-1: the first new job of an idempotent request names it; the request's jobs are
    // exactly as durable as this record.
    const ip = getHeader(r.headers, H_IDEMPOTENCE);
    if (ip !== undefined) {
      const h = decodeIdemHeader(ip);
      if (h !== null) producers.restore(h.producerId, h.sequence, r.offset, h.count);
      else c.logger.warn({ queue: c.queue, offset: r.offset }, "ignoring a malformed idempotent-enqueue header");
    }
  };
  await scan(c.msgs, Math.max(st.table.end, c.msgs.logStartOffset), add, (from, to, err) => {
    c.logger.error(
      { err, queue: c.queue, from, to, lost: to - from },
      "queue message log is damaged: the jobs in this range cannot be read and are skipped (counted in stats().unreadable)",
    );
    for (let o = from; o < to; o++) st.addUnreadable(o, c.now);
  });
}

/** Priority, group, expiry and singleton key of a job after the snapshot (JOB-1..3, GRP-Q1). */
function restoreJobOptions(c: RecoveryContext, st: JobState, r: StoredRecord, replaced: number[]): void {
  st.setPriority(r.offset, priorityOf(r));
  const g = groupOf(r);
  if (g !== null) st.setGroup(r.offset, g);
  st.setExpiry(r.offset, expiresAtOf(r));
  const f = flowOf(r);
  if (f !== null) st.linkFlow(r.offset, f);
  const sk = singletonOf(r);
  if (sk === null) return;
  const exp = sk.mode === "throttle" ? r.timestamp + sk.windowMs : Infinity;
  if (exp > c.now) st.singletons.set(sk.mode, sk.key, { mode: sk.mode, off: r.offset, exp, wait: null, idx: 0 });
  if (sk.replaces >= 0) replaced.push(sk.replaces);
}

/**
 * A debounce job names the waiting job it replaced; that job was held back (never granted) from
 * the decision on, so whatever the journal says of it after that, it is removed (a lost DEAD
 * event is made good here).
 */
function removeReplaced(st: JobState, offs: readonly number[], leases: Map<number, LeaseRecord>): void {
  const t = st.table;
  for (const o of offs) {
    if (!t.has(o)) continue;
    const i = t.idx(o);
    if (isTerminal(t.status[i]) || t.status[i] === St.INFLIGHT) continue;
    t.status[i] = St.DONE;
    leases.delete(o);
    st.moving.delete(o);
  }
}

async function replayJournal(c: RecoveryContext, st: JobState, leases: Map<number, LeaseRecord>, from: number, progress: Map<number, string>): Promise<void> {
  const apply = (r: StoredRecord): void => {
    if (r.value === null) return;
    for (const ev of decodeEvents(r.value)) {
      if (ev.type === Ev.PROGRESS) progress.set(ev.offset, JSON.stringify(ev.data));
      else replay(st, ev, leases);
    }
  };
  await scan(c.journal, from, apply, (from, to, err) => {
    c.logger.error({ err, queue: c.queue, from, to }, "queue journal is damaged: the settlements in this range are lost (those jobs are delivered again)");
  });
}

/**
 * Reads a log from `from` to its durable end, record by record. A damaged range (REC-1) is
 * handed to `damaged` and skipped: reading resumes where intact data does.
 */
async function scan(log: PartitionLog, from: number, each: (r: StoredRecord) => void, damaged: (from: number, to: number, err: CorruptRecordError) => void): Promise<void> {
  let off = from;
  const end = log.highWatermark;
  while (off < end) {
    let read: { records: StoredRecord[]; nextOffset: number };
    try {
      read = await log.read(off, RECOVERY_READ_BYTES);
    } catch (e) {
      if (!(e instanceof CorruptRecordError)) throw e;
      const resume = Math.min(end, Math.max(off + 1, e.nextOffset ?? end));
      damaged(off, resume, e);
      off = resume;
      continue;
    }
    for (const r of read.records) each(r);
    if (read.nextOffset <= off) break;
    off = read.nextOffset;
  }
}

/** Applies one journal event (JRN-1: assignments, never deltas; terminal rows stay terminal). */
export function replay(st: JobState, ev: JournalEvent, leases: Map<number, LeaseRecord>): void {
  const t = st.table;
  if (ev.type === Ev.PURGE) {
    t.forEachLive((o, i) => {
      if (o < ev.offset) {
        t.status[i] = St.DONE;
        leases.delete(o);
        st.history.delete(o);
        st.moving.delete(o);
      }
    });
    return;
  }
  if (!t.has(ev.offset)) return;
  const i = t.idx(ev.offset);
  if (isTerminal(t.status[i])) return;
  const o = ev.offset;
  switch (ev.type) {
    case Ev.DELIVER:
      t.attempts[i] = Math.max(t.attempts[i], ev.attempt);
      t.status[i] = St.INFLIGHT;
      leases.set(o, { attempt: ev.attempt, deadlineWall: ev.time, consumer: "(before restart)" });
      break;
    case Ev.EXTEND: {
      const l = leases.get(o);
      if (l && l.attempt === ev.attempt) l.deadlineWall = ev.time;
      break;
    }
    case Ev.ACK:
      // the result travels in the ACK event itself.
      st.keepCompleted(o, ev.time, ev.attempt, ev.data === undefined ? undefined : JSON.stringify(ev.data));
      // FLOW-2: a child's result reaches its parent from the same event.
      st.flows?.replayed(o, ev.data === undefined ? { state: "completed" } : { state: "completed", result: JSON.stringify(ev.data) });
      t.status[i] = St.DONE;
      leases.delete(o);
      break;
    case Ev.NACK:
    case Ev.EXPIRE:
      t.attempts[i] = Math.max(t.attempts[i], ev.attempt);
      t.status[i] = St.DELAYED;
      t.visibleAt[i] = ev.time;
      leases.delete(o);
      if (ev.data !== undefined) st.pushHistory(o, ev.data as AttemptRecord);
      break;
    case Ev.GIVE_BACK:
      // RATE-2: only while the given-back delivery (ev.attempt + 1) is the latest: a later
      // delivery's count is never lowered, and a replay of it twice changes nothing more.
      if (t.attempts[i] === ev.attempt + 1) t.attempts[i] = ev.attempt;
      t.status[i] = St.DELAYED;
      t.visibleAt[i] = ev.time;
      leases.delete(o);
      break;
    case Ev.DLQ_INTENT:
      t.status[i] = St.MOVING;
      leases.delete(o);
      st.moving.set(o, ev.data as DlqIntent);
      break;
    case Ev.DEAD:
      if (ev.data !== undefined && (ev.data as { removed?: unknown }).removed !== undefined) {
        // Removed without a copy (JOB-3, JOB-4): gone, as a purged job.
        st.flows?.replayed(o, { state: "removed" });
        t.status[i] = St.DONE;
        leases.delete(o);
        st.moving.delete(o);
        break;
      }
      st.keepDead(o, ev.time);
      st.flows?.replayed(o, { state: "failed", error: deadError(st.moving.get(o)) });
      t.status[i] = St.DEAD;
      leases.delete(o);
      st.moving.delete(o);
      break;
  }
}

/** What a flow's parent is told of a dead-lettered child (FLOW-2). */
function deadError(m: DlqIntent | undefined): string {
  return m === undefined ? "unreadable" : m.error || m.errorClass;
}
