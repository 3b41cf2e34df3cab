// SPDX-License-Identifier: Apache-2.0
/**
 * The sluice error hierarchy. Every error the broker raises is a `BrokerError` with a stable
 * `code` (documented in docs/errors.md) and `retriable`, which says whether the same call may
 * succeed if simply tried again later.
 */

export interface BrokerErrorOptions extends ErrorOptions {
  retriable?: boolean;
}

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
}

/** Invalid argument, name or configuration. */
export class ValidationError extends BrokerError {
  constructor(message: string, options?: BrokerErrorOptions) {
    super("VALIDATION", message, options);
  }
}

export class InvalidNameError extends BrokerError {
  constructor(kind: string, name: string, reason: string) {
    super("INVALID_NAME", `invalid ${kind} name ${JSON.stringify(name.slice(0, 300))}: ${reason}`);
  }
}

export class NotFoundError extends BrokerError {
  constructor(message: string, code = "NOT_FOUND") {
    super(code, message);
  }
}

export class TopicNotFoundError extends NotFoundError {
  readonly topic: string;
  constructor(topic: string) {
    super(`topic ${JSON.stringify(topic)} does not exist`, "TOPIC_NOT_FOUND");
    this.topic = topic;
  }
}

export class PartitionNotFoundError extends NotFoundError {
  constructor(topic: string, partition: number) {
    super(`topic ${JSON.stringify(topic)} has no partition ${partition}`, "PARTITION_NOT_FOUND");
  }
}

export class ConflictError extends BrokerError {
  constructor(message: string, code = "CONFLICT", options?: BrokerErrorOptions) {
    super(code, message, options);
  }
}

export class TopicExistsError extends ConflictError {
  constructor(topic: string) {
    super(`topic ${JSON.stringify(topic)} already exists`, "TOPIC_EXISTS");
  }
}

export class GroupActiveError extends ConflictError {
  constructor(group: string) {
    super(
      `group ${JSON.stringify(group)} has active members; stop them before resetting offsets`,
      "GROUP_ACTIVE",
      { retriable: true },
    );
  }
}

export class RecordTooLargeError extends BrokerError {
  readonly sizeBytes: number;
  readonly maxBytes: number;
  constructor(sizeBytes: number, maxBytes: number) {
    super("RECORD_TOO_LARGE", `record of ${sizeBytes} bytes exceeds maxMessageBytes ${maxBytes}`);
    this.sizeBytes = sizeBytes;
    this.maxBytes = maxBytes;
  }
}

export class OffsetOutOfRangeError extends BrokerError {
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
  readonly logStartOffset: number;
  readonly logEndOffset: number;
  constructor(topic: string, partition: number, offset: number, start: number, end: number) {
    super(
      "OFFSET_OUT_OF_RANGE",
      `offset ${offset} is outside ${topic}/${partition} [${start}, ${end}]`,
    );
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.logStartOffset = start;
    this.logEndOffset = end;
  }
}

/**
 * A stored batch failed its checksum or structure checks. It is never served; records before
 * and after it remain readable. `nextOffset` (when known) is where a reader can resume.
 */
export class CorruptRecordError extends BrokerError {
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
    super(
      "CORRUPT_RECORD",
      `corrupt record batch in ${topic}/${partition} at offset ${offset} (${file} @${position}): ${detail}`,
    );
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.file = file;
    this.position = position;
    this.nextOffset = nextOffset;
  }
}

/** Bytes that do not decode as a record batch (raised by the decoder, before any offset is known). */
export class InvalidBatchError extends BrokerError {
  constructor(message: string) {
    super("INVALID_BATCH", message);
  }
}

/** The disk is full. Nothing already acknowledged is lost; reads keep working. */
export class StorageFullError extends BrokerError {
  constructor(message: string, cause?: unknown) {
    super("STORAGE_FULL", message, { retriable: true, cause });
  }
}

/**
 * An I/O error: what was being written is not acknowledged, and the partition is unwritable
 * until it has been reopened from disk, which the broker does by itself (recovery re-verifies
 * the files). Retriable: the same call may succeed once the partition is recovered.
 */
export class StorageError extends BrokerError {
  constructor(message: string, cause?: unknown) {
    super("STORAGE_ERROR", message, { retriable: true, cause });
  }
}

export class OutOfOrderSequenceError extends BrokerError {
  constructor(message: string) {
    super("OUT_OF_ORDER_SEQUENCE", message);
  }
}

export class ProducerFencedError extends BrokerError {
  constructor(message: string) {
    super("PRODUCER_FENCED", message);
  }
}

export class BrokerClosedError extends BrokerError {
  constructor(message = "broker is closed") {
    super("BROKER_CLOSED", message);
  }
}

export class TimeoutError extends BrokerError {
  constructor(message: string) {
    super("TIMEOUT", message, { retriable: true });
  }
}

export class AbortedError extends BrokerError {
  constructor(message = "operation aborted", cause?: unknown) {
    super("ABORTED", message, { cause });
  }
}

export class ConnectionClosedError extends BrokerError {
  constructor(message = "connection closed", cause?: unknown) {
    super("CONNECTION_CLOSED", message, { retriable: true, cause });
  }
}

/** A commit or fetch for a partition this member no longer owns. */
export class NotAssignedError extends BrokerError {
  constructor(message: string) {
    super("NOT_ASSIGNED", message);
  }
}

export class StaleGenerationError extends BrokerError {
  constructor(message: string) {
    super("STALE_GENERATION", message);
  }
}

export class LeaseExpiredError extends BrokerError {
  constructor(message = "lease expired: another worker may have this job; make side effects idempotent") {
    super("LEASE_EXPIRED", message);
  }
}

export class QueueFullError extends BrokerError {
  readonly depth: number;
  readonly bytes: number;
  constructor(queue: string, depth: number, bytes: number) {
    super("QUEUE_FULL", `queue ${JSON.stringify(queue)} is full (depth ${depth}, ${bytes} bytes)`, {
      retriable: true,
    });
    this.depth = depth;
    this.bytes = bytes;
  }
}

/** Thrown by a job handler to send the job straight to the dead-letter queue. */
export class PermanentError extends BrokerError {
  constructor(message: string, options?: ErrorOptions) {
    super("PERMANENT", message, options);
  }
}

export class ProtocolError extends BrokerError {
  constructor(message: string, code = "PROTOCOL") {
    super(code, message);
  }
}

export class UnsupportedVersionError extends BrokerError {
  constructor(message: string) {
    super("UNSUPPORTED_VERSION", message);
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
  ConflictError,
  TopicExistsError,
  GroupActiveError,
  RecordTooLargeError,
  OffsetOutOfRangeError,
  CorruptRecordError,
  InvalidBatchError,
  StorageFullError,
  StorageError,
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
  ProtocolError,
  UnsupportedVersionError,
} as const;
