// SPDX-License-Identifier: Apache-2.0
/**
 * The server layer's limits and defaults, declared once: `startServer()` and `sluice serve`
 * (src/cli/serve.ts) read them from here, and docs/protocol.md §2 lists them.
 */
import { DEFAULT_MAX_FRAME_BYTES } from "../wire/index.js";
import type { ConnectionLimits } from "./session.js";

export const DEFAULT_LIMITS: ConnectionLimits = {
  maxFrameBytes: DEFAULT_MAX_FRAME_BYTES,
  maxInFlight: 1024,
  maxInFlightBytes: 64 * 1024 * 1024,
  maxInFlightBytesTotal: 512 * 1024 * 1024,
  maxOutputBytes: 8 * 1024 * 1024,
  maxRecordsPerBatch: 100_000,
  maxSubscriptionsPerConnection: 256,
  minSessionTimeoutMs: 500,
  maxSessionTimeoutMs: 300_000,
  defaultSessionTimeoutMs: 10_000,
  /** AUTH-1: an unauthenticated peer holds its socket this long at most. */
  handshakeTimeoutMs: 5_000,
};

/** Listening defaults: loopback only, so a broker is never exposed on every interface by accident. */
export const DEFAULT_HOST = "127.0.0.1";
export const DEFAULT_PORT = 7070;
export const DEFAULT_HTTP_PORT = 7071;
export const DEFAULT_MAX_CONNECTIONS = 10_000;
/** Largest HTTP request body, enforced while it streams in. */
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;
/** Records or jobs per HTTP produce/enqueue request. */
export const MAX_HTTP_ITEMS_PER_REQUEST = 10_000;
/** HTTP fetch: default and largest `maxBytes`. */
export const HTTP_DEFAULT_FETCH_BYTES = 1024 * 1024;
export const HTTP_MAX_FETCH_BYTES = 8 * 1024 * 1024;
/** `sluice serve`: how long a graceful shutdown may take before the process exits anyway. */
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 10_000;
