// SPDX-License-Identifier: Apache-2.0
// Embedded enforcement (docs/security.md, "Embedded mode"): `broker.as(principal)` is checked
// against the data dir's policy file as the server checks a logged-in principal (ACL-5): the
// same needs, lists filtered, a resource one may not see answers exactly as an absent one,
// creating answers FORBIDDEN, tenants confined to their prefix however names are spelled, live
// subscriptions and workers ended when the policy stops allowing them; the broker itself keeps
// full rights.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { RESOURCE_TYPES, type AclRule, type Operation, type ResourceType } from "../src/security/acl/model.js";
import { BrokerError, ForbiddenError } from "../src/errors.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import type { PrincipalBroker } from "../src/broker/principal-view.js";
import { NAMES, matrixPrincipals, model, type Need } from "./acl-reference.js";

const OPS: Operation[] = ["publish", "consume", "create", "delete", "commit", "ack"];
const TYPES: ResourceType[] = ["topic", "queue", "group"];

/** alice: publish, consume, create, delete, commit and ack on every name under "a."; bob the same under "b.". */
async function policyFor(data: string): Promise<{ policy: PolicyStore; rules: Map<string, AclRule> }> {
  const policy = await PolicyStore.open(data);
  const rules = new Map<string, AclRule>();
  for (const [who, prefix] of [["alice", "a."], ["bob", "b."]])
    for (const op of OPS)
      for (const type of TYPES) rules.set(`${who}:${op}:${type}`, await policy.addRule({ principal: who, effect: "allow", operation: op, resourceType: type, pattern: "prefix", name: prefix }));
  return { policy, rules };
}

async function outcome(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "OK",
    (e: unknown) => (e instanceof BrokerError ? `${e.code}: ${e.message}` : String(e)),
  );
}

/** The error of `p` with `name` written as X, to compare a forbidden resource's error with an absent one's. */
async function errorOf(p: Promise<unknown>, name: string): Promise<string> {
  return (await outcome(p)).split(name).join("X");
}

async function withBroker(fn: (broker: EmbeddedBroker, data: string, ctx: { policy: PolicyStore; rules: Map<string, AclRule> }) => Promise<void>): Promise<void> {
  using dir = tempDir("sluice-embedded-acl-");
  const data = join(dir.dir, "data");
  const ctx = await policyFor(data);
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  try {
    await fn(broker, data, ctx);
  } finally {
    await broker.close();
  }
}

/** Bob's resources and alice's, made with the broker's own full rights. */
async function seed(broker: EmbeddedBroker): Promise<void> {
  for (const p of ["a", "b"]) {
    await broker.createTopic(`${p}.orders`, { partitions: 1 });
    await broker.publish(`${p}.orders`, `${p}-secret`);
    await broker.resetGroup(`${p}.g`, `${p}.orders`, "earliest");
    await broker.queue(`${p}.jobs`, { maxAttempts: 1 }).enqueue(`${p}-job`);
  }
}

test("a principal view cannot reach another principal's resources, and what it is refused looks absent", { timeout: 60_000 }, async () => {
  await withBroker(async (broker) => {
    await seed(broker);
    const alice = broker.as("alice");
    // Her own: allowed.
    assert.equal((await alice.publish("a.orders", "x")).offset, 1);
    assert.equal((await alice.fetch("a.orders", 0, 0)).records.length, 2);
    assert.equal((await alice.describeTopic("a.orders")).name, "a.orders");
    assert.equal((await alice.queue("a.jobs").browse()).jobs.length, 1);

    // Bob's: each refusal is exactly the error of an absent resource (ACL-4).
    const probes: [string, (b: typeof broker | typeof alice, n: string) => Promise<unknown>][] = [
      ["describe", (b, n) => b.describeTopic(n)],
      ["publish", (b, n) => b.publish(n, "x")],
      ["publishBatch", (b, n) => b.publishBatch(n, [{ value: "x" }])],
      ["fetch", (b, n) => b.fetch(n, 0, 0)],
      ["offsetForTimestamp", (b, n) => b.offsetForTimestamp(n, 0, 0)],
      ["alter", (b, n) => b.alterTopic(n, { retentionMs: 1000 })],
      ["delete", (b, n) => b.deleteTopic(n)],
      ["groupLag", (b, n) => b.groupLag("a.g", n)],
      ["listGroups", (b, n) => b.listGroups({ topic: n })],
      ["subscribe", (b, n) => b.subscribe(n, { group: "a.g" })[Symbol.asyncIterator]().next()],
      ["queue stats", (b, n) => b.queue(n).stats()],
      ["queue browse", (b, n) => b.queue(n).browse()],
      ["queue purge", (b, n) => b.queue(n).purge()],
      ["queue remove", (b, n) => b.queue(n).remove("1")],
      ["queue redrive", (b, n) => b.queue(n).redrive()],
    ];
    for (const [what, probe] of probes) {
      const bobs = what.startsWith("queue") ? "b.jobs" : "b.orders";
      const forbidden = await errorOf(probe(alice, bobs), bobs);
      const absent = await errorOf(probe(broker, "a.absent"), "a.absent");
      assert.notEqual(forbidden, "OK", `alice ${what} on bob's`);
      assert.equal(forbidden, absent, `alice ${what} on bob's answers as an absent one`);
    }
    // Group on bob's side, topic on hers: the group is refused as absent too.
    assert.match(await outcome(alice.resetGroup("b.g", "a.orders", "earliest")), /^NOT_FOUND/);
    // Reads that answer an absent queue with nothing (null, []) are refused as absent.
    assert.match(await outcome(alice.queue("b.jobs").getJob("1")), /^QUEUE_NOT_FOUND/);
    assert.match(await outcome(alice.queue("b.jobs").listSchedules()), /^QUEUE_NOT_FOUND/);
    assert.match(await outcome(broker.as("alice").deleteQueue("b.jobs")), /^QUEUE_NOT_FOUND/);

    // Nothing of bob's changed, and nothing was created by the attempts.
    assert.equal((await broker.fetch("b.orders", 0, 0)).records.length, 1);
    assert.equal((await broker.queue("b.jobs").stats()).waiting, 1);
    assert.deepEqual((await broker.listTopics()).sort(), ["a.orders", "b.orders"]);
  });
});

test("creating outside the principal's prefix answers FORBIDDEN and creates nothing; lists show only its own", { timeout: 60_000 }, async () => {
  await withBroker(async (broker) => {
    await seed(broker);
    const alice = broker.as("alice");
    assert.equal((await alice.createTopic("a.new", { partitions: 1 })).name, "a.new");
    for (const name of ["b.new", "c.new", "A.new"]) assert.match(await outcome(alice.createTopic(name, { partitions: 1 })), /^FORBIDDEN/, name);
    // A declared queue (or its dead-letter queue) outside her prefix is a creation too; an
    // enqueue there is refused first for writing to a queue she cannot see (as the server does).
    assert.match(await outcome(alice.queue("c.q", { maxAttempts: 1 }).enqueue("x")), /^QUEUE_NOT_FOUND/);
    assert.match(await outcome(alice.queue("a.q", { maxAttempts: 1, deadLetter: "b.stolen" }).enqueue("x")), /^FORBIDDEN/);
    assert.equal((await alice.queue("a.q2", { maxAttempts: 1 }).enqueue("x")).id.length > 0, true);
    const all = [...(await broker.listTopics()), ...(await broker.listQueues())];
    for (const n of ["b.new", "c.new", "A.new", "c.q", "b.stolen", "a.q"]) assert.ok(!all.includes(n), `${n} was not created`);

    assert.deepEqual((await alice.listTopics()).sort(), ["a.new", "a.orders"]);
    assert.deepEqual((await alice.listQueues()).sort(), ["a.jobs", "a.jobs.dlq", "a.q2", "a.q2.dlq"]);
    assert.deepEqual((await alice.listGroups()).map((g) => `${g.group}/${g.topic}`), ["a.g/a.orders"]);
    assert.deepEqual((await broker.as("bob").listTopics()).sort(), ["b.orders"]);
    assert.deepEqual(await broker.as("nobody").listTopics(), []);
  });
});

test("denied calls of a view are audited with its principal and source embedded", { timeout: 60_000 }, async () => {
  await withBroker(async (broker) => {
    await seed(broker);
    const alice = broker.as("alice");
    await outcome(alice.describeTopic("b.orders"));
    await outcome(alice.createTopic("b.mine"));
    const denied = await waitUntil(
      async () => {
        const rs = (await broker.listAudit({ limit: 10_000 })).filter((r) => r.op === "acl.denied" && r.principal === "alice");
        return rs.length >= 2 ? rs : null;
      },
      "alice's denials in the audit log",
      5000,
    );
    assert.ok(denied.every((r) => r.source === "embedded"));
    assert.ok(denied.some((r) => r.resource === "b.orders" && r.details.operation === "describe" && r.result === "TOPIC_NOT_FOUND"));
    assert.ok(denied.some((r) => r.resource === "b.mine" && r.details.operation === "create" && r.result === "FORBIDDEN"));
    // Allowed administrative calls are audited as the principal too.
    await alice.createTopic("a.audited");
    const created = (await broker.listAudit({ limit: 10_000 })).find((r) => r.op === "topic.create" && r.resource === "a.audited");
    assert.equal(created?.principal, "alice");
    assert.equal(created?.source, "embedded");
  });
});

test("handles a view returns check too: commits and settles need their own permission", { timeout: 60_000 }, async () => {
  await withBroker(async (broker, _data, { policy }) => {
    await seed(broker);
    // eve may consume alice's topic and queue, but neither commit in the group nor settle jobs.
    for (const type of ["topic", "group", "queue"] as const) await policy.addRule({ principal: "eve", effect: "allow", operation: "consume", resourceType: type, pattern: "prefix", name: "a." });
    const eve = broker.as("eve");
    const sub = eve.subscribe<string>("a.orders", { group: "a.eve", start: "earliest" });
    const first = await withTimeout(sub[Symbol.asyncIterator]().next(), 5000, "eve's first message");
    assert.equal(first.done, false);
    if (!first.done) await assert.rejects(first.value.commit(), ForbiddenError);
    await sub.close();
    const worker = eve.queue("a.jobs").work();
    const job = await withTimeout(worker[Symbol.asyncIterator]().next(), 5000, "eve's first job");
    if (job.done !== true) await assert.rejects(job.value.ack(), ForbiddenError);
    await worker.close();
    // A handle of the broker itself has full rights: the job is still there to ack.
    const w = broker.queue("a.jobs").work();
    const again = await withTimeout(w[Symbol.asyncIterator]().next(), 5000, "the job again");
    if (again.done !== true) await again.value.ack();
    await w.close();
  });
});

test("a live subscription, worker and process() loop end with ForbiddenError within a second of losing consume", { timeout: 60_000 }, async () => {
  await withBroker(async (broker, _data, { policy, rules }) => {
    await seed(broker);
    const alice = broker.as("alice");
    const sub = alice.subscribe<string>("a.orders", { group: "a.live", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    const m = await withTimeout(it.next(), 5000, "alice's first message");
    assert.equal(m.done, false);
    if (!m.done) await m.value.commit();
    const worker = alice.queue("a.jobs").work();
    const wit = worker[Symbol.asyncIterator]();
    const j = await withTimeout(wit.next(), 5000, "alice's first job");
    if (j.done !== true) await j.value.ack();
    // All wait for more; then the policy takes consume away.
    const pending = it.next().then(() => "delivered", (e: unknown) => e);
    const pendingJob = wit.next().then(() => "delivered", (e: unknown) => e);
    const processing = alice
      .queue("a.jobs")
      .process(() => undefined)
      .then(() => "returned", (e: unknown) => e);
    const removedAt = Date.now();
    await policy.removeRule(rules.get("alice:consume:topic")!.id);
    await policy.removeRule(rules.get("alice:consume:queue")!.id);
    const ended = await withTimeout(pending, 3000, "the subscription to end");
    const endedJob = await withTimeout(pendingJob, 3000, "the worker to end");
    const endedProcess = await withTimeout(processing, 3000, "process() to end");
    const tookMs = Date.now() - removedAt;
    assert.ok(endedProcess instanceof ForbiddenError, `process() ended with ${String(endedProcess)}`);
    assert.ok(ended instanceof ForbiddenError, `subscription ended with ${String(ended)}`);
    assert.ok(endedJob instanceof ForbiddenError, `worker ended with ${String(endedJob)}`);
    // ACL-3: polled every 250 ms; the slack is for a loaded machine.
    assert.ok(tookMs < 2000, `ended ${tookMs} ms after the change`);
    await assert.rejects(it.next(), ForbiddenError);
    // The member left its group, so the group can be reset by one still allowed.
    await waitUntil(async () => (await broker.groupLag("a.live", "a.orders")).members.length === 0, "alice's member to leave", 5000);
    // New ones are refused as for an absent topic (alice can still see it: she may publish).
    assert.match(await outcome(alice.subscribe("a.orders", { group: "a.live2" })[Symbol.asyncIterator]().next()), /^FORBIDDEN/);
    await alice.close();
  });
});

test("the broker itself keeps full rights whatever the policy says", { timeout: 60_000 }, async () => {
  await withBroker(async (broker, _data, { policy }) => {
    await policy.addRule({ principal: "*", effect: "deny", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });
    broker.as("alice"); // a view exists: the policy is loaded and polled
    await broker.createTopic("z.any", { partitions: 1 });
    await broker.publish("z.any", "x");
    assert.equal((await broker.fetch("z.any", 0, 0)).records.length, 1);
    await broker.queue("z.q").enqueue("x");
    assert.deepEqual(await broker.listTopics(), ["z.any"]);
    assert.ok((await broker.listQueues()).includes("z.q"));
    await broker.deleteTopic("z.any");
    assert.match(await outcome(broker.as("alice").describeTopic("a.none")), /^TOPIC_NOT_FOUND/);
  });
});

const TRICKS = [
  "acme.orders",
  "ACME.orders",
  "Acme.orders",
  "\uff41cme.orders",
  "acme.orders\u0301",
  "a\u0063me.orders".normalize("NFD"),
  "\u00e1cme.orders".normalize("NFD"),
  "acme%2Forders",
  "bob/../acme.orders",
  "bob.x/../../acme.orders",
  "../acme.orders",
  "./acme.orders",
  " acme.orders",
  "acme\u0000.orders",
];

test("tenants: a view of one tenant's principal reaches nothing of another, however names are spelled", { timeout: 60_000 }, async () => {
  await withBroker(async (broker, _data, { policy }) => {
    await policy.setTenant("acme", ["carol"]);
    await policy.setTenant("bob", ["dave"]);
    for (const [who, tenant] of [["carol", "acme"], ["dave", "bob"]])
      for (const type of RESOURCE_TYPES.filter((t) => t !== "cluster")) await policy.addRule({ principal: who, effect: "allow", operation: "admin", resourceType: type, pattern: "prefix", name: `${tenant}.` });
    // Even a super-user rule does not take dave outside his tenant (ACL-2).
    await policy.addRule({ principal: "dave", effect: "allow", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });
    const carol = broker.as("carol");
    const dave = broker.as("dave");
    await carol.createTopic("acme.orders", { partitions: 1 });
    await carol.publish("acme.orders", "secret-order");
    await carol.resetGroup("acme.g", "acme.orders", "earliest");
    await carol.queue("acme.jobs", { maxAttempts: 1 }).enqueue("4111");
    await dave.createTopic("bob.orders", { partitions: 1 });
    assert.notEqual(await outcome(carol.queue("acme.q2", { deadLetter: "bob.stolen" }).enqueue("x")), "OK");

    for (const name of TRICKS) {
      const jobs = name.replace("orders", "jobs");
      const outcomes = {
        describe: await outcome(dave.describeTopic(name)),
        publish: await outcome(dave.publish(name, "x")),
        fetch: await outcome(dave.fetch(name, 0, 0)),
        delete: await outcome(dave.deleteTopic(name)),
        create: await outcome(dave.createTopic(name, { partitions: 1 })),
        lag: await outcome(dave.groupLag("acme.g", name)),
        reset: await outcome(dave.resetGroup(name.replace("orders", "g"), "bob.orders", "earliest")),
        // An invalid name may be refused by subscribe() itself, as the broker's own does.
        subscribe: await outcome(Promise.resolve().then(() => dave.subscribe(name, { group: "bob.g" })[Symbol.asyncIterator]().next())),
        browse: await outcome(dave.queue(jobs).browse()),
        purge: await outcome(dave.queue(jobs).purge()),
        redrive: await outcome(dave.queue(`${jobs}.dlq`).redrive()),
        enqueue: await outcome(dave.queue(jobs).enqueue("x")),
      };
      for (const [what, c] of Object.entries(outcomes)) {
        const code = c.split(":")[0];
        const ok = ["TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "NOT_FOUND", "INVALID_NAME", "VALIDATION", ...(what === "create" ? ["FORBIDDEN"] : [])];
        assert.ok(ok.includes(code), `dave ${what} ${JSON.stringify(name)}: ${c}`);
      }
    }
    assert.deepEqual(await dave.listTopics(), ["bob.orders"]);
    assert.deepEqual((await dave.listQueues()).filter((q) => !q.startsWith("bob.")), []);
    assert.deepEqual(await dave.listGroups(), []);
    // Carol's data is untouched.
    assert.equal((await carol.fetch("acme.orders", 0, 0)).records.length, 1);
    assert.equal((await carol.queue("acme.jobs").stats()).waiting, 1);
  });
});

// The ACL matrix (test/acl-matrix.test.ts) again, embedded: a subset of its principals, each
// probe made through `broker.as(principal)` and compared with the same reference model.
const MATRIX_OPS: Operation[] = ["publish", "consume", "describe", "create", "alter", "delete", "reset-offsets", "purge", "redrive", "admin"];
const GROUP = (n: string): string => `${n}.g`;
interface EmbeddedProbe {
  what: string;
  needs: (n: string) => Need[];
  run: (v: PrincipalBroker, n: string) => Promise<unknown>;
  /** Puts back what an allowed probe changed (with the broker's own rights). */
  restore?: (b: EmbeddedBroker, n: string) => Promise<unknown>;
}
async function firstMessage(v: PrincipalBroker, n: string): Promise<unknown> {
  const sub = v.subscribe(n, { group: GROUP(n), start: "earliest" });
  try {
    return await withTimeout(sub[Symbol.asyncIterator]().next(), 5000, `first message of ${n}`);
  } finally {
    await sub.close();
  }
}
const EMBEDDED_PROBES: EmbeddedProbe[] = [
  { what: "describe topic", needs: (n) => [["describe", "topic", n]], run: (v, n) => v.describeTopic(n) },
  { what: "publish", needs: (n) => [["publish", "topic", n]], run: (v, n) => v.publish(n, "x") },
  { what: "fetch", needs: (n) => [["consume", "topic", n]], run: (v, n) => v.fetch(n, 0, 0) },
  { what: "subscribe", needs: (n) => [["consume", "topic", n], ["consume", "group", GROUP(n)]], run: firstMessage },
  { what: "alter topic", needs: (n) => [["alter", "topic", n]], run: (v, n) => v.alterTopic(n, { retentionMs: 86_400_000 }) },
  { what: "delete topic", needs: (n) => [["delete", "topic", n]], run: (v, n) => v.deleteTopic(n), restore: async (b, n) => (await b.createTopic(n, { partitions: 1 }), b.publish(n, "x")) },
  { what: "create topic", needs: (n) => [["create", "topic", `${n}.new`]], run: (v, n) => v.createTopic(`${n}.new`, { partitions: 1 }), restore: (b, n) => b.deleteTopic(`${n}.new`) },
  { what: "group lag", needs: (n) => [["describe", "group", GROUP(n)], ["describe", "topic", "mx.lit"]], run: (v, n) => v.groupLag(GROUP(n), "mx.lit") },
  { what: "reset offsets", needs: (n) => [["reset-offsets", "group", GROUP(n)], ["describe", "topic", "mx.lit"]], run: (v, n) => v.resetGroup(GROUP(n), "mx.lit", "earliest") },
  { what: "enqueue", needs: (n) => [["publish", "queue", n]], run: (v, n) => v.queue(n).enqueue("x") },
  { what: "queue stats", needs: (n) => [["describe", "queue", n]], run: (v, n) => v.queue(n).stats() },
  { what: "browse", needs: (n) => [["consume", "queue", n]], run: (v, n) => v.queue(n).browse() },
  { what: "purge", needs: (n) => [["purge", "queue", n]], run: (v, n) => v.queue(n).purge() },
  { what: "redrive", needs: (n) => [["redrive", "dlq", n]], run: (v, n) => v.queue(n).redrive() },
  { what: "delete queue", needs: (n) => [["delete", "queue", n]], run: (v, n) => v.deleteQueue(n), restore: (b, n) => b.queue(n, { maxAttempts: 3 }).stats() },
];
const DENIED_CODES = new Set(["FORBIDDEN", "TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "NOT_FOUND"]);

test("ACL matrix, embedded: a subset of operations x resource types x literal|prefix x allow|deny agrees with the reference model", { timeout: 300_000 }, async (t) => {
  using dir = tempDir("sluice-embedded-matrix-");
  const data = join(dir.dir, "data");
  const principals = matrixPrincipals(MATRIX_OPS, ["topic", "queue", "group", "dlq", "cluster"]);
  principals.set("nobody", []);
  // One write of the whole policy (the file `sluice acl` writes), instead of one per rule.
  const rules = [...principals].flatMap(([who, rs]) => rs.map((r, i) => ({ id: `${who}-${i}`, principal: who, effect: r.effect, operation: r.op, resourceType: r.type, pattern: r.pattern, name: r.name })));
  mkdirSync(join(data, "security"), { recursive: true });
  writeFileSync(join(data, "security", "acl.json"), JSON.stringify({ version: 1, rules, groups: {}, tenants: {}, quotas: {} }));
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0, audit: false });
  try {
    for (const n of NAMES) {
      await broker.createTopic(n, { partitions: 1 });
      await broker.publish(n, "x");
      await broker.queue(n, { maxAttempts: 3 }).stats();
    }
    const mismatches: string[] = [];
    let checked = 0;
    for (const [who, rs] of principals) {
      const view = broker.as(who);
      for (const p of EMBEDDED_PROBES)
        for (const n of NAMES) {
          const want = model(rs, p.needs(n));
          const got = await p.run(view, n).then(
            () => true,
            (e: unknown) => !(e instanceof BrokerError && DENIED_CODES.has(e.code)),
          );
          if (got !== want) mismatches.push(`${who} ${p.what} ${n}: model ${want}, view ${got}`);
          checked++;
          if (got && p.restore) await p.restore(broker, n).catch(() => {});
        }
      const seen = (await view.listTopics()).filter((x) => NAMES.includes(x)).sort();
      const expectSeen = NAMES.filter((n) => model(rs, [["describe", "topic", n]])).sort();
      if (JSON.stringify(seen) !== JSON.stringify(expectSeen)) mismatches.push(`${who} listTopics: ${seen} vs model ${expectSeen}`);
      const qs = (await view.listQueues()).filter((x) => NAMES.includes(x)).sort();
      const expectQs = NAMES.filter((n) => model(rs, [["describe", "queue", n]])).sort();
      if (JSON.stringify(qs) !== JSON.stringify(expectQs)) mismatches.push(`${who} listQueues: ${qs} vs model ${expectQs}`);
      checked += 2;
      await view.close();
    }
    t.diagnostic(`${principals.size} principals, ${checked} checks, ${mismatches.length} mismatches`);
    assert.deepEqual(mismatches.slice(0, 20), []);
  } finally {
    await broker.close();
  }
});
