// SPDX-License-Identifier: Apache-2.0
/**
 * Load on small segments, through `sluice serve`: 64 concurrent publishers (per-message
 * `publish()`, as the README writes it), a consumer group committing every message, a work
 * queue enqueued and worked, and a reader replaying old segments (more sealed segments than
 * the open-handle limit, so handles are evicted and reopened all the time). Once without and
 * once with server SIGKILLs. Nothing may fail with STORAGE_ERROR or CORRUPT_RECORD, the server
 * never exits by itself and logs no error, and read-back finds every acknowledged record once,
 * at its offset, with contiguous offsets.
 *
 * Longer under `npm run soak` (SLUICE_LOAD_SECONDS, SLUICE_LOAD_KILLS).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "../src/client/index.js";
import { BrokerError } from "../src/errors.js";
import { waitUntil } from "../src/testing/helpers.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const SECONDS = Number(process.env.SLUICE_LOAD_SECONDS ?? 8);
const KILLS = Number(process.env.SLUICE_LOAD_KILLS ?? 5);
const PUBLISHERS = 64;
const PARTITIONS = 8;
const SEGMENT_BYTES = 16 * 1024;
/** PartitionLog's bound on open handles of sealed segments (MAX_OPEN_SEALED). */
const OPEN_HANDLE_LIMIT = 4;
/** About 40 records a segment: segments roll every few hundred publishes. */
const PAD = "x".repeat(350);

type Counts = Map<string, number>;
function count(m: Counts, e: unknown): void {
  const code = e instanceof BrokerError ? e.code : `uncoded:${(e as Error)?.message}`;
  m.set(code, (m.get(code) ?? 0) + 1);
}
const total = (m: Counts): number => [...m.values()].reduce((a, b) => a + b, 0);
const show = (m: Counts): string => JSON.stringify(Object.fromEntries(m));

async function runLoad(t: { diagnostic(s: string): void }, kills: number): Promise<void> {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-load-"));
  const args = (port: number): string[] => ["--data", dir, "--port", String(port), "--http-port", "off", "--log-level", "warn"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  // The server may only exit when we kill it.
  const unexpectedExits: string[] = [];
  let killing = false;
  const watch = (s: SpawnedServer): void => {
    void s.exited.then((code) => {
      if (!killing) unexpectedExits.push(`exit ${code}: ${s.stdout.slice(-5).join(" | ")}`);
    });
  };
  watch(server);
  const errorLines: string[] = [];
  const collectErrors = (s: SpawnedServer): void => {
    for (const line of s.stdout) if (line.includes('"level":"error"')) errorLines.push(line);
  };
  const client = await connect({ url: server.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 100, requestTimeoutMs: 60_000 });
  const pubErrors: Counts = new Map();
  const commitErrors: Counts = new Map();
  const enqueueErrors: Counts = new Map();
  const readErrors: Counts = new Map();
  const acked = new Map<number, { partition: number; offset: number }>();
  let consumed = 0;
  let commits = 0;
  let enqueued = 0;
  let worked = 0;
  let replayed = 0;
  let stop = false;
  const ac = new AbortController();
  const started = Date.now();
  try {
    await client.createTopic("load", { partitions: PARTITIONS, segmentBytes: SEGMENT_BYTES });
    const jobs = client.queue<{ n: number }>("jobs", { segmentBytes: SEGMENT_BYTES, visibilityTimeoutMs: 10_000 });
    let nextId = 0;
    const publisher = async (): Promise<void> => {
      while (!stop) {
        const id = nextId++;
        try {
          const r = await client.publish("load", { id, pad: PAD }, { key: `k${id % 1000}` });
          acked.set(id, { partition: r.partition, offset: r.offset });
        } catch (e) {
          count(pubErrors, e);
        }
      }
    };
    const consumer = async (): Promise<void> => {
      const sub = client.subscribe<{ id: number }>("load", { group: "g", start: "earliest", signal: ac.signal });
      try {
        for await (const msg of sub) {
          consumed++;
          try {
            await msg.commit();
            commits++;
          } catch (e) {
            count(commitErrors, e);
          }
        }
      } catch (e) {
        if (!stop) count(commitErrors, e);
      }
    };
    let nextJob = 0;
    const enqueuer = async (): Promise<void> => {
      while (!stop) {
        try {
          await jobs.enqueue({ n: nextJob++ });
          enqueued++;
        } catch (e) {
          count(enqueueErrors, e);
        }
      }
    };
    // Replays every partition from its start over and over: sealed segments' handles are
    // opened, evicted and reopened while appends roll new segments.
    const replayer = async (): Promise<void> => {
      while (!stop) {
        for (let p = 0; p < PARTITIONS && !stop; p++) {
          try {
            let off = 0;
            for (;;) {
              const r = await client.fetch("load", p, off, { maxBytes: 8 * 1024 });
              replayed += r.records.length;
              if (r.records.length === 0 || r.nextOffset >= r.highWatermark) break;
              off = r.nextOffset;
            }
          } catch (e) {
            count(readErrors, e);
          }
        }
      }
    };
    const loops = [
      ...Array.from({ length: PUBLISHERS }, publisher),
      consumer(),
      ...Array.from({ length: 4 }, enqueuer),
      replayer(),
      jobs
        .process(
          async () => {
            worked++;
          },
          { concurrency: 8, signal: ac.signal },
        )
        .catch((e: unknown) => {
          if (!stop) count(enqueueErrors, e);
        }),
    ];
    const deadline = Date.now() + SECONDS * 1000;
    for (let k = 0; k < kills; k++) {
      // Kill at a random point of the run, once traffic flows.
      const before = acked.size;
      await waitUntil(() => acked.size >= before + 200 + Math.floor(Math.random() * 2000), `progress before kill ${k}`, 60_000);
      collectErrors(server);
      killing = true;
      server.proc.kill("SIGKILL");
      await server.exited;
      killing = false;
      server = await spawnServer(args(port));
      watch(server);
    }
    // At least SECONDS, and until every partition has more sealed segments than open handles
    // (a loaded machine publishes less per second; the point is the rolls, not the rate).
    const sealedNow = (): number[] =>
      Array.from({ length: PARTITIONS }, (_, p) => readdirSync(join(dir, "topics", "load", String(p))).filter((f) => /^\d{20}\.log$/.test(f)).length - 1);
    while (Date.now() < deadline || Math.min(...sealedNow()) <= OPEN_HANDLE_LIMIT + 1) {
      await new Promise((r) => setTimeout(r, 100));
      if (unexpectedExits.length > 0 || Date.now() > deadline + 120_000) break;
    }
    const last = acked.size;
    await waitUntil(() => acked.size > last + 100 || unexpectedExits.length > 0, "progress at the end", 60_000);
    stop = true;
    ac.abort();
    await Promise.all(loops);
    collectErrors(server);

    // Read back every partition: every acknowledged record once, at its offset, no damage.
    const seen = new Map<number, { partition: number; offset: number }>();
    const dups: number[] = [];
    const gaps: string[] = [];
    const corrupt: Counts = new Map();
    for (let p = 0; p < PARTITIONS; p++) {
      let off = 0;
      let expect = 0;
      for (;;) {
        let r;
        try {
          r = await client.fetch("load", p, off, { maxBytes: 1 << 20 });
        } catch (e) {
          count(corrupt, e);
          break;
        }
        for (const rec of r.records) {
          if (rec.offset !== expect) gaps.push(`partition ${p}: offset ${rec.offset} where ${expect} was expected`);
          expect = rec.offset + 1;
          const id = (rec.value as { id: number }).id;
          if (seen.has(id)) dups.push(id);
          seen.set(id, { partition: p, offset: rec.offset });
        }
        if (r.records.length === 0 || r.nextOffset >= r.highWatermark) break;
        off = r.nextOffset;
      }
    }
    let lost = 0;
    for (const [id, at] of acked) {
      const got = seen.get(id);
      if (!got || got.partition !== at.partition || got.offset !== at.offset) lost++;
    }
    const sealed = sealedNow();
    t.diagnostic(
      `${kills} kills, ${((Date.now() - started) / 1000).toFixed(1)} s: published ${acked.size} (errors ${show(pubErrors)}), consumed ${consumed}, ` +
        `committed ${commits} (errors ${show(commitErrors)}), enqueued ${enqueued} (errors ${show(enqueueErrors)}), worked ${worked}, ` +
        `replayed ${replayed} (errors ${show(readErrors)}), sealed segments per partition ${sealed.join(",")}`,
    );
    assert.deepEqual(unexpectedExits, [], "the server never exits by itself");
    assert.deepEqual(errorLines, [], "the server logs no error");
    for (const [what, m] of [["publish", pubErrors], ["commit", commitErrors], ["enqueue/work", enqueueErrors], ["replay", readErrors], ["read-back", corrupt]] as const) {
      assert.equal(m.get("STORAGE_ERROR") ?? 0, 0, `${what}: no STORAGE_ERROR`);
      assert.equal(m.get("CORRUPT_RECORD") ?? 0, 0, `${what}: no CORRUPT_RECORD`);
      for (const code of m.keys()) assert.ok(!code.startsWith("uncoded:"), `${what}: untyped error ${code}`);
    }
    assert.equal(total(corrupt), 0, `read-back errors: ${show(corrupt)}`);
    assert.equal(lost, 0, `acknowledged records lost or misplaced (of ${acked.size})`);
    assert.deepEqual(dups, [], "no record stored twice");
    assert.deepEqual(gaps, [], "offsets contiguous");
    // The idempotent producer retries across restarts: no publish fails.
    assert.equal(total(pubErrors), 0, `publish errors ${show(pubErrors)}`);
    if (kills === 0) {
      for (const [what, m] of [["commit", commitErrors], ["enqueue/work", enqueueErrors], ["replay", readErrors]] as const) assert.equal(total(m), 0, `${what} errors without kills: ${show(m)}`);
    }
    assert.ok(Math.min(...sealed) > OPEN_HANDLE_LIMIT, `more sealed segments than open handles per partition: ${sealed.join(",")}`);
    assert.ok(consumed > 0 && commits > 0 && enqueued > 0 && worked > 0 && replayed > 0, "every activity made progress");
  } finally {
    stop = true;
    ac.abort();
    await client.close();
    killing = true;
    server.proc.kill("SIGKILL");
    await server.exited;
    rmSync(dir, { recursive: true, force: true });
  }
}

test(`load on 16 KiB segments: ${PUBLISHERS} publishers, a group committing every message, a worked queue, replays; no server kills`, { timeout: 300_000 + SECONDS * 10_000 }, async (t) => {
  await runLoad(t, 0);
});

test(`load on 16 KiB segments with ${KILLS} server SIGKILLs: no STORAGE_ERROR, no CORRUPT_RECORD, no self-exit, nothing acknowledged lost`, { timeout: 300_000 + SECONDS * 10_000 }, async (t) => {
  await runLoad(t, KILLS);
});
