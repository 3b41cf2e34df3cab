// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice serve --engine postgres://...`: a server process whose topics live in PostgreSQL.
 * SIGKILLed under load (many publishes in flight, keys over 4 partitions) and restarted on the
 * same port, several times: every acknowledged record is stored exactly once, at the offset
 * its receipt gave (the client's idempotent retries across reconnects meet the producer state
 * kept in the database). With `exclusive=true` a second server on the same schema is refused.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { dropSchema, freshSchema } from "./fixtures/postgres.js";
import { spawnServer } from "./fixtures/server-spawn.js";
import { pgEngineUrl, pgServeArgs, startPgServerOn } from "./fixtures/postgres-serve.js";

const KILLS = Number(process.env.SLUICE_PG_SERVE_KILLS ?? 4);
const IN_FLIGHT = 100;
const PARTITIONS = 4;

test(`serve --engine postgres: SIGKILLed ${KILLS}x under load, every acknowledged record stored once at its receipt's offset`, { timeout: 180_000 }, async (t) => {
  const schema = freshSchema();
  const tmp = tempDir();
  const url = pgEngineUrl(schema);
  let server = await spawnServer(pgServeArgs(url, tmp.dir, 0));
  const port = server.port;
  const client = await connect({ url: server.url, reconnectTimeoutMs: 30_000 });
  let stop = false;
  try {
    await client.createTopic("t", { partitions: PARTITIONS });
    const acked = new Map<string, { partition: number; offset: number }>();
    let issued = 0;
    const pump = async (): Promise<void> => {
      while (!stop) {
        const v = `v${issued++}`;
        const r = await client.publish("t", v, { key: `k${issued % 37}` });
        acked.set(v, { partition: r.partition, offset: r.offset });
      }
    };
    const pumps = Array.from({ length: IN_FLIGHT }, pump);
    for (let k = 0; k < KILLS; k++) {
      const before = acked.size;
      // A random point in the stream: somewhere between 200 and 1,200 more acknowledgements.
      const target = before + 200 + Math.floor(Math.random() * 1000);
      await waitUntil(() => acked.size >= target, `${target} acknowledged publishes`, 60_000);
      server.proc.kill("SIGKILL");
      await server.exited;
      server = await startPgServerOn(url, tmp.dir, port);
    }
    await waitUntil(() => acked.size >= 500 + (KILLS + 1) * 200, "publishes acknowledged after the last restart", 60_000);
    stop = true;
    await Promise.all(pumps);
    // Read everything back.
    const seen = new Map<string, { partition: number; offset: number }>();
    for (let p = 0; p < PARTITIONS; p++) {
      let offset = 0;
      for (;;) {
        const r = await client.fetch("t", p, offset, { maxBytes: 1 << 20 });
        for (const rec of r.records) {
          const v = rec.value as string;
          assert.ok(!seen.has(v), `${v} stored twice (${JSON.stringify(seen.get(v))} and ${p}:${rec.offset})`);
          seen.set(v, { partition: p, offset: rec.offset });
        }
        if (r.nextOffset >= r.highWatermark) break;
        offset = r.nextOffset;
      }
    }
    for (const [v, at] of acked) assert.deepEqual(seen.get(v), at, `acknowledged ${v} at ${JSON.stringify(at)}`);
    assert.ok(acked.size >= 1000, `${acked.size} acknowledged`);
    t.diagnostic(`${acked.size} acknowledged publishes, ${KILLS} SIGKILLs, all stored once at their receipts' offsets`);
  } finally {
    stop = true;
    await client.close().catch(() => {});
    server.proc.kill("SIGKILL");
    await server.exited;
    await dropSchema(schema);
    tmp.cleanup();
  }
});

test("serve --engine postgres with exclusive=true: a second server on the same schema exits with DATA_DIR_LOCKED", { timeout: 60_000 }, async () => {
  const schema = freshSchema();
  const a = tempDir();
  const b = tempDir();
  const first = await spawnServer(pgServeArgs(pgEngineUrl(schema, { exclusive: "true" }), a.dir, 0));
  try {
    const err = await spawnServer(pgServeArgs(pgEngineUrl(schema, { exclusive: "true" }), b.dir, 0)).then(
      () => null,
      (e: unknown) => e as Error,
    );
    assert.ok(err !== null, "the second server must not start");
    assert.match(err.message, /DATA_DIR_LOCKED/);
    assert.match(err.message, new RegExp(`PostgreSQL schema "${schema}"`));
    assert.match(err.message, new RegExp(`pid ${first.proc.pid}`));
  } finally {
    first.proc.kill("SIGKILL");
    await first.exited;
    await dropSchema(schema);
    a.cleanup();
    b.cleanup();
  }
});
