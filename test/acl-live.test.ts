// SPDX-License-Identifier: Apache-2.0
// ACL-3: a policy change reaches live connections within a second: requests are refused and a
// running subscription ends with FORBIDDEN.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { BrokerError } from "../src/errors.js";
import { tempDir } from "../src/testing/helpers.js";

test("a revoked permission applies to a live connection within a second", { timeout: 60_000 }, async () => {
  using dir = tempDir("sluice-acl-live-");
  const data = join(dir.dir, "data");
  const token = (await (await CredentialStore.open(data)).createToken("app")).token;
  const policy = await PolicyStore.open(data);
  const rules = await Promise.all(
    (["publish", "consume"] as const).map((operation) => policy.addRule({ principal: "app", effect: "allow", operation, resourceType: "topic", pattern: "literal", name: "t" })),
  );
  await policy.addRule({ principal: "app", effect: "allow", operation: "consume", resourceType: "group", pattern: "prefix", name: "" });
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  await broker.createTopic("t", { partitions: 1 });
  const srv = await startServer({ broker, port: 0, httpPort: null, dataDir: data });
  const c = await connect({ url: srv.url, auth: { token } });
  try {
    await c.publish("t", { value: "one" });
    const sub = c.subscribe("t", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    assert.equal((await it.next()).done, false);
    // Revoke both; the server must refuse the next publish and end the subscription within 1 s.
    const t0 = performance.now();
    for (const r of rules) await policy.removeRule(r.id);
    let refused = "";
    while (performance.now() - t0 < 1000 && refused === "") {
      refused = await c.publish("t", { value: "more" }).then(
        () => "",
        (e: unknown) => (e instanceof BrokerError ? e.code : String(e)),
      );
    }
    const elapsed = performance.now() - t0;
    assert.ok(refused === "TOPIC_NOT_FOUND" || refused === "FORBIDDEN", `publish after revoke: ${refused || "still allowed"} after ${elapsed.toFixed(0)} ms`);
    assert.ok(elapsed < 1000, `took ${elapsed.toFixed(0)} ms`);
    // Records published before the change took effect may still arrive; then the iterator fails.
    const ended = (async (): Promise<string> => {
      try {
        while (!(await it.next()).done);
        return "ended without error";
      } catch (e) {
        return e instanceof BrokerError ? e.code : String(e);
      }
    })();
    const how = await Promise.race([ended, new Promise<string>((r) => setTimeout(() => r("still running"), 1200).unref())]);
    assert.equal(how, "FORBIDDEN");
    // The change is in the audit log once the server took it into force.
    const changes = (await broker.listAudit({ limit: 1000 })).filter((r) => r.op === "acl.change");
    assert.ok(changes.length >= 1 && changes.at(-1)!.details.rules === 1, JSON.stringify(changes.at(-1)));
    // So is a new token (its id, never the token).
    const { info, token: second } = await (await CredentialStore.open(data)).createToken("second");
    const deadline = Date.now() + 3000;
    let cred: Awaited<ReturnType<typeof broker.listAudit>> = [];
    // The first record is the server's start: the token made before it, never recorded (AUD-5).
    while (Date.now() < deadline && cred.length < 2) {
      cred = (await broker.listAudit({ limit: 1000 })).filter((r) => r.op === "credentials.change");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(cred.length, 2);
    assert.match(String(cred[0].details.added), /token:[0-9a-f]{12}\(app\)/);
    assert.match(String(cred[1].details.added), new RegExp(`token:${info.id}\\(second\\)`));
    assert.doesNotMatch(JSON.stringify(cred), new RegExp(second));
  } finally {
    await c.close();
    await srv.close();
    await broker.close();
  }
});
