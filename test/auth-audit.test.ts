// SPDX-License-Identifier: Apache-2.0
// Audited operations through a server that requires logins carry the authenticated principal:
// a SCRAM user over the protocol and a token's principal over HTTP (docs/security.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { NodeFileSystem } from "../src/log/io.js";
import { listAuditRecords } from "../src/security/audit/reader.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { startServer } from "../src/server/index.js";
import { tempDir } from "../src/testing/helpers.js";
import { grantAdmin } from "./fixtures/acl.js";

test("audit records name the user or token principal that logged in", async () => {
  using dir = tempDir("sluice-auth-audit-");
  const store = await CredentialStore.open(dir.dir);
  await store.addUser("alice", "alice-password", 4096);
  const { token } = await store.createToken("ci-bot");
  await grantAdmin(dir.dir, "alice", "ci-bot");
  const broker = await openBroker({ dataDir: dir.dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: dir.dir });
  try {
    const c = await connect({ url: srv.url, auth: { username: "alice", password: "alice-password" } });
    await c.createTopic("by-alice", { partitions: 1 });
    await c.close();
    const res = await fetch(`http://127.0.0.1:${srv.httpPort}/v1/topics`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "by-ci" }),
    });
    assert.equal(res.status, 201);
  } finally {
    await srv.close();
    await broker.close();
  }
  const records = await listAuditRecords(new NodeFileSystem(), dir.dir, { limit: 100 });
  const by = (topic: string): string | undefined => records.find((r) => JSON.stringify(r).includes(`"${topic}"`))?.principal;
  assert.equal(by("by-alice"), "alice");
  assert.equal(by("by-ci"), "ci-bot");
});
