// SPDX-License-Identifier: Apache-2.0
/**
 * Client stubs derived from the operation table (src/wire/ops.ts): one function per request
 * op, `rpc.CreateTopic(meta)`, sending it with the table's retry rule. Ops whose retry safety
 * depends on the request (`retry: "caller"` in the table) require the call to say.
 */
import { OPS, type CallerRetryOpName, type Frame, type Op, type RequestOpName } from "../wire/index.js";

export interface CallOptions {
  body?: Buffer | null;
  signal?: AbortSignal;
  /** Added to the request deadline (long-polls). */
  extraTimeoutMs?: number;
}

export type Stub<N extends RequestOpName> = N extends CallerRetryOpName
  ? (meta: object, opts: CallOptions & { retry: boolean }) => Promise<Frame>
  : (meta: object, opts?: CallOptions) => Promise<Frame>;

/** HELLO belongs to the handshake, not to the stubs. */
export type Rpc = { readonly [N in Exclude<RequestOpName, "Hello">]: Stub<N> };

export type RequestFn = (
  op: Op,
  meta: unknown,
  body: Buffer | null,
  o: { retry: boolean; signal?: AbortSignal; extraTimeoutMs?: number },
) => Promise<Frame>;

export function stubs(request: RequestFn): Rpc {
  const out: Record<string, (meta: object, o?: CallOptions & { retry?: boolean }) => Promise<Frame>> = {};
  for (const [name, spec] of Object.entries(OPS)) {
    if (spec.kind !== "request" || name === "Hello") continue;
    out[name] = (meta, o = {}) =>
      request(spec.code, meta, o.body ?? null, { retry: o.retry ?? spec.retry === true, signal: o.signal, extraTimeoutMs: o.extraTimeoutMs });
  }
  return Object.freeze(out) as Rpc;
}
