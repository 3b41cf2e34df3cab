// SPDX-License-Identifier: Apache-2.0
// Tenant isolation (docs/security.md#tenants): a tenant's principals reach only names under
// "<tenant>.", whatever their rules say and however another tenant's names are spelled or
// encoded (case, Unicode look-alikes and normalisation, %2F, ".."), over TCP and HTTP.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { BrokerError } from "../src/errors.js";
import { tempDir } from "../src/testing/helpers.js";
import { tenantsWithTokens } from "./fixtures/acl.js";

const TRICKS = [
  "acme.orders",
  "ACME.orders",
  "Acme.orders",
  "\uff41cme.orders", // fullwidth a
  "acme.orders\u0301", // combining accent
  "a\u0063me.orders".normalize("NFD"),
  "acme%2Forders",
  "acme%2Eorders",
  "bob/../acme.orders",
  "bob.x/../../acme.orders",
  "../acme.orders",
  "./acme.orders",
  "acme.orders/",
  " acme.orders",
  "acme\u0000.orders",
];

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "OK",
    (e: unknown) => (e instanceof BrokerError ? e.code : String(e)),
  );
}

test("tenants: nothing of one tenant is reachable from another, however names are spelled", { timeout: 120_000 }, async () => {
  using dir = tempDir("sluice-tenants-");
  const data = join(dir.dir, "data");
  const { alice, bob } = await tenantsWithTokens(data, [
    ["acme", "alice"],
    ["bob", "bob"],
  ]);
  const policy = await PolicyStore.open(data);
  // Even a rule that would make bob a super user does not reach outside his tenant (ACL-2).
  await policy.addRule({ principal: "bob", effect: "allow", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });

  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, metrics: { contentType: "text/plain", metrics: async () => 'sluice_x{topic="acme.orders"} 1\n' } });
  const a = await connect({ url: srv.url, auth: { token: alice } });
  const b = await connect({ url: srv.url, auth: { token: bob } });
  const base = `http://127.0.0.1:${srv.httpPort}`;
  const http = (token: string, method: string, path: string, body?: unknown): Promise<Response> =>
    fetch(base + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  try {
    // Alice's tenant: a topic with a record, a group with a committed offset, a queue with a
    // job and a dead-letter queue.
    await a.createTopic("acme.orders", { partitions: 1 });
    await a.publish("acme.orders", { key: "k", value: "secret-order" });
    await a.resetGroup("acme.g", "acme.orders", "earliest");
    const q = a.queue("acme.jobs", { maxAttempts: 1 });
    await q.enqueue({ card: "4111" });
    await b.createTopic("bob.orders", { partitions: 1 });
    // Alice cannot step outside her tenant either, not even by naming a DLQ in bob's.
    assert.notEqual(await code(a.queue("acme.q2", { deadLetter: "bob.stolen" }).enqueue("x")), "OK");
    assert.equal(await code(a.describeTopic("bob.orders")), "TOPIC_NOT_FOUND");

    for (const name of TRICKS) {
      const outcomes = {
        describe: await code(b.describeTopic(name)),
        publish: await code(b.publish(name, { value: "x" })),
        fetch: await code(b.fetch(name, 0, 0)),
        delete: await code(b.deleteTopic(name)),
        create: await code(b.createTopic(name, { partitions: 1 })),
        lag: await code(b.groupLag("acme.g", name)),
        groups: await code(b.listGroups({ topic: name })),
        reset: await code(b.resetGroup(name.replace("orders", "g"), "bob.orders", "earliest")),
        browse: await code(b.queue(name.replace("orders", "jobs")).browse()),
        purge: await code(b.queue(name.replace("orders", "jobs")).purge()),
        redrive: await code(b.queue(`${name.replace("orders", "jobs")}.dlq`).redrive()),
        enqueue: await code(b.queue(name.replace("orders", "jobs")).enqueue("x")),
      };
      for (const [what, c] of Object.entries(outcomes)) {
        // Never allowed, and never FORBIDDEN either: bob cannot tell a tenant's name exists.
        // Creating is refused with FORBIDDEN before any existence check, so it tells nothing.
        const ok = ["TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "NOT_FOUND", "INVALID_NAME", "VALIDATION", ...(what === "create" ? ["FORBIDDEN"] : [])];
        assert.ok(ok.includes(c), `bob ${what} ${JSON.stringify(name)}: ${c}`);
      }
      for (const path of [`/v1/topics/${encodeURIComponent(name)}`, `/v1/topics/${name}`, `/v1/queues/${encodeURIComponent(name.replace("orders", "jobs"))}/browse`]) {
        const res = await http(bob, "GET", path).catch(() => null);
        if (res === null) continue; // a URL fetch refuses to send is not a way in either
        assert.ok(res.status === 404 || res.status === 400, `bob GET ${path}: ${res.status}`);
        assert.doesNotMatch(await res.text(), /secret-order|4111/);
      }
    }
    // Lists show bob nothing of acme; metrics name every tenant's resources, so no tenant
    // principal reads them, and the audit log is for admins outside tenants.
    assert.deepEqual((await b.listTopics()).filter((t) => !t.startsWith("bob.")), []);
    assert.deepEqual((await b.listQueues()).filter((t) => !t.startsWith("bob.")), []);
    assert.deepEqual((await b.listGroups()).filter((g) => !g.group.startsWith("bob.") || !g.topic.startsWith("bob.")), []);
    assert.equal((await http(bob, "GET", "/metrics")).status, 404);
    assert.equal((await http(bob, "GET", "/v1/audit")).status, 404);
    const listed = (await (await http(bob, "GET", "/v1/topics")).json()) as { topics: string[] };
    assert.deepEqual(listed.topics.filter((t) => !t.startsWith("bob.")), []);
    // Denied requests are audited (in the background: wait for them), one record per
    // (principal, address, operation, resource) per minute with a count.
    const deadline = Date.now() + 5000;
    let denied: Awaited<ReturnType<typeof broker.listAudit>> = [];
    while (Date.now() < deadline && !denied.some((r) => r.resource === "acme.orders" && r.details.operation === "describe")) {
      denied = (await broker.listAudit({ limit: 10_000 })).filter((r) => r.op === "acl.denied" && r.principal === "bob");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.ok(denied.some((r) => r.resource === "acme.orders" && r.details.operation === "describe" && r.result === "TOPIC_NOT_FOUND"), "bob's denied describe is audited");
    // Alice's data is untouched.
    const r = await a.fetch("acme.orders", 0, 0);
    assert.equal(r.records.length, 1);
    assert.equal((await q.stats()).waiting, 1);
  } finally {
    await a.close();
    await b.close();
    await srv.close();
    await broker.close();
  }
});
