// SPDX-License-Identifier: Apache-2.0
// Crash tests: a real child process owns the queue and is SIGKILLed.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { Job, Queue } from "../src/queues/index.js";
import { iter, nextJob, openManager, rng, tempDir, waitFor } from "./fixtures/queue-helpers.js";

const CHILD = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "queue-crash-child.js");
const UNAWAITED_CHILD = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "queue-unawaited-child.js");
const cleanups: (() => void)[] = [];
after(() => cleanups.forEach((c) => c()));

interface ChildResult {
  lines: string[];
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

/** Runs the child; if `killAfterLines` is set, SIGKILLs it once that many lines were reported. */
function runChild(args: string[], killAfterLines?: number, timeoutMs = 20_000, script = CHILD): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    const lines: string[] = [];
    let buf = "";
    let stderr = "";
    let killed = false;
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`child timed out; stderr: ${stderr}`));
    }, timeoutMs);
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (d: string) => {
      buf += d;
      const parts = buf.split("\n");
      buf = parts.pop()!;
      for (const l of parts) lines.push(l);
      if (killAfterLines !== undefined && !killed && lines.length >= killAfterLines) {
        killed = true;
        child.kill("SIGKILL");
      }
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d: string) => (stderr += d));
    // "close" fires after the process exited and its pipes are drained (lines written before the kill).
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      if (buf) lines.push(buf);
      resolve({ lines, code, signal, stderr });
    });
  });
}

function readLines(path: string): string[] {
  return existsSync(path) ? readFileSync(path, "utf8").split("\n").filter(Boolean) : [];
}

for (const point of ["before", "after-effect", "after-ack"] as const) {
  test(`worker SIGKILLed ${point} the side effect/ack: no loss, redelivery only if unacked, one effect per job`, async () => {
    const t = tempDir();
    const s = tempDir();
    cleanups.push(t.cleanup, s.cleanup);
    const m = await openManager(t.dir);
    const q = m.queue<string>("crash", { visibilityTimeoutMs: 300 });
    const ids: string[] = [];
    for (let i = 0; i < 8; i++) ids.push((await q.enqueue(`job-${i}`)).id);
    await m.close();

    const r1 = await runChild(["worker", t.dir, s.dir, point, "4"]);
    assert.equal(r1.signal, "SIGKILL", `child should have been killed; stderr: ${r1.stderr}`);
    const r2 = await runChild(["worker", t.dir, s.dir, "none", "0"]);
    assert.equal(r2.code, 0, `second worker finishes; stderr: ${r2.stderr}`);

    const effects = readLines(join(s.dir, "effects"));
    assert.deepEqual([...effects].sort(), [...ids].sort(), "exactly one effect per job");
    const deliveries = readLines(join(s.dir, "deliveries")).map((l) => l.split(" "));
    const perId = new Map<string, number[]>();
    for (const [id, attempt] of deliveries) perId.set(id, [...(perId.get(id) ?? []), Number(attempt)]);
    const killedId = ids[3];
    for (const id of ids) {
      const attempts = perId.get(id) ?? [];
      if (id === killedId && point !== "after-ack") {
        assert.equal(attempts.length, 2, `unacked job ${id} is redelivered once`);
        assert.ok(attempts[1] > attempts[0], "attempt rises");
      } else {
        assert.equal(attempts.length, 1, `job ${id} (acked) is never redelivered: ${attempts}`);
      }
    }
    const m2 = await openManager(t.dir);
    assert.equal((await m2.queue("crash").stats()).depth, 0);
    await m2.close();
  });
}

for (const [prefetch, maxPending] of [
  [8, 1000],
  [4, 16],
] as const) {
  test(`README loop with un-awaited acks (prefetch ${prefetch}, maxPendingSettlements ${maxPending}) SIGKILLed: no job lost; handled jobs delivered again <= prefetch + maxPendingSettlements`, async (ctx) => {
    const t = tempDir();
    cleanups.push(t.cleanup);
    const m = await openManager(t.dir);
    const q = m.queue<number>("unawaited", { visibilityTimeoutMs: 300 });
    const ids: string[] = [];
    for (let i = 0; i < 8000; i += 1000) ids.push(...(await q.enqueueBatch(Array.from({ length: 1000 }, (_, k) => ({ data: i + k })))).map((r) => r.id));
    await m.close();

    const r = await runChild([t.dir, String(prefetch), String(maxPending)], 3000, 30_000, UNAWAITED_CHILD);
    assert.equal(r.signal, "SIGKILL", `child should have been killed; stderr: ${r.stderr}`);
    const handled = new Set(r.lines.filter((l) => l.startsWith("H ")).map((l) => l.slice(2)));
    assert.ok(handled.size >= 3000, `jobs handled before the kill (${handled.size})`);

    const m2 = await openManager(t.dir);
    const q2 = m2.queue<number>("unawaited", { visibilityTimeoutMs: 300 });
    const remaining = new Set<string>();
    const stop = new AbortController();
    const drain = (async () => {
      for await (const j of q2.work({ prefetch: 64, visibilityTimeoutMs: 60_000, signal: stop.signal })) {
        remaining.add(j.id);
        void j.ack();
      }
    })();
    // Leases restored from the killed child expire 300 ms after their hand-out: then the queue is empty.
    await waitFor(async () => (await q2.stats()).depth === 0, "the queue drained", 30_000);
    stop.abort();
    await drain;
    await m2.close();
    const lost = ids.filter((id) => !handled.has(id) && !remaining.has(id));
    assert.deepEqual(lost.slice(0, 10), [], "every job was handled or is delivered again");
    const again = [...handled].filter((id) => remaining.has(id));
    ctx.diagnostic(`handled before the kill ${handled.size} of ${ids.length}; handled and delivered again ${again.length}`);
    assert.ok(again.length <= prefetch + maxPending, `handled jobs delivered again: ${again.length} <= ${prefetch + maxPending}`);
  });
}

test("SIGKILL of the queue owner at random moments (25 kills): no acked enqueue lost, no confirmed ack redelivered, never in neither source nor DLQ, attempts never go backwards; a confirmed ack's result is kept, no result without an ack", async (ctx) => {
  const t = tempDir();
  cleanups.push(t.cleanup);
  const rand = rng(42);
  const all: string[] = [];
  const kills = 25;
  for (let k = 0; k < kills; k++) {
    const r = await runChild(["ops", t.dir, `r${k}`, String(1000 + k)], 10 + Math.floor(rand() * 110));
    assert.equal(r.signal, "SIGKILL", `run ${k} was killed; stderr: ${r.stderr}`);
    assert.ok(!r.lines.some((l) => l.startsWith("X ")) || true);
    all.push(...r.lines);
  }

  // Final state: drain the DLQ and the source.
  const m = await openManager(t.dir);
  const q = m.queue<string>("ops", { visibilityTimeoutMs: 200, maxAttempts: 3, backoff: { minDelayMs: 1, maxDelayMs: 5 }, resultRetentionMs: 3_600_000 });
  const dlq = m.queue<string>("ops.dlq");
  await (q as unknown as { whenIdle(): Promise<void> }).whenIdle();
  await (dlq as unknown as { whenIdle(): Promise<void> }).whenIdle();
  // Drain both queues at once until both stay empty. Leases restored from the killed child
  // still expire after this open, and a job at maxAttempts then moves to the DLQ: draining one
  // queue after the other would miss a job that moves during the first drain.
  const dlqJobs: Job<string>[] = [];
  const srcJobs: Job<string>[] = [];
  const stop = new AbortController();
  const consume = async (queue: typeof q, into: Job<string>[]): Promise<void> => {
    // A long lease for the check itself: under CPU load a 200 ms lease can expire before the ack.
    for await (const j of queue.work({ prefetch: 64, visibilityTimeoutMs: 60_000, signal: stop.signal })) {
      into.push(j);
      await j.ack();
    }
  };
  const consumers = [consume(q, srcJobs), consume(dlq, dlqJobs)];
  const idle = async (): Promise<boolean> => {
    await (q as unknown as { whenIdle(): Promise<void> }).whenIdle();
    await (dlq as unknown as { whenIdle(): Promise<void> }).whenIdle();
    return (await q.stats()).depth === 0 && (await dlq.stats()).depth === 0;
  };
  const deadline = Date.now() + 30_000;
  let quiet = 0;
  while (quiet < 3) {
    assert.ok(Date.now() < deadline, "queues drained within 30 s");
    quiet = (await idle()) ? quiet + 1 : 0;
    await new Promise((r) => setTimeout(r, 50));
  }
  stop.abort();
  await Promise.all(consumers);
  const resultProblems = await checkResults(q, all);
  await m.close();

  const enqueued = new Set<string>();
  const ackIntent = new Set<string>();
  const acked = new Map<string, number>(); // token -> index of its confirmed ack line
  const attemptsById = new Map<string, number>();
  const problems: string[] = [];
  all.forEach((line, idx) => {
    const [op, token, id, attempt] = line.split(" ");
    if (op === "E") enqueued.add(token);
    else if (op === "a") ackIntent.add(token);
    else if (op === "A") acked.set(token, idx);
    else if (op === "G") {
      if (acked.has(token)) problems.push(`confirmed-acked ${token} delivered again (line ${idx})`);
      const prev = attemptsById.get(id) ?? 0;
      if (Number(attempt) <= prev) problems.push(`attempt went backwards for id ${id}: ${prev} -> ${attempt}`);
      attemptsById.set(id, Number(attempt));
    } else if (op === "X" && !/LeaseExpired|closed|BROKER_CLOSED/.test(line)) problems.push(`child error: ${line}`);
  });
  const inSource = new Set(srcJobs.map((j) => j.data));
  const inDlq = new Map<string, number>();
  for (const j of dlqJobs) inDlq.set(j.data, (inDlq.get(j.data) ?? 0) + 1);
  for (const tok of acked.keys()) if (inSource.has(tok) || inDlq.has(tok)) problems.push(`confirmed-acked ${tok} still present`);
  for (const [tok, n] of inDlq) {
    if (n > 1) problems.push(`${tok} is ${n} times in the DLQ`);
    if (inSource.has(tok)) problems.push(`${tok} is in both the source and the DLQ`);
  }
  let lost = 0;
  for (const tok of enqueued) {
    if (!inSource.has(tok) && !inDlq.has(tok) && !ackIntent.has(tok)) {
      lost++;
      problems.push(`acknowledged enqueue ${tok} is in neither source nor DLQ and was never acked; its history: ${all.filter((l) => l.split(" ")[1] === tok).join(" | ")}`);
    }
  }
  const count = (p: string): number => all.filter((l) => l.startsWith(p)).length;
  ctx.diagnostic(
    `enqueued ${enqueued.size}, acked ${acked.size}, nacks ${count("N ")}, dlq moves ${count("D ")}, redrives ${count("R ")} (moved ${all.filter((l) => l.startsWith("R ")).reduce((a, l) => a + Number(l.split(" ")[1]), 0)}), final source ${srcJobs.length}, final dlq ${dlqJobs.length}`,
  );
  assert.deepEqual(problems.slice(0, 20), []);
  assert.deepEqual(resultProblems.slice(0, 20), [], "results after the crashes");
  assert.equal(lost, 0);
  assert.ok(enqueued.size > 100, `enough work happened (${enqueued.size} enqueues)`);
  assert.ok(acked.size > 20, `acks happened (${acked.size})`);
  assert.ok(dlqJobs.length + [...all].filter((l) => l.startsWith("D ")).length > 0, "dead-letter moves happened");
});

/**
 * Q-9 after the kills: every confirmed ack (`A` line) has its result ({t: token}), and no job
 * has a result unless an ack with it was issued (`a` line) for that job (the final drain acks
 * without results). The retention (1 h) does not pass during the test.
 */
async function checkResults(q: Queue<string>, lines: string[]): Promise<string[]> {
  const problems: string[] = [];
  const tokenOf = new Map<string, string>();
  const intents = new Set<string>();
  const confirmed: [string, string][] = [];
  for (const line of lines) {
    const [op, token, id] = line.split(" ");
    if (op === "E" || op === "G") tokenOf.set(id, token);
    else if (op === "a") intents.add(`${token} ${id}`);
    else if (op === "A") confirmed.push([token, id]);
  }
  for (const [token, id] of confirmed) {
    const j = await q.getJob(id);
    if (j?.state !== "completed" || (j.result as { t?: string } | undefined)?.t !== token) problems.push(`confirmed ack of ${token} (id ${id}) has ${JSON.stringify(j)}`);
  }
  for (const [id, token] of tokenOf) {
    const j = await q.getJob(id);
    if (j === null || j.result === undefined) continue;
    if (j.state !== "completed") problems.push(`job ${id} is ${j.state} with a result`);
    if ((j.result as { t?: string }).t !== token || !intents.has(`${token} ${id}`)) problems.push(`job ${id} (${token}) has result ${JSON.stringify(j.result)} without an ack that carried it`);
  }
  return problems;
}
