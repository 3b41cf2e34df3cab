// SPDX-License-Identifier: Apache-2.0
/**
 * The server's authorization is the shared one (src/security/acl/authorization.ts), which the
 * embedded principal view uses too (ACL-5); the server adds its quotas' use of it.
 */
export { PolicyAuthorization as ServerAuthorization, type Gate, type Reauthorize, type RecordAudit } from "../security/acl/authorization.js";
