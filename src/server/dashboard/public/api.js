// SPDX-License-Identifier: Apache-2.0
// The dashboard reads and acts only through the broker's HTTP API (the same routes as the CLI
// and clients use), so it gets the same checks and the same errors. On a server with users or
// tokens every call carries the credential typed into the login form (login.js), as an
// Authorization header; the browser's own credentials are never used (see `request`).

/** Where the Authorization header value lives: this tab's sessionStorage only, gone when the
 * tab closes; never localStorage, a cookie or a URL. */
const CREDENTIAL_KEY = "sluice.dashboard.authorization";

export const credential = {
  get() {
    return globalThis.sessionStorage?.getItem(CREDENTIAL_KEY) ?? null;
  },
  set(value) {
    sessionStorage.setItem(CREDENTIAL_KEY, value);
  },
  forget() {
    globalThis.sessionStorage?.removeItem(CREDENTIAL_KEY);
  },
};

/** Called once with the ApiError when the server refuses the stored credential (401). */
let onRefused = null;
export function whenRefused(fn) {
  onRefused = fn;
}

/**
 * fetch with the stored credential (or `authorization` when given: a login attempt, whose 401
 * is the caller's to show). `credentials: "omit"`: the browser neither attaches HTTP
 * authentication it cached nor opens its own password dialog on the server's 401 challenge,
 * so logging out here really logs out and the page's login form is the only one shown.
 */
async function request(path, init, authorization) {
  const auth = authorization === undefined ? credential.get() : authorization;
  const headers = { ...init.headers, ...(auth ? { authorization: auth } : {}) };
  try {
    return await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
  } catch (e) {
    throw new ApiError("UNREACHABLE", `the broker did not answer (${e.message})`, 0);
  }
}

/** A 401 with the stored credential: the login is over (a removed user, a revoked token). */
function refused(err, authorization) {
  if (err.status === 401 && authorization === undefined && onRefused !== null) {
    const fn = onRefused;
    onRefused = null;
    fn(err);
  }
  return err;
}

export class ApiError extends Error {
  constructor(code, message, status) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

export const enc = encodeURIComponent;

/** One JSON request; a non-2xx answer throws ApiError with the broker's error code.
 * `opts.authorization`: send this Authorization value (null: none) instead of the stored one. */
export async function api(method, path, body, opts = {}) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await request(path, init, opts.authorization);
  const json = parse(await res.text());
  if (!res.ok) throw refused(failure(res, json), opts.authorization);
  return json;
}

/** A text resource (the Prometheus exposition); null when the server answers 404. */
export async function apiText(path) {
  const res = await request(path, {}, undefined);
  if (res.status === 404) return null;
  const text = await res.text();
  if (!res.ok) throw refused(failure(res, parse(text)), undefined);
  return text;
}

function parse(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

/** The broker's error ({ error: { code, message } }) as an ApiError. */
function failure(res, json) {
  const err = json && json.error;
  return new ApiError(err?.code ?? `HTTP_${res.status}`, err?.message ?? (res.statusText || "request failed"), res.status);
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
