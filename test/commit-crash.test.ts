// SPDX-License-Identifier: Apache-2.0
/**
 * Per-message commits not awaited (the README's loop), SIGKILLed at random moments (COMMIT-1):
 * embedded, and a network client against `sluice serve` (the client killed, and every third
 * round the server too). After every kill:
 * - no message is skipped: every offset below a partition's committed position was processed
 *   (the child records a message before committing it);
 * - the position never moves back, and never passes what was processed;
 * - what the killed child processed past the committed positions (redelivered next time),
 *   summed over the partitions, is at most maxPendingCommits + 1 (docs/guarantees.md).
 * Finally the rest is consumed and every message was processed at least once.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker } from "../src/index.js";
import { connect } from "../src/client/index.js";
import type { Broker } from "../src/types.js";
import { prng, tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const marker = fileURLToPath(new URL("./fixtures/commit-marker.js", import.meta.url));
const KILLS = Number(process.env.SLUICE_COMMIT_KILLS ?? 8);
const N = 120_000;
const PARTITIONS = 4;
const MAX_PENDING = 256;

/** Fills topic "t" and returns, per value, its partition and offset. */
async function fill(dir: string): Promise<{ where: Int32Array[] }> {
  const b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: PARTITIONS, segmentBytes: 64 * 1024 });
  const part = new Int32Array(N);
  const off = new Int32Array(N);
  for (let i = 0; i < N; i += 4000) {
    const recs = Array.from({ length: Math.min(4000, N - i) }, (_, j) => ({ key: `k${i + j}`, value: i + j }));
    const rs = await b.publishBatch("t", recs);
    rs.forEach((r, j) => {
      part[i + j] = r.partition;
      off[i + j] = r.offset;
    });
  }
  await b.close();
  return { where: [part, off] };
}

function processedValues(out: string): Uint32Array {
  if (!existsSync(out)) return new Uint32Array(0);
  const buf = readFileSync(out);
  const n = Math.floor(buf.length / 4); // a SIGKILL never tears a 4-byte write(2), but be safe
  return new Uint32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + n * 4));
}

async function runCrashRounds(mode: "embedded" | "server"): Promise<{ redelivered: number; maxRound: number; kills: number }> {
  using tmp = tempDir(`sluice-commit-crash-${mode}-`);
  const { where } = await fill(tmp.dir);
  const [part, off] = where;
  const out = join(tmp.dir, "processed.bin");
  const rnd = prng(Number(process.env.SLUICE_SEED ?? Date.now()) >>> 0);
  const serverArgs = (port: number): string[] => ["--data", tmp.dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer | null = mode === "server" ? await spawnServer(serverArgs(0)) : null;
  const port = server?.port ?? 0;
  const seen = new Uint8Array(N);
  const lastCommitted = new Array<number>(PARTITIONS).fill(0);
  let redelivered = 0;
  let maxRound = 0;
  try {
    for (let round = 0; round < KILLS; round++) {
      const before = existsSync(out) ? statSync(out).size : 0;
      const child = spawn(process.execPath, [marker, mode, server ? server.url : tmp.dir, "t", out, String(MAX_PENDING)], { stdio: ["ignore", "ignore", "inherit"] });
      const exited = new Promise<void>((r) => child.once("exit", () => r()));
      const target = before + 4 * (500 + Math.floor(rnd() * 15_000));
      await waitUntil(() => child.exitCode !== null || (existsSync(out) && statSync(out).size >= target), `child processed past ${target / 4}`, 60_000);
      const killServer = server !== null && round % 3 === 2;
      if (killServer) server!.proc.kill("SIGKILL");
      child.kill("SIGKILL");
      await exited;
      if (killServer) {
        await server!.exited;
        server = await spawnServer(serverArgs(port));
      }
      const vals = processedValues(out);
      const last = new Array<number>(PARTITIONS).fill(-1); // over every run so far
      const lastHere = new Array<number>(PARTITIONS).fill(-1); // by this round's child
      for (let i = 0; i < vals.length; i++) {
        const v = vals[i];
        seen[v] = 1;
        if (off[v] > last[part[v]]) last[part[v]] = off[v];
        if (i >= before / 4 && off[v] > lastHere[part[v]]) lastHere[part[v]] = off[v];
      }
      const committed = await committedPositions(mode, tmp.dir, server);
      let behind = 0;
      for (let p = 0; p < PARTITIONS; p++) {
        const c = committed[p];
        assert.ok(c >= lastCommitted[p], `round ${round}: partition ${p} position moved back from ${lastCommitted[p]} to ${c}`);
        assert.ok(c <= last[p] + 1, `round ${round}: partition ${p} committed ${c} past the last processed offset ${last[p]}`);
        // What this child processed past the durable position is redelivered next time
        // (an earlier child's excess, not yet reached again, was counted in its own round).
        behind += Math.max(0, lastHere[p] + 1 - c);
        lastCommitted[p] = c;
      }
      assert.ok(behind <= MAX_PENDING + 1, `round ${round}: ${behind} processed messages behind the committed positions (bound ${MAX_PENDING + 1})`);
      redelivered += behind;
      maxRound = Math.max(maxRound, behind);
      // No skip: every offset below a committed position was processed in some run.
      for (let v = 0; v < N; v++) if (!seen[v] && off[v] < committed[part[v]]) assert.fail(`round ${round}: value ${v} (${part[v]}@${off[v]}) committed but never processed`);
    }
    // The rest, through the same API: everything is processed at least once.
    const b: Broker = server ? await connect({ url: server.url }) : await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    try {
      const sub = b.subscribe<number>("t", { group: "g", start: "earliest" });
      let missing = 0;
      for (let v = 0; v < N; v++) if (!seen[v]) missing++;
      for await (const m of sub) {
        if (!seen[m.value]) {
          seen[m.value] = 1;
          missing--;
        }
        void m.commit();
        if (missing === 0) break;
      }
      assert.equal(missing, 0);
    } finally {
      await b.close();
    }
    return { redelivered, maxRound, kills: KILLS };
  } finally {
    if (server) {
      server.proc.kill("SIGKILL");
      await server.exited;
    }
  }
}

async function committedPositions(mode: "embedded" | "server", dir: string, server: SpawnedServer | null): Promise<number[]> {
  const b: Broker = mode === "server" ? await connect({ url: server!.url }) : await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    const lag = await b.groupLag("g", "t");
    const out = new Array<number>(PARTITIONS).fill(0);
    for (const p of lag.partitions) out[p.partition] = p.committedOffset ?? 0;
    return out;
  } finally {
    await b.close();
  }
}

for (const mode of ["embedded", "server"] as const) {
  test(`per-message commits not awaited, ${mode}, SIGKILLed x${KILLS}: nothing skipped, redelivery within maxPendingCommits + 1`, { timeout: 60_000 + KILLS * 30_000 }, async (t) => {
    const r = await runCrashRounds(mode);
    t.diagnostic(`${mode}: ${r.kills} kills, ${r.redelivered} messages redelivered in all, at most ${r.maxRound} after one kill (bound ${MAX_PENDING + 1})`);
  });
}
