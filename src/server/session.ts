// SPDX-License-Identifier: Apache-2.0
/**
 * What an operation handler (src/server/handlers.ts) may use of its connection, and the shapes
 * of handlers. A handler reads the request frame, calls the broker through `BrokerHost`, and
 * returns the response meta and body; the connection sends it (or the error response).
 */
import type { ProcessingLog } from "./processing-log.js";
import { ValidationError } from "../errors.js";
import type { BrokerHost } from "../broker/host.js";
import type { AuditActor } from "../security/audit/record.js";
import type { Gate } from "./authorization.js";
import type { HostQueue } from "../queues/host-api.js";
import type { Frame, OneWayOpName, RequestOpName } from "../wire/index.js";
import type { RemoteMember } from "./remote-member.js";
import type { RemoteWorker } from "./remote-queue.js";

export interface ConnectionLimits {
  maxFrameBytes: number;
  maxInFlight: number;
  /** Bytes of request frames being executed on one connection; reading pauses above it. */
  maxInFlightBytes: number;
  /** The same across all connections of the server (a pipelining client cannot pin
   * maxInFlight x maxFrameBytes, and many clients together cannot exceed this). */
  maxInFlightBytesTotal: number;
  maxOutputBytes: number;
  maxRecordsPerBatch: number;
  maxSubscriptionsPerConnection: number;
  minSessionTimeoutMs: number;
  maxSessionTimeoutMs: number;
  defaultSessionTimeoutMs: number;
  handshakeTimeoutMs: number;
}

export interface Session {
  readonly id: number;
  /** Who logged in on this connection (a user name or a token's principal); null when the
   * server runs without credentials. Set before the first request is dispatched (AUTH-1). */
  readonly principal: string | null;
  /** The authorization checks of this connection (list filtering; docs/security.md#authorization). */
  readonly gate: Gate;
  /** The peer's address (without the port). */
  readonly source: string;
  readonly host: BrokerHost;
  /** Who this connection's administrative operations are audited as (its peer address). */
  readonly actor: AuditActor;
  readonly limits: ConnectionLimits;
  /** Aborts when the connection closes (requests still running give up). */
  readonly signal: AbortSignal;
  /** Group members (SUBSCRIBE) by the client's subscription id. */
  readonly members: Map<number, RemoteMember>;
  /** Queue workers (QUEUE_WORK) by the client's worker id. */
  readonly workers: Map<number, RemoteWorker>;
  /** Writes a frame; false when the socket's output is above its limit. */
  send(frame: Buffer): boolean;
  /** Writes a frame head and a body that is not copied; same result as `send`. */
  sendParts(head: Buffer, body: Buffer): boolean;
  /** Resolves when the socket can take more output. */
  waitWritable(): Promise<void>;
  /** Members of this connection expire after `ms` without a frame from the client. */
  armLiveness(ms: number): void;
  /** Why a member id of this connection ended (for late commits), if it did. */
  endedReason(id: number): string | undefined;
  rememberEnded(id: number, reason: string): void;
  /** Structured processing lines (settlements, commits): processing-log.ts. */
  readonly processing: ProcessingLog;
  /** The queue handle a request's `queue` and `config` name (cached per connection). */
  queueFor(meta: Record<string, unknown>): HostQueue;
  forgetQueue(name: string): void;
}

/** A response: JSON meta (null for an empty meta section) and an optional binary body. */
export interface Reply {
  meta: unknown;
  body?: Buffer | null;
}

export type RequestHandler = (s: Session, frame: Frame) => Reply | Promise<Reply>;
/** Frames that get no response (CREDIT, HEARTBEAT, REVOKE_ACK); handled inline, synchronously. */
export type OneWayHandler = (s: Session, frame: Frame) => void;

/** One handler per request op of the table (HELLO is the handshake's); the compiler checks
 * that none is missing. */
export type RequestHandlers = { readonly [N in Exclude<RequestOpName, "Hello">]: RequestHandler };
export type OneWayHandlers = { readonly [N in OneWayOpName]: OneWayHandler };

export function str(meta: Record<string, unknown>, key: string, maxLen = 1000): string {
  const v = meta[key];
  if (typeof v !== "string") throw new ValidationError(`field ${key} must be a string`);
  if (v.length > maxLen) throw new ValidationError(`field ${key} is longer than ${maxLen} characters`);
  return v;
}

export function int(meta: Record<string, unknown>, key: string): number;
export function int(meta: Record<string, unknown>, key: string, opt: true): number | undefined;
export function int(meta: Record<string, unknown>, key: string, opt = false): number | undefined {
  const v = meta[key];
  if (v === undefined || v === null) {
    if (opt) return undefined;
    throw new ValidationError(`field ${key} is required`);
  }
  if (typeof v !== "number" || !Number.isSafeInteger(v)) throw new ValidationError(`field ${key} must be an integer`);
  return v;
}
