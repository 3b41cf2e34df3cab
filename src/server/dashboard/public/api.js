// SPDX-License-Identifier: Apache-2.0
// The dashboard reads and acts only through the broker's HTTP API (the same routes as the CLI
// and clients use), so it gets the same checks and the same errors.

export class ApiError extends Error {
  constructor(code, message, status) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

export const enc = encodeURIComponent;

/** One JSON request; a non-2xx answer throws ApiError with the broker's error code. */
export async function api(method, path, body) {
  const init = { method, cache: "no-store", headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError("UNREACHABLE", `the broker did not answer (${e.message})`, 0);
  }
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!res.ok) {
    const err = json && json.error;
    throw new ApiError(err?.code ?? `HTTP_${res.status}`, err?.message ?? (res.statusText || "request failed"), res.status);
  }
  return json;
}

/** A text resource (the Prometheus exposition); null when the server answers 404. */
export async function apiText(path) {
  const res = await fetch(path, { cache: "no-store" });
  if (res.status === 404) return null;
  if (!res.ok) throw new ApiError(`HTTP_${res.status}`, `GET ${path} failed`, res.status);
  return res.text();
}

/** The one line an error is shown as: "CODE: message". */
export function errorLine(e) {
  if (e instanceof ApiError) return `${e.code}: ${e.message}`;
  return `ERROR: ${e?.message ?? String(e)}`;
}

/** Runs `fn` on items with at most `limit` requests in flight (browsers queue the rest anyway;
 * this keeps one poll from flooding the broker). */
export async function mapLimit(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      try {
        out[i] = { ok: true, value: await fn(items[i]) };
      } catch (e) {
        out[i] = { ok: false, error: e };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
