// SPDX-License-Identifier: Apache-2.0
/**
 * Acceptance (issue 2, item 2): a child appends with durability "always" while this test
 * SIGKILLs it at random moments (>= 20 kills). After each restart every acknowledged record is
 * present once, byte-identical, offsets are contiguous, and no torn record is served.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { statSync } from "node:fs";
import { openBroker } from "../src/index.js";
import { NodeFileSystem } from "../src/log/io.js";
import { PartitionLog } from "../src/log/partition-log.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { valueFor } from "./fixtures/crash-common.js";

const fixture = fileURLToPath(new URL("./fixtures/crash-appender.js", import.meta.url));
const KILLS = Number(process.env.SLUICE_CRASH_KILLS ?? 24);

test(`SIGKILL during durable appends x${KILLS}: no acknowledged record lost, none duplicated, none torn`, { timeout: 240_000 }, async () => {
  using tmp = tempDir();
  {
    const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    // Small segments so kills also land during segment rolls.
    await b.createTopic("crash", { partitions: 3, segmentBytes: 64 * 1024 });
    await b.close();
  }
  const acked = new Map<number, { partition: number; offset: number }>();
  let nextSeq = 0;
  let totalAcked = 0;
  for (let round = 0; round < KILLS; round++) {
    const child = spawn(process.execPath, [fixture, tmp.dir, "crash", String(nextSeq)], { stdio: ["ignore", "pipe", "inherit"] });
    let buf = "";
    let ready = false;
    let ackedThisRound = 0;
    child.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === "READY") ready = true;
        else if (line.startsWith("ACK ")) {
          const [, p, o, s] = line.split(" ");
          acked.set(Number(s), { partition: Number(p), offset: Number(o) });
          ackedThisRound++;
        }
      }
    });
    const exited = new Promise<void>((r) => child.on("exit", () => r()));
    await waitUntil(() => ready || child.exitCode !== null, "child ready", 20_000);
    assert.equal(child.exitCode, null, "child died before READY");
    // Kill after a random amount of acknowledged work (and sometimes immediately).
    const target = Math.floor(Math.random() * 400);
    await waitUntil(() => ackedThisRound >= target || child.exitCode !== null, "acks", 20_000);
    child.kill("SIGKILL");
    await exited;
    totalAcked += ackedThisRound;
    // Sequence numbers of the next child start past anything this one may have used.
    nextSeq += 1_000_000;

    // Verify with a fresh broker (this runs recovery).
    const b = await openBroker({ dataDir: tmp.dir, retentionCheckIntervalMs: 0 });
    try {
      const d = await b.describeTopic("crash");
      const seen = new Map<number, { partition: number; offset: number }>();
      for (const p of d.partitions) {
        let off = p.logStartOffset;
        let expected = p.logStartOffset;
        while (off < p.highWatermark) {
          const r = await b.fetch("crash", p.partition, off, { maxBytes: 1 << 20 });
          for (const rec of r.records) {
            assert.equal(rec.offset, expected, "offsets contiguous");
            expected++;
            const v = rec.value as Uint8Array;
            const seq = Buffer.from(v).readUInt32BE(0);
            assert.ok(Buffer.from(v).equals(valueFor(seq)), `record at ${p.partition}/${rec.offset} is byte-identical`);
            assert.equal(Buffer.from(rec.headers.seq).toString(), String(seq));
            assert.ok(!seen.has(seq), `seq ${seq} stored once`);
            seen.set(seq, { partition: p.partition, offset: rec.offset });
          }
          off = r.nextOffset;
        }
        assert.equal(expected, p.highWatermark);
      }
      for (const [seq, where] of acked) {
        const got = seen.get(seq);
        assert.ok(got, `acknowledged seq ${seq} present after kill ${round + 1}`);
        assert.deepEqual(got, where, `acknowledged seq ${seq} at its acknowledged offset`);
      }
    } finally {
      await b.close();
    }
  }
  assert.ok(totalAcked > 0, "some records were acknowledged");
});

const preallocFixture = fileURLToPath(new URL("./fixtures/prealloc-appender.js", import.meta.url));
const PREALLOC_KILLS = Math.max(8, Math.floor(KILLS / 2));

test(`SIGKILL during preallocation x${PREALLOC_KILLS}: zero fills, rolls and truncations lose and tear nothing acknowledged`, { timeout: 240_000 }, async () => {
  using tmp = tempDir();
  const acked = new Map<number, number>(); // offset -> seq
  let nextSeq = 0;
  let fillsSeen = 0;
  for (let round = 0; round < PREALLOC_KILLS; round++) {
    const child = spawn(process.execPath, [preallocFixture, tmp.dir, String(nextSeq)], { stdio: ["ignore", "pipe", "inherit"] });
    let buf = "";
    let ready = false;
    let fills = 0;
    // Kill right as the k-th zero fill of this run starts: during its write, its fdatasync, or
    // the appends and roll right after it.
    const killAtFill = 1 + Math.floor(Math.random() * 6);
    child.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === "READY") ready = true;
        else if (line === "FILL") {
          if (++fills === killAtFill) child.kill("SIGKILL");
        } else if (line.startsWith("ACK ")) {
          const [, o, s] = line.split(" ");
          acked.set(Number(o), Number(s));
        }
      }
    });
    const exited = new Promise<void>((r) => child.on("exit", () => r()));
    await waitUntil(() => ready || child.exitCode !== null, "child ready", 20_000);
    assert.equal(child.exitCode, null, "child died before READY");
    await waitUntil(() => fills >= killAtFill || child.exitCode !== null, "zero fills", 30_000);
    child.kill("SIGKILL");
    await exited;
    fillsSeen += fills;
    nextSeq += 1_000_000;

    // Recover without preallocation so the files show exactly what recovery left.
    const log = await PartitionLog.open({
      fs: new NodeFileSystem(),
      dir: tmp.dir,
      topic: "crash",
      partition: 0,
      config: { segmentBytes: 256 * 1024, segmentMs: 7 * 86_400_000, maxMessageBytes: 64 * 1024, durability: "always", flushIntervalMs: 1000, retentionMs: -1, retentionBytes: -1 },
      preallocate: "off",
    });
    try {
      const seen = new Map<number, number>();
      let off = 0;
      while (off < log.highWatermark) {
        const r = await log.read(off, 1 << 20);
        for (const rec of r.records) {
          assert.equal(rec.offset, off, "offsets contiguous");
          const seq = rec.value!.readUInt32BE(0);
          assert.ok(rec.value!.equals(valueFor(seq)), `record at ${rec.offset} is byte-identical`);
          seen.set(rec.offset, seq);
          off++;
        }
        assert.equal(r.nextOffset, off);
      }
      for (const [o, s] of acked) assert.equal(seen.get(o), s, `acknowledged seq ${s} at offset ${o} after kill ${round + 1}`);
      for (const s of log.describeSegments()) assert.equal(statSync(s.file).size, s.size, `${s.file}: no zeros or torn bytes past the log`);
    } finally {
      await log.close();
    }
  }
  assert.ok(fillsSeen >= PREALLOC_KILLS, "kills landed around zero fills");
  assert.ok(acked.size > 0, "some appends were acknowledged");
});
