// SPDX-License-Identifier: Apache-2.0
/**
 * The standard message envelope, carried in record (or job) headers so that the value stays
 * the application's payload: message id, type, schema version, kind, occurred-at, correlation
 * and causation ids, tenant. The inbox, the outbox relay, schemas and dead letters read it.
 *
 * Header names are fixed (`ENVELOPE_HEADERS`) and lower-case; values are UTF-8 strings, so an
 * envelope survives every path (embedded, the wire, HTTP) unchanged. docs/patterns.md.
 */
import { randomUUID } from "node:crypto";
import { InvalidEnvelopeError } from "../errors.js";
import type { Headers } from "../value-types.js";

export type MessageKind = "command" | "event" | "notification";
const KINDS: ReadonlySet<string> = new Set<MessageKind>(["command", "event", "notification"]);

export interface Envelope {
  /** Unique per message; the key of idempotent consumers (inbox) and of the outbox relay. */
  messageId: string;
  /** What the message is, e.g. `OrderAccepted`; schemas are registered per type. */
  type: string;
  /** Version of the type's schema the value was written with (integer >= 1). */
  schemaVersion: number;
  kind: MessageKind;
  /** When the fact happened or the command was issued (ms since epoch), not when it was published. */
  occurredAt: number;
  /** Shared by every message of one business flow; defaults to the first message's id. */
  correlationId?: string;
  /** The id of the message that caused this one. */
  causationId?: string;
  tenant?: string;
}

export interface EnvelopeInit {
  type: string;
  kind?: MessageKind;
  schemaVersion?: number;
  messageId?: string;
  occurredAt?: number | Date;
  correlationId?: string;
  causationId?: string;
  tenant?: string;
}

/** Header names of the envelope fields. */
export const ENVELOPE_HEADERS = {
  messageId: "sluice-message-id",
  type: "sluice-type",
  schemaVersion: "sluice-schema-version",
  kind: "sluice-kind",
  occurredAt: "sluice-occurred-at",
  correlationId: "sluice-correlation-id",
  causationId: "sluice-causation-id",
  tenant: "sluice-tenant",
} as const satisfies Record<keyof Envelope, string>;

/** Longest accepted text field (ids, type, tenant): headers are meant to stay small. */
export const MAX_ENVELOPE_FIELD_CHARS = 256;

/**
 * Builds the headers of a new message. `messageId` defaults to a random UUID, `occurredAt` to
 * now, `schemaVersion` to 1, `kind` to "event". Merge with other headers:
 * `{ ...envelope({ type: "OrderAccepted" }), "x-trace": id }`.
 */
export function envelope(init: EnvelopeInit): Record<string, string> {
  const env: Envelope = {
    messageId: init.messageId ?? randomUUID(),
    type: init.type,
    schemaVersion: init.schemaVersion ?? 1,
    kind: init.kind ?? "event",
    occurredAt: init.occurredAt instanceof Date ? init.occurredAt.getTime() : (init.occurredAt ?? Date.now()),
    correlationId: init.correlationId,
    causationId: init.causationId,
    tenant: init.tenant,
  };
  checkEnvelope(env);
  const h: Record<string, string> = {};
  for (const k of Object.keys(ENVELOPE_HEADERS) as (keyof Envelope)[]) {
    const v = env[k];
    if (v !== undefined) h[ENVELOPE_HEADERS[k]] = String(v);
  }
  return h;
}

/**
 * The headers of a message caused by `cause` (a command issued while handling an event, an
 * event emitted by a command handler): same correlation id (or the cause's id when it had
 * none), causation id = the cause's id, same tenant unless given.
 */
export function causedBy(cause: Envelope, init: EnvelopeInit): Record<string, string> {
  return envelope({ tenant: cause.tenant, ...init, correlationId: cause.correlationId ?? cause.messageId, causationId: cause.messageId });
}

/**
 * Reads the envelope of a consumed record or job. Returns null when the message carries no
 * envelope at all (no `sluice-message-id` and no `sluice-type`); throws `InvalidEnvelopeError`
 * naming the header when it carries a partial or malformed one.
 */
export function readEnvelope(headers: Headers | undefined | null): Envelope | null {
  if (!headers) return null;
  const get = (name: string): string | undefined => {
    const v = headers[name];
    if (v === undefined) return undefined;
    return typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
  };
  const id = get(ENVELOPE_HEADERS.messageId);
  const type = get(ENVELOPE_HEADERS.type);
  if (id === undefined && type === undefined) return null;
  const version = get(ENVELOPE_HEADERS.schemaVersion);
  const at = get(ENVELOPE_HEADERS.occurredAt);
  const env: Envelope = {
    messageId: required(id, ENVELOPE_HEADERS.messageId),
    type: required(type, ENVELOPE_HEADERS.type),
    schemaVersion: version === undefined ? 1 : integer(version, ENVELOPE_HEADERS.schemaVersion),
    kind: (get(ENVELOPE_HEADERS.kind) ?? "event") as MessageKind,
    occurredAt: at === undefined ? Number.NaN : integer(at, ENVELOPE_HEADERS.occurredAt),
    correlationId: get(ENVELOPE_HEADERS.correlationId),
    causationId: get(ENVELOPE_HEADERS.causationId),
    tenant: get(ENVELOPE_HEADERS.tenant),
  };
  if (at === undefined) throw new InvalidEnvelopeError(ENVELOPE_HEADERS.occurredAt, "missing");
  checkEnvelope(env);
  return env;
}

/** The message id of a record or job's headers, or null without an envelope id. */
export function messageIdOf(headers: Headers | undefined | null): string | null {
  const v = headers?.[ENVELOPE_HEADERS.messageId];
  if (v === undefined) return null;
  return typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
}

function required(v: string | undefined, header: string): string {
  if (v === undefined) throw new InvalidEnvelopeError(header, "missing");
  return v;
}

function integer(v: string, header: string): number {
  if (!/^-?\d{1,16}$/.test(v)) throw new InvalidEnvelopeError(header, `not an integer: ${JSON.stringify(v.slice(0, 40))}`);
  return Number(v);
}

function checkEnvelope(e: Envelope): void {
  const text = (v: string | undefined, header: string, optional: boolean) => {
    if (v === undefined && optional) return;
    if (typeof v !== "string" || v.length === 0) throw new InvalidEnvelopeError(header, "must be a non-empty string");
    if (v.length > MAX_ENVELOPE_FIELD_CHARS) throw new InvalidEnvelopeError(header, `longer than ${MAX_ENVELOPE_FIELD_CHARS} characters`);
  };
  text(e.messageId, ENVELOPE_HEADERS.messageId, false);
  text(e.type, ENVELOPE_HEADERS.type, false);
  text(e.correlationId, ENVELOPE_HEADERS.correlationId, true);
  text(e.causationId, ENVELOPE_HEADERS.causationId, true);
  text(e.tenant, ENVELOPE_HEADERS.tenant, true);
  if (!Number.isSafeInteger(e.schemaVersion) || e.schemaVersion < 1) throw new InvalidEnvelopeError(ENVELOPE_HEADERS.schemaVersion, "must be an integer >= 1");
  if (!KINDS.has(e.kind)) throw new InvalidEnvelopeError(ENVELOPE_HEADERS.kind, `must be one of ${[...KINDS].join(", ")}`);
  if (!Number.isSafeInteger(e.occurredAt) || e.occurredAt < 0) throw new InvalidEnvelopeError(ENVELOPE_HEADERS.occurredAt, "must be ms since the epoch");
}
