// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance (issue 2, item 5): committed offsets survive SIGKILL right after commit()
 * resolves and the group resumes exactly there; reset with dry-run; lag in records and time;
 * in-process group membership with incremental rebalancing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { openBroker, NotAssignedError, GroupActiveError, type Message } from "../src/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";

const committer = fileURLToPath(new URL("./fixtures/crash-committer.js", import.meta.url));

test("committed offsets survive SIGKILL right after commit() resolves; the group resumes exactly there", { timeout: 120_000 }, async () => {
  using tmp = tempDir();
  {
    const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    await b.createTopic("t", { partitions: 3 });
    await b.publishBatch("t", Array.from({ length: 3000 }, (_, i) => ({ value: i, key: `k${i}` })));
    await b.close();
  }
  for (let round = 0; round < 5; round++) {
    const child = spawn(process.execPath, [committer, tmp.dir, "t"], { stdio: ["ignore", "pipe", "inherit"] });
    const reported = new Map<number, number>();
    let count = 0;
    let buf = "";
    child.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const [kind, p, o] = buf.slice(0, i).split(" ");
        buf = buf.slice(i + 1);
        if (kind === "COMMIT") {
          reported.set(Number(p), Number(o));
          count++;
        }
      }
    });
    const exited = new Promise<void>((r) => child.on("exit", () => r()));
    const target = 1 + Math.floor(Math.random() * 150);
    await waitUntil(() => count >= target || child.exitCode !== null, "commits", 20_000);
    child.kill("SIGKILL");
    await exited;
    const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    const lag = await b.groupLag("g", "t");
    let ahead = 0;
    for (const p of lag.partitions) {
      const rep = reported.get(p.partition);
      if (rep === undefined) continue;
      assert.ok(p.committedOffset !== null && p.committedOffset >= rep + 1, `partition ${p.partition}: committed ${p.committedOffset} >= reported ${rep} + 1`);
      ahead += p.committedOffset! - (rep + 1);
    }
    assert.ok(ahead <= 1, "at most the one in-flight commit beyond what was reported");
    // Resume exactly at the committed positions.
    const sub = b.subscribe<number>("t", { group: "g", start: "earliest" });
    const first = new Map<number, number>();
    for await (const m of sub) {
      if (!first.has(m.partition)) first.set(m.partition, m.offset);
      if (first.size === lag.partitions.filter((p) => (p.committedOffset ?? 0) < p.highWatermark).length) break;
    }
    for (const [p, o] of first) assert.equal(o, lag.partitions[p].committedOffset ?? 0, `partition ${p} resumes at its commit`);
    await b.close();
  }
});

test("resetGroup: dry run reports per partition without changing anything; real reset applies", async () => {
  using tmp = tempDir();
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: 2 });
  const t0 = Date.now() - 10_000;
  for (let i = 0; i < 10; i++) await b.publish("t", i, { partition: i % 2, timestamp: t0 + i * 1000 });
  const sub = b.subscribe<number>("t", { group: "g", start: "earliest" });
  let n = 0;
  for await (const m of sub) {
    await m.commit();
    if (++n === 6) break;
  }
  const before = await b.groupLag("g", "t");
  const dry = await b.resetGroup("g", "t", "earliest", { dryRun: true });
  assert.equal(dry.dryRun, true);
  assert.deepEqual(dry.partitions.map((p) => p.next), [0, 0]);
  assert.deepEqual(dry.partitions.map((p) => p.previous), before.partitions.map((p) => p.committedOffset));
  assert.deepEqual((await b.groupLag("g", "t")).partitions.map((p) => p.committedOffset), before.partitions.map((p) => p.committedOffset), "dry run changed nothing");
  const shifted = await b.resetGroup("g", "t", { shiftBy: -1 }, { dryRun: true });
  assert.deepEqual(shifted.partitions.map((p) => p.next), before.partitions.map((p) => Math.max(0, (p.committedOffset ?? 0) - 1)));
  const byTime = await b.resetGroup("g", "t", { timestamp: t0 + 4500 });
  // Records at t0+5000.. are i=5..9; partition 0 holds even i (offsets 0..4), partition 1 odd i.
  assert.deepEqual(byTime.partitions.map((p) => p.next), [3, 2]);
  assert.deepEqual((await b.groupLag("g", "t")).partitions.map((p) => p.committedOffset), [3, 2]);
  await b.resetGroup("g", "t", { offset: 99 });
  assert.deepEqual((await b.groupLag("g", "t")).partitions.map((p) => p.committedOffset), [5, 5], "clamped to the end");
  await b.resetGroup("g", "t", "earliest");
  const again: number[] = [];
  for await (const m of b.subscribe<number>("t", { group: "g" })) {
    again.push(m.value);
    if (again.length === 10) break;
  }
  assert.deepEqual(again.sort((a, x) => a - x), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  await b.close();
});

test("resetGroup refuses while the group has live members", async () => {
  using tmp = tempDir();
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t");
  await b.publish("t", 1);
  const sub = b.subscribe("t", { group: "g", start: "earliest" });
  const it = sub[Symbol.asyncIterator]();
  await it.next();
  await assert.rejects(b.resetGroup("g", "t", "earliest"), GroupActiveError);
  await sub.close();
  await b.resetGroup("g", "t", "earliest");
  await b.close();
});

test("lag in records and in time", async () => {
  using tmp = tempDir();
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: 2 });
  const now = Date.now();
  await b.publishBatch("t", [
    { value: "a", partition: 0, timestamp: now - 60_000 },
    { value: "b", partition: 0, timestamp: now - 30_000 },
    { value: "c", partition: 0, timestamp: now - 10_000 },
    { value: "d", partition: 1, timestamp: now - 5_000 },
  ]);
  let lag = await b.groupLag("g", "t");
  assert.equal(lag.totalRecords, 4);
  assert.equal(lag.partitions[0].committedOffset, null);
  assert.ok(lag.partitions[0].lagMs >= 60_000 && lag.partitions[0].lagMs < 70_000);
  await b.resetGroup("g", "t", { offset: 1 });
  lag = await b.groupLag("g", "t");
  assert.equal(lag.partitions[0].lagRecords, 2);
  assert.equal(lag.partitions[1].lagRecords, 0, "offset 1 on a 1-record partition is its end");
  assert.ok(lag.partitions[0].lagMs >= 30_000 && lag.partitions[0].lagMs < 40_000, "age of the oldest unconsumed record");
  assert.equal(lag.partitions[1].lagMs, 0);
  assert.equal(lag.totalRecords, 2);
  assert.ok(lag.maxLagMs >= 30_000);
  await b.close();
});

test("two members share partitions; moved partitions are revoked first; stale commits get NotAssignedError", async () => {
  using tmp = tempDir();
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: 4 });
  await b.publishBatch("t", Array.from({ length: 40 }, (_, i) => ({ value: i, partition: i % 4 })));
  const s1 = b.subscribe<number>("t", { group: "g", start: "earliest" });
  const it1 = s1[Symbol.asyncIterator]();
  const m1 = (await it1.next()).value as Message<number>;
  assert.deepEqual(s1.assignment(), [0, 1, 2, 3]);
  const s2 = b.subscribe<number>("t", { group: "g", start: "earliest" });
  const it2 = s2[Symbol.asyncIterator]();
  const m2 = (await it2.next()).value as Message<number>;
  assert.deepEqual(s1.assignment(), [0, 1]);
  assert.deepEqual(s2.assignment(), [2, 3]);
  const all = new Set([...s1.assignment(), ...s2.assignment()]);
  assert.equal(all.size, 4, "every partition owned exactly once");
  if (m1.partition >= 2) {
    assert.ok(m1.signal.aborted, "msg.signal aborts when its partition moves");
    await assert.rejects(m1.commit(), NotAssignedError);
  } else await m1.commit();
  await m2.commit();
  await s2.close();
  // After s2 leaves, s1 owns everything again and can read all of it.
  const seen = new Set<number>();
  for (let r = await it1.next(); !r.done; r = await it1.next()) {
    seen.add(r.value.partition);
    await r.value.commit();
    if ((await b.groupLag("g", "t")).totalRecords === 0) break;
  }
  assert.deepEqual(s1.assignment(), [0, 1, 2, 3]);
  await s1.close();
  await b.close();
});

test("members beyond the partition count stay idle; round-robin assignment", async () => {
  using tmp = tempDir();
  const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
  await b.createTopic("t", { partitions: 3 });
  await b.publishBatch("t", Array.from({ length: 3 }, (_, i) => ({ value: i, partition: i })));
  const subs = Array.from({ length: 4 }, () => b.subscribe<number>("t", { group: "g", start: "earliest", assignment: "roundrobin" }));
  const its = subs.map((s) => s[Symbol.asyncIterator]());
  const firsts = its.slice(0, 3).map((it) => it.next());
  await Promise.all(firsts);
  void its[3].next();
  await waitUntil(() => subs.reduce((n, s) => n + s.assignment().length, 0) === 3 && subs[3].assignment().length === 0, "4 members, 3 partitions");
  for (const s of subs) await s.close();
  await b.close();
});
