// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueue input validation: user input (or the network server's decoded wire records) becomes
 * `NewJob`s, the neutral form every engine stores. Bad input throws ValidationError or
 * RecordTooLargeError here, before anything reaches the engine.
 */
import { RecordTooLargeError, ValidationError } from "../errors.js";
import { prepareValue, recordSize, type PreparedRecord, type ValueKind } from "../log/record-batch.js";
import { isSystemHeader, RESERVED_HEADER_PREFIX, SYSTEM_DEDUPE_PREFIX, type NewJob } from "../store/queue-store.js";
import { MAX_DEDUPE_ID_BYTES, MAX_DELAY_MS, MAX_HEADERS, MAX_KEY_BYTES } from "./config.js";
import type { EnqueueItem } from "./types.js";


/** The options of an enqueue item without its data. */
export type EnqueueItemOptions = Omit<EnqueueItem, "data">;

/** A user's enqueue item (value of any kind). */
export function prepareItem(item: EnqueueItem, maxMessageBytes: number, dedupeWindowMs: number, now: number): NewJob {
  const { value, valueKind } = prepareValue(item.data);
  return prepareRaw(value, valueKind, item, maxMessageBytes, dedupeWindowMs, now);
}

/** A job whose value is already bytes of a known kind (the network server stores the client's encoding as is). */
export function prepareRaw(value: Buffer | null, valueKind: ValueKind, item: EnqueueItemOptions, maxMessageBytes: number, dedupeWindowMs: number, now: number): NewJob {
  let key: string | null = null;
  if (item.key !== undefined && item.key !== null) {
    if (typeof item.key !== "string") throw new ValidationError("key must be a string");
    if (Buffer.byteLength(item.key) > MAX_KEY_BYTES) throw new ValidationError(`key longer than ${MAX_KEY_BYTES} bytes`);
    key = item.key;
  }
  if (item.delayMs !== undefined && item.deliverAt !== undefined) throw new ValidationError("use delayMs or deliverAt, not both");
  let deliverAt = now;
  if (item.delayMs !== undefined) {
    if (typeof item.delayMs !== "number" || !Number.isFinite(item.delayMs) || item.delayMs < 0 || item.delayMs > MAX_DELAY_MS)
      throw new ValidationError("delayMs must be a number in [0, 1 year]");
    deliverAt = now + item.delayMs;
  } else if (item.deliverAt !== undefined) {
    const t = item.deliverAt instanceof Date ? item.deliverAt.getTime() : item.deliverAt;
    if (typeof t !== "number" || !Number.isFinite(t) || t > now + MAX_DELAY_MS) throw new ValidationError("deliverAt must be a time within a year");
    deliverAt = Math.max(now, t);
  }
  let dedupeId: string | null = null;
  if (item.dedupeId !== undefined) {
    if (typeof item.dedupeId !== "string" || item.dedupeId.length === 0 || Buffer.byteLength(item.dedupeId) > MAX_DEDUPE_ID_BYTES)
      throw new ValidationError(`dedupeId must be a non-empty string of at most ${MAX_DEDUPE_ID_BYTES} bytes`);
    if (item.dedupeId.startsWith(SYSTEM_DEDUPE_PREFIX)) throw new ValidationError(`dedupeId prefix "${SYSTEM_DEDUPE_PREFIX}" is reserved`);
    // Without a window a dedupeId would be silently ignored and the job stored twice.
    if (dedupeWindowMs <= 0) throw new ValidationError("dedupeId needs the queue's dedupeWindowMs > 0 (declare the queue with it: broker.queue(name, { dedupeWindowMs }))");
    dedupeId = item.dedupeId;
  }
  const record: PreparedRecord = { key: key === null ? null : Buffer.from(key, "utf8"), value, valueKind, timestamp: now, headers: prepareHeaders(item.headers) };
  // The size as the storage format measures a record (what maxMessageBytes bounds).
  const size = recordSize(record);
  if (size > maxMessageBytes) throw new RecordTooLargeError(size, maxMessageBytes);
  return { record, key, deliverAt, dedupeId, size, origin: null };
}

function prepareHeaders(h: EnqueueItem["headers"]): [string, Buffer][] | null {
  // Most jobs have no headers at all: no array for them.
  if (h === undefined) return null;
  if (h === null || typeof h !== "object") throw new ValidationError("headers must be an object");
  const names = Object.keys(h);
  if (names.length > MAX_HEADERS) throw new ValidationError(`at most ${MAX_HEADERS} headers`);
  if (names.length === 0) return null;
  const out: [string, Buffer][] = [];
  for (const k of names) {
    if (isSystemHeader(k)) throw new ValidationError(`header name ${JSON.stringify(k)} is reserved (${RESERVED_HEADER_PREFIX}*)`);
    const v = h[k];
    if (typeof v === "string") out.push([k, Buffer.from(v, "utf8")]);
    else if (v instanceof Uint8Array) out.push([k, Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
    else throw new ValidationError(`header ${JSON.stringify(k)} must be a string or Uint8Array`);
  }
  return out;
}
