// SPDX-License-Identifier: Apache-2.0
/**
 * Flows at every crash point: an embedded broker on FaultyFileSystem (crash model: what was not
 * made durable may be lost, torn or kept) stores a flow (root -> [a -> [a1, a2], b, c]) and
 * works it job by job, acking each with its label; the file system freezes at I/O operation k
 * for every k of the workload (power loss after it), and a new broker opens the data dir:
 * - FLOW-1: the flow is there whole or not at all, and whole if its enqueue was acknowledged;
 * - every acknowledged ack stays: the job is completed, never delivered again, and a waiting
 *   parent shows the child's result;
 * - FLOW-2: worked to the end after recovery, every parent is delivered only once all its
 *   children completed, and sees each child's result.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import type { FlowJob, FlowResult, Queue } from "../src/queues/types.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { nextJob } from "../src/testing/conformance-helpers.js";

interface Node {
  label: string;
  kids: number;
}
const FLOW: FlowJob = {
  data: { label: "root", kids: 3 },
  children: [{ data: { label: "a", kids: 2 }, children: [{ data: { label: "a1", kids: 0 } }, { data: { label: "a2", kids: 0 } }] }, { data: { label: "b", kids: 0 } }, { data: { label: "c", kids: 0 } }],
};
/** Jobs in FLOW (root, a, a1, a2, b, c). */
const countJobs = (f: FlowJob): number => 1 + (f.children ?? []).reduce((n, c) => n + countJobs(c), 0);
const JOBS = countJobs(FLOW);
const CONFIG = { segmentBytes: 16 * 1024, resultRetentionMs: 86_400_000, deadLetter: null, visibilityTimeoutMs: 60_000 };
/** Recovery runs this much later (leases restored from the journal have run out by then, LEASE-1). */
const SKEW_MS = 3_600_000;

/** What the workload saw acknowledged before the crash. */
interface Ledger {
  flow: FlowResult | null;
  acked: Map<string, string>;
  problems: string[];
}

/** Checks a parent's children at its delivery (FLOW-2): all completed, each with its label as result. */
async function checkChildren(job: { data: Node; childResults(): Promise<Record<string, { state: string; result?: unknown }>> }, problems: string[]): Promise<void> {
  const kids = Object.values(await job.childResults());
  const ok = kids.length === job.data.kids && kids.every((k) => k.state === "completed" && typeof k.result === "string");
  if (!ok) problems.push(`${job.data.label} delivered with children ${JSON.stringify(kids)}`);
}

/** What a crashed workload leaves open (closed, with a deadline, before recovery). */
interface Open {
  broker: EmbeddedBroker | null;
  worker: { close(): Promise<void> } | null;
}

async function workload(fs: FaultyFileSystem, dataDir: string, L: Ledger, open: Open): Promise<void> {
  try {
    const b = (open.broker = await openBroker({ dataDir, fs, retentionCheckIntervalMs: 0 }));
    const q: Queue<Node> = b.queue<Node>("f", CONFIG);
    L.flow = await q.enqueueFlow(FLOW);
    const w = (open.worker = q.work({ prefetch: 10 }));
    const it = w[Symbol.asyncIterator]();
    for (let n = 0; n < JOBS; n++) {
      const job = await nextJob(it, 5000);
      if (job.data.kids > 0) await checkChildren(job, L.problems);
      await job.ack(job.data.label);
      L.acked.set(job.id, job.data.label);
    }
    await w.close();
    await b.close();
    open.broker = open.worker = null;
  } catch {
    // The crash (or its consequences): what is open is abandoned by the caller.
  }
}

/** Closes what a crashed workload left open, giving up after 2 s (its file system is frozen). */
async function abandon(open: Open): Promise<void> {
  const all = [open.worker?.close(), open.broker?.close()].filter((p) => p !== undefined);
  for (const p of all) p.catch(() => {});
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([Promise.allSettled(all), new Promise((r) => (timer = setTimeout(r, 2000)))]);
  clearTimeout(timer);
}

async function recoverAndCheck(dataDir: string, scratch: string, L: Ledger): Promise<string[]> {
  const problems: string[] = [];
  const fs2 = new FaultyFileSystem({ crashModel: { scratchDir: scratch } });
  const realNow = Date.now;
  Date.now = () => realNow() + SKEW_MS;
  let b: EmbeddedBroker;
  try {
    b = await openBroker({ dataDir, fs: fs2, retentionCheckIntervalMs: 0 });
  } catch (e) {
    Date.now = realNow;
    fs2.dispose();
    return [`recovery failed: ${(e as Error).stack}`];
  }
  try {
    const q: Queue<Node> = b.queue<Node>("f", CONFIG);
    const s = await q.stats();
    const stored = s.depth + s.completed;
    if (L.flow !== null) {
      for (const id of idsOf(L.flow)) if ((await q.getJob(id)) === null) problems.push(`job ${id} of an acknowledged flow is gone`);
    } else if (s.depth !== 0 && s.depth !== JOBS) problems.push(`a flow whose enqueue was not acknowledged is partly there: depth ${s.depth}`);
    for (const [id, label] of L.acked) {
      const j = await q.getJob(id);
      if (j?.state !== "completed" || j.result !== label) problems.push(`acked job ${label} (${id}) is ${JSON.stringify(j)}`);
      const parent = j?.parentId ?? (L.flow !== null ? parentIn(L.flow, id) : undefined);
      const p = parent === undefined ? null : await q.getJob(parent);
      if (p?.state === "waiting-children" && p.children?.[id]?.result !== label) problems.push(`waiting parent ${parent} lost acked child ${label}: ${JSON.stringify(p.children)}`);
    }
    // Work the rest: no acked job again; parents only after all their children.
    const w = q.work({ prefetch: 10 });
    const it = w[Symbol.asyncIterator]();
    for (let n = 0; n < s.depth; n++) {
      const job = await nextJob(it, 5000);
      if (L.acked.has(job.id)) problems.push(`acked job ${job.data.label} delivered again`);
      if (job.data.kids > 0) await checkChildren(job, problems);
      await job.ack(job.data.label);
    }
    await w.close();
    const end = await q.stats();
    if (end.depth !== 0) problems.push(`depth ${end.depth} after working the flow (stored ${stored})`);
  } finally {
    await b.close();
    Date.now = realNow;
    fs2.dispose();
  }
  return problems;
}

function idsOf(r: FlowResult, out: string[] = []): string[] {
  out.push(r.id);
  for (const c of r.children) idsOf(c, out);
  return out;
}

function parentIn(r: FlowResult, id: string): string | undefined {
  for (const c of r.children) {
    if (c.id === id) return r.id;
    const p = parentIn(c, id);
    if (p !== undefined) return p;
  }
  return undefined;
}

async function runAt(k: number, seed: number): Promise<{ ops: number; problems: string[] }> {
  const root = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-flowcp-"));
  const dataDir = join(root, "data");
  mkdirSync(dataDir);
  try {
    const fs = new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch") } });
    fs.crashAtOp(k);
    const L: Ledger = { flow: null, acked: new Map(), problems: [] };
    const open: Open = { broker: null, worker: null };
    const ended = await Promise.race([workload(fs, dataDir, L, open).then(() => "done" as const), fs.whenCrashed().then(() => "crashed" as const)]);
    if (ended === "crashed") await new Promise((r) => setTimeout(r, 5)); // acks already due arrive
    else if (!fs.isCrashed) fs.crash("power lost after the end of the workload");
    const frozen = { flow: L.flow, acked: new Map(L.acked), problems: [...L.problems] };
    await abandon(open);
    const ops = fs.opCount;
    await fs.powerLoss({ seed: seed * 7919 + k, mode: "mixed" });
    fs.dispose();
    const problems = [...frozen.problems, ...(await recoverAndCheck(dataDir, join(root, "scratch2"), frozen))];
    return { ops, problems };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

test("flows at every crash point: stored whole or not at all; acked children's results reach their parent; parents only after all children", { timeout: 600_000 }, async (t) => {
  const seed = Number(process.env.SLUICE_SEED ?? 1);
  const dry = await runAt(Number.MAX_SAFE_INTEGER, seed);
  assert.deepEqual(dry.problems, [], "the workload without a crash");
  const failures: string[] = [];
  for (let k = 0; k < dry.ops; k++) {
    const r = await runAt(k, seed);
    for (const p of r.problems) failures.push(`k=${k}: ${p}`);
  }
  t.diagnostic(`${dry.ops} crash points, ${failures.length} problems`);
  assert.deepEqual(failures.slice(0, 20), []);
});
