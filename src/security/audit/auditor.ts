// SPDX-License-Identifier: Apache-2.0
/**
 * What the broker facade and the queue manager use to audit an administrative operation: run
 * it, then write its outcome ("ok" or the error code) to the audit log and wait until that
 * record is durable before handing the outcome back (AUD-1).
 *
 * A crash after the operation took effect and before its record was durable leaves the change
 * unrecorded; the caller never got an answer in that case. An operation whose record could
 * not be written is reported as a retriable `StorageError` (a change it made stands; a failure
 * is its cause), so no caller is told an outcome that is not in the audit log.
 */
import { BrokerError, StorageError } from "../../errors.js";
import type { Logger } from "../../observability/telemetry.js";
import type { AuditLog } from "./audit-log.js";
import { EMBEDDED_ACTOR, type AuditActor, type AuditDetails, type AuditResourceType } from "./record.js";

/** The operation and what it acts on. */
export interface AuditTarget {
  op: string;
  resourceType: AuditResourceType;
  resource: string;
  details?: AuditDetails;
}

export interface Auditor {
  /** Runs `fn`; its outcome is durable in the audit log before it is returned (AUD-1). */
  run<T>(actor: AuditActor | undefined, target: AuditTarget, fn: () => Promise<T>, describe?: (result: T) => AuditDetails): Promise<T>;
  /** Records the outcome of an operation that already ran (`error` undefined: it succeeded). */
  record(actor: AuditActor | undefined, target: AuditTarget, error?: unknown): Promise<void>;
}

/** An auditor that records nothing (no data dir, or auditing turned off). */
export const NO_AUDIT: Auditor = {
  run: (_actor, _target, fn) => fn(),
  record: () => Promise.resolve(),
};

/** The code recorded for a failure: the typed error's code, else INTERNAL. */
export function resultCode(error: unknown): string {
  return error instanceof BrokerError ? error.code : "INTERNAL";
}

export class LogAuditor implements Auditor {
  constructor(
    private readonly log: AuditLog,
    private readonly logger: Logger,
  ) {}

  async run<T>(actor: AuditActor | undefined, target: AuditTarget, fn: () => Promise<T>, describe?: (result: T) => AuditDetails): Promise<T> {
    let value: T;
    try {
      value = await fn();
    } catch (e) {
      // A failure is answered only once recorded too; when that record can not be written the
      // caller learns it (the operation's own error is the cause).
      try {
        await this.record(actor, target, e);
      } catch (err) {
        this.logger.error({ err, op: target.op, resource: target.resource }, "audit record of a failed operation not written");
        throw new StorageError(`${target.op} ${target.resource} failed (${resultCode(e)}), and its audit record could not be written`, e);
      }
      throw e;
    }
    const details = describe === undefined ? target.details : { ...target.details, ...describe(value) };
    try {
      await this.record(actor, { ...target, details });
    } catch (err) {
      throw new StorageError(`${target.op} ${target.resource} took effect, but its audit record could not be written`, err);
    }
    return value;
  }

  async record(actor: AuditActor | undefined, target: AuditTarget, error?: unknown): Promise<void> {
    const a = actor ?? EMBEDDED_ACTOR;
    await this.log.append({
      principal: a.principal,
      source: a.source,
      op: target.op,
      resourceType: target.resourceType,
      resource: target.resource,
      result: error === undefined ? "ok" : resultCode(error),
      details: target.details,
    });
  }
}
