// SPDX-License-Identifier: Apache-2.0
/**
 * planTopology / applyTopology (src/topology/plan.ts) against an embedded broker and through a
 * server (connect()), alike: a fresh broker gets every topic, group and queue of the file and a
 * second plan is empty; queue config changes are planned field by field (old → new), a field
 * the file leaves out returns to its default; declared groups start where the file says; a
 * topic's partitions cannot change (nothing is applied) and its other settings are refused
 * while the rest is applied.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { resolveQueueConfig } from "../src/queues/config.js";
import { startServer } from "../src/server/index.js";
import { tempDir } from "../src/testing/helpers.js";
import { applyTopology, formatPlan, parseTopology, planIsEmpty, planTopology, readQueueSettings } from "../src/topology/index.js";
import type { Broker } from "../src/types.js";

const FILE = `
queues:
  - name: certificate-generation
    visibilityTimeoutMs: 120000
    retries: { maximumAttempts: 5, backoff: exponential, jitter: true, minDelayMs: 1000, maxDelayMs: 60000 }
    deadLetter: certificate-generation-failures
    dedupeWindowMs: 3600000
    concurrencyHint: 8
  - name: emails
topics:
  - name: learning-domain-events
    partitions: 12
    retentionMs: 604800000
    groups: [notifications, search-index, { name: analytics, start: earliest }]
`;

type Mode = "embedded" | "server";

/** Runs `body` against a fresh broker of the mode (a server: in this process, reached by connect()). */
async function withMode(mode: Mode, body: (b: Broker) => Promise<void>): Promise<void> {
  using tmp = tempDir(`sluice-topology-${mode}-`);
  const embedded = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  if (mode === "embedded") {
    try {
      return await body(embedded);
    } finally {
      await embedded.close();
    }
  }
  const server = await startServer({ broker: embedded, port: 0, httpPort: null });
  const client = await connect({ url: server.url });
  try {
    await body(client);
  } finally {
    await client.close();
    await server.close();
    await embedded.close();
  }
}

for (const mode of ["embedded", "server"] as const) {
  test(`${mode}: a fresh broker gets the whole file; applying it again changes nothing`, async () => {
    await withMode(mode, async (b) => {
      const topology = parseTopology(FILE);
      const plan = await planTopology(b, topology);
      assert.deepEqual(plan.errors, []);
      assert.deepEqual(
        plan.entries.map((e) => `${e.op} ${e.kind} ${e.name}`),
        [
          "create topic learning-domain-events",
          "create group notifications",
          "create group search-index",
          "create group analytics",
          "create queue certificate-generation",
          "create queue emails",
        ],
      );
      const q0 = plan.entries[4];
      assert.ok(q0.op === "create" && q0.kind === "queue");
      assert.equal(q0.deadLetter, "certificate-generation-failures");
      assert.equal((await applyTopology(b, plan)).applied, 6);

      const t = await b.describeTopic("learning-domain-events");
      assert.equal(t.config.partitions, 12);
      assert.equal(t.config.retentionMs, 604800000);
      const groups = await b.listGroups({ topic: "learning-domain-events" });
      assert.deepEqual(groups.map((g) => [g.group, g.committedPartitions]).sort(), [["analytics", 12], ["notifications", 12], ["search-index", 12]]);
      const settings = await readQueueSettings(b, "certificate-generation");
      assert.deepEqual(settings, resolveQueueConfig("certificate-generation", topology.queues[0].config));
      assert.equal(settings.visibilityTimeoutMs, 120000);
      assert.deepEqual(settings.backoff, { type: "exponential", minDelayMs: 1000, maxDelayMs: 60000 });
      assert.deepEqual((await b.listQueues()).sort(), ["certificate-generation", "certificate-generation-failures", "emails", "emails.dlq"]);

      const again = await planTopology(b, topology);
      assert.deepEqual(again, { entries: [], errors: [] });
      assert.ok(planIsEmpty(again));
      assert.deepEqual(formatPlan(again, "applied"), ["no changes"]);
    });
  });

  test(`${mode}: queue changes are planned field by field; a field left out returns to its default`, async () => {
    await withMode(mode, async (b) => {
      // Declared through the API with settings the file does not give.
      await b.queue("emails", { maxAttempts: 9, visibilityTimeoutMs: 1000 }).stats();
      const topology = parseTopology("queues:\n  - name: emails\n    visibilityTimeoutMs: 2000\n    retries: { backoff: fixed, jitter: false, minDelayMs: 250 }\n");
      const plan = await planTopology(b, topology);
      assert.equal(plan.entries.length, 1);
      const e = plan.entries[0];
      assert.ok(e.op === "change");
      assert.deepEqual(
        e.changes.map((c) => `${c.field} ${JSON.stringify(c.from)} → ${JSON.stringify(c.to)}`),
        ['backoff.minDelayMs 1000 → 250', 'backoff.type "exponential" → "fixed"', "maxAttempts 9 → 5", "visibilityTimeoutMs 1000 → 2000"],
      );
      assert.match(formatPlan(plan, "dry-run").join("\n"), /^~ queue emails: backoff\.minDelayMs 1000 → 250, backoff\.type exponential → fixed, maxAttempts 9 → 5, visibilityTimeoutMs 1000 → 2000\ndry run, nothing changed: 1 to change$/);
      await applyTopology(b, plan);
      const s = await readQueueSettings(b, "emails");
      assert.equal(s.maxAttempts, 5);
      assert.equal(s.visibilityTimeoutMs, 2000);
      assert.deepEqual(s.backoff, { type: "fixed", minDelayMs: 250, maxDelayMs: 300000 });
      assert.ok(planIsEmpty(await planTopology(b, topology)));
    });
  });

  test(`${mode}: a declared group's offsets start where the file says; a group with offsets is left alone`, async () => {
    await withMode(mode, async (b) => {
      await b.createTopic("events", { partitions: 2 });
      for (let i = 0; i < 6; i++) await b.publish("events", `e${i}`, { partition: i % 2 });
      await b.resetGroup("existing", "events", "earliest");
      const topology = parseTopology("topics:\n  - name: events\n    partitions: 2\n    groups: [late, { name: early, start: earliest }, existing]\n");
      const plan = await planTopology(b, topology);
      assert.deepEqual(plan.entries.map((e) => `${e.op} ${e.kind} ${e.name}`), ["create group late", "create group early"]);
      await applyTopology(b, plan);
      assert.equal((await b.groupLag("late", "events")).totalRecords, 0);
      assert.equal((await b.groupLag("early", "events")).totalRecords, 6);
      assert.equal((await b.groupLag("existing", "events")).totalRecords, 6);
      assert.ok(planIsEmpty(await planTopology(b, topology)));
    });
  });

  test(`${mode}: partitions of an existing topic cannot change (nothing applied); retention changes; other topic settings are refused, the rest applied`, async () => {
    await withMode(mode, async (b) => {
      await b.createTopic("events", { partitions: 4, retentionMs: 86_400_000 });
      const wrongParts = parseTopology("queues: [{ name: jobs }]\ntopics:\n  - name: events\n    partitions: 12\n    retentionMs: 86400000\n");
      const bad = await planTopology(b, wrongParts);
      assert.deepEqual(bad.errors, ["cannot change partitions of an existing topic: events has 4, file says 12"]);
      await assert.rejects(applyTopology(b, bad), { code: "VALIDATION", message: /cannot change partitions of an existing topic: events has 4, file says 12 \(nothing was applied\)/ });
      assert.deepEqual(await b.listQueues(), [], "nothing was applied");

      const retention = parseTopology("queues: [{ name: jobs }]\ntopics:\n  - name: events\n    partitions: 4\n    retentionMs: 604800000\n    segmentBytes: 1048576\n");
      const plan = await planTopology(b, retention);
      assert.deepEqual(plan.errors, []);
      const [changed, refused] = plan.entries;
      assert.ok(changed.op === "change" && changed.kind === "topic");
      assert.deepEqual(changed.changes, [{ field: "retentionMs", from: 86_400_000, to: 604_800_000 }]);
      assert.ok(refused.op === "refuse" && !refused.fatal);
      assert.deepEqual(refused.changes.map((c) => c.field), ["segmentBytes"]);
      assert.equal((await applyTopology(b, plan)).applied, 2);
      assert.equal((await b.describeTopic("events")).config.retentionMs, 604_800_000, "retention changed (alterTopic)");
      assert.ok((await b.listQueues()).includes("jobs"));
      const again = await planTopology(b, retention);
      assert.ok(planIsEmpty(again));
      assert.deepEqual(formatPlan(again, "applied"), [
        `! topic events: segmentBytes ${(await b.describeTopic("events")).config.segmentBytes} → 1048576 (refused: only retention can change on an existing topic; left as it is)`,
        "no changes (1 refused)",
      ]);
    });
  });
}
