// SPDX-License-Identifier: Apache-2.0
// Job results on the disk engine: kept across close/reopen, expired ones never come back and
// leave the snapshot, the memory bound of the retained outcomes.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, type Dirent } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { RETAINED_ENTRY_BYTES } from "../src/queues/config.js";
import { RetainedJobs } from "../src/store/disk/queues/retained.js";
import { iter, nextJob, openManager, tempDir, waitFor } from "./fixtures/queue-helpers.js";

/** Acks one job of `name` with `result`; returns its id. */
async function ackOne(qs: Awaited<ReturnType<typeof openManager>>, name: string, config: object, data: string, result: unknown): Promise<string> {
  const q = qs.queue<string>(name, config);
  const { id } = await q.enqueue(data);
  const w = q.work({ prefetch: 1 });
  const job = await nextJob(iter(w));
  assert.equal(job.id, id);
  await job.ack(result);
  await w.close();
  return id;
}

test("results and dead-letter outcomes survive close and reopen", async () => {
  const { dir, cleanup } = tempDir();
  try {
    let qs = await openManager(dir);
    const id = await ackOne(qs, "r", { resultRetentionMs: 3_600_000 }, "a", { answer: 42 });
    const q = qs.queue<string>("r");
    const dead = await q.enqueue("b");
    const w = q.work({ prefetch: 1 });
    const job = await nextJob(iter(w));
    await job.nack({ requeue: false, reason: "no" });
    await w.close();
    // A second result, acked after the dead-letter move.
    const late = await ackOne(qs, "r", { resultRetentionMs: 3_600_000 }, "c", "late");
    await qs.close();

    qs = await openManager(dir);
    const again = qs.queue<string>("r");
    const got = await again.getJob(id);
    assert.equal(got?.state, "completed");
    assert.deepEqual(got?.result, { answer: 42 });
    assert.equal(got?.attempts, 1);
    assert.equal((await again.getJob(late))?.result, "late");
    const d = await again.getJob(dead.id);
    assert.equal(d?.state, "dead");
    assert.equal(d?.lastError, "no");
    await qs.close();
  } finally {
    cleanup();
  }
});

test("an expired result does not come back after a reopen and leaves the snapshot", async () => {
  const { dir, cleanup } = tempDir();
  try {
    const retention = 1500;
    let qs = await openManager(dir);
    const marker = "result-marker-7f3a";
    const id = await ackOne(qs, "e", { resultRetentionMs: retention }, "a", marker);
    const completedAt = (await qs.queue("e").getJob(id))?.completedAt;
    assert.equal(typeof completedAt, "number");
    await qs.close();
    await waitFor(() => Date.now() > completedAt! + retention, "the retention period passed", 10_000);
    qs = await openManager(dir);
    assert.equal(await qs.queue("e").getJob(id), null, "expired before the reopen: not restored");
    await qs.close();
    // The final snapshot of that open no longer holds it.
    const snapshots = findSnapshots(dir);
    assert.ok(snapshots.length > 0, "the queue has a snapshot");
    for (const p of snapshots) assert.equal(readFileSync(p).includes(marker), false, `${p} holds no expired result`);
  } finally {
    cleanup();
  }
});

test("retained outcomes: expiry from the front, memory bound drops the oldest", () => {
  const r = new RetainedJobs(10 * RETAINED_ENTRY_BYTES + 100);
  r.record(0, { state: "completed", at: 0, attempts: 1 });
  assert.equal(r.size, 0, "retention 0 keeps nothing");
  r.retentionMs = 1000;
  for (let i = 0; i < 20; i++) r.record(i, { state: "completed", at: i * 10, attempts: 1, result: "12345" });
  assert.ok(r.heldBytes <= 10 * RETAINED_ENTRY_BYTES + 100, `bounded: ${r.heldBytes}`);
  assert.equal(r.get(0, 500), undefined, "the oldest were dropped for the bound");
  assert.equal(r.get(19, 500)?.result, "12345");
  assert.equal(r.get(19, 190 + 1000), undefined, "expired at its completion + retention");
  r.prune(10_000);
  assert.equal(r.size, 0);
  assert.equal(r.heldBytes, 0);
});

/** Every queue snapshot file under `dir`. */
function findSnapshots(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string): void => {
    for (const e of readdirSyncSafe(d)) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name === "snapshot.bin") out.push(p);
    }
  };
  walk(dir);
  return out;
}

function readdirSyncSafe(d: string): Dirent[] {
  try {
    return readdirSync(d, { withFileTypes: true });
  } catch {
    return [];
  }
}
