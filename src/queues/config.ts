// SPDX-License-Identifier: Apache-2.0
/**
 * Queue policy: config validation and defaults, and the limits of the queue API, declared once
 * for every layer that checks them (the embedded queue, the network client and server).
 * Engines receive the resolved settings (`QueueSettings`, src/store/queue-store.ts).
 */
import { ValidationError } from "../errors.js";
import type { QueueSettings } from "../store/queue-store.js";
import type { QueueConfig } from "./types.js";

/** Unsettled jobs a worker may hold (`prefetch`), and handlers `process()` runs at once. */
export const MAX_PREFETCH = 10_000;
export const DEFAULT_PREFETCH = 16;
/**
 * Settlements of one worker issued and not yet durable (un-awaited acks): above this the worker
 * takes and hands out no jobs, which bounds what a crash delivers again.
 */
export const DEFAULT_MAX_PENDING_SETTLEMENTS = 1000;
export const MAX_PENDING_SETTLEMENTS = 100_000;
/** Handlers `process()` runs at once by default. */
export const DEFAULT_PROCESS_CONCURRENCY = 1;
export const MAX_ATTEMPTS_LIMIT = 1000;
export const MAX_KEY_BYTES = 1024;
export const MAX_DEDUPE_ID_BYTES = 256;
/** Highest job priority (`EnqueueOptions.priority`: 0 .. MAX_PRIORITY, higher first). */
export const MAX_PRIORITY = 9;
/** Longest `singletonWindowMs`: 30 days. */
export const MAX_SINGLETON_WINDOW_MS = 30 * 86_400_000;
export const MAX_HEADERS = 64;
/** Jobs per enqueueBatch (also per network enqueue request). */
export const MAX_BATCH_ITEMS = 10_000;
/** Error messages are cut to this many characters in history and DLQ metadata. */
export const MAX_ERROR_CHARS = 500;
/** Longest delay (`delayMs`, `deliverAt`, nack `delayMs`): a year. */
export const MAX_DELAY_MS = 366 * 86_400_000;
/** Longest lease (`visibilityTimeoutMs`, `extend(ms)`). */
export const MAX_LEASE_MS = 12 * 3_600_000;
export const MIN_LEASE_MS = 10;
/** A job's result (`job.ack(result)`) as JSON, UTF-8 bytes: at most 64 KiB. */
export const MAX_RESULT_BYTES = 64 * 1024;
/** A job's progress (`job.progress(value)`) as JSON, UTF-8 bytes: at most 4 KiB. */
export const MAX_PROGRESS_BYTES = 4 * 1024;
/** `queue.events()`: events per read (embedded) or per QUEUE_EVENTS answer. */
export const MAX_EVENTS_PER_READ = 1000;
/** `queue.events()`: longest wait of one read for new events (the long-poll of QUEUE_EVENTS). */
export const MAX_EVENTS_WAIT_MS = 30_000;
/** Longest `resultRetentionMs`: 30 days. */
export const MAX_RESULT_RETENTION_MS = 30 * 86_400_000;
/**
 * Memory a queue spends on retained outcomes (completed and dead-lettered jobs, kept for
 * `getJob` while `resultRetentionMs` runs): each costs its result's JSON length plus
 * RETAINED_ENTRY_BYTES; beyond this bound the oldest are forgotten before their retention ends.
 * The same entries are in every snapshot of the queue, so this also bounds the snapshot's share.
 */
export const MAX_RETAINED_BYTES = 32 * 1024 * 1024;
/** What a retained outcome costs besides its result text (map entry, object, numbers), roughly. */
export const RETAINED_ENTRY_BYTES = 128;
/** `queue.browse()`: jobs per page by default, and at most. */
export const DEFAULT_BROWSE_LIMIT = 50;
export const MAX_BROWSE_LIMIT = 1000;
/** `queue.browse()`: payload bytes per page (a page ends early above it; at least one job). */
export const MAX_BROWSE_BYTES = 4 * 1024 * 1024;
/** `rateLimit.max`: starts per window, at most (the window remembers one entry per grant round). */
export const MAX_RATE_LIMIT = 1_000_000;
/** `rateLimit.durationMs`: the longest window, a day. */
export const MAX_RATE_LIMIT_WINDOW_MS = 86_400_000;
/** `groupConcurrency`: leases per group at once, at most. */
export const MAX_GROUP_CONCURRENCY = 1_000_000;
/** Names of redacted headers per queue. */
const MAX_REDACT_HEADERS = 256;

/** The resolved config of a queue (every default filled in). */
export type ResolvedQueueConfig = QueueSettings;

function num(v: unknown, name: string, min: number, max: number, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max)
    throw new ValidationError(`${name} must be a number in [${min}, ${max}], got ${String(v)}`);
  return v;
}

/** An option that must be an integer within bounds (not floored), or its default. */
function strictInt(v: unknown, name: string, min: number, max: number, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) throw new ValidationError(`${name} must be an integer in [${min}, ${max}], got ${String(v)}`);
  return v;
}

/** An integer option within bounds (floored), or its default. */
export function intOption(v: unknown, name: string, min: number, max: number, dflt: number): number {
  return Math.floor(num(v, name, min, max, dflt));
}

/** A lease length option in [MIN_LEASE_MS, MAX_LEASE_MS], or its default. */
export function leaseOption(v: unknown, name: string, dflt: number): number {
  return num(v, name, MIN_LEASE_MS, MAX_LEASE_MS, dflt);
}

/** Validates a queue config and fills defaults. Throws ValidationError before anything is allocated. */
export function resolveQueueConfig(name: string, c: QueueConfig = {}): ResolvedQueueConfig {
  if (c === null || typeof c !== "object") throw new ValidationError("queue config must be an object");
  const minDelayMs = num(c.backoff?.minDelayMs, "backoff.minDelayMs", 0, 86_400_000, 1000);
  const maxDelayMs = num(c.backoff?.maxDelayMs, "backoff.maxDelayMs", minDelayMs, 30 * 86_400_000, Math.max(minDelayMs, 300_000));
  const type = c.backoff?.type ?? "exponential";
  if (type !== "exponential" && type !== "fixed") throw new ValidationError(`backoff.type must be "exponential" or "fixed"`);
  const overflow = c.overflow ?? "reject";
  if (overflow !== "reject" && overflow !== "block") throw new ValidationError(`overflow must be "reject" or "block"`);
  const durability = c.durability ?? "always";
  if (durability !== "always" && durability !== "interval" && durability !== "never")
    throw new ValidationError(`durability must be always|interval|never`);
  let deadLetter: string | null;
  if (c.deadLetter === undefined) deadLetter = name.endsWith(".dlq") ? null : `${name}.dlq`;
  else if (c.deadLetter === null) deadLetter = null;
  else {
    validateQueueName(c.deadLetter);
    deadLetter = c.deadLetter;
  }
  if (deadLetter === name) throw new ValidationError(`queue ${name} cannot be its own dead-letter queue`);
  const onExpire = c.onExpire ?? "dead-letter";
  if (onExpire !== "dead-letter" && onExpire !== "drop") throw new ValidationError(`onExpire must be "dead-letter" or "drop"`);
  const redact = c.redactHeaders ?? [];
  if (!Array.isArray(redact) || redact.length > MAX_REDACT_HEADERS || redact.some((h) => typeof h !== "string"))
    throw new ValidationError(`redactHeaders must be an array of at most ${MAX_REDACT_HEADERS} header names`);
  return {
    visibilityTimeoutMs: leaseOption(c.visibilityTimeoutMs, "visibilityTimeoutMs", 30_000),
    maxAttempts: intOption(c.maxAttempts, "maxAttempts", 1, MAX_ATTEMPTS_LIMIT, 5),
    backoff: { type, minDelayMs, maxDelayMs },
    deadLetter,
    maxDepth: intOption(c.maxDepth, "maxDepth", 1, 1e12, 10_000_000),
    maxBytes: intOption(c.maxBytes, "maxBytes", 1, 2 ** 50, 1024 ** 3),
    overflow,
    blockTimeoutMs: num(c.blockTimeoutMs, "blockTimeoutMs", 0, 3_600_000, 5000),
    dedupeWindowMs: num(c.dedupeWindowMs, "dedupeWindowMs", 0, 30 * 86_400_000, 0),
    maxDedupeEntries: intOption(c.maxDedupeEntries, "maxDedupeEntries", 1, 100_000_000, 1_000_000),
    redactHeaders: redact.map((h) => h.toLowerCase()),
    maxRedrives: intOption(c.maxRedrives, "maxRedrives", 0, 1000, 3),
    maxMessageBytes: intOption(c.maxMessageBytes, "maxMessageBytes", 64, 64 * 1024 * 1024 - 1024, 1024 * 1024),
    durability,
    maxInFlight: intOption(c.maxInFlight, "maxInFlight", 1, 10_000_000, 100_000),
    segmentBytes: intOption(c.segmentBytes, "segmentBytes", 16 * 1024, 1024 ** 3, 64 * 1024 * 1024),
    resultRetentionMs: strictInt(c.resultRetentionMs, "resultRetentionMs", 0, MAX_RESULT_RETENTION_MS, 0),
    onExpire,
    rateLimit: rateLimitOption(c.rateLimit),
    groupConcurrency: strictInt(c.groupConcurrency, "groupConcurrency", 0, MAX_GROUP_CONCURRENCY, 0),
    groupRateLimit: rateLimitOption(c.groupRateLimit, "groupRateLimit"),
    encrypted: boolOption(c.encrypted, "encrypted"),
  };
}

function boolOption(v: unknown, name: string): boolean {
  if (v === undefined) return false;
  if (typeof v !== "boolean") throw new ValidationError(`${name} must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

/** `rateLimit` (or `groupRateLimit`): `{ max, durationMs }` integers within bounds, or null (none). */
function rateLimitOption(v: unknown, name = "rateLimit"): { max: number; durationMs: number } | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) throw new ValidationError(`${name} must be an object { max, durationMs } or null`);
  const r = v as Record<string, unknown>;
  for (const k of Object.keys(r)) if (k !== "max" && k !== "durationMs") throw new ValidationError(`${name} has an unknown field ${JSON.stringify(k)}`);
  if (r.max === undefined || r.durationMs === undefined) throw new ValidationError(`${name} needs both max and durationMs`);
  return {
    max: strictInt(r.max, `${name}.max`, 1, MAX_RATE_LIMIT, 0),
    durationMs: strictInt(r.durationMs, `${name}.durationMs`, 1, MAX_RATE_LIMIT_WINDOW_MS, 0),
  };
}

const NAME_RE = /^[a-zA-Z0-9._-]{1,200}$/;
export function validateQueueName(name: unknown): asserts name is string {
  if (typeof name !== "string" || !NAME_RE.test(name) || name === "." || name === "..")
    throw new ValidationError(`invalid queue name ${JSON.stringify(String(name).slice(0, 300))}: use 1-200 of [a-zA-Z0-9._-], not "." or ".."`);
}

/** `prefetch` (or `concurrency`) of a worker: an integer in [1, MAX_PREFETCH]. */
export function prefetchOption(v: unknown, name: "prefetch" | "concurrency", dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > MAX_PREFETCH) throw new ValidationError(`${name} must be an integer in [1, ${MAX_PREFETCH}]`);
  return v;
}
