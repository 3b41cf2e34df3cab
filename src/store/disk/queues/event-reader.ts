// SPDX-License-Identifier: Apache-2.0
/**
 * `queue.events()` of the disk engine: lifecycle events derived from what the queue stores
 * anyway, read back by offset. Nothing is written for them and nothing is buffered for a
 * reader (EVT-1): a queue without readers pays nothing, a slow reader costs only its own reads.
 *
 *  - "enqueued" comes from the message log (one record per job, its offset is the job id);
 *  - every other event from the state journal (events.ts): DELIVER -> active, PROGRESS ->
 *    progress, ACK -> completed (attempt 0: removed by a redrive), NACK -> failed (with an
 *    attempt record) or released (without), EXPIRE -> stalled, DLQ_INTENT -> failed / stalled
 *    with willRetry false, DEAD -> dead-lettered, PURGE -> purged. EXTEND is not reported.
 *
 * The two logs are merged by one rule: before a journal event about job `o` is reported, the
 * "enqueued" events of every job up to `o` are (Q-1: a job's DELIVER is written only once its
 * enqueue is durable, so they are readable). At the journal's end, new jobs are reported as
 * they arrive. The position after each event is `e1.<incarnation>.<journal record>.<event in
 * record>.<next job offset>`: resuming from it repeats nothing and skips nothing the logs still
 * hold; a position of an earlier incarnation of the queue (deleted and re-created) resumes at
 * the new one's oldest event after a `gap` event.
 *
 * Retention (EVT-2, journal-retention.ts): a snapshot deletes only journal segments beyond the
 * newest journal segment's worth of history; a position below the journal's start resumes at
 * the oldest kept event after a `gap` event (as does a damaged journal range, REC-1).
 * "enqueued" events of finished jobs whose message-log segment was deleted are not reported.
 */
import { CorruptRecordError, OffsetOutOfRangeError, ValidationError } from "../../../errors.js";
import type { PartitionLog } from "../../../log/partition-log.js";
import type { StoredRecord } from "../../../log/record-batch.js";
import type { AttemptRecord, QueueEvent } from "../../../queues/types.js";
import type { StoredEventsPage, StoredEventsRequest } from "../../queue-store.js";
import { decodeEvents, Ev, type JournalEvent, type RemovedReason } from "./events.js";
import type { DlqIntent } from "./job-state.js";
import { deliverAtOf } from "./records.js";

/** Bytes per read of either log. */
const READ_BYTES = 256 * 1024;
/**
 * A page ends once the journal records its events came from (an upper bound of their results,
 * progress values and errors) reach this, so a page of events with 64 KiB results stays far
 * below a frame (16 MiB) and a reader's memory stays bounded.
 */
const MAX_PAGE_BYTES = 1024 * 1024;

export interface EventSource {
  journal: PartitionLog;
  msgs: PartitionLog;
  /** The queue's incarnation: positions of an earlier one (the queue deleted and re-created) do not apply. */
  incarnation: string;
}

/** Where a reader is: journal record, event index in it, next job whose "enqueued" is due. */
interface Cursor {
  j: number;
  k: number;
  m: number;
}

const POSITION = /^e1\.([0-9a-z]{1,40})\.(0|[1-9][0-9]{0,15})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,15})$/;

/** The incarnation's unique part (its name is `<queue>.<time><random>`). */
function tagOf(incarnation: string): string {
  return incarnation.slice(incarnation.lastIndexOf(".") + 1).replace(/[^0-9a-z]/g, "").slice(0, 40) || "0";
}

export function encodePosition(tag: string, c: Cursor): string {
  return `e1.${tag}.${c.j}.${c.k}.${c.m}`;
}

/** The cursor `from` names, and whether events it asks for are gone (an earlier incarnation's position). */
function resolveFrom(src: EventSource, from: string): { c: Cursor; gone: boolean } {
  const earliest = { j: src.journal.logStartOffset, k: 0, m: src.msgs.logStartOffset };
  if (from === "now") return { c: { j: src.journal.highWatermark, k: 0, m: src.msgs.highWatermark }, gone: false };
  if (from === "earliest") return { c: earliest, gone: false };
  const p = POSITION.exec(from);
  if (p === null) throw new ValidationError(`events: from must be "now", "earliest" or an event's position, got ${JSON.stringify(from).slice(0, 80)}`);
  // The queue was deleted and created again: everything after that position is gone.
  if (p[1] !== tagOf(src.incarnation)) return { c: earliest, gone: true };
  const c = { j: Number(p[2]), k: Number(p[3]), m: Number(p[4]) };
  if (c.j > src.journal.logEndOffset || c.m > src.msgs.logEndOffset) throw new ValidationError(`events: position ${from} is not one this queue issued`);
  return { c, gone: false };
}

/** One page of events (at most `req.max`), waiting up to `req.maxWaitMs` while there is none. */
export async function readEvents(src: () => EventSource, req: StoredEventsRequest): Promise<StoredEventsPage> {
  const s = src();
  const from = resolveFrom(s, req.from);
  const r = new PageReader(s, from.c, req.max);
  if (from.gone) r.gap();
  const deadline = Date.now() + req.maxWaitMs;
  for (;;) {
    await r.fill();
    const left = deadline - Date.now();
    if (r.out.length > 0 || left <= 0 || req.signal?.aborted) return { events: r.out, position: r.position() };
    if (!(await waitForEither(src(), r.c, left, req.signal))) return { events: r.out, position: r.position() };
    r.src = src();
  }
}

/** Resolves true once either log has a record at the cursor, false on timeout or abort. */
async function waitForEither(src: EventSource, c: Cursor, ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  const ac = new AbortController();
  const stop = (): void => ac.abort();
  signal?.addEventListener("abort", stop, { once: true });
  try {
    return await Promise.race([src.journal.waitFor(c.j, ms, ac.signal), src.msgs.waitFor(c.m, ms, ac.signal)]);
  } finally {
    ac.abort();
    signal?.removeEventListener("abort", stop);
  }
}

class PageReader {
  readonly out: QueueEvent[] = [];
  /** Bytes the page's events may take (their journal records' sizes, ~100 per enqueued). */
  private bytes = 0;
  /** The journal record whose size `bytes` counts already. */
  private counted = -1;

  constructor(
    public src: EventSource,
    readonly c: Cursor,
    private readonly max: number,
  ) {}

  position(): string {
    return encodePosition(tagOf(this.src.incarnation), this.c);
  }

  /** EVT-2: events after the reader's position are gone; it goes on from the oldest kept one. */
  gap(): void {
    this.push({ type: "gap", at: Date.now() } as QueueEvent);
  }

  private get full(): boolean {
    return this.out.length >= this.max || this.bytes >= MAX_PAGE_BYTES;
  }

  /** Reads what both logs hold from the cursor, up to `max` events. */
  async fill(): Promise<void> {
    while (!this.full) {
      const { journal, msgs } = this.src;
      if (this.c.j < journal.logStartOffset) {
        // EVT-2: the journal below its start was deleted after a snapshot: say so, go on.
        this.c.j = journal.logStartOffset;
        this.c.k = 0;
        this.gap();
        continue;
      }
      if (this.c.m < msgs.logStartOffset) this.c.m = msgs.logStartOffset;
      if (this.c.j < journal.highWatermark) {
        if (!(await this.journalRecords())) return;
      } else if (this.c.m < msgs.highWatermark) {
        await this.enqueuedUpTo(msgs.highWatermark - 1);
      } else return;
    }
  }

  private push(e: QueueEvent): void {
    e.position = this.position();
    this.out.push(e);
  }

  /** Reports the journal records from the cursor; false when nothing could be read. */
  private async journalRecords(): Promise<boolean> {
    let recs: StoredRecord[];
    try {
      recs = (await this.src.journal.read(this.c.j, READ_BYTES)).records;
    } catch (e) {
      if (e instanceof OffsetOutOfRangeError) return true; // deleted meanwhile: `fill` reports the gap
      if (!(e instanceof CorruptRecordError)) throw e;
      // REC-1: a damaged journal range is skipped (those events are lost), as recovery does.
      this.c.j = Math.max(this.c.j + 1, e.nextOffset ?? this.c.j + 1);
      this.c.k = 0;
      this.gap();
      return true;
    }
    const start = this.c.j;
    for (const r of recs) {
      if (r.offset < this.c.j) continue;
      const evs = r.value === null ? [] : decodeEvents(r.value);
      if (r.offset > this.c.j) this.c.k = 0;
      this.c.j = r.offset;
      while (this.c.k < evs.length) {
        const ev = evs[this.c.k];
        const job = ev.type === Ev.PURGE ? ev.offset - 1 : ev.offset;
        if (job >= this.c.m) await this.enqueuedUpTo(job);
        if (this.full) return true;
        this.c.k++;
        const e = journalEvent(ev, r.timestamp);
        if (e !== null) {
          if (this.counted !== r.offset) this.bytes += r.value?.length ?? 0;
          this.counted = r.offset;
          this.push(e);
        }
        if (this.full) return true;
      }
      this.c.j = r.offset + 1;
      this.c.k = 0;
    }
    // Nothing at or after the cursor (never expected): end the page rather than spin.
    return this.c.j > start;
  }

  /** Reports "enqueued" for the jobs from the cursor through `last` (while there is room). */
  private async enqueuedUpTo(last: number): Promise<void> {
    const msgs = this.src.msgs;
    while (this.c.m <= last && !this.full) {
      if (this.c.m >= msgs.highWatermark) {
        this.c.m = last + 1; // not readable (an unsynced tail lost): nothing to report
        return;
      }
      let recs: StoredRecord[];
      try {
        recs = (await msgs.read(this.c.m, READ_BYTES)).records;
      } catch (e) {
        if (e instanceof OffsetOutOfRangeError) {
          // Deleted meanwhile (a snapshot moved the floor): those jobs are finished.
          if (this.c.m >= msgs.logStartOffset) return;
          this.c.m = msgs.logStartOffset;
          continue;
        }
        if (!(e instanceof CorruptRecordError)) throw e;
        this.c.m = Math.max(this.c.m + 1, e.nextOffset ?? this.c.m + 1);
        continue;
      }
      if (recs.length === 0) return;
      for (const r of recs) {
        if (r.offset < this.c.m) continue;
        if (r.offset > last || this.full) return;
        this.c.m = r.offset + 1;
        const delayedUntil = deliverAtOf(r);
        const e = { type: "enqueued", jobId: String(r.offset), at: r.timestamp, key: r.key === null ? null : r.key.toString("utf8") } as QueueEvent & { delayedUntil?: number };
        if (delayedUntil > r.timestamp) e.delayedUntil = delayedUntil;
        this.bytes += 100 + (r.key?.length ?? 0);
        this.push(e);
      }
    }
  }
}

/** A journal event as users see it (null: not reported). `at`: when its record was stored. */
export function journalEvent(ev: JournalEvent, at: number): QueueEvent | null {
  const jobId = String(ev.offset);
  const base = { position: "", at, jobId };
  switch (ev.type) {
    case Ev.DELIVER:
      return { ...base, type: "active", attempt: ev.attempt, leaseExpiresAt: ev.time };
    case Ev.PROGRESS:
      return { ...base, type: "progress", attempt: ev.attempt, progress: ev.data };
    case Ev.ACK:
      if (ev.attempt === 0) return { ...base, type: "removed" };
      return ev.data === undefined ? { ...base, type: "completed", attempt: ev.attempt } : { ...base, type: "completed", attempt: ev.attempt, result: ev.data };
    case Ev.NACK: {
      const f = ev.data as AttemptRecord | undefined;
      if (f === undefined) return { ...base, type: "released", attempt: ev.attempt };
      return { ...base, type: "failed", attempt: ev.attempt, errorClass: f.errorClass, error: f.error, willRetry: true, retryAt: ev.time };
    }
    case Ev.GIVE_BACK:
      // `job.retryAfter` (RATE-2): the delivery `attempt + 1` was given back, not counted.
      return { ...base, type: "released", attempt: ev.attempt + 1, retryAt: ev.time };
    case Ev.EXPIRE:
      return { ...base, type: "stalled", attempt: ev.attempt, willRetry: true, retryAt: ev.time };
    case Ev.DLQ_INTENT: {
      const d = ev.data as DlqIntent;
      if (d.errorClass === "LeaseExpiredError") return { ...base, type: "stalled", attempt: ev.attempt, willRetry: false };
      return { ...base, type: "failed", attempt: ev.attempt, errorClass: d.errorClass, error: d.error, willRetry: false };
    }
    case Ev.DEAD: {
      // `{removed}`: left without a copy (remove(id), replaced by a debounce enqueue, expired and dropped).
      const removed = (ev.data as { removed?: RemovedReason } | undefined)?.removed;
      if (removed !== undefined) return { ...base, type: "removed", reason: removed };
      return { ...base, type: "dead-lettered" };
    }
    case Ev.PURGE:
      return { position: "", at, type: "purged", beforeId: jobId };
    default:
      return null;
  }
}
