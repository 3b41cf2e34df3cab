// SPDX-License-Identifier: Apache-2.0
/**
 * One audit record: its fields, its canonical encoding, its chain hash, and its frame in
 * `audit/audit.log` (docs/storage-format.md "Audit log"):
 *
 *   u32 BE length of payload | u32 BE CRC-32C of payload | payload
 *   payload = canonical encoding (UTF-8 JSON array, fixed field order) | SHA-256 hash (32 bytes)
 *
 * `hash = SHA-256(prev || canonical)` and the next record's `prev` is this `hash` (AUD-2), the
 * first record's `prev` being 32 zero bytes. The CRC only tells a torn write from a whole one;
 * the hash chain is what shows an edit, since anyone who can edit the file can fix a CRC.
 */
import { createHash } from "node:crypto";
import { Buffer } from "node:buffer";
import { crc32c } from "../../log/crc32c.js";

/** Who asked and from where. Until authentication exists: "embedded" / "anonymous". */
export interface AuditActor {
  /** The authenticated principal; "embedded" for in-process calls, "anonymous" for unauthenticated connections. */
  principal: string;
  /** The peer address (`host:port`) of a server connection, or "embedded". */
  source: string;
}

export const EMBEDDED_ACTOR: AuditActor = Object.freeze({ principal: "embedded", source: "embedded" });

/** "server": an event of the server itself, e.g. a login (resource: the interface, "protocol" or "http"). */
export type AuditResourceType = "topic" | "queue" | "group" | "server";
/** Small scalar facts about an operation (never payloads or secrets). */
export type AuditDetails = Record<string, string | number | boolean | null>;

/** What the caller of `AuditLog.append` provides; sequence, time and chain are added by the log. */
export interface AuditEntry {
  principal: string;
  source: string;
  /** e.g. `topic.create`, `queue.purge`, `group.reset`. */
  op: string;
  resourceType: AuditResourceType;
  resource: string;
  /** "ok", or the error code of the failure. */
  result: string;
  details?: AuditDetails;
}

export interface AuditRecord extends Required<AuditEntry> {
  seq: number;
  /** Milliseconds since the epoch. */
  time: number;
  /** Hex SHA-256 of the previous record (64 zeros for the first). */
  prev: string;
  /** Hex SHA-256 over prev and this record's canonical encoding. */
  hash: string;
}

export const FRAME_HEADER_BYTES = 8;
export const HASH_BYTES = 32;
/** Largest payload accepted; details are truncated well below it. */
export const MAX_AUDIT_PAYLOAD_BYTES = 16 * 1024;
export const GENESIS_HASH = "0".repeat(64);
const FORMAT_VERSION = 1;
/** Characters per string field or detail; 6 fields of 256 characters stay far below the payload limit even as JSON escapes. */
const MAX_STRING = 256;
const MAX_DETAILS = 16;

/** The canonical bytes: a JSON array in a fixed order, details sorted by key. */
export function canonicalEncoding(r: Omit<AuditRecord, "hash">): Buffer {
  const details = Object.keys(r.details)
    .sort()
    .map((k) => [k, r.details[k]]);
  return Buffer.from(JSON.stringify([FORMAT_VERSION, r.seq, r.time, r.principal, r.source, r.op, r.resourceType, r.resource, r.result, details, r.prev]), "utf8");
}

export function chainHash(prevHex: string, canonical: Uint8Array): string {
  return createHash("sha256").update(Buffer.from(prevHex, "hex")).update(canonical).digest("hex");
}

/** Bounds strings and details so a record stays small whatever the caller passes. */
export function boundEntry(e: AuditEntry): Required<AuditEntry> {
  const cut = (s: string): string => (s.length > MAX_STRING ? `${s.slice(0, MAX_STRING)}…` : s);
  const details: AuditDetails = {};
  for (const [k, v] of Object.entries(e.details ?? {}).slice(0, MAX_DETAILS)) {
    if (v === undefined) continue;
    details[cut(k)] = typeof v === "string" ? cut(v) : typeof v === "number" || typeof v === "boolean" || v === null ? v : cut(String(v));
  }
  return { principal: cut(e.principal), source: cut(e.source), op: cut(e.op), resourceType: e.resourceType, resource: cut(e.resource), result: cut(e.result), details };
}

/** Seals an entry into the record after `prev`, and returns it with its frame bytes. */
export function sealRecord(e: Required<AuditEntry>, seq: number, time: number, prev: string): { record: AuditRecord; frame: Buffer } {
  let unsealed = { ...e, seq, time, prev };
  let canonical = canonicalEncoding(unsealed);
  // Details too large even after bounding (long escaped strings): the record keeps its fields
  // and says so, since a frame above the limit could not be read back.
  if (canonical.length + HASH_BYTES > MAX_AUDIT_PAYLOAD_BYTES) {
    unsealed = { ...unsealed, details: { detailsTruncated: true } };
    canonical = canonicalEncoding(unsealed);
  }
  const hash = chainHash(prev, canonical);
  const payload = Buffer.concat([canonical, Buffer.from(hash, "hex")]);
  const frame = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  frame.writeUInt32BE(crc32c(payload), 4);
  payload.copy(frame, FRAME_HEADER_BYTES);
  return { record: { ...unsealed, hash }, frame };
}

/** The outcome of decoding a payload whose CRC matched. */
export type DecodedPayload = { ok: true; record: AuditRecord; hashMatches: boolean } | { ok: false; why: string };

/** Decodes a payload (CRC already checked) and recomputes its hash. */
export function decodePayload(payload: Buffer): DecodedPayload {
  if (payload.length <= HASH_BYTES) return { ok: false, why: "payload too short" };
  const canonical = payload.subarray(0, payload.length - HASH_BYTES);
  const stored = payload.subarray(payload.length - HASH_BYTES).toString("hex");
  let a: unknown;
  try {
    a = JSON.parse(canonical.toString("utf8"));
  } catch {
    return { ok: false, why: "fields are not decodable" };
  }
  const r = fromArray(a);
  if (r === null) return { ok: false, why: "fields have the wrong shape" };
  const record: AuditRecord = { ...r, hash: stored };
  // Re-encoding must give the same bytes, or the stored bytes are not canonical (edited).
  const recoded = canonicalEncoding(r);
  const hashMatches = recoded.equals(canonical) && chainHash(r.prev, canonical) === stored;
  return { ok: true, record, hashMatches };
}

function fromArray(a: unknown): Omit<AuditRecord, "hash"> | null {
  if (!Array.isArray(a) || a.length !== 11 || a[0] !== FORMAT_VERSION) return null;
  const [, seq, time, principal, source, op, resourceType, resource, result, details, prev] = a as unknown[];
  if (!Number.isSafeInteger(seq) || !Number.isFinite(time)) return null;
  for (const s of [principal, source, op, resourceType, resource, result, prev]) if (typeof s !== "string") return null;
  if (!/^[0-9a-f]{64}$/.test(prev as string) || !Array.isArray(details)) return null;
  const d: AuditDetails = {};
  for (const kv of details as unknown[]) {
    if (!Array.isArray(kv) || kv.length !== 2 || typeof kv[0] !== "string") return null;
    d[kv[0]] = kv[1] as AuditDetails[string];
  }
  return {
    seq: seq as number,
    time: time as number,
    principal: principal as string,
    source: source as string,
    op: op as string,
    resourceType: resourceType as AuditResourceType,
    resource: resource as string,
    result: result as string,
    details: d,
    prev: prev as string,
  };
}
