// SPDX-License-Identifier: Apache-2.0
/**
 * The effect gate (EFFECT-1): an effect is performed once per id; one interrupted by a crash is
 * filed as uncertain, never repeated blindly; in replay mode intents are deferred for review and
 * reconciliation releases only those never performed. Then consumer processes SIGKILLed at
 * random between effects and commits: every message's effect happens exactly once (after the
 * uncertain ones are resolved against the external record, as a person would).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { EffectGate } from "../src/contracts/effects.js";
import { sqliteDatabase } from "../src/contracts/stores/sql.js";
import { envelope } from "../src/contracts/envelope.js";
import { openBroker } from "../src/broker/broker.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";

const CHILD = join(fileURLToPath(new URL(".", import.meta.url)), "fixtures", "effect-child.js");

test("once per id; an interrupted effect is uncertain; replay defers; reconcile releases only what never happened", async () => {
  const d = tempDir("sluice-effects-");
  try {
    const db = new Database(join(d.dir, "app.db"));
    const gate = new EffectGate(sqliteDatabase(db), { consumer: "notify" });
    const sent: string[] = [];
    const send = (id: string) => () => (sent.push(id), `sent ${id}`);
    assert.deepEqual(await gate.perform("e1", send("e1")), { outcome: "performed", result: "sent e1" });
    assert.deepEqual(await gate.perform("e1", send("e1")), { outcome: "skipped" }, "a redelivery does not send again");
    await assert.rejects(gate.perform("e2", () => Promise.reject(new Error("smtp down"))), /smtp down/);
    assert.equal((await gate.perform("e2", send("e2"))).outcome, "performed", "a failed effect may be retried");
    // A crash in the middle of an effect: the ledger says started, nothing says done.
    db.prepare("INSERT INTO effect_ledger (consumer_name, effect_id, status, started_at) VALUES ('notify', 'e3', 'started', 0)").run();
    assert.equal((await gate.perform("e3", send("e3"))).outcome, "uncertain", "never repeated blindly");
    assert.deepEqual((await gate.review("uncertain")).map((e) => e.effectId), ["e3"]);
    await gate.resolveUncertain("e3", false);
    assert.equal((await gate.perform("e3", send("e3"))).outcome, "performed", "resolved as not performed: it may run");
    // Replay: nothing new is performed; intents are filed; reconcile releases the new ones only.
    assert.equal((await gate.perform("e1", send("e1"), { replay: true })).outcome, "skipped");
    assert.equal((await gate.perform("e4", send("e4"), { replay: true, intent: { to: "a@example.com" } })).outcome, "deferred");
    assert.equal((await gate.perform("e5", send("e5"), { replay: true })).outcome, "deferred");
    await gate.perform("e5", send("e5")); // the live consumer got there first
    const released: string[] = [];
    assert.deepEqual(await gate.reconcile((e) => released.push(e.effectId)), { released: 1, alreadyPerformed: 1 });
    assert.deepEqual(released, ["e4"]);
    assert.deepEqual((await gate.review("released")).map((e) => [e.effectId, e.intent]), [["e3", null], ["e4", { to: "a@example.com" }]], "e3 released by the person, e4 by reconcile");
    assert.deepEqual(sent, ["e1", "e2", "e3", "e5"]);
    db.close();
  } finally {
    d.cleanup();
  }
});

test("consumer processes SIGKILLed at random between effects and commits: every effect exactly once", async (t) => {
  const kills = Number(process.env.SLUICE_EFFECT_KILLS ?? 10);
  const d = tempDir("sluice-effects-kill-");
  const dataDir = join(d.dir, "data");
  const dbFile = join(d.dir, "app.db");
  const effectsFile = join(d.dir, "effects.log");
  const n = 3000;
  try {
    const b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
    await b.createTopic("signups", { partitions: 3, segmentBytes: 16384 });
    const ids: string[] = [];
    for (let i = 0; i < n; i += 500) {
      const batch = Array.from({ length: 500 }, (_, k) => {
        const headers = envelope({ type: "UserSignedUp", messageId: `user-${i + k}` });
        ids.push(`user-${i + k}`);
        return { key: `user-${i + k}`, value: { i: i + k }, headers };
      });
      await b.publishBatch("signups", batch);
    }
    await b.close();
    const lines = () => (existsSync(effectsFile) ? readFileSync(effectsFile, "utf8").split("\n").filter(Boolean) : []);
    for (let k = 0; k <= kills; k++) {
      const child = spawn(process.execPath, [CHILD, dataDir, dbFile, effectsFile], { stdio: ["ignore", "pipe", "inherit"] });
      const exited = new Promise((r) => child.once("exit", r));
      let out = "";
      child.stdout!.on("data", (x: Buffer) => (out += x.toString()));
      await waitUntil(() => out.includes("ready") || child.exitCode !== null, "child ready", 20_000);
      const before = lines().length;
      if (k < kills) {
        // Kill after a random amount of progress (mid-effect, mid-commit, anywhere).
        const target = before + 20 + Math.floor(Math.random() * 200);
        await waitUntil(() => lines().length >= Math.min(target, n) || Math.random() < 0.01, "progress", 30_000, 1);
        child.kill("SIGKILL");
      } else {
        await waitUntil(() => new Set(lines()).size >= n - 50 || lines().length >= n, "the last run finishes", 60_000);
        await waitUntil(async () => {
          const db = new Database(dbFile, { readonly: true });
          try {
            const r = db.prepare("SELECT count(*) AS n FROM effect_ledger WHERE status = 'done'").get() as { n: number };
            const u = db.prepare("SELECT count(*) AS n FROM effect_review WHERE status = 'uncertain'").get() as { n: number };
            return r.n + u.n >= n;
          } finally {
            db.close();
          }
        }, "every effect done or filed as uncertain", 60_000);
        child.kill("SIGKILL");
      }
      await exited;
    }
    // A person resolves the uncertain ones against the external record (the effects file).
    const db = new Database(dbFile);
    const gate = new EffectGate(sqliteDatabase(db), { consumer: "mailer" });
    const performed = new Set(lines());
    const uncertain = await gate.review("uncertain");
    for (const e of uncertain) {
      const id = e.effectId.slice("welcome:".length);
      await gate.resolveUncertain(e.effectId, performed.has(id));
      if (!performed.has(id)) await gate.perform(e.effectId, () => void lines().push(id));
    }
    const redelivered = lines().length; // each line is one effect; duplicates would show below
    t.diagnostic(`${kills} kills, ${uncertain.length} uncertain effects resolved, ${redelivered} effects`);
    const counts = new Map<string, number>();
    for (const id of lines()) counts.set(id, (counts.get(id) ?? 0) + 1);
    assert.deepEqual([...counts].filter(([, c]) => c > 1), [], "no effect performed twice");
    const missing = ids.filter((id) => !counts.has(id) && !uncertain.some((e) => e.effectId === `welcome:${id}`));
    assert.deepEqual(missing, [], "no effect lost");
    db.close();
  } finally {
    d.cleanup();
  }
});
