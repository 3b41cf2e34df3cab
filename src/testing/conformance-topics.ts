// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, topic administration: create, describe, list and delete; names;
 * a re-created topic is a new incarnation. Registered by `defineConformanceSuite`
 * (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { InvalidNameError, TopicExistsError, TopicNotFoundError, ValidationError } from "../errors.js";
import type { Broker } from "../types.js";
import { readAll, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";

export function topicTests(t: DefineTest, opts: { compaction: boolean }): void {
  t("createTopic / describeTopic / listTopics / deleteTopic", topicLifecycle);
  t("topic names are checked against the allow-list", topicNames);
  t("deleting then re-creating a topic never resurrects old data", recreateIsEmpty);
  t("operations on a missing topic fail with TopicNotFoundError", missingTopic);
  t("alterTopic changes retention durably; other keys and bad values are refused, nothing changed", alterRetention);
  if (opts.compaction) t("a compacted topic refuses a record without a key before storing anything (CMP-1)", compactedNeedsKeys);
}

async function compactedNeedsKeys(b: Broker): Promise<void> {
  await assert.rejects(b.createTopic(uniq("badpolicy"), { cleanupPolicy: "shrink" as never }), ValidationError);
  await assert.rejects(b.createTopic(uniq("badlag"), { minCompactionLagMs: -1 }), ValidationError);
  const name = uniq("compacted");
  const d = await b.createTopic(name, { partitions: 2, cleanupPolicy: "compact" });
  assert.equal(d.config.cleanupPolicy, "compact");
  assert.equal(d.config.minCompactionLagMs, 0);
  assert.equal(d.config.deleteRetentionMs, 86_400_000);
  await assert.rejects(b.publish(name, "no key"), (e: unknown) => e instanceof ValidationError && e.code === "VALIDATION" && !e.retriable && /needs a key/.test(e.message));
  await assert.rejects(b.publish(name, "no key", { partition: 1 }), ValidationError);
  // One keyless record refuses the whole batch: nothing of it is stored.
  await assert.rejects(b.publishBatch(name, [{ key: "a", value: 1, partition: 0 }, { value: 2, partition: 0 }]), ValidationError);
  const r = await b.publish(name, "kept", { key: "k", partition: 0 });
  assert.equal(r.offset, 0, "the refused records took no offsets");
  const tombstone = await b.publish(name, null, { key: "k", partition: 0 });
  assert.equal(tombstone.offset, 1);
  assert.deepEqual((await b.describeTopic(name)).config.cleanupPolicy, "compact");
  await b.deleteTopic(name);
}

async function topicLifecycle(b: Broker): Promise<void> {
  const name = uniq("topics");
  const d = await b.createTopic(name, { partitions: 3, maxMessageBytes: 4096 });
  assert.equal(d.name, name);
  assert.equal(d.partitions.length, 3);
  assert.equal(d.config.partitions, 3);
  assert.equal(d.config.maxMessageBytes, 4096);
  assert.equal(d.config.durability, "always", "durability defaults to always");
  assert.ok(typeof d.topicId === "string" && d.topicId.length > 0);
  for (const p of d.partitions) {
    assert.equal(p.logStartOffset, 0);
    assert.equal(p.highWatermark, 0);
  }
  assert.deepEqual((await b.describeTopic(name)).topicId, d.topicId);
  assert.ok((await b.listTopics()).includes(name));
  await assert.rejects(b.createTopic(name), TopicExistsError);
  await b.deleteTopic(name);
  assert.ok(!(await b.listTopics()).includes(name));
  await assert.rejects(b.describeTopic(name), TopicNotFoundError);
  await assert.rejects(b.deleteTopic(name), TopicNotFoundError);
}

async function topicNames(b: Broker): Promise<void> {
  for (const bad of ["", ".", "..", "a/b", "../x", "a b", "x".repeat(250), "tab\t"]) {
    await assert.rejects(b.createTopic(bad), (e: unknown) => e instanceof InvalidNameError || e instanceof ValidationError, `name ${JSON.stringify(bad)}`);
  }
  const ok = uniq("Ok.name_with-chars");
  await b.createTopic(ok);
  await b.deleteTopic(ok);
}

async function recreateIsEmpty(b: Broker): Promise<void> {
  const name = uniq("recreate");
  const d1 = await b.createTopic(name);
  await b.publish(name, "old");
  await b.deleteTopic(name);
  const d2 = await b.createTopic(name);
  assert.notEqual(d2.topicId, d1.topicId);
  const r = await b.fetch(name, 0, 0);
  assert.equal(r.records.length, 0);
  assert.equal(r.highWatermark, 0);
  await b.publish(name, "new");
  assert.deepEqual((await readAll(b, name)).get(0), ["new"]);
}

async function missingTopic(b: Broker): Promise<void> {
  const name = uniq("missing");
  await assert.rejects(b.publish(name, "x"), TopicNotFoundError);
  await assert.rejects(b.fetch(name, 0, 0), TopicNotFoundError);
  await assert.rejects(b.groupLag("g", name), TopicNotFoundError);
}

async function alterRetention(b: Broker, kit: ConformanceKit): Promise<void> {
  const name = uniq("alter");
  await b.createTopic(name, { partitions: 2, retentionMs: 86_400_000 });
  const d = await b.alterTopic(name, { retentionMs: 3_600_000, retentionBytes: 1 << 30 });
  assert.equal(d.config.retentionMs, 3_600_000);
  assert.equal(d.config.retentionBytes, 1 << 30);
  assert.equal(d.config.partitions, 2, "the rest is unchanged");
  assert.equal((await b.describeTopic(name)).config.retentionMs, 3_600_000);
  for (const bad of [{ partitions: 4 }, { segmentBytes: 1 << 20 }, { retentionMs: -5 }, { retentionMs: 1.5 }, { colour: "red" }, {}]) {
    await assert.rejects(b.alterTopic(name, bad as object), (e: unknown) => e instanceof ValidationError, JSON.stringify(bad));
  }
  await assert.rejects(b.alterTopic(uniq("missing"), { retentionMs: 1000 }), (e: unknown) => e instanceof TopicNotFoundError);
  assert.equal((await b.describeTopic(name)).config.retentionMs, 3_600_000, "refused changes changed nothing");
  if (kit.reopen) {
    const again = await kit.reopen();
    assert.equal((await again.describeTopic(name)).config.retentionMs, 3_600_000, "stored durably");
  }
}
