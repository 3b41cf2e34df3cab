// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance: flows across crashes. A client stores a 3-level flow of 1,000 jobs (a root, 9
 * parents, 990 leaves) on a real `sluice serve` and works it with 16 jobs in flight, while the
 * server is SIGKILLed and restarted at random moments (SLUICE_FLOW_KILLS, default 10; the first
 * kill lands while the flow's enqueue may still be in flight, which the client retries under
 * its identity). 16 KiB segments, so both queue logs roll throughout. Each handler reads its
 * children's outcomes, and acks with the sum of their results (a leaf: 1). At the end:
 * - the flow was stored once, whole: 1,000 distinct ids, every one of them worked, depth 0;
 * - every run of a parent saw every one of its children completed, with a result (FLOW-2);
 * - the results flowed up intact: every run of a parent summed 110 from its children's results,
 *   every run of the root 990 (the queue keeps no results of its own: `resultRetentionMs` 0);
 * - no job was acked twice, and none ran again after its ack was confirmed.
 * A parent runs again only when its lease died with the server (at least once, Q-1); the
 * number of such re-runs is printed.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import type { FlowJob, FlowResult, Job, Queue } from "../src/queues/types.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const KILLS = Number(process.env.SLUICE_FLOW_KILLS ?? 10);
const PARENTS = 9;
const LEAVES = 110;

interface Node {
  label: string;
  level: number;
}

function flow(): FlowJob {
  return {
    data: { label: "root", level: 2 },
    children: Array.from({ length: PARENTS }, (_, p) => ({
      data: { label: `p${p}`, level: 1 },
      children: Array.from({ length: LEAVES }, (_, l) => ({ data: { label: `p${p}.l${l}`, level: 0 } })),
    })),
  };
}

function ids(r: FlowResult, out: string[] = []): string[] {
  out.push(r.id);
  for (const c of r.children) ids(c, out);
  return out;
}

test(`sluice serve SIGKILLed x${KILLS} while a 3-level flow of 1,000 jobs runs: stored once; every parent runs after all its children, with their results; nothing acked twice`, { timeout: 120_000 + KILLS * 15_000 }, async (t) => {
  using tmp = tempDir("sluice-flow-crash-");
  const args = (port: number): string[] => ["--data", tmp.dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const client = await connect({ url: server.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 100, requestTimeoutMs: 30_000 });
  let clock = 0;
  const runs = new Map<string, number[]>(); // id -> clocks of its runs
  const ackedAt = new Map<string, number[]>(); // id -> clocks of its confirmed acks
  const violations: string[] = [];
  let rootId = "";
  try {
    const q: Queue<Node> = client.queue<Node>("flows", { visibilityTimeoutMs: 2000, segmentBytes: 16 * 1024, deadLetter: null });
    await q.stats();

    const worker = q.work({ prefetch: 16 });
    const handle = async (job: Job<Node>): Promise<void> => {
      const at = ++clock;
      const prev = ackedAt.get(job.id);
      if (prev !== undefined) violations.push(`${job.data.label} (${job.id}) ran again at ${at} after its ack was confirmed at ${prev[0]}`);
      runs.set(job.id, [...(runs.get(job.id) ?? []), at]);
      let sum = 1;
      if (job.data.level > 0) {
        let kids;
        try {
          kids = Object.values(await job.childResults());
        } catch {
          return; // the server went away: the lease dies with it and the job comes back
        }
        const want = job.data.level === 2 ? PARENTS : LEAVES;
        const done = kids.filter((k) => k.state === "completed" && typeof k.result === "number");
        if (kids.length !== want || done.length !== want) violations.push(`${job.data.label} ran with ${done.length}/${kids.length} children completed (want ${want})`);
        sum = done.reduce((s, k) => s + (k.result as number), 0);
        const full = job.data.level === 2 ? PARENTS * LEAVES : LEAVES;
        if (sum !== full) violations.push(`${job.data.label} summed ${sum} from its children's results (want ${full})`);
      }
      await new Promise((r) => setTimeout(r, 1 + Math.random() * 6));
      await job.ack(sum).then(
        () => ackedAt.set(job.id, [...(ackedAt.get(job.id) ?? []), ++clock]),
        () => {}, // lease lost with the connection: the job comes back
      );
    };
    const working = (async () => {
      for await (const job of worker) void handle(job);
    })();

    // The enqueue is in flight (or just stored) at the first kill.
    const stored = q.enqueueFlow(flow());
    let kills = 0;
    for (let k = 0; k < KILLS; k++) {
      if (k > 0) {
        const before = clock;
        const want = 20 + Math.floor(Math.random() * 150);
        await waitUntil(() => clock >= before + want || ackedAt.has(rootId), `progress before kill ${k + 1}`, 60_000);
        if (ackedAt.has(rootId)) break;
      } else await new Promise((r) => setTimeout(r, Math.random() * 30));
      server.proc.kill("SIGKILL");
      await server.exited;
      kills++;
      server = await spawnServer(args(port), { timeoutMs: 30_000 });
    }
    assert.ok(kills >= Math.min(KILLS, 3), `killed ${kills} times while the flow ran`);
    const result = await stored;
    const all = ids(result);
    rootId = result.id;
    assert.equal(new Set(all).size, 1 + PARENTS + PARENTS * LEAVES, "1,000 distinct ids");
    await waitUntil(async () => (await q.stats()).depth === 0, "the whole flow finished", 60_000);
    await worker.close();
    await working;

    // Stored once, whole: every id of the flow ran, no job outside it did.
    assert.deepEqual([...runs.keys()].filter((id) => !all.includes(id)), [], "no job outside the flow");
    assert.deepEqual(all.filter((id) => !runs.has(id)), [], "every job of the flow ran");
    assert.deepEqual(violations, []);
    for (const [id, acks] of ackedAt) assert.equal(acks.length, 1, `job ${id} acked once`);
    assert.ok((runs.get(result.id)?.length ?? 0) >= 1, "the root ran");
    const reruns = [result.id, ...result.children.map((c) => c.id)].filter((id) => (runs.get(id)?.length ?? 0) > 1).length;
    const jobReruns = [...runs.values()].filter((r) => r.length > 1).length;
    t.diagnostic(`kills ${kills}; runs ${[...runs.values()].reduce((s, r) => s + r.length, 0)} for 1000 jobs; jobs run more than once (lease died with the server) ${jobReruns}, of them parents ${reruns}`);
  } finally {
    await client.close().catch(() => {});
    server.proc.kill("SIGKILL");
    await server.exited;
  }
});
