// SPDX-License-Identifier: Apache-2.0
/**
 * The sluice error hierarchy and its registry. Every error the broker raises is a
 * `BrokerError` with a stable `code` (documented in docs/errors.md) and `retriable`, which says
 * whether the same call may succeed if simply tried again later.
 *
 * Each error class carries its facts in one place, its static `spec`: code, `retriable`, HTTP
 * status, where it comes from, and how to rebuild it from the wire; an instance's
 * `wireDetails()` gives the structured fields the wire carries. The wire mapping
 * (src/wire/errors.ts), the HTTP port (src/server/http.ts) and the docs check
 * (test/errors-registry.test.ts) all read `ERROR_CLASSES`, so a code means the same class,
 * retriability and status embedded, through a client and over HTTP.
 */

/** Structured fields of an error on the wire (docs/protocol.md §3). */
export type WireDetails = Record<string, unknown>;

/**
 * Where an error comes from: `broker` (raised by the broker, the same embedded and remote),
 * `client` (raised by the network client itself), `wire` (a protocol violation between client
 * and server), `server` (the server process: internal failures, HTTP), `handler` (thrown by
 * application code), `base` (a base class other classes refine; not raised as itself).
 */
export type ErrorOrigin = "broker" | "client" | "wire" | "server" | "handler" | "base";

export interface ErrorSpec {
  readonly code: string;
  readonly retriable: boolean;
  /** The status the HTTP port answers with. */
  readonly httpStatus: number;
  readonly origin: ErrorOrigin;
  /**
   * Rebuilds the error from its wire details. The caller then sets the message the server
   * sent (several constructors build their own text).
   */
  fromWire(details: WireDetails): BrokerError;
}

export interface BrokerErrorOptions extends ErrorOptions {
  retriable?: boolean;
}

/** Base of every sluice error. Thrown directly only for codes this version does not know. */
export class BrokerError extends Error {
  /** Stable machine-readable code, e.g. `RECORD_TOO_LARGE`. */
  readonly code: string;
  /** True when retrying the same call later may succeed. */
  readonly retriable: boolean;
  constructor(code: string, message: string, options: BrokerErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.retriable = options.retriable ?? false;
  }
  get helpUrl(): string {
    return `docs/errors.md#${this.code.toLowerCase().replace(/_/g, "-")}`;
  }
  /** The structured fields sent with the error on the wire; none unless a class has some. */
  wireDetails(): WireDetails | undefined {
    return undefined;
  }
}

/** A `BrokerError` whose class fixes its code and retriability (its `spec`). */
export abstract class RegisteredError extends BrokerError {
  declare static readonly spec: ErrorSpec;
  constructor(message: string, options?: ErrorOptions) {
    const spec = new.target.spec;
    super(spec.code, message, { cause: options?.cause, retriable: spec.retriable });
  }
}

/** A spec: code, retriable, HTTP status, origin, and the constructor call from wire details. */
function spec(code: string, retriable: boolean, httpStatus: number, origin: ErrorOrigin, fromWire: (details: WireDetails) => BrokerError): ErrorSpec {
  return { code, retriable, httpStatus, origin, fromWire };
}

const str = (v: unknown): string => (v === undefined || v === null ? "" : String(v));
const num = (v: unknown): number => Number(v ?? 0);

/** Invalid argument, name or configuration. */
export class ValidationError extends RegisteredError {
  static override readonly spec = spec("VALIDATION", false, 400, "broker", () => new ValidationError(""));
}

export class InvalidNameError extends RegisteredError {
  static override readonly spec = spec("INVALID_NAME", false, 400, "broker", () => new InvalidNameError("", "", ""));
  constructor(kind: string, name: string, reason: string) {
    super(`invalid ${kind} name ${JSON.stringify(name.slice(0, 300))}: ${reason}`);
  }
}

/** Something does not exist. The broker raises the specific subclasses; the HTTP port raises
 * this one for a path that names no resource. */
export class NotFoundError extends RegisteredError {
  static override readonly spec = spec("NOT_FOUND", false, 404, "server", () => new NotFoundError(""));
}

export class TopicNotFoundError extends NotFoundError {
  static override readonly spec = spec("TOPIC_NOT_FOUND", false, 404, "broker", (d) => new TopicNotFoundError(str(d.topic)));
  readonly topic: string;
  constructor(topic: string) {
    super(`topic ${JSON.stringify(topic)} does not exist`);
    this.topic = topic;
  }
  override wireDetails(): WireDetails {
    return { topic: this.topic };
  }
}

export class PartitionNotFoundError extends NotFoundError {
  static override readonly spec = spec("PARTITION_NOT_FOUND", false, 404, "broker", (d) => new PartitionNotFoundError(str(d.topic), num(d.partition)));
  readonly topic: string;
  readonly partition: number;
  constructor(topic: string, partition: number) {
    super(`topic ${JSON.stringify(topic)} has no partition ${partition}`);
    this.topic = topic;
    this.partition = partition;
  }
  override wireDetails(): WireDetails {
    return { topic: this.topic, partition: this.partition };
  }
}

export class QueueNotFoundError extends NotFoundError {
  static override readonly spec = spec("QUEUE_NOT_FOUND", false, 404, "broker", (d) => new QueueNotFoundError(str(d.queue)));
  readonly queue: string;
  constructor(queue: string) {
    super(`queue ${JSON.stringify(queue)} does not exist`);
    this.queue = queue;
  }
  override wireDetails(): WireDetails {
    return { queue: this.queue };
  }
}

/** The request conflicts with current state; the broker raises the specific subclasses. */
export class ConflictError extends RegisteredError {
  static override readonly spec = spec("CONFLICT", false, 409, "base", () => new ConflictError(""));
}

export class TopicExistsError extends ConflictError {
  static override readonly spec = spec("TOPIC_EXISTS", false, 409, "broker", () => new TopicExistsError(""));
  constructor(topic: string) {
    super(`topic ${JSON.stringify(topic)} already exists`);
  }
}

export class GroupActiveError extends ConflictError {
  static override readonly spec = spec("GROUP_ACTIVE", true, 409, "broker", () => new GroupActiveError(""));
  constructor(group: string) {
    super(`group ${JSON.stringify(group)} has active members; stop them before resetting offsets`);
  }
}

/** `queue.remove(id)` of a job leased to a worker (active): nothing changed. */
export class JobActiveError extends ConflictError {
  static override readonly spec = spec("JOB_ACTIVE", false, 409, "broker", (d) => new JobActiveError(str(d.queue), str(d.id)));
  readonly queue: string;
  readonly id: string;
  constructor(queue: string, id: string) {
    super(`job ${id} of queue ${JSON.stringify(queue)} is active (leased to a worker) and cannot be removed; settle it through its worker`);
    this.queue = queue;
    this.id = id;
  }
  override wireDetails(): WireDetails {
    return { queue: this.queue, id: this.id };
  }
}

export class RecordTooLargeError extends RegisteredError {
  static override readonly spec = spec("RECORD_TOO_LARGE", false, 400, "broker", (d) => new RecordTooLargeError(num(d.sizeBytes), num(d.maxBytes)));
  readonly sizeBytes: number;
  readonly maxBytes: number;
  constructor(sizeBytes: number, maxBytes: number) {
    super(`record of ${sizeBytes} bytes exceeds maxMessageBytes ${maxBytes}`);
    this.sizeBytes = sizeBytes;
    this.maxBytes = maxBytes;
  }
  override wireDetails(): WireDetails {
    return { sizeBytes: this.sizeBytes, maxBytes: this.maxBytes };
  }
}

export class OffsetOutOfRangeError extends RegisteredError {
  static override readonly spec = spec(
    "OFFSET_OUT_OF_RANGE",
    false,
    400,
    "broker",
    (d) => new OffsetOutOfRangeError(str(d.topic), num(d.partition), num(d.offset), num(d.logStartOffset), num(d.logEndOffset)),
  );
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
  readonly logStartOffset: number;
  readonly logEndOffset: number;
  constructor(topic: string, partition: number, offset: number, start: number, end: number) {
    super(`offset ${offset} is outside ${topic}/${partition} [${start}, ${end}]`);
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.logStartOffset = start;
    this.logEndOffset = end;
  }
  override wireDetails(): WireDetails {
    const { topic, partition, offset, logStartOffset, logEndOffset } = this;
    return { topic, partition, offset, logStartOffset, logEndOffset };
  }
}

/**
 * A stored batch failed its checksum or structure checks. It is never served; records before
 * and after it remain readable. `nextOffset` (when known) is where a reader can resume.
 */
export class CorruptRecordError extends RegisteredError {
  static override readonly spec = spec(
    "CORRUPT_RECORD",
    false,
    500,
    "broker",
    (d) =>
      new CorruptRecordError(str(d.topic), num(d.partition), num(d.offset), str(d.file), num(d.position), "", d.nextOffset === undefined || d.nextOffset === null ? undefined : Number(d.nextOffset)),
  );
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
  readonly file: string;
  readonly position: number;
  readonly nextOffset: number | undefined;
  constructor(
    topic: string,
    partition: number,
    offset: number,
    file: string,
    position: number,
    detail: string,
    nextOffset?: number,
  ) {
    super(`corrupt record batch in ${topic}/${partition} at offset ${offset} (${file} @${position}): ${detail}`);
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.file = file;
    this.position = position;
    this.nextOffset = nextOffset;
  }
  override wireDetails(): WireDetails {
    const { topic, partition, offset, file, position, nextOffset } = this;
    return { topic, partition, offset, file, position, nextOffset };
  }
}

/** Bytes that do not decode as a record batch (raised by the decoder, before any offset is known). */
export class InvalidBatchError extends RegisteredError {
  static override readonly spec = spec("INVALID_BATCH", false, 400, "broker", () => new InvalidBatchError(""));
}

/** The disk is full. Nothing already acknowledged is lost; reads keep working. */
export class StorageFullError extends RegisteredError {
  static override readonly spec = spec("STORAGE_FULL", true, 503, "broker", () => new StorageFullError(""));
  constructor(message: string, cause?: unknown) {
    super(message, { cause });
  }
}

/**
 * An I/O error: what was being written is not acknowledged, and the partition is unwritable
 * until it has been reopened from disk, which the broker does by itself (recovery re-verifies
 * the files). Retriable: the same call may succeed once the partition is recovered.
 */
export class StorageError extends RegisteredError {
  static override readonly spec = spec("STORAGE_ERROR", true, 503, "broker", () => new StorageError(""));
  constructor(message: string, cause?: unknown) {
    super(message, { cause });
  }
}

/**
 * An archived segment (tiered storage, src/log/archive/) does not match its manifest: its
 * SHA-256, CRC-32C or length differ from what was verified when it was archived (ARC-3). Its
 * bytes are never served. Not retriable: the archive copy is damaged; restore it from a
 * backup of the archive, or read from an offset the archive still holds intact.
 */
export class ArchiveCorruptError extends StorageError {
  static override readonly spec = spec("ARCHIVE_CORRUPT", false, 500, "broker", (d) => new ArchiveCorruptError(str(d.key), str(d.detail)));
  constructor(
    readonly key: string,
    readonly detail: string,
  ) {
    super(`archived object ${key} is corrupt: ${detail}`);
  }
  override wireDetails(): WireDetails {
    return { key: this.key, detail: this.detail };
  }
}

/**
 * `sluice audit verify` found the audit log's hash chain broken (AUD-2): the record with
 * sequence number `seq` was modified, is missing, is out of order, or does not chain onto the
 * record before it (`reason`). Not retriable: the file was altered or damaged after it was
 * written; keep it as evidence and compare it with a copy or backup.
 */
export class AuditLogCorruptError extends StorageError {
  static override readonly spec = spec("AUDIT_CORRUPT", false, 500, "broker", (d) => new AuditLogCorruptError(num(d.seq), str(d.reason), str(d.detail)));
  constructor(
    readonly seq: number,
    readonly reason: string,
    readonly detail: string,
  ) {
    super(`audit log broken at seq ${seq} (${reason}): ${detail}`);
  }
  override wireDetails(): WireDetails {
    return { seq: this.seq, reason: this.reason, detail: this.detail };
  }
}

/**
 * The data directory is in use by another broker, server or CLI command (its exclusive lock is
 * held, FS-3). Nothing was changed. Not retriable as such: stop the holder, or talk to it.
 */
export class DataDirLockedError extends RegisteredError {
  static override readonly spec = spec("DATA_DIR_LOCKED", false, 409, "broker", (d) => new DataDirLockedError(str(d.dataDir), d.pid === null || d.pid === undefined ? null : num(d.pid), d.host === undefined ? null : (d.host as string | null), d.since === undefined ? null : (d.since as string | null)));
  constructor(
    readonly dataDir: string,
    readonly pid: number | null,
    readonly host: string | null,
    readonly since: string | null,
  ) {
    super(`data directory ${dataDir} is in use by another process (pid ${pid ?? "?"} on ${host ?? "?"} since ${since ?? "?"}); stop it first, or talk to the running server`);
  }
  override wireDetails(): WireDetails {
    return { dataDir: this.dataDir, pid: this.pid, host: this.host, since: this.since };
  }
}

export class OutOfOrderSequenceError extends RegisteredError {
  static override readonly spec = spec("OUT_OF_ORDER_SEQUENCE", false, 409, "broker", () => new OutOfOrderSequenceError(""));
}

export class ProducerFencedError extends RegisteredError {
  static override readonly spec = spec("PRODUCER_FENCED", false, 409, "broker", () => new ProducerFencedError(""));
}

export class BrokerClosedError extends RegisteredError {
  static override readonly spec = spec("BROKER_CLOSED", false, 503, "broker", () => new BrokerClosedError());
  constructor(message = "broker is closed") {
    super(message);
  }
}

export class TimeoutError extends RegisteredError {
  static override readonly spec = spec("TIMEOUT", true, 504, "client", () => new TimeoutError(""));
}

export class AbortedError extends RegisteredError {
  static override readonly spec = spec("ABORTED", false, 503, "broker", () => new AbortedError());
  constructor(message = "operation aborted", cause?: unknown) {
    super(message, { cause });
  }
}

export class ConnectionClosedError extends RegisteredError {
  static override readonly spec = spec("CONNECTION_CLOSED", true, 503, "client", () => new ConnectionClosedError());
  constructor(message = "connection closed", cause?: unknown) {
    super(message, { cause });
  }
}

/**
 * A commit for a partition this group member no longer owns: it was revoked in a rebalance
 * (even if it has come back since: the commit belongs to an earlier ownership period), or the
 * member itself ended (closed, session expired, connection lost). Raised alike embedded and
 * through a server.
 */
export class NotAssignedError extends RegisteredError {
  static override readonly spec = spec("NOT_ASSIGNED", false, 409, "broker", () => new NotAssignedError(""));
}

/**
 * @deprecated A stale member's commit raises `NotAssignedError` in every mode; this name is
 * kept so that existing `instanceof StaleGenerationError` checks still match those errors.
 */
export const StaleGenerationError = NotAssignedError;
/** @deprecated See the value of the same name. */
export type StaleGenerationError = NotAssignedError;

export class LeaseExpiredError extends RegisteredError {
  static override readonly spec = spec("LEASE_EXPIRED", false, 409, "broker", () => new LeaseExpiredError());
  constructor(message = "lease expired: another worker may have this job; make side effects idempotent") {
    super(message);
  }
}

export class QueueFullError extends RegisteredError {
  static override readonly spec = spec("QUEUE_FULL", true, 429, "broker", (d) => new QueueFullError(str(d.queue), num(d.depth), num(d.bytes)));
  readonly queue: string;
  readonly depth: number;
  readonly bytes: number;
  constructor(queue: string, depth: number, bytes: number) {
    super(`queue ${JSON.stringify(queue)} is full (depth ${depth}, ${bytes} bytes)`);
    this.queue = queue;
    this.depth = depth;
    this.bytes = bytes;
  }
  override wireDetails(): WireDetails {
    return { queue: this.queue, depth: this.depth, bytes: this.bytes };
  }
}

/** Thrown by a job handler to send the job straight to the dead-letter queue. */
export class PermanentError extends RegisteredError {
  static override readonly spec = spec("PERMANENT", false, 500, "handler", () => new PermanentError(""));
}

/**
 * Thrown by a job handler whose downstream is rate limited (an HTTP 429): the job goes back,
 * visible after `retryAfterMs`, without spending an attempt (`job.retryAfter`).
 */
export class RateLimitedError extends RegisteredError {
  static override readonly spec = spec("RATE_LIMITED", true, 429, "handler", (d) => new RateLimitedError(num(d.retryAfterMs)));
  readonly retryAfterMs: number;
  constructor(retryAfterMs: number, message?: string, options?: ErrorOptions) {
    super(message ?? `rate limited downstream: retry after ${retryAfterMs} ms`, options);
    this.retryAfterMs = retryAfterMs;
  }
  override wireDetails(): WireDetails {
    return { retryAfterMs: this.retryAfterMs };
  }
}

/** A message's envelope headers (docs/patterns.md) are partial or malformed. */
export class InvalidEnvelopeError extends RegisteredError {
  static override readonly spec = spec("INVALID_ENVELOPE", false, 400, "broker", (d) => new InvalidEnvelopeError(str(d.header), str(d.reason)));
  readonly header: string;
  readonly reason: string;
  constructor(header: string, reason: string) {
    super(`invalid envelope header ${JSON.stringify(header)}: ${reason}`);
    this.header = header;
    this.reason = reason;
  }
  override wireDetails(): WireDetails {
    return { header: this.header, reason: this.reason };
  }
}

/**
 * A published value does not match the schema registered for its target, type and version;
 * `field` names the offending field as a JSON pointer ("" for the value itself).
 */
export class SchemaViolationError extends RegisteredError {
  static override readonly spec = spec("SCHEMA_VIOLATION", false, 400, "broker", (d) => new SchemaViolationError(str(d.target), str(d.type), num(d.version), str(d.field), str(d.reason)));
  readonly target: string;
  readonly type: string;
  readonly version: number;
  readonly field: string;
  readonly reason: string;
  constructor(target: string, type: string, version: number, field: string, reason: string) {
    super(`${JSON.stringify(target)}: ${type ? `${type} v${version}` : "message"}${field ? ` field ${JSON.stringify(field)}` : ""}: ${reason}`);
    this.target = target;
    this.type = type;
    this.version = version;
    this.field = field;
    this.reason = reason;
  }
  override wireDetails(): WireDetails {
    return { target: this.target, type: this.type, version: this.version, field: this.field, reason: this.reason };
  }
}

/** A schema version registered after an earlier one is not backward compatible with it. */
export class SchemaIncompatibleError extends RegisteredError {
  static override readonly spec = spec("SCHEMA_INCOMPATIBLE", false, 409, "broker", (d) => new SchemaIncompatibleError(str(d.type), num(d.version), Array.isArray(d.problems) ? (d.problems as string[]) : []));
  readonly type: string;
  readonly version: number;
  readonly problems: string[];
  constructor(type: string, version: number, problems: string[]) {
    super(`${type} v${version} is not backward compatible: ${problems.join("; ")}`);
    this.type = type;
    this.version = version;
    this.problems = problems;
  }
  override wireDetails(): WireDetails {
    return { type: this.type, version: this.version, problems: this.problems };
  }
}

/** A wire-protocol frame could not be decoded or violated the protocol. */
export class ProtocolError extends RegisteredError {
  static override readonly spec = spec("PROTOCOL", false, 400, "wire", () => new ProtocolError(""));
}

/** A frame's length exceeds the receiver's `maxFrameBytes`. */
export class FrameTooLargeError extends ProtocolError {
  static override readonly spec = spec("FRAME_TOO_LARGE", false, 413, "wire", () => new FrameTooLargeError(""));
}

/** The peer did not start with the `SLCE` preamble: not a sluice client. */
export class BadMagicError extends ProtocolError {
  static override readonly spec = spec("PROTOCOL_BAD_MAGIC", false, 400, "wire", () => new BadMagicError(""));
}

export class UnsupportedVersionError extends RegisteredError {
  static override readonly spec = spec("UNSUPPORTED_VERSION", false, 400, "wire", () => new UnsupportedVersionError(""));
}

/** The server hit an unexpected (non-sluice) exception; it is logged on the server. */
export class InternalError extends RegisteredError {
  static override readonly spec = spec("INTERNAL", false, 500, "server", () => new InternalError(""));
}

/**
 * The request is not allowed: on the HTTP port, a state-changing request from another site (a
 * browser's cross-origin or form post), refused before it is read.
 */
export class ForbiddenError extends RegisteredError {
  static override readonly spec = spec("FORBIDDEN", false, 403, "server", () => new ForbiddenError(""));
}

/**
 * A tenant is at its storage quota (docs/security.md#quotas): the publish or enqueue was
 * refused before anything was written. Retriable: space comes back as retention deletes
 * segments and consumers settle jobs.
 */
export class QuotaExceededError extends RegisteredError {
  static override readonly spec = spec("QUOTA_EXCEEDED", true, 429, "server", (d) => new QuotaExceededError(str(d.entity), num(d.usedBytes), num(d.limitBytes)));
  readonly entity: string;
  readonly usedBytes: number;
  readonly limitBytes: number;
  constructor(entity: string, usedBytes: number, limitBytes: number) {
    super(`${entity} is at its storage quota (${usedBytes} of ${limitBytes} bytes stored): nothing was written`);
    this.entity = entity;
    this.usedBytes = usedBytes;
    this.limitBytes = limitBytes;
  }
  override wireDetails(): WireDetails {
    return { entity: this.entity, usedBytes: this.usedBytes, limitBytes: this.limitBytes };
  }
}

/** An HTTP request body exceeded the server's `maxBodyBytes`. */
export class BodyTooLargeError extends RegisteredError {
  static override readonly spec = spec("BODY_TOO_LARGE", false, 413, "server", () => new BodyTooLargeError(""));
}

/**
 * TLS configuration that cannot be used: a certificate, key or CA file that is missing or not
 * PEM, a key that does not match its certificate, a `sluice+tls://` URL without TLS or TLS
 * options with a plain `sluice://` URL. Raised by `startServer()`, `server.reloadTls()` (the
 * old certificate stays in use) and `connect()`.
 */
export class TlsConfigError extends ValidationError {
  static override readonly spec = spec("TLS_CONFIG", false, 400, "server", () => new TlsConfigError(""));
}

/**
 * Encryption at rest cannot be set up: a key file or `SLUICE_ENCRYPTION_KEYS` that is not a valid
 * keyring (docs/security.md, "Encryption at rest"), or a topic or queue declared `encrypted`
 * where no keyring is configured. Messages never include key material.
 */
export class EncryptionConfigError extends ValidationError {
  static override readonly spec = spec("ENCRYPTION_CONFIG", false, 400, "broker", () => new EncryptionConfigError(""));
}

/**
 * An encrypted batch (or queue snapshot) names a key id the configured keyring lacks, or an
 * encrypted topic or queue is written without a keyring. Nothing is decrypted with a guess and
 * nothing is served; restart the broker with the key added back.
 */
export class EncryptionKeyMissingError extends RegisteredError {
  static override readonly spec = spec("ENCRYPTION_KEY_MISSING", false, 500, "broker", (d) => new EncryptionKeyMissingError(str(d.keyId), str(d.where)));
  readonly keyId: string;
  readonly where: string;
  constructor(keyId: string, where: string) {
    super(keyId === "" ? `no encryption keys are configured, and ${where} is encrypted` : `encryption key ${JSON.stringify(keyId)} is not in the keyring (needed by ${where}); add it back to the key file`);
    this.keyId = keyId;
    this.where = where;
  }
  override wireDetails(): WireDetails {
    return { keyId: this.keyId, where: this.where };
  }
}

/**
 * The TLS handshake with the server failed: its certificate is not trusted (unknown CA,
 * expired, wrong host name), no TLS version is shared (the server accepts TLS 1.2 and 1.3), or
 * the port does not speak TLS. Retrying does not help until the configuration changes.
 */
export class TlsHandshakeError extends RegisteredError {
  static override readonly spec = spec("TLS_HANDSHAKE", false, 502, "client", () => new TlsHandshakeError(""));
}

/**
 * Authentication failed: in the protocol handshake (`connect({ auth })`) or on the HTTP port
 * (401). One error whatever the reason (unknown user, wrong password, expired or revoked
 * token, no credentials where the server requires them), so a caller learns nothing about
 * which users exist. Not retriable: the same credentials fail again.
 */
export class AuthenticationError extends RegisteredError {
  static override readonly spec = spec("AUTHENTICATION_FAILED", false, 401, "server", () => new AuthenticationError());
  constructor(message = "authentication failed") {
    super(message);
  }
}

/** Namespace object, NATS style: `err instanceof errors.NotAssignedError`. */
export const errors = {
  BrokerError,
  ValidationError,
  InvalidNameError,
  NotFoundError,
  TopicNotFoundError,
  PartitionNotFoundError,
  QueueNotFoundError,
  ConflictError,
  TopicExistsError,
  GroupActiveError,
  JobActiveError,
  RecordTooLargeError,
  OffsetOutOfRangeError,
  CorruptRecordError,
  InvalidBatchError,
  StorageFullError,
  StorageError,
  ArchiveCorruptError,
  AuditLogCorruptError,
  DataDirLockedError,
  OutOfOrderSequenceError,
  ProducerFencedError,
  BrokerClosedError,
  TimeoutError,
  AbortedError,
  ConnectionClosedError,
  NotAssignedError,
  StaleGenerationError,
  LeaseExpiredError,
  QueueFullError,
  PermanentError,
  RateLimitedError,
  InvalidEnvelopeError,
  SchemaViolationError,
  SchemaIncompatibleError,
  ProtocolError,
  FrameTooLargeError,
  BadMagicError,
  UnsupportedVersionError,
  InternalError,
  BodyTooLargeError,
  ForbiddenError,
  QuotaExceededError,
  TlsConfigError,
  TlsHandshakeError,
  EncryptionConfigError,
  EncryptionKeyMissingError,
  AuthenticationError,
} as const;

/** A registered error class: constructible (for `instanceof`) and carrying its spec. */
export type ErrorClass = (abstract new (...args: never[]) => BrokerError) & { readonly spec: ErrorSpec };

const registered = (c: object): c is ErrorClass => c !== BrokerError && "spec" in c;

/** Every registered error class, in the order docs/errors.md lists them (that of `errors`,
 * without the base class and the deprecated alias). */
export const ERROR_CLASSES: readonly ErrorClass[] = [...new Set(Object.values(errors))].flatMap((c) => (registered(c) ? [c] : []));

/**
 * Codes that servers of earlier versions send and that now belong to another class:
 * `STALE_GENERATION` was raised for some stale-member commits that are `NOT_ASSIGNED` now.
 */
const LEGACY_CODES: ReadonlyMap<string, ErrorSpec> = new Map([["STALE_GENERATION", NotAssignedError.spec]]);

const BY_CODE: ReadonlyMap<string, ErrorSpec> = new Map([...ERROR_CLASSES.map((c) => [c.spec.code, c.spec] as const), ...LEGACY_CODES]);

/** The registry entry of a code (including codes of earlier versions), if it is known. */
export function errorSpec(code: string): ErrorSpec | undefined {
  return BY_CODE.get(code);
}

/** The HTTP status for an error: its class's, or 503/500 for an unknown retriable/other one. */
export function httpStatusOf(err: BrokerError): number {
  return errorSpec(err.code)?.httpStatus ?? (err.retriable ? 503 : 500);
}
