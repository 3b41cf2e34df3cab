// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance: `sluice serve` is SIGKILLed at random moments (SLUICE_QUEUE_SERVER_KILLS, default
 * 15; more under `npm run soak`) while one client enqueues (single calls and batches, many in
 * flight) and works the same queue: ack, nack with a delay, dead-letter (at once, and after
 * maxAttempts), with 16 KiB segments so both logs roll all the time. Enqueues interrupted by a
 * kill are retried by the client under their identity. At the end:
 * - no confirmed enqueue is lost (it was acked, or is still in the queue or its DLQ);
 * - no confirmed ack is followed by another delivery of that job;
 * - every confirmed dead letter is in the DLQ (and not in the source);
 * - no enqueue that failed to its caller is stored, and none failed at all;
 * - no job is stored twice (one id per payload in the source, at most one DLQ copy).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/client/index.js";
import { enqueueStats } from "../src/client/queue.js";
import type { Job, Queue } from "../src/queues/types.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

const KILLS = Number(process.env.SLUICE_QUEUE_SERVER_KILLS ?? 15);
const MAX_ATTEMPTS = 3;
const BACKLOG = 1500;

/** Deterministic per-token choice of what the worker does with a job. */
function plan(token: string): "ack" | "retry-then-ack" | "retry" | "dead" {
  let h = 2166136261;
  for (let i = 0; i < token.length; i++) h = Math.imul(h ^ token.charCodeAt(i), 16777619);
  const r = (h >>> 0) % 20;
  if (r < 13) return "ack";
  if (r < 16) return "retry-then-ack"; // nack with a delay once, then ack
  if (r < 18) return "retry"; // nack with a delay every time: dead-lettered after maxAttempts
  return "dead"; // nack({ requeue: false }) at once
}

test(`sluice serve SIGKILLed x${KILLS} while a client enqueues and works a queue: no confirmed enqueue, ack or dead letter lost; failed enqueues not stored; nothing stored twice`, { timeout: 120_000 + KILLS * 15_000 }, async (t) => {
  using tmp = tempDir("sluice-srv-qcrash-");
  const args = (port: number): string[] => ["--data", tmp.dir, "--port", String(port), "--http-port", "off", "--log-level", "error"];
  let server: SpawnedServer = await spawnServer(args(0));
  const port = server.port;
  const client = await connect({ url: server.url, reconnectMinDelayMs: 10, reconnectMaxDelayMs: 100, requestTimeoutMs: 30_000 });
  // One event order for everything the test observes.
  let clock = 0;
  const confirmed = new Map<string, string>(); // token -> id its caller got
  const failed = new Map<string, string>(); // token -> error
  const deliveries: { at: number; token: string; id: string; attempt: number }[] = [];
  const ackTried = new Set<string>();
  const acked = new Map<string, number>(); // token -> clock of the confirmed ack
  const deadConfirmed = new Set<string>();
  let settledJobs = 0;
  let stop = false;
  let next = 0;
  try {
    const dlqCfg = { deadLetter: null, segmentBytes: 16 * 1024 };
    const cfg = { maxAttempts: MAX_ATTEMPTS, visibilityTimeoutMs: 2000, segmentBytes: 16 * 1024, deadLetter: "jobs.dlq", backoff: { minDelayMs: 5, maxDelayMs: 20 } };
    const dlq = client.queue<string>("jobs.dlq", dlqCfg);
    await dlq.stats(); // created with its config before the source ever dead-letters into it
    const q: Queue<string> = client.queue<string>("jobs", cfg);

    // Enqueuers pause while the queue holds more than BACKLOG jobs (asked from the server: the
    // test's own count drifts, an ack whose answer died with a kill is never confirmed).
    let depth = 0;
    const backlogFull = (): boolean => depth > BACKLOG;
    const roomInQueue = async (): Promise<void> => {
      for (;;) {
        depth = (await q.stats()).depth;
        if (stop || !backlogFull()) return;
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    const enqueueOne = (token: string): Promise<void> =>
      q.enqueue(token).then(
        (r) => void confirmed.set(token, r.id),
        (e: Error) => void failed.set(token, `${e.name}: ${e.message}`),
      );
    // Singles: 4 loops x 40 calls in flight; batches: 2 loops of 25 jobs.
    const singles = async (): Promise<void> => {
      while (!stop) {
        if (backlogFull() || Math.random() < 0.05) await roomInQueue();
        await Promise.all(Array.from({ length: 40 }, () => enqueueOne(`s${next++}`)));
      }
    };
    const batches = async (): Promise<void> => {
      while (!stop) {
        if (backlogFull() || Math.random() < 0.05) await roomInQueue();
        const tokens = Array.from({ length: 25 }, () => `b${next++}`);
        await q.enqueueBatch(tokens.map((data) => ({ data }))).then(
          (rs) => rs.forEach((r, i) => confirmed.set(tokens[i], r.id)),
          (e: Error) => tokens.forEach((tok) => failed.set(tok, `${e.name}: ${e.message}`)),
        );
      }
    };

    // The worker: settles each job as its plan says, recording intents and confirmations.
    const worker = q.work({ prefetch: 64 });
    const handle = (job: Job<string>): void => {
      const token = job.data;
      deliveries.push({ at: ++clock, token, id: job.id, attempt: job.attempt });
      const p = plan(token);
      let settle: Promise<void>;
      let kind: "ack" | "nack" | "dead";
      if (p === "ack" || (p === "retry-then-ack" && job.attempt > 1)) {
        kind = "ack";
        ackTried.add(token);
        settle = job.ack();
      } else if (p === "dead") {
        kind = "dead";
        settle = job.nack({ requeue: false, reason: "planned dead letter" });
      } else {
        // The last attempt's nack dead-letters it (maxAttempts).
        kind = job.attempt >= MAX_ATTEMPTS ? "dead" : "nack";
        settle = job.nack({ delayMs: 20, reason: "planned retry" });
      }
      settle.then(
        () => {
          if (kind === "ack") acked.set(token, ++clock);
          if (kind === "dead") deadConfirmed.add(token);
          if (kind !== "nack") settledJobs++;
        },
        () => {}, // lease lost with the connection: the job comes back
      );
    };
    const working = (async () => {
      for await (const job of worker) handle(job);
    })();
    const loops = [singles(), singles(), singles(), singles(), batches(), batches()];

    for (let k = 0; k < KILLS; k++) {
      const enq = confirmed.size;
      const done = settledJobs;
      // A random moment of traffic: after some new confirmed enqueues and settlements.
      const want = 20 + Math.floor(Math.random() * 400);
      await waitUntil(() => confirmed.size >= enq + want && settledJobs >= done + Math.floor(want / 4), `traffic before kill ${k + 1}`, 60_000);
      server.proc.kill("SIGKILL");
      await server.exited;
      server = await spawnServer(args(port), { timeoutMs: 30_000 });
    }
    const enq = confirmed.size;
    await waitUntil(() => confirmed.size >= enq + 200, "traffic after the last restart", 60_000);
    stop = true;
    await Promise.all(loops);
    await worker.close();
    await working;

    // Drain what is left, from both queues at once: leases restored after a kill still expire
    // and may move a job at maxAttempts into the DLQ meanwhile.
    const leftSource: { token: string; id: string }[] = [];
    const leftDlq: { token: string; sourceId: string }[] = [];
    const drainStop = new AbortController();
    const drainers = [
      (async () => {
        for await (const j of q.work({ prefetch: 256, visibilityTimeoutMs: 120_000, signal: drainStop.signal })) {
          leftSource.push({ token: j.data, id: j.id });
          deliveries.push({ at: ++clock, token: j.data, id: j.id, attempt: j.attempt });
          await j.ack();
        }
      })(),
      (async () => {
        for await (const j of dlq.work({ prefetch: 256, visibilityTimeoutMs: 120_000, signal: drainStop.signal })) {
          leftDlq.push({ token: j.data, sourceId: j.deadLetter?.sourceId ?? "?" });
          await j.ack();
        }
      })(),
    ];
    let quiet = 0;
    const deadline = Date.now() + 60_000;
    while (quiet < 3) {
      assert.ok(Date.now() < deadline, "both queues drained within 60 s");
      const [a, b] = await Promise.all([q.stats(), dlq.stats()]);
      quiet = a.depth === 0 && b.depth === 0 ? quiet + 1 : 0;
      await new Promise((r) => setTimeout(r, 100));
    }
    drainStop.abort();
    await Promise.all(drainers);

    const problems: string[] = [];
    const inSource = new Set(leftSource.map((x) => x.token));
    const dlqCount = new Map<string, number>();
    for (const x of leftDlq) dlqCount.set(x.token, (dlqCount.get(x.token) ?? 0) + 1);
    // Stored twice: one token under two ids of the source queue.
    const idsOf = new Map<string, Set<string>>();
    for (const d of deliveries) {
      let s = idsOf.get(d.token);
      if (!s) idsOf.set(d.token, (s = new Set()));
      s.add(d.id);
    }
    for (const x of leftDlq) {
      let s = idsOf.get(x.token);
      if (!s) idsOf.set(x.token, (s = new Set()));
      s.add(x.sourceId);
    }
    for (const [tok, ids] of idsOf) if (ids.size > 1) problems.push(`${tok} stored twice: ids ${[...ids].join(", ")}`);
    for (const [tok, n] of dlqCount) {
      if (n > 1) problems.push(`${tok} is ${n} times in the DLQ`);
      if (inSource.has(tok)) problems.push(`${tok} is in both the source and the DLQ`);
    }
    // Confirmed enqueues: stored under the id the caller got, and not lost.
    for (const [tok, id] of confirmed) {
      const ids = idsOf.get(tok);
      if (ids === undefined || (!ackTried.has(tok) && !inSource.has(tok) && !dlqCount.has(tok))) problems.push(`confirmed enqueue ${tok} (id ${id}) lost`);
      else if (!ids.has(id)) problems.push(`confirmed enqueue ${tok} stored under ${[...ids].join(", ")}, its caller got ${id}`);
    }
    // Failed enqueues: never stored.
    for (const [tok, err] of failed) if (idsOf.has(tok)) problems.push(`enqueue of ${tok} failed to its caller (${err}) but was stored`);
    // Confirmed acks: never delivered again, not left anywhere.
    for (const d of deliveries) {
      const at = acked.get(d.token);
      if (at !== undefined && d.at > at) problems.push(`${d.token} delivered again (attempt ${d.attempt}) after its ack was confirmed`);
    }
    for (const tok of acked.keys()) if (dlqCount.has(tok)) problems.push(`acked ${tok} found in the DLQ`);
    // Confirmed dead letters: in the DLQ.
    for (const tok of deadConfirmed) if (!dlqCount.has(tok)) problems.push(`confirmed dead letter ${tok} missing from the DLQ`);

    const st = enqueueStats(client.transport);
    t.diagnostic(
      `kills ${KILLS}, client reconnects ${client.transport.reconnects}; enqueues confirmed ${confirmed.size}, failed ${failed.size}; ` +
        `enqueue requests ${st.requests}, retried across reconnects/timeouts ${st.retried} (${st.retriedJobs} jobs); ` +
        `deliveries ${deliveries.length}, acks confirmed ${acked.size}, dead letters confirmed ${deadConfirmed.size}; left at the end: source ${leftSource.length}, DLQ ${leftDlq.length}`,
    );
    assert.deepEqual(problems.slice(0, 20), [], `${problems.length} problems`);
    assert.equal(failed.size, 0, `enqueues that failed instead of being retried: ${[...failed.values()].slice(0, 3).join("; ")}`);
    assert.ok(confirmed.size > KILLS * 50, `enough enqueues: ${confirmed.size}`);
    assert.ok(acked.size > KILLS * 10, `enough acks: ${acked.size}`);
    assert.ok(deadConfirmed.size > 0, "dead letters happened");
    assert.ok(st.retried > 0, "some enqueue requests were retried across a kill");
  } finally {
    stop = true;
    await client.close().catch(() => {});
    server.proc.kill("SIGKILL");
    await server.exited;
  }
});
