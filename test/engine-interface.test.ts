// SPDX-License-Identifier: Apache-2.0
/**
 * Nothing reaches around the storage-engine interface: the whole broker conformance suite
 * runs on `openBroker({ engine })` with an engine that only delegates to the disk engine
 * through the public interface and counts the calls, embedded and through the network server
 * (in process, so the server's paths use the same engine), and once with the encoded-batch
 * capability hidden (the fallbacks an engine without it gets).
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { NodeFileSystem } from "../src/log/io.js";
import { CountingEngine } from "../src/testing/counting-engine.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";

const engines: { name: string; engine: CountingEngine }[] = [];
const dirs: string[] = [];

function countingEngine(name: string, encoded: boolean): { engine: CountingEngine; dir: string } {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-engine-if-"));
  dirs.push(dir);
  const engine = new CountingEngine(new DiskEngine({ dataDir: dir, fs: new NodeFileSystem() }), { encoded });
  engines.push({ name, engine });
  return { engine, dir };
}

for (const encoded of [true, false]) {
  const label = encoded ? "counting engine" : "counting engine without the encoded capability";
  defineConformanceSuite(`${label}, embedded`, async () => {
    const { engine, dir } = countingEngine(`${label}, embedded`, encoded);
    const broker = await openBroker({ dataDir: dir, engine, retentionCheckIntervalMs: 0 });
    return { broker, cleanup: () => broker.close() };
  });
  defineConformanceSuite(`${label}, server`, async () => {
    const { engine, dir } = countingEngine(`${label}, server`, encoded);
    const broker = await openBroker({ dataDir: dir, engine, retentionCheckIntervalMs: 0 });
    const server = await startServer({ broker, port: 0, httpPort: null });
    const client = await connect({ url: server.url });
    return {
      broker: client,
      cleanup: async () => {
        await client.close();
        await server.close();
        await broker.close();
      },
    };
  });
}

test("every conformance run went through the counting engine: appends, reads, commits, producers and (when offered) encoded batches", () => {
  const total = (name: string, method: string): number => engines.filter((e) => e.name === name).reduce((s, e) => s + (e.engine.calls.get(method) ?? 0), 0);
  const names = [...new Set(engines.map((e) => e.name))];
  assert.equal(names.length, 4);
  for (const name of names) {
    for (const m of ["open", "close", "createTopic", "getTopic", "read", "offsets", "getCommitted", "commitOffsets", "resetOffsets", "allocateProducer"])
      assert.ok(total(name, m) > 0, `${name}: ${m} was called`);
    const appended = total(name, "append") + total(name, "encoded.appendEncoded");
    assert.ok(appended > 0, `${name}: records were appended`);
    // Work queues reach storage only through `engine.queues` (dead-letter copies included).
    for (const m of ["queues.open", "queues.enqueue", "queues.grant", "queues.ack", "queues.retry", "queues.deadLetter", "queues.stats", "queues.purge"])
      assert.ok(total(name, m) > 0, `${name}: ${m} was called`);
  }
  // The server publishes client-encoded batches and pushes stored batches when it can.
  assert.ok(total("counting engine, server", "encoded.appendEncoded") > 0, "server publishes use appendEncoded");
  assert.ok(total("counting engine, server", "encoded.readRaw") > 0, "server subscriptions use readRaw");
  assert.equal(total("counting engine without the encoded capability, server", "encoded.appendEncoded"), 0);
  assert.ok(total("counting engine without the encoded capability, server", "append") > 0, "without the capability, server publishes fall back to append");
});

after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
