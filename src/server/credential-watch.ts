// SPDX-License-Identifier: Apache-2.0
/**
 * Audits changes to users and tokens (docs/security.md "Audit log"): `sluice users` and
 * `sluice tokens` edit the credential store's file directly, so the server looks at it every
 * POLICY_POLL_MS and records what changed (`credentials.change`: which user names and token
 * ids appeared or went; never a password, key or token).
 */
import { POLICY_POLL_MS } from "../security/acl/policy-store.js";
import type { CredentialStore } from "../security/auth/credential-store.js";
import type { Logger } from "../observability/telemetry.js";
import type { RecordAudit } from "./authorization.js";

/** What can be said of the store without a secret: user names and token ids with principals. */
function names(store: CredentialStore): Set<string> {
  return new Set([...store.listUsers().map((u) => `user:${u.name}`), ...store.listTokens().map((t) => `token:${t.id}(${t.principal})`)]);
}

export function watchCredentials(store: CredentialStore, audit: RecordAudit, logger: Logger): { stop(): void } {
  let known = names(store);
  let busy = false;
  const timer = setInterval(() => {
    if (busy) return;
    busy = true;
    void store
      .refresh()
      .then(() => {
        const now = names(store);
        const added = [...now].filter((n) => !known.has(n));
        const removed = [...known].filter((n) => !now.has(n));
        known = now;
        if (added.length === 0 && removed.length === 0) return;
        const details = { added: added.join(" ").slice(0, 200) || null, removed: removed.join(" ").slice(0, 200) || null, users: store.listUsers().length, tokens: store.listTokens().length };
        return audit({ principal: "data-dir", source: "credentials.json" }, { op: "credentials.change", resourceType: "server", resource: "credentials.json", details });
      })
      .catch((err: unknown) => logger.error({ err }, "audit record of a credentials change not written"))
      .finally(() => (busy = false));
  }, POLICY_POLL_MS);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
