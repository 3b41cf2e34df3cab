// SPDX-License-Identifier: Apache-2.0
/** The audit log of administrative operations (docs/security.md "Audit log"). */
export { AuditLog, auditLogPath, AUDIT_DIR, AUDIT_FILE, type AuditLogOptions } from "./audit-log.js";
export { LogAuditor, NO_AUDIT, resultCode, type Auditor, type AuditTarget } from "./auditor.js";
export { listAuditRecords, readAuditItems, type AuditItem, type ListOptions } from "./reader.js";
export { EMBEDDED_ACTOR, type AuditActor, type AuditDetails, type AuditEntry, type AuditRecord, type AuditResourceType } from "./record.js";
export { verifyAuditLog, type VerifyFailure, type VerifyResult } from "./verify.js";
