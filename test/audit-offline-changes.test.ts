// SPDX-License-Identifier: Apache-2.0
// AUD-5 (docs/security.md "Audit log"): users, tokens and the authorization policy edited while
// no server runs are recorded by the next server to start, each change once: a restart with
// nothing changed records nothing; a password change is a change even under the same name.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { startServer } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { verifyAuditLog } from "../src/security/audit/verify.js";
import { NodeFileSystem } from "../src/log/io.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import type { AuditRecord } from "../src/security/audit/record.js";

const CHANGE_OPS = new Set(["credentials.change", "acl.change"]);

/** Starts a server on `data`, waits until `expected` change records exist in all, returns those of this start. */
async function startAndRead(data: string, before: number, expected: number): Promise<AuditRecord[]> {
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data });
  try {
    const all = await waitUntil(
      async () => {
        const r = (await broker.listAudit({ limit: 1000 })).filter((x) => CHANGE_OPS.has(x.op));
        return r.length >= before + expected ? r : null;
      },
      `${expected} change records after the start`,
      5_000,
      20,
    );
    // Nothing more arrives: every change is recorded once.
    await new Promise((r) => setTimeout(r, 600)); // two policy polls, to catch a duplicate (not a wait for a condition)
    const again = (await broker.listAudit({ limit: 1000 })).filter((x) => CHANGE_OPS.has(x.op));
    assert.equal(again.length, before + expected, JSON.stringify(again.slice(before).map((r) => [r.op, r.details])));
    return all.slice(before);
  } finally {
    await srv.close();
    await broker.close();
  }
}

test("changes made while no server ran are audited by the next start, once each (AUD-5)", { timeout: 60_000 }, async () => {
  using dir = tempDir("sluice-audit-offline-");
  const data = join(dir.dir, "data");
  const creds = await CredentialStore.open(data);
  const policy = await PolicyStore.open(data);
  await creds.addUser("alice", "correct horse battery");
  const { info: bot } = await creds.createToken("bot");
  await policy.addRule({ principal: "alice", effect: "allow", operation: "admin", resourceType: "topic", pattern: "prefix", name: "a." });

  // First start: everything made before it is new to the audit log.
  const first = await startAndRead(data, 0, 2);
  const cred1 = first.find((r) => r.op === "credentials.change")!;
  assert.deepEqual(String(cred1.details.added).split(" ").sort(), ["user:alice", `token:${bot.id}(bot)`].sort());
  assert.equal(cred1.principal, "data-dir");
  assert.equal(first.find((r) => r.op === "acl.change")!.details.rules, 1);

  // A restart with nothing changed records nothing.
  await startAndRead(data, 2, 0);

  // Offline: a new password for alice, a new user, a revoked token, one more rule.
  await creds.addUser("alice", "a different passphrase");
  await creds.addUser("bob", "bobs own password");
  assert.ok(await creds.revokeToken(bot.id));
  await policy.addRule({ principal: "bob", effect: "allow", operation: "consume", resourceType: "topic", pattern: "literal", name: "b.events" });
  const second = await startAndRead(data, 2, 2);
  const cred2 = second.find((r) => r.op === "credentials.change")!;
  assert.equal(cred2.details.added, "user:bob");
  assert.equal(cred2.details.removed, `token:${bot.id}(bot)`);
  assert.equal(cred2.details.changed, "user:alice");
  assert.equal(second.find((r) => r.op === "acl.change")!.details.rules, 2);
  // Never a password or a key in the records.
  assert.doesNotMatch(JSON.stringify([...first, ...second]), /horse|passphrase|bobs own/);

  const report = await verifyAuditLog(new NodeFileSystem(), data);
  assert.equal(report.ok, true, JSON.stringify(report));
});
