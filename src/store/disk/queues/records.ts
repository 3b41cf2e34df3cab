// SPDX-License-Identifier: Apache-2.0
/**
 * How a job is laid out as a record of the queue's message log: key = FIFO key, value =
 * payload, headers = user headers plus the reserved `sluice-*` headers below (the engine's own
 * columns; user header names may not start with `sluice-`, the policy layer refuses them).
 */
import { recordSize, type PreparedRecord, type StoredRecord } from "../../../log/record-batch.js";
import type { DeadLetterInfo } from "../../../queues/types.js";
import { isSystemHeader, type ChildFailurePolicy, type FlowLink, type NewJob, type SingletonMode } from "../../queue-store.js";

/** Delivery time (f64 ms) of a job enqueued with a delay. */
export const H_DELIVER_AT = "sluice-at";
/** Dedupe id (UTF-8). */
export const H_DEDUPE = "sluice-dd";
/** Redrive count (decimal). */
export const H_REDRIVES = "sluice-rd";
/** First enqueue of the original job (decimal ms), on redriven jobs. */
export const H_FIRST_ENQUEUED = "sluice-fe";
/** Dead-letter record (JSON of DeadLetterInfo + key), on jobs in a dead-letter queue. */
export const H_DLQ = "sluice-dlq";
/** Priority (u8, 1..MAX_PRIORITY; absent = 0), on jobs enqueued with one. */
export const H_PRIORITY = "sluice-pr";
/** Group (UTF-8), on jobs enqueued with one (GRP-Q1/GRP-Q2). */
export const H_GROUP = "sluice-gr";
/** Expiry (f64 wall-clock ms): not started by then, the job is dead-lettered or dropped. */
export const H_EXPIRES = "sluice-ex";
/**
 * Singleton key (singletons.ts): mode u8 (1 singleton, 2 debounce, 3 throttle) | window f64 ms |
 * replaces f64 (the debounced job this one replaced, -1 none) | key UTF-8.
 */
export const H_SINGLETON = "sluice-sk";
/**
 * A job's place in a flow (FLOW-1): parentDelta f64 (how many offsets back its parent is; 0
 * none) | children u32 (how many it waits for) | policy u8 (1 fail, 2 continue).
 */
export const H_FLOW = "sluice-fl";
/**
 * Room the message log leaves above `maxMessageBytes` for the reserved headers (delivery time,
 * dedupe id, idempotent request, redrive fields), so a job the policy admitted always fits.
 */
export const RESERVED_HEADER_ROOM = 4096;
/** A dead-letter record larger than this keeps only the last 3 attempts of its history. */
const MAX_DLQ_META_BYTES = 256 * 1024;

export function getHeader(h: [string, Buffer][] | null, name: string): Buffer | undefined {
  if (h) for (const [k, v] of h) if (k === name) return v;
  return undefined;
}

/** The record a new job is stored as: the policy's record, with the reserved headers it needs. */
export function encodeJob(job: NewJob): PreparedRecord {
  const r = job.record;
  // Most jobs carry no reserved header at all: stored as handed over (the hot path).
  if (job.origin === null && job.deliverAt <= r.timestamp && job.dedupeId === null && !job.priority && !job.expiresAt && !job.singleton && !job.flow && !job.group) return r;
  const out: [string, Buffer][] = r.headers === null ? [] : [...r.headers];
  const o = job.origin;
  if (o !== null) {
    if (o.redriveCount > 0) out.push([H_REDRIVES, Buffer.from(String(o.redriveCount))]);
    if (o.firstEnqueuedAt !== r.timestamp) out.push([H_FIRST_ENQUEUED, Buffer.from(String(o.firstEnqueuedAt))]);
    if (o.deadLetter !== null) out.push([H_DLQ, dlqMeta(o.deadLetter)]);
  }
  if (job.deliverAt > r.timestamp) {
    const b = Buffer.allocUnsafe(8);
    b.writeDoubleLE(job.deliverAt, 0);
    out.push([H_DELIVER_AT, b]);
  }
  if (job.dedupeId !== null) out.push([H_DEDUPE, Buffer.from(job.dedupeId, "utf8")]);
  if (job.priority) out.push([H_PRIORITY, Buffer.from([job.priority])]);
  if (job.group) out.push([H_GROUP, Buffer.from(job.group, "utf8")]);
  if (job.expiresAt) {
    const b = Buffer.allocUnsafe(8);
    b.writeDoubleLE(job.expiresAt, 0);
    out.push([H_EXPIRES, b]);
  }
  if (job.singleton) out.push([H_SINGLETON, encodeSingleton(job.singleton.mode, job.singleton.windowMs, -1, job.singleton.key)]);
  if (job.flow) out.push([H_FLOW, encodeFlow(job.flow)]);
  return { ...r, headers: out.length > 0 ? out : null };
}

const SINGLETON_MODES = ["singleton", "debounce", "throttle"] as const;

/** The singleton header (H_SINGLETON). */
export function encodeSingleton(mode: SingletonMode, windowMs: number, replaces: number, key: string): Buffer {
  const k = Buffer.from(key, "utf8");
  const b = Buffer.allocUnsafe(17 + k.length);
  b[0] = SINGLETON_MODES.indexOf(mode) + 1;
  b.writeDoubleLE(windowMs, 1);
  b.writeDoubleLE(replaces, 9);
  k.copy(b, 17);
  return b;
}

/** A stored job's singleton key, or null (absent or malformed). */
export function singletonOf(r: PreparedRecord): { mode: SingletonMode; windowMs: number; replaces: number; key: string } | null {
  const b = getHeader(r.headers, H_SINGLETON);
  if (b === undefined || b.length < 17) return null;
  const mode = SINGLETON_MODES[b[0] - 1];
  if (mode === undefined) return null;
  return { mode, windowMs: b.readDoubleLE(1), replaces: b.readDoubleLE(9), key: b.toString("utf8", 17) };
}

const FLOW_POLICIES: readonly ChildFailurePolicy[] = ["fail", "continue"];

function encodeFlow(f: FlowLink): Buffer {
  const b = Buffer.allocUnsafe(13);
  b.writeDoubleLE(f.parentDelta, 0);
  b.writeUInt32LE(f.children, 8);
  b[12] = FLOW_POLICIES.indexOf(f.onChildFailure) + 1;
  return b;
}

/** A stored job's place in a flow, or null (none, or malformed). */
export function flowOf(r: PreparedRecord): FlowLink | null {
  const b = getHeader(r.headers, H_FLOW);
  if (b === undefined || b.length !== 13) return null;
  const onChildFailure = FLOW_POLICIES[b[12] - 1];
  const parentDelta = b.readDoubleLE(0);
  if (onChildFailure === undefined || !Number.isSafeInteger(parentDelta) || parentDelta < 0) return null;
  return { parentDelta, children: b.readUInt32LE(8), onChildFailure };
}

/** A stored job's priority (0 when it has none). */
export function priorityOf(r: PreparedRecord): number {
  const p = getHeader(r.headers, H_PRIORITY);
  return p !== undefined && p.length === 1 ? p[0] : 0;
}

/** A stored job's group, or null when it has none. */
export function groupOf(r: PreparedRecord): string | null {
  const g = getHeader(r.headers, H_GROUP);
  return g === undefined || g.length === 0 ? null : g.toString("utf8");
}

/** A stored job's expiry (wall-clock ms), or 0 when it has none. */
export function expiresAtOf(r: PreparedRecord): number {
  const e = getHeader(r.headers, H_EXPIRES);
  return e !== undefined && e.length === 8 ? e.readDoubleLE(0) : 0;
}

/** The same record with one more reserved header (the idempotent request's identity). */
export function withHeader(r: PreparedRecord, name: string, value: Buffer): PreparedRecord {
  const h: [string, Buffer] = [name, value];
  return { ...r, headers: r.headers === null ? [h] : [...r.headers, h] };
}

function dlqMeta(info: DeadLetterInfo & { key: string | null }): Buffer {
  let meta = Buffer.from(JSON.stringify(info), "utf8");
  if (meta.length > MAX_DLQ_META_BYTES) meta = Buffer.from(JSON.stringify({ ...info, history: info.history.slice(-3) }), "utf8");
  return meta;
}

/** Encoded size as the log checks it (the policy checked the user part; this adds ours). */
export function encodedSize(rec: PreparedRecord): number {
  return recordSize(rec);
}

/** Bytes a stored job counts against `maxBytes` after recovery (payload and key). */
export function storedSize(r: StoredRecord): number {
  return (r.value?.length ?? 0) + (r.key?.length ?? 0) + 16;
}

/** Wall-clock time the stored job becomes deliverable. */
export function deliverAtOf(r: PreparedRecord): number {
  const at = getHeader(r.headers, H_DELIVER_AT);
  return at !== undefined && at.length === 8 ? at.readDoubleLE(0) : r.timestamp;
}

export function dedupeIdOf(r: PreparedRecord): string | null {
  const d = getHeader(r.headers, H_DEDUPE);
  return d === undefined ? null : d.toString("utf8");
}

/** The dead-letter record of a job in a dead-letter queue (with the source job's key). */
export function deadLetterOf(r: PreparedRecord): (DeadLetterInfo & { key?: string | null }) | null {
  const m = getHeader(r.headers, H_DLQ);
  return m === undefined ? null : (JSON.parse(m.toString("utf8")) as DeadLetterInfo & { key?: string | null });
}

export function redriveCountOf(r: PreparedRecord): number {
  const rd = getHeader(r.headers, H_REDRIVES);
  return rd === undefined ? 0 : Number(rd.toString("utf8")) || 0;
}

export function firstEnqueuedAtOf(r: PreparedRecord): number {
  const fe = getHeader(r.headers, H_FIRST_ENQUEUED);
  return fe === undefined ? r.timestamp : Number(fe.toString("utf8")) || r.timestamp;
}

/** User headers only (null when there are none). */
export function userHeaders(h: [string, Buffer][] | null): [string, Buffer][] | null {
  if (h === null) return null;
  let out: [string, Buffer][] | null = null;
  for (const e of h) if (!isSystemHeader(e[0])) (out ??= []).push(e);
  return out;
}

/** The fields of a stored job that take decoding (read once per delivery, on first access). */
export interface DecodedJobFields {
  key: string | null;
  /** User headers only. */
  headers: [string, Buffer][] | null;
  redriveCount: number;
  /** The stored record also names the source job's key (for redrive); harmless to expose. */
  deadLetter: DeadLetterInfo | null;
}

export function decodeJobFields(r: PreparedRecord): DecodedJobFields {
  return {
    key: r.key === null ? null : r.key.toString("utf8"),
    headers: userHeaders(r.headers),
    redriveCount: r.headers === null ? 0 : redriveCountOf(r),
    deadLetter: r.headers === null ? null : deadLetterOf(r),
  };
}
