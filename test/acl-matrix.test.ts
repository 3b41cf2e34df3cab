// SPDX-License-Identifier: Apache-2.0
// The ACL matrix (docs/security.md#authorization): one principal per (operation x resource type
// x literal|prefix x allow|deny) rule, every probe request over the binary protocol and over
// HTTP, each outcome compared with a reference model written independently of src/security/acl
// (test/acl-reference.ts). Default deny: a principal without rules may do nothing and sees nothing.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect, type RemoteBrokerHandle as Client } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { BrokerError } from "../src/errors.js";
import { tempDir } from "../src/testing/helpers.js";
import { NAMES, matrixPrincipals, model, type Need, type Rule } from "./acl-reference.js";

// ---- the probes ------------------------------------------------------------------------
const GROUP = (n: string): string => `${n}.g`;

interface Probe {
  what: string;
  needs: (n: string) => Need[];
  /** When the client makes other requests first (a publishing client reads the topic's partitions). */
  tcpNeeds?: (n: string) => Need[];
  tcp?: (c: Client, n: string) => Promise<unknown>;
  http?: (n: string) => { method: string; path: string; body?: unknown };
  /** Puts back what an allowed probe changed (run as admin). */
  restore?: (admin: Client, n: string) => Promise<unknown>;
}

const PROBES: Probe[] = [
  { what: "describe topic", needs: (n) => [["describe", "topic", n]], tcp: (c, n) => c.describeTopic(n), http: (n) => ({ method: "GET", path: `/v1/topics/${n}` }) },
  { what: "publish", needs: (n) => [["publish", "topic", n]], tcpNeeds: (n) => [["publish", "topic", n], ["describe", "topic", n]], tcp: (c, n) => c.publish(n, { value: "x" }), http: (n) => ({ method: "POST", path: `/v1/topics/${n}/records`, body: { value: "x" } }) },
  { what: "fetch", needs: (n) => [["consume", "topic", n]], tcp: (c, n) => c.fetch(n, 0, 0), http: (n) => ({ method: "GET", path: `/v1/topics/${n}/partitions/0/records` }) },
  { what: "alter topic", needs: (n) => [["alter", "topic", n]], tcp: (c, n) => c.alterTopic(n, { retentionMs: 86_400_000 }), http: (n) => ({ method: "PATCH", path: `/v1/topics/${n}`, body: { retentionMs: 86_400_000 } }) },
  {
    what: "delete topic",
    needs: (n) => [["delete", "topic", n]],
    tcp: (c, n) => c.deleteTopic(n),
    http: (n) => ({ method: "DELETE", path: `/v1/topics/${n}` }),
    restore: (a, n) => a.createTopic(n, { partitions: 1 }).catch(() => {}),
  },
  { what: "create topic", needs: (n) => [["create", "topic", `${n}.new`]], tcp: (c, n) => c.createTopic(`${n}.new`, { partitions: 1 }), http: (n) => ({ method: "POST", path: "/v1/topics", body: { name: `${n}.new`, config: { partitions: 1 } } }), restore: (a, n) => a.deleteTopic(`${n}.new`).catch(() => {}) },
  { what: "group lag", needs: (n) => [["describe", "group", GROUP(n)], ["describe", "topic", "mx.lit"]], tcp: (c, n) => c.groupLag(GROUP(n), "mx.lit"), http: (n) => ({ method: "GET", path: `/v1/groups/${GROUP(n)}/topics/mx.lit/lag` }) },
  { what: "reset offsets", needs: (n) => [["describe", "topic", "mx.lit"], ["reset-offsets", "group", GROUP(n)]], tcp: (c, n) => c.resetGroup(GROUP(n), "mx.lit", "earliest"), http: (n) => ({ method: "POST", path: `/v1/groups/${GROUP(n)}/topics/mx.lit/reset`, body: { to: "earliest" } }) },
  { what: "enqueue", needs: (n) => [["publish", "queue", n]], tcp: (c, n) => c.queue(n).enqueue("x"), http: (n) => ({ method: "POST", path: `/v1/queues/${n}/jobs`, body: { data: "x" } }) },
  { what: "queue stats", needs: (n) => [["describe", "queue", n]], tcp: (c, n) => c.queue(n).stats(), http: (n) => ({ method: "GET", path: `/v1/queues/${n}/stats` }) },
  { what: "browse", needs: (n) => [["consume", "queue", n]], tcp: (c, n) => c.queue(n).browse(), http: (n) => ({ method: "GET", path: `/v1/queues/${n}/browse` }) },
  { what: "purge", needs: (n) => [["purge", "queue", n]], tcp: (c, n) => c.queue(n).purge(), http: (n) => ({ method: "POST", path: `/v1/queues/${n}/purge` }) },
  { what: "redrive", needs: (n) => [["redrive", "dlq", n]], tcp: (c, n) => c.queue(n).redrive(), http: (n) => ({ method: "POST", path: `/v1/queues/${n}/redrive`, body: {} }) },
  {
    what: "delete queue",
    needs: (n) => [["delete", "queue", n]],
    tcp: (c, n) => c.deleteQueue(n),
    http: (n) => ({ method: "DELETE", path: `/v1/queues/${n}` }),
    restore: (a, n) => a.queue(n, { maxAttempts: 3 }).stats(),
  },
  { what: "metrics", needs: () => [["describe", "cluster", "cluster"]], http: () => ({ method: "GET", path: "/metrics" }) },
  { what: "audit", needs: () => [["admin", "cluster", "cluster"]], http: () => ({ method: "GET", path: "/v1/audit" }) },
];

const DENIED_CODES = new Set(["FORBIDDEN", "TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "NOT_FOUND"]);

test("ACL matrix: every operation x resource type x literal|prefix x allow|deny agrees with the reference model over TCP and HTTP", { timeout: 600_000 }, async (t) => {
  using dir = tempDir("sluice-acl-matrix-");
  const data = join(dir.dir, "data");
  const creds = await CredentialStore.open(data);
  const policy = await PolicyStore.open(data);
  const rulesOf = new Map<string, Rule[]>();
  const tokens = new Map<string, string>();
  const admin = "admin";
  tokens.set(admin, (await creds.createToken(admin)).token);
  await policy.addRule({ principal: admin, effect: "allow", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });
  tokens.set("nobody", (await creds.createToken("nobody")).token);
  rulesOf.set("nobody", []);
  for (const [who, rules] of matrixPrincipals()) {
    rulesOf.set(who, rules);
    tokens.set(who, (await creds.createToken(who)).token);
    for (const r of rules) await policy.addRule({ principal: who, effect: r.effect, operation: r.op, resourceType: r.type, pattern: r.pattern, name: r.name });
  }

  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, metrics: { contentType: "text/plain", metrics: async () => "x 1\n" } });
  const adminClient = await connect({ url: srv.url, auth: { token: tokens.get(admin)! } });
  const base = `http://127.0.0.1:${srv.httpPort}`;
  try {
    for (const n of NAMES) {
      await adminClient.createTopic(n, { partitions: 1 });
      await adminClient.queue(n, { maxAttempts: 3 }).stats();
    }
    let checked = 0;
    const mismatches: string[] = [];
    for (const [who, rules] of rulesOf) {
      const client = await connect({ url: srv.url, auth: { token: tokens.get(who)! } });
      try {
        for (const p of PROBES)
          for (const n of NAMES) {
            const want = model(rules, p.needs(n));
            if (p.tcp) {
              const want = model(rules, (p.tcpNeeds ?? p.needs)(n));
              const got = await p.tcp(client, n).then(
                () => true,
                (e: unknown) => !(e instanceof BrokerError && DENIED_CODES.has(e.code)),
              );
              if (got !== want) mismatches.push(`tcp ${who} ${p.what} ${n}: model ${want}, server ${got}`);
              checked++;
              if (want && p.restore) await p.restore(adminClient, n);
            }
            if (p.http) {
              const r = p.http(n);
              const res = await fetch(base + r.path, {
                method: r.method,
                headers: { authorization: `Bearer ${tokens.get(who)}`, "content-type": "application/json" },
                body: r.body === undefined ? undefined : JSON.stringify(r.body),
              });
              const body = (await res.json().catch(() => ({}))) as { error?: { code?: string } };
              const got = !(res.status === 403 || (res.status === 404 && DENIED_CODES.has(body.error?.code ?? "")));
              if (got !== want) mismatches.push(`http ${who} ${p.what} ${n}: model ${want}, server ${got} (${res.status} ${body.error?.code ?? ""})`);
              checked++;
            }
            if (want && p.restore) await p.restore(adminClient, n);
          }
        // Lists show exactly what the model lets this principal see.
        const seen = (await client.listTopics()).filter((x) => NAMES.includes(x)).sort();
        const expectSeen = NAMES.filter((n) => model(rules, [["describe", "topic", n]])).sort();
        if (JSON.stringify(seen) !== JSON.stringify(expectSeen)) mismatches.push(`tcp ${who} listTopics: ${seen} vs model ${expectSeen}`);
        const qs = (await client.listQueues()).filter((x) => NAMES.includes(x)).sort();
        const expectQs = NAMES.filter((n) => model(rules, [["describe", "queue", n]])).sort();
        if (JSON.stringify(qs) !== JSON.stringify(expectQs)) mismatches.push(`tcp ${who} listQueues: ${qs} vs model ${expectQs}`);
        checked += 2;
      } finally {
        await client.close();
      }
    }
    t.diagnostic(`${rulesOf.size} principals, ${checked} checks, ${mismatches.length} mismatches`);
    assert.deepEqual(mismatches.slice(0, 20), []);
    // Default deny: the principal without rules was refused everything (part of the above), and
    // an absent and a forbidden topic answer alike.
    const nobody = await connect({ url: srv.url, auth: { token: tokens.get("nobody")! } });
    try {
      const forbidden = await nobody.describeTopic("mx.lit").then(() => null, (e: BrokerError) => [e.code, e.message.replace("mx.lit", "X")]);
      const absent = await adminClient.describeTopic("mx.absent").then(() => null, (e: BrokerError) => [e.code, e.message.replace("mx.absent", "X")]);
      assert.deepEqual(forbidden, absent);
    } finally {
      await nobody.close();
    }
  } finally {
    await adminClient.close();
    await srv.close();
    await broker.close();
  }
});
