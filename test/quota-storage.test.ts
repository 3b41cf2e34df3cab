// SPDX-License-Identifier: Apache-2.0
// Storage quotas of tenants (QUO-2) and quotas over HTTP (QUO-1), docs/security.md#quotas: a
// tenant at its storage bound gets QUOTA_EXCEEDED for publishes and enqueues, over the protocol
// and HTTP, with nothing written; another tenant writes on; raising the bound (or freeing
// space) lets writes through again. HTTP requests are delayed by a requests-per-second quota
// like protocol requests.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { validateQuota } from "../src/security/acl/quotas.js";
import { BrokerError, QuotaExceededError, ValidationError } from "../src/errors.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { tenantsWithTokens } from "./fixtures/acl.js";

const LIMIT = 64 * 1024;

async function outcome(p: Promise<unknown>): Promise<BrokerError | "OK"> {
  return p.then(
    () => "OK" as const,
    (e: unknown) => {
      if (e instanceof BrokerError) return e;
      throw e;
    },
  );
}

test("a storage quota is for tenants only", () => {
  assert.throws(() => validateQuota("alice", { storageBytes: 10 }), ValidationError);
  validateQuota("tenant:acme", { storageBytes: 10 });
});

test("storage quota: a tenant at its bound is refused with QUOTA_EXCEEDED over TCP and HTTP, nothing written; others write on; raising it lets writes through", { timeout: 60_000 }, async () => {
  using dir = tempDir("sluice-storage-quota-");
  const data = join(dir.dir, "data");
  const { alice, bob } = await tenantsWithTokens(data, [
    ["acme", "alice"],
    ["bob", "bob"],
  ]);
  const policy = await PolicyStore.open(data);
  await policy.setQuota("tenant:acme", { storageBytes: LIMIT });

  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data });
  // QUOTA_EXCEEDED is retriable: the client holds a refused write, retrying, for up to
  // deliveryTimeoutMs before failing it with the error (short here).
  const a = await connect({ url: srv.url, auth: { token: alice }, deliveryTimeoutMs: 1500 });
  const b = await connect({ url: srv.url, auth: { token: bob } });
  const http = (method: string, path: string, body?: unknown): Promise<Response> =>
    fetch(`http://127.0.0.1:${srv.httpPort}${path}`, { method, headers: { authorization: `Bearer ${alice}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  try {
    await a.createTopic("acme.t", { partitions: 1 });
    await b.createTopic("bob.t", { partitions: 1 });
    const q = a.queue<string>("acme.q");
    await q.enqueue("first");
    // Fill past the bound: writes are accepted until a measurement (every second) sees it.
    const value = "x".repeat(4000);
    const refused = await waitUntil(
      async () => {
        const r = await outcome(a.publishBatch("acme.t", Array.from({ length: 4 }, () => ({ value }))));
        return r === "OK" ? null : r;
      },
      "a publish refused once acme holds more than its storage quota",
      20_000,
      20,
    );
    assert.ok(refused instanceof QuotaExceededError, `refused with ${String(refused)}`);
    assert.equal(refused.code, "QUOTA_EXCEEDED");
    assert.equal(refused.retriable, true);
    assert.equal(refused.entity, "tenant:acme");
    assert.equal(refused.limitBytes, LIMIT);
    assert.ok(refused.usedBytes >= LIMIT);

    // Writes let through between measurements are counted: the bound is passed by at most the
    // write that crossed it (a batch of 16 KB here), not by a second's worth of writes.
    const stored = (await a.describeTopic("acme.t")).partitions.reduce((n, p) => n + p.sizeBytes, 0) + (await q.stats()).bytes;
    assert.ok(stored < LIMIT + 32 * 1024, `acme stores ${stored} bytes against a bound of ${LIMIT}`);

    // Nothing written by refused calls, over either port; reads go on.
    const end = (await a.describeTopic("acme.t")).partitions[0].logEndOffset;
    assert.equal(((await outcome(a.publish("acme.t", "one more"))) as BrokerError).code, "QUOTA_EXCEEDED");
    assert.equal(((await outcome(q.enqueue("second"))) as BrokerError).code, "QUOTA_EXCEEDED");
    const res = await http("POST", "/v1/topics/acme.t/records", { value: "by http" });
    assert.equal(res.status, 429);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "QUOTA_EXCEEDED");
    assert.equal((await http("POST", "/v1/queues/acme.q/jobs", { jobs: [{ data: "by http" }] })).status, 429);
    assert.equal((await a.describeTopic("acme.t")).partitions[0].logEndOffset, end);
    assert.equal((await q.stats()).depth, 1);
    assert.equal((await a.fetch("acme.t", 0, 0)).records.length > 0, true);

    // Another tenant is not affected.
    assert.equal(await outcome(b.publish("bob.t", value)), "OK");

    // A write held by the client goes through once the bound is raised (within a poll of the
    // policy and a measurement), like every write after it.
    const held = await connect({ url: srv.url, auth: { token: alice }, deliveryTimeoutMs: 30_000 });
    try {
      const pending = outcome(held.publish("acme.t", "held"));
      await policy.setQuota("tenant:acme", { storageBytes: 100 * LIMIT });
      assert.equal(await pending, "OK");
      assert.equal(await outcome(a.publish("acme.t", "after raise")), "OK");
      assert.equal(await outcome(q.enqueue("second")), "OK");
    } finally {
      await held.close();
    }
  } finally {
    await a.close();
    await b.close();
    await srv.close();
    await broker.close();
  }
});

test("requests per second count HTTP requests too: they are delayed, not refused", { timeout: 60_000 }, async () => {
  using dir = tempDir("sluice-http-quota-");
  const data = join(dir.dir, "data");
  const creds = await CredentialStore.open(data);
  const policy = await PolicyStore.open(data);
  const carol = (await creds.createToken("carol")).token;
  await policy.addRule({ principal: "carol", effect: "allow", operation: "admin", resourceType: "topic", pattern: "prefix", name: "" });
  const RATE = 10;
  await policy.setQuota("carol", { requestsPerSec: RATE });
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data });
  try {
    const N = 3 * RATE;
    const t0 = performance.now();
    const statuses = await Promise.all(
      Array.from({ length: N }, () => fetch(`http://127.0.0.1:${srv.httpPort}/v1/topics`, { headers: { authorization: `Bearer ${carol}` } }).then((r) => r.status)),
    );
    const seconds = (performance.now() - t0) / 1000;
    assert.deepEqual(new Set(statuses), new Set([200]));
    // The bucket holds one second of the rate; the rest go at RATE per second.
    assert.ok(seconds >= (N - RATE) / RATE - 0.3, `${N} requests at ${RATE}/s took ${seconds.toFixed(2)} s`);
  } finally {
    await srv.close();
    await broker.close();
  }
});
