// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's and the archive's per-partition figures of describeTopic travel to a network
 * client, to the HTTP API the dashboard reads (GET /v1/topics/:topic) and to
 * `sluice topics describe --url`, equal to what the embedded broker reports.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { NodeFileSystem } from "../src/log/io.js";
import { startServer } from "../src/server/index.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { tempDir } from "../src/testing/helpers.js";
import type { PartitionDescription } from "../src/types.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const run = promisify(execFile);

const CLEANER = ["cleanerDirtyRatio", "bytesReclaimed", "lastCleanedAt", "cleanerPasses", "cleanerPassProgress"] as const;
const ARCHIVE = ["archivedBytes", "archivedSegments", "archiveStartOffset", "archiveLagBytes", "archiveReadBytes"] as const;

function pick(p: PartitionDescription, keys: readonly (keyof PartitionDescription)[]): Record<string, unknown> {
  return Object.fromEntries(keys.map((k) => [k, p[k]]));
}

test("cleaner and archive figures reach a client, the HTTP API and the CLI through a server", { timeout: 60_000 }, async () => {
  using tmp = tempDir("sluice-figures-srv-");
  const engine = new DiskEngine({ dataDir: join(tmp.dir, "data"), fs: new NodeFileSystem(), cleanerIntervalMs: 0 });
  const broker = await openBroker({ engine, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: 0 });
  const client = await connect({ url: srv.url });
  try {
    await client.createTopic("table", { segmentBytes: 1024, cleanupPolicy: "compact" });
    await client.createTopic("cold", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: join(tmp.dir, "archive") } });
    for (let i = 0; i < 40; i++) await client.publishBatch("table", [0, 1, 2].map((j) => ({ key: `k${(i * 3 + j) % 4}`, value: i * 3 + j, partition: 0 })));
    for (let i = 0; i < 50; i++) await client.publishBatch("cold", Array.from({ length: 4 }, (_, j) => ({ value: `record ${i}.${j} `.repeat(12), partition: 0 })));
    await engine.compact();
    await broker.enforceRetention(Date.now());
    for (let off = 0; off < 20; ) off = (await client.fetch("cold", 0, off)).nextOffset; // from the archive

    const table = (await broker.describeTopic("table")).partitions[0];
    const cold = (await broker.describeTopic("cold")).partitions[0];
    assert.ok(table.bytesReclaimed! > 0 && table.cleanerPasses! >= 1 && typeof table.lastCleanedAt === "number");
    assert.ok(cold.archivedBytes! > 0 && cold.archivedSegments! > 0 && cold.archiveReadBytes! > 0);
    assert.equal(cold.archiveStartOffset, 0);
    assert.equal(cold.archiveLagBytes, 0);
    assert.equal("archivedBytes" in table, false, "no archive figures for a topic without an archive");
    assert.equal("bytesReclaimed" in cold, false, "no cleaner figures for a topic that is not compacted");

    // Network client: the same figures.
    const remoteTable = (await client.describeTopic("table")).partitions[0];
    const remoteCold = (await client.describeTopic("cold")).partitions[0];
    assert.deepEqual(pick(remoteTable, CLEANER), pick(table, CLEANER));
    assert.deepEqual(pick(remoteCold, ARCHIVE), pick(cold, ARCHIVE));
    assert.equal(remoteTable.cleanerPassProgress, null, "null travels as null");

    // HTTP API (what the dashboard reads).
    const http = async (t: string): Promise<PartitionDescription> => ((await (await fetch(`http://127.0.0.1:${srv.httpPort}/v1/topics/${t}`)).json()) as { partitions: PartitionDescription[] }).partitions[0];
    assert.deepEqual(pick(await http("table"), CLEANER), pick(table, CLEANER));
    assert.deepEqual(pick(await http("cold"), ARCHIVE), pick(cold, ARCHIVE));

    // CLI: a table of each kind of figures under the partitions.
    const env = { ...process.env, SLUICE_URL: "", SLUICE_DATA: "" };
    const described = (await run(process.execPath, [CLI, "topics", "describe", "table", "--url", srv.url], { env })).stdout;
    assert.match(described, /DIRTY +RECLAIMED +PASSES +LAST-CLEANED +PASS/);
    assert.match(described, /^0 +\d+% +[\d.]+ (B|KiB) +1 +\d{4}-\d\d-\d\dT[\d:.]+Z +idle *$/m);
    const coldOut = (await run(process.execPath, [CLI, "topics", "describe", "cold", "--url", srv.url], { env })).stdout;
    assert.match(coldOut, /ARCHIVE-START +ARCHIVED +ARCHIVED-SEGMENTS +ARCHIVE-LAG +ARCHIVE-READ/);
    assert.match(coldOut, new RegExp(`^0 +0 +[\\d.]+ KiB +${cold.archivedSegments} +0 B +[\\d.]+ (B|KiB) *$`, "m"));
    assert.doesNotMatch(coldOut, /DIRTY/);
  } finally {
    await client.close();
    await srv.close();
    await broker.close();
  }
});
