// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, declaring queues: `broker.queue(name, config)` creates the queue
 * and stores its config at once (not at its first operation), a config given to a queue that
 * is already open applies at once (the dedupe window included), reads of a queue that does
 * not exist create nothing, and a `dedupeId` without a dedupe window is refused instead of
 * being ignored. Registered by `defineConformanceSuite` (conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { QueueNotFoundError, ValidationError } from "../errors.js";
import type { Broker } from "../types.js";
import { uniq, type DefineTest } from "./conformance-helpers.js";
import { waitUntil } from "./helpers.js";

export function queueDeclareTests(t: DefineTest): void {
  t("queue declare: broker.queue(name, config) creates the queue and stores its config before any operation", declaredAtOnce);
  t("queue declare: reading a queue that does not exist (stats, purge, redrive) raises QueueNotFoundError and creates nothing", readsCreateNothing);
  t("queue declare: a dedupe window declared on a queue that is already open dedupes the next enqueue", windowOnOpenQueue);
  t("queue declare: a dedupeId on a queue without dedupeWindowMs is a ValidationError, nothing stored", dedupeWithoutWindow);
  t("queue declare: declaring config A, then B, then A again leaves the queue on A", declareAgain);
}

async function declaredAtOnce(b: Broker): Promise<void> {
  const name = uniq("decl");
  b.queue(name, { maxAttempts: 3, dedupeWindowMs: 60_000 });
  await waitUntil(async () => (await b.listQueues()).includes(name), `queue ${name} listed after its declaration`);
  // The stored config is the declared one: a plain handle made later dedupes with its window.
  const q = b.queue(name);
  const first = await q.enqueue({ n: 1 }, { dedupeId: "a" });
  const again = await q.enqueue({ n: 1 }, { dedupeId: "a" });
  assert.equal(again.duplicate, true);
  assert.equal(again.id, first.id);
}

async function readsCreateNothing(b: Broker): Promise<void> {
  const name = uniq("decl-none");
  const before = await b.listQueues();
  await assert.rejects(b.queue(name).stats(), (e: unknown) => e instanceof QueueNotFoundError);
  await assert.rejects(b.queue(name).purge(), (e: unknown) => e instanceof QueueNotFoundError);
  await assert.rejects(b.queue(name).redrive(), (e: unknown) => e instanceof QueueNotFoundError);
  assert.deepEqual(await b.listQueues(), before);
}

async function windowOnOpenQueue(b: Broker): Promise<void> {
  const name = uniq("decl-window");
  await b.queue(name).enqueue({ n: 0 }); // created and open, without a window
  const q = b.queue(name, { dedupeWindowMs: 3_600_000 });
  const first = await q.enqueue({ n: 1 }, { dedupeId: "x" });
  const second = await q.enqueue({ n: 1 }, { dedupeId: "x" });
  assert.equal(first.duplicate, false);
  assert.equal(second.duplicate, true, "the declared window applies to the open queue at once");
  assert.equal((await q.stats()).waiting, 2);
}

async function dedupeWithoutWindow(b: Broker): Promise<void> {
  const q = b.queue(uniq("decl-nowindow"));
  await q.enqueue({ n: 0 });
  await assert.rejects(q.enqueue({ n: 1 }, { dedupeId: "x" }), (e: unknown) => e instanceof ValidationError && /dedupeWindowMs/.test(e.message));
  assert.equal((await q.stats()).waiting, 1, "the refused job was not stored");
}

async function declareAgain(b: Broker): Promise<void> {
  const name = uniq("decl-aba");
  const A = { dedupeWindowMs: 60_000 };
  await b.queue(name, A).enqueue({ n: 1 }, { dedupeId: "a" });
  const onB = b.queue(name, { maxAttempts: 3 });
  await assert.rejects(onB.enqueue({ n: 2 }, { dedupeId: "b" }), (e: unknown) => e instanceof ValidationError, "B has no dedupe window");
  const again = await b.queue(name, A).enqueue({ n: 3 }, { dedupeId: "a" });
  assert.equal(again.duplicate, true, "A's window is back");
}
