// SPDX-License-Identifier: Apache-2.0
/**
 * Enqueue input validation: user input (or the network server's decoded wire records) becomes
 * `NewJob`s, the neutral form every engine stores. Bad input throws ValidationError or
 * RecordTooLargeError here, before anything reaches the engine.
 */
import { RecordTooLargeError, ValidationError } from "../errors.js";
import { prepareValue, recordSize, type PreparedRecord, type ValueKind } from "../log/record-batch.js";
import { isSystemHeader, RESERVED_HEADER_PREFIX, SYSTEM_DEDUPE_PREFIX, type FlowLink, type NewJob, type SingletonSpec } from "../store/queue-store.js";
import { MAX_BATCH_ITEMS, MAX_DEDUPE_ID_BYTES, MAX_DELAY_MS, MAX_HEADERS, MAX_KEY_BYTES, MAX_PRIORITY, MAX_SINGLETON_WINDOW_MS } from "./config.js";
import type { EnqueueItem } from "./types.js";


/**
 * The options of an enqueue item without its data; `flow` is set by `enqueueFlow` (flows.ts),
 * never by users directly (it travels in QUEUE_ENQUEUE's per-job options).
 */
export type EnqueueItemOptions = Omit<EnqueueItem, "data"> & { flow?: FlowLink };

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
  const job: NewJob = { record, key, deliverAt, dedupeId, size, origin: null, priority: 0, expiresAt: 0, singleton: null };
  // Most jobs set none of these: one check for all of them.
  if (item.priority !== undefined || item.expireInMs !== undefined || item.expiresAt !== undefined || item.singletonKey !== undefined || item.singletonMode !== undefined || item.singletonWindowMs !== undefined || item.flow !== undefined || item.group !== undefined)
    jobOptions(job, item, now);
  return job;
}

/** Priority, group, expiry and singleton key of a job (validated; docs on `EnqueueOptions`). */
function jobOptions(job: NewJob, item: EnqueueItemOptions, now: number): void {
  if (item.group !== undefined) {
    const g = item.group;
    if (typeof g !== "string" || g.length === 0 || Buffer.byteLength(g) > MAX_KEY_BYTES) throw new ValidationError(`group must be a non-empty string of at most ${MAX_KEY_BYTES} bytes`);
    job.group = g;
  }
  if (item.priority !== undefined && item.priority !== null) {
    if (!Number.isInteger(item.priority) || item.priority < 0 || item.priority > MAX_PRIORITY)
      throw new ValidationError(`priority must be an integer in [0, ${MAX_PRIORITY}] (higher first)`);
    job.priority = item.priority;
  }
  if (item.expireInMs !== undefined && item.expiresAt !== undefined) throw new ValidationError("use expireInMs or expiresAt, not both");
  if (item.expireInMs !== undefined) {
    if (typeof item.expireInMs !== "number" || !Number.isFinite(item.expireInMs) || item.expireInMs <= 0 || item.expireInMs > MAX_DELAY_MS)
      throw new ValidationError("expireInMs must be a number in (0, 1 year]");
    job.expiresAt = now + item.expireInMs;
  } else if (item.expiresAt !== undefined) {
    const t = item.expiresAt instanceof Date ? item.expiresAt.getTime() : item.expiresAt;
    if (typeof t !== "number" || !Number.isFinite(t) || t <= 0 || t > now + MAX_DELAY_MS) throw new ValidationError("expiresAt must be a time within a year");
    job.expiresAt = t;
  }
  if (item.flow !== undefined) job.flow = flowLink(item);
  if (item.singletonKey === undefined) {
    if (item.singletonMode !== undefined || item.singletonWindowMs !== undefined) throw new ValidationError("singletonMode and singletonWindowMs need a singletonKey");
    return;
  }
  const key = item.singletonKey;
  if (typeof key !== "string" || key.length === 0 || Buffer.byteLength(key) > MAX_DEDUPE_ID_BYTES)
    throw new ValidationError(`singletonKey must be a non-empty string of at most ${MAX_DEDUPE_ID_BYTES} bytes`);
  const mode = item.singletonMode ?? "singleton";
  if (mode !== "singleton" && mode !== "debounce" && mode !== "throttle") throw new ValidationError(`singletonMode must be "singleton", "debounce" or "throttle"`);
  const w = item.singletonWindowMs ?? 0;
  if (typeof w !== "number" || !Number.isFinite(w) || w < 0 || w > MAX_SINGLETON_WINDOW_MS) throw new ValidationError("singletonWindowMs must be a number in [0, 30 days]");
  if (mode === "throttle" && w <= 0) throw new ValidationError(`singletonMode "throttle" needs singletonWindowMs > 0`);
  const singleton: SingletonSpec = { key, mode, windowMs: w };
  job.singleton = singleton;
  // Debounce: the job waits out its quiet period (a later enqueue replaces it meanwhile).
  if (mode === "debounce" && w > 0) job.deliverAt = Math.max(job.deliverAt, now + w);
}

/** A flow job's link (its shape across the call is checked by `checkFlowShape`). */
function flowLink(item: EnqueueItemOptions): FlowLink {
  const f = item.flow;
  if (f === null || typeof f !== "object") throw new ValidationError("flow must be an object");
  const { parentDelta, children, onChildFailure } = f;
  if (!Number.isSafeInteger(parentDelta) || parentDelta < 0 || parentDelta >= MAX_BATCH_ITEMS) throw new ValidationError("flow.parentDelta must be an integer in [0, 10000)");
  if (!Number.isSafeInteger(children) || children < 0 || children >= MAX_BATCH_ITEMS) throw new ValidationError("flow.children must be an integer in [0, 10000)");
  if (onChildFailure !== "fail" && onChildFailure !== "continue") throw new ValidationError(`onChildFailure must be "fail" or "continue"`);
  // A flow's jobs are stored together or not at all (FLOW-1); a dedupe or singleton decision
  // could drop one of them alone.
  if (item.dedupeId !== undefined || item.singletonKey !== undefined) throw new ValidationError("jobs of a flow cannot have a dedupeId or singletonKey");
  return { parentDelta, children, onChildFailure };
}

/**
 * FLOW-1: the jobs of one enqueue call that belong to flows form whole trees: each parent comes
 * before its children (parentDelta points back inside the call, at a job that declares
 * children) and declares exactly as many children as point at it. Checked before anything is
 * stored, wherever the call came from (a network client's options are not trusted).
 */
export function checkFlowShape(jobs: readonly NewJob[], from = 0, to = jobs.length): void {
  let counted: Map<number, number> | null = null;
  for (let i = from; i < to; i++) {
    const f = jobs[i].flow;
    if (!f) continue;
    counted ??= new Map();
    if (f.parentDelta > 0) {
      const p = i - f.parentDelta;
      const pf = p >= from ? jobs[p].flow : undefined;
      if (!pf || pf.children === 0) throw new ValidationError("flow: a child's parent must come before it in the same call");
      counted.set(p, (counted.get(p) ?? 0) + 1);
    }
  }
  if (counted === null) return;
  for (let i = from; i < to; i++) {
    const f = jobs[i].flow;
    if (f && f.children !== (counted.get(i) ?? 0)) throw new ValidationError("flow: a parent must declare exactly its children");
  }
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
