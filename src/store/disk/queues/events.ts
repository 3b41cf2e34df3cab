// SPDX-License-Identifier: Apache-2.0
/**
 * State-journal events. Many events are packed into one journal record per group commit.
 * Layout per event (little endian): type u8 | offset f64 | attempt u32 | time f64 | varLen u32 |
 * var bytes (UTF-8 JSON). 25 bytes + var.
 *
 * Invariant JRN-1: every event is an idempotent assignment (never a delta), and replay never
 * revives a terminal row, so replaying events already reflected in a snapshot is harmless.
 */

export const enum Ev {
  /** Lease granted: attempt = delivery number, time = wall-clock lease deadline. */
  DELIVER = 1,
  /** Job completed; var = its result as JSON (only when the queue retains results). */
  ACK = 2,
  /** Attempt failed or released: time = wall-clock visibleAt; var = AttemptRecord or empty. */
  NACK = 3,
  /** Lease extended: time = new wall-clock deadline. */
  EXTEND = 4,
  /** Lease expired: visible again at `time`; var = AttemptRecord. */
  EXPIRE = 5,
  /** Dead-letter move started: var = DeadLetterInfo (+ key). Resumed on restart. */
  DLQ_INTENT = 6,
  /**
   * Dead-letter move finished (the DLQ copy is durable). With var `{removed: reason}`: the job
   * left the queue without a copy (`remove(id)`, replaced by a debounce enqueue, expired with
   * `onExpire: "drop"`), JOB-3/JOB-4; replayed as DONE.
   */
  DEAD = 7,
  /** Every row below `offset` is done. */
  PURGE = 8,
  /** Progress of a leased job: var = the progress as JSON (MAX_PROGRESS_BYTES). Kept while the job is live. */
  PROGRESS = 9,
  /**
   * A delivery given back (`job.retryAfter(ms)`, RATE-2): attempt = the job's attempt count
   * without it (the given-back delivery's number - 1), time = wall-clock visibleAt. Replayed only
   * while the given-back delivery is the job's latest (a conditional assignment, JRN-1).
   */
  GIVE_BACK = 10,
}

/** Why a job left the queue without a copy (the var of a DEAD event). */
export type RemovedReason = "removed" | "replaced" | "expired";

export const EVENT_FIXED_BYTES = 25;
/** Bound on the variable part (JSON), so a hostile error message cannot bloat the journal. */
export const MAX_EVENT_VAR_BYTES = 64 * 1024;

export interface JournalEvent {
  type: Ev;
  offset: number;
  attempt: number;
  time: number;
  data: unknown;
}

export function encodeEvent(type: Ev, offset: number, attempt: number, time: number, data?: unknown): Buffer {
  const v = data === undefined ? null : Buffer.from(JSON.stringify(data), "utf8");
  if (v !== null && v.length > MAX_EVENT_VAR_BYTES) throw new Error(`journal event payload too large (${v.length} bytes)`);
  const b = Buffer.allocUnsafe(EVENT_FIXED_BYTES + (v?.length ?? 0));
  b.writeUInt8(type, 0);
  b.writeDoubleLE(offset, 1);
  b.writeUInt32LE(attempt, 9);
  b.writeDoubleLE(time, 13);
  b.writeUInt32LE(v?.length ?? 0, 21);
  if (v !== null) v.copy(b, EVENT_FIXED_BYTES);
  return b;
}

/** An event whose variable part is JSON text already (an ack's result, validated by the policy). */
export function encodeRawEvent(type: Ev, offset: number, attempt: number, time: number, json: string): Buffer {
  const len = Buffer.byteLength(json, "utf8");
  if (len > MAX_EVENT_VAR_BYTES) throw new Error(`journal event payload too large (${len} bytes)`);
  const b = Buffer.allocUnsafe(EVENT_FIXED_BYTES + len);
  b.writeUInt8(type, 0);
  b.writeDoubleLE(offset, 1);
  b.writeUInt32LE(attempt, 9);
  b.writeDoubleLE(time, 13);
  b.writeUInt32LE(len, 21);
  b.write(json, EVENT_FIXED_BYTES, "utf8");
  return b;
}

/** Writes a fixed-size event (no payload) into `buf` at `pos`; returns the next position. */
export function writeEvent(buf: Buffer, pos: number, type: Ev, offset: number, attempt: number, time: number): number {
  buf[pos] = type;
  buf.writeDoubleLE(offset, pos + 1);
  buf.writeUInt32LE(attempt, pos + 9);
  buf.writeDoubleLE(time, pos + 13);
  buf.writeUInt32LE(0, pos + 21);
  return pos + EVENT_FIXED_BYTES;
}

/** Decodes every event of one journal record value. Throws on a malformed value. */
export function decodeEvents(buf: Buffer, out: JournalEvent[] = []): JournalEvent[] {
  let p = 0;
  while (p < buf.length) {
    if (buf.length - p < EVENT_FIXED_BYTES) throw new Error(`journal record: truncated event at byte ${p}`);
    const type = buf.readUInt8(p) as Ev;
    const offset = buf.readDoubleLE(p + 1);
    const attempt = buf.readUInt32LE(p + 9);
    const time = buf.readDoubleLE(p + 13);
    const len = buf.readUInt32LE(p + 21);
    p += EVENT_FIXED_BYTES;
    if (len > buf.length - p) throw new Error(`journal record: event payload length ${len} exceeds record`);
    const data = len > 0 ? JSON.parse(buf.toString("utf8", p, p + len)) : undefined;
    p += len;
    out.push({ type, offset, attempt, time, data });
  }
  return out;
}
