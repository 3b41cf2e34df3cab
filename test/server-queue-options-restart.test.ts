// SPDX-License-Identifier: Apache-2.0
// Priorities, singleton keys, expiry and remove(id) through a server that is SIGKILLed and
// started again on the same data dir (no clean close: recovered from the logs and the journal).
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import { JobActiveError } from "../src/errors.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer } from "./fixtures/server-spawn.js";

test("sluice serve SIGKILLed and restarted: priorities, singleton keys, expiries and removals hold", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-srv-qopts-");
  const args = ["--data", tmp.dir, "--port", "0", "--http-port", "off", "--log-level", "error"];
  let server = await spawnServer(args);
  let client = await connect({ url: server.url });
  let removedId: string;
  let debouncedId: string;
  let singleId: string;
  let expiringId: string;
  try {
    const q = client.queue<string>("opts", { onExpire: "drop" });
    await q.enqueue("low");
    await q.enqueue("high", { priority: 9 });
    await q.enqueue("mid", { priority: 5 });
    singleId = (await q.enqueue("single", { singletonKey: "s" })).id;
    debouncedId = (await q.enqueue("d1", { singletonKey: "d", singletonMode: "debounce" })).id;
    const d2 = await q.enqueue("d2", { singletonKey: "d", singletonMode: "debounce", priority: 1 });
    assert.equal(d2.replaced, debouncedId);
    removedId = (await q.enqueue("removed", { priority: 9 })).id;
    assert.equal(await q.remove(removedId), true);
    expiringId = (await q.enqueue("expiring", { priority: 9, expireInMs: 500 })).id;
  } finally {
    server.proc.kill("SIGKILL");
    await server.exited;
    await client.close().catch(() => {});
  }
  server = await spawnServer(args);
  client = await connect({ url: server.url });
  try {
    const q = client.queue<string>("opts");
    assert.deepEqual(await q.enqueue("single-again", { singletonKey: "s" }), { id: singleId, duplicate: true });
    assert.equal(await q.getJob(removedId), null, "removed stays removed");
    assert.equal(await q.getJob(debouncedId), null, "replaced stays replaced");
    await waitUntil(async () => (await q.getJob(expiringId)) === null, "the expiring job expired after the restart");
    const w = q.work({ prefetch: 1 });
    const it = w[Symbol.asyncIterator]();
    const got: string[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await it.next();
      assert.ok(!r.done);
      if (i === 0) await assert.rejects(q.remove(r.value.id), JobActiveError);
      got.push(r.value.data);
      await r.value.ack();
    }
    await w.close();
    assert.deepEqual(got, ["high", "mid", "d2", "low", "single"]);
  } finally {
    await client.close();
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});

test("HTTP: POST /v1/queues/:q/jobs takes priority and singleton options; DELETE /v1/queues/:q/jobs/:id removes a waiting job", { timeout: 30_000 }, async () => {
  using tmp = tempDir("sluice-srv-qopts-http-");
  const server = await spawnServer(["--data", tmp.dir, "--port", "0", "--http-port", "0", "--log-level", "error"]);
  const base = `http://127.0.0.1:${server.httpPort}/v1/queues/web`;
  const call = async (method: string, path: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown> }> => {
    const r = await fetch(base + path, { method, headers: { "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    return { status: r.status, json: (await r.json()) as Record<string, unknown> };
  };
  try {
    const r = await call("POST", "/jobs", { jobs: [{ data: "low" }, { data: "high", priority: 9 }, { data: "s1", singletonKey: "k" }, { data: "s2", singletonKey: "k" }] });
    assert.equal(r.status, 200);
    const results = r.json.results as { id: string; duplicate: boolean }[];
    assert.deepEqual(results[3], { id: results[2].id, duplicate: true });
    assert.deepEqual(await call("DELETE", `/jobs/${results[0].id}`), { status: 200, json: { removed: true } });
    assert.deepEqual(await call("DELETE", `/jobs/${results[0].id}`), { status: 200, json: { removed: false } });
    const bad = await call("POST", "/jobs", { jobs: [{ data: "x", priority: 99 }] });
    assert.equal(bad.status, 400);
    const client = await connect({ url: server.url });
    try {
      const w = client.queue<string>("web").work({ prefetch: 1 });
      const it = w[Symbol.asyncIterator]();
      const first = await it.next();
      assert.equal(first.done ? null : first.value.data, "high");
      const active = await call("DELETE", `/jobs/${first.done ? "" : first.value.id}`);
      assert.equal(active.status, 409);
      assert.equal((active.json.error as { code?: string } | undefined)?.code ?? active.json.code, "JOB_ACTIVE");
      await w.close();
    } finally {
      await client.close();
    }
  } finally {
    server.proc.kill("SIGTERM");
    await server.exited;
  }
});
