// SPDX-License-Identifier: Apache-2.0
/**
 * Errors on the wire (docs/protocol.md §3): an error response's meta is
 * `{ code, message, retriable, details? }`. Both directions read the registry in src/errors.ts,
 * so the client rebuilds exactly the class the broker raised.
 */
import { BrokerError, InternalError, errorSpec, type WireDetails } from "../errors.js";

export interface WireError {
  code: string;
  message: string;
  retriable: boolean;
  details?: WireDetails;
}

export function errorToWire(err: unknown): WireError {
  if (err instanceof BrokerError) {
    return { code: err.code, message: err.message, retriable: err.retriable, details: err.wireDetails() ?? {} };
  }
  const message = err instanceof Error ? err.message : String(err);
  const internal = new InternalError(`internal server error: ${message}`);
  return { code: internal.code, message: internal.message, retriable: internal.retriable };
}

/** Rebuilds the error a server raised, so `instanceof errors.X` works on the client. A code
 * this version does not know stays a `BrokerError` with the code and retriability sent. */
export function wireToError(w: WireError): BrokerError {
  const code = String(w.code);
  const message = String(w.message ?? "");
  const spec = errorSpec(code);
  if (spec === undefined) return new BrokerError(code, message, { retriable: Boolean(w.retriable) });
  const details = w.details !== null && typeof w.details === "object" ? w.details : {};
  const e = spec.fromWire(details);
  // Keep the server's exact message (several constructors build their own text).
  e.message = message;
  return e;
}
