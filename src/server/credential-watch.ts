// SPDX-License-Identifier: Apache-2.0
/**
 * Audits changes to users and tokens (docs/security.md "Audit log"): `sluice users` and
 * `sluice tokens` edit the credential store's file directly, so the server compares it, at
 * start and then every POLICY_POLL_MS, with what the audit log last recorded (AUD-5,
 * src/security/audit/change-baseline.ts) and records what changed (`credentials.change`: which
 * user names and token ids appeared, went or changed; never a password, key or token). Changes
 * made while no server ran are recorded by the next one to start.
 */
import { POLICY_POLL_MS } from "../security/acl/policy-store.js";
import type { CredentialStore } from "../security/auth/credential-store.js";
import type { Logger } from "../observability/telemetry.js";
import type { RecordAudit } from "./authorization.js";
import { credentialDiff, credentialFingerprints, type ChangeBaseline } from "../security/audit/change-baseline.js";

const list = (names: string[]): string | null => names.join(" ").slice(0, 200) || null;

export async function watchCredentials(store: CredentialStore, audit: RecordAudit, logger: Logger, baseline: ChangeBaseline): Promise<{ stop(): void }> {
  let busy = false;
  const check = async (): Promise<void> => {
    await store.refresh();
    const now = credentialFingerprints(store);
    const { added, removed, changed } = credentialDiff(baseline.state.credentials, now);
    if (added.length === 0 && removed.length === 0 && changed.length === 0) return;
    const details = { added: list(added), removed: list(removed), changed: list(changed), users: store.listUsers().length, tokens: store.listTokens().length };
    await audit({ principal: "data-dir", source: "credentials.json" }, { op: "credentials.change", resourceType: "server", resource: "credentials.json", details });
    // AUD-5: only once the record is durable.
    await baseline.save({ credentials: now });
  };
  const run = (): Promise<void> => {
    if (busy) return Promise.resolve();
    busy = true;
    return check()
      .catch((err: unknown) => logger.error({ err }, "audit record of a credentials change not written"))
      .finally(() => (busy = false));
  };
  await run();
  const timer = setInterval(() => void run(), POLICY_POLL_MS);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
