// SPDX-License-Identifier: Apache-2.0
/**
 * Job results (`job.ack(result)`, a `process()` handler's return value) and `getJob`: the
 * checks and conversions shared by the embedded queue, the network client and the server.
 * A result travels and is stored as JSON text; it is checked here, before anything is written.
 */
import { decodeValue, type ValueKind } from "../log/record-batch.js";
import { ValidationError } from "../errors.js";
import type { StoredBrowsedJob, StoredBrowseRequest, StoredChildOutcome, StoredJobInfo } from "../store/queue-store.js";
import { DEFAULT_BROWSE_LIMIT, MAX_BROWSE_BYTES, MAX_BROWSE_LIMIT, MAX_PROGRESS_BYTES, MAX_RESULT_BYTES } from "./config.js";
import type { BrowsedJob, BrowseOptions, ChildOutcome, JobInfo } from "./types.js";

/** `result` as JSON text; ValidationError when it is not JSON-serialisable or too large. */
export function encodeResult(result: unknown): string {
  let json: string | undefined;
  try {
    json = JSON.stringify(result);
  } catch (e) {
    throw new ValidationError(`job result is not JSON-serialisable: ${(e as Error)?.message ?? String(e)}`);
  }
  if (json === undefined) throw new ValidationError(`job result is not JSON-serialisable (${typeof result})`);
  checkResultText(json);
  return json;
}

/** Checks JSON text of a result (as it arrives from a network client). */
export function checkResultText(json: string): void {
  // UTF-8 bytes are at most 3 per UTF-16 unit: only long strings need counting.
  const bytes = json.length * 3 <= MAX_RESULT_BYTES ? json.length : Buffer.byteLength(json, "utf8");
  if (bytes > MAX_RESULT_BYTES) throw new ValidationError(`job result is ${bytes} bytes as JSON, above the limit of ${MAX_RESULT_BYTES}; ack without it or nack`);
}

/** A job's progress as JSON text; ValidationError when it is not JSON-serialisable or above MAX_PROGRESS_BYTES. */
export function encodeProgress(value: unknown): string {
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (e) {
    throw new ValidationError(`job progress is not JSON-serialisable: ${(e as Error)?.message ?? String(e)}`);
  }
  if (json === undefined) throw new ValidationError(`job progress is not JSON-serialisable (${typeof value})`);
  checkProgressText(json);
  return json;
}

/** Checks JSON text of a progress value (as it arrives from a network client); returns its value. */
export function checkProgressText(json: string): unknown {
  const bytes = json.length * 3 <= MAX_PROGRESS_BYTES ? json.length : Buffer.byteLength(json, "utf8");
  if (bytes > MAX_PROGRESS_BYTES) throw new ValidationError(`job progress is ${bytes} bytes as JSON, above the limit of ${MAX_PROGRESS_BYTES}`);
  try {
    return JSON.parse(json);
  } catch {
    throw new ValidationError("job progress is not JSON text");
  }
}

/** What `getJob` returns, from what the store reports (payload and result decoded). */
export function toJobInfo<T>(s: StoredJobInfo): JobInfo<T> {
  const out: JobInfo<T> = { id: s.id, state: s.state, attempts: s.attempts };
  if (s.record !== undefined) {
    try {
      out.data = decodeValue(s.record.value, s.record.valueKind as ValueKind) as T;
    } catch {
      out.data = s.record.value as T;
    }
  }
  if (s.result !== undefined) out.result = JSON.parse(s.result);
  if (s.lastError !== undefined) out.lastError = s.lastError;
  if (s.completedAt !== undefined) out.completedAt = s.completedAt;
  if (s.progress !== undefined) out.progress = JSON.parse(s.progress);
  if (s.group !== undefined) out.group = s.group;
  if (s.parentId !== undefined) out.parentId = s.parentId;
  if (s.children !== undefined) out.children = childOutcomes(s.children);
  return out;
}

/** A parent's children as users see them: results parsed (FLOW-2). */
function childOutcomes(c: Record<string, StoredChildOutcome>): Record<string, ChildOutcome> {
  const out: Record<string, ChildOutcome> = {};
  for (const [id, o] of Object.entries(c)) {
    const x: ChildOutcome = { state: o.state };
    if (o.result !== undefined) x.result = JSON.parse(o.result);
    if (o.error !== undefined) x.error = o.error;
    out[id] = x;
  }
  return out;
}

/** `browse()` options checked and bounded for the store (ValidationError when bad). */
export function browseRequest(opts: BrowseOptions | undefined): StoredBrowseRequest {
  const o = opts ?? {};
  if (typeof o !== "object") throw new ValidationError("browse options must be an object");
  const limit = o.limit ?? DEFAULT_BROWSE_LIMIT;
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > MAX_BROWSE_LIMIT)
    throw new ValidationError(`browse: limit must be an integer in [1, ${MAX_BROWSE_LIMIT}], got ${String(limit)}`);
  if (o.after !== undefined && o.after !== null && typeof o.after !== "string") throw new ValidationError("browse: after must be a job id (a string)");
  const state = o.state ?? "all";
  if (state !== "waiting" && state !== "delayed" && state !== "all") throw new ValidationError(`browse: state must be waiting, delayed or all, got ${JSON.stringify(state)}`);
  return { after: o.after ?? null, limit, maxBytes: MAX_BROWSE_BYTES, state };
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** Header values as strings where they are valid UTF-8 (what people read), else their bytes. */
export function readableHeaders(h: Iterable<[string, string | Uint8Array]> | null): Record<string, string | Uint8Array> {
  const out: Record<string, string | Uint8Array> = {};
  if (h === null) return out;
  for (const [k, v] of h) {
    if (typeof v === "string") out[k] = v;
    else {
      try {
        out[k] = strictUtf8.decode(v);
      } catch {
        out[k] = v;
      }
    }
  }
  return out;
}

/** What `browse` lists, from what the store reports (payload decoded, headers readable). */
export function toBrowsedJob<T>(s: StoredBrowsedJob): BrowsedJob<T> {
  let data: T;
  try {
    data = decodeValue(s.value, s.valueKind) as T;
  } catch {
    data = s.value as T;
  }
  return {
    id: s.id,
    state: s.state,
    attempts: s.attempts,
    data,
    key: s.key,
    enqueuedAt: s.enqueuedAt,
    headers: readableHeaders(s.headers),
    redriveCount: s.redriveCount,
    deadLetter: s.deadLetter,
    ...(s.group !== undefined ? { group: s.group } : {}),
  };
}
