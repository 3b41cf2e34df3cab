// SPDX-License-Identifier: Apache-2.0
/**
 * Job results (`job.ack(result)`, a `process()` handler's return value) and `getJob`: the
 * checks and conversions shared by the embedded queue, the network client and the server.
 * A result travels and is stored as JSON text; it is checked here, before anything is written.
 */
import { decodeValue, type ValueKind } from "../log/record-batch.js";
import { ValidationError } from "../errors.js";
import type { StoredJobInfo } from "../store/queue-store.js";
import { MAX_RESULT_BYTES } from "./config.js";
import type { JobInfo } from "./types.js";

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
  return out;
}
