// SPDX-License-Identifier: Apache-2.0
/**
 * Per-entity version sequencing (SEQ-1) on SQLite and PostgreSQL: next versions applied in
 * order, exact duplicates ignored, conflicting duplicates flagged, gaps parked durably until
 * the missing version arrives, is repaired or skipped; shuffled deliveries with duplicates
 * always end in the same, ordered projection.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { VersionSequencer } from "../src/contracts/sequencer.js";
import { pgDatabase, sqliteDatabase, type SqlDatabase } from "../src/contracts/stores/sql.js";
import { tempDir } from "../src/testing/helpers.js";

const dir = tempDir("sluice-seq-");
const pgUrl = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const admin = new pg.Pool({ connectionString: pgUrl, max: 1 });
const pools: pg.Pool[] = [];
const schemas: string[] = [];
after(async () => {
  for (const p of pools) await p.end();
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  await admin.end();
  dir.cleanup();
});

interface Msg {
  value: { entity: string; v: number; body: string };
  headers?: Record<string, string>;
}
const msg = (entity: string, v: number, body = `${entity}@${v}`): Msg => ({ value: { entity, v, body } });

interface Backend {
  name: string;
  db(): Promise<SqlDatabase<unknown>>;
}

let n = 0;
const backends: Backend[] = [
  {
    name: "SQLite",
    db: async () => {
      const db = new Database(join(dir.dir, `seq-${n++}.db`));
      return sqliteDatabase(db) as SqlDatabase<unknown>;
    },
  },
  {
    name: "PostgreSQL",
    db: async () => {
      const schema = `sluice_seq_test_${process.pid}_${n++}`;
      schemas.push(schema);
      await admin.query(`CREATE SCHEMA ${schema}`);
      const pool = new pg.Pool({ connectionString: pgUrl, max: 4, options: `-c search_path=${schema}` });
      pools.push(pool);
      return pgDatabase(pool) as SqlDatabase<unknown>;
    },
  },
];

function sequencer(db: SqlDatabase<unknown>) {
  return new VersionSequencer<unknown, Msg>(db, { consumer: "projector", entityOf: (m) => ({ entityId: m.value.entity, version: m.value.v }) });
}

/** The projection: what each database's applies wrote, in order (checked by the tests). */
const writes = new Map<SqlDatabase<unknown>, [string, number][]>();
function pendingWrites(db: SqlDatabase<unknown>) {
  let w = writes.get(db);
  if (!w) writes.set(db, (w = []));
  return w;
}
const apply = (db: SqlDatabase<unknown>) => async (_tx: unknown, rec: { entityId: string; version: number }) => void pendingWrites(db).push([rec.entityId, rec.version]);

for (const b of backends) {
  test(`${b.name}: in order, duplicates, conflicts, gaps parked and released, repair and skip`, async () => {
    const db = await b.db();
    const s = sequencer(db);
    const ap = apply(db);
    const outcome = async (m: Msg) => (await s.handle(m, ap)).outcome;
    assert.equal(await outcome(msg("A", 1)), "applied");
    assert.equal(await outcome(msg("A", 2)), "applied");
    assert.equal(await outcome(msg("A", 2)), "duplicate", "exact duplicate ignored");
    assert.equal(await outcome(msg("A", 2, "other content")), "conflict", "same version, other content");
    assert.equal(await outcome(msg("A", 4)), "parked");
    assert.equal(await outcome(msg("A", 5)), "parked");
    assert.equal(await outcome(msg("A", 4)), "parked", "a parked duplicate stays parked once");
    assert.equal(await outcome(msg("A", 4, "else")), "conflict", "a parked version with other content");
    assert.equal(await outcome(msg("B", 2)), "parked");
    const parked = await s.listParked();
    assert.deepEqual(parked.map((p) => [p.entityId, p.waitingFor, p.parkedVersions]), [["A", 3, [4, 5]], ["B", 1, [2]]]);
    assert.ok(parked.every((p) => p.ageMs >= 0));
    const r = await s.handle(msg("A", 3), ap);
    assert.deepEqual(r, { outcome: "applied", applied: [3, 4, 5] }, "the missing version releases its parked successors");
    assert.equal(await s.currentVersion("A"), 5);
    // Operator tools: B's version 1 is lost: skip to 2; C's version 1 is supplied by hand.
    assert.deepEqual(await s.skipTo("B", 2, ap), { outcome: "applied", applied: [2] });
    assert.equal(await outcome(msg("C", 2)), "parked");
    assert.deepEqual(await s.repair({ entityId: "C", version: 1, value: msg("C", 1).value, headers: {} }, ap), { outcome: "applied", applied: [1, 2] });
    assert.deepEqual(await s.listParked(), []);
    assert.deepEqual((await s.listConflicts()).map((c) => [c.entityId, c.version]), [["A", 2], ["A", 4]]);
    const applied = pendingWrites(db).map(([e, v]) => `${e}${v}`);
    assert.deepEqual(applied, ["A1", "A2", "A3", "A4", "A5", "B2", "C1", "C2"]);
  });

  test(`${b.name}: shuffled deliveries with duplicates always apply each version once, in order`, async () => {
    const db = await b.db();
    const s = sequencer(db);
    const ap = apply(db);
    const all: Msg[] = [];
    for (let e = 0; e < 6; e++) for (let v = 1; v <= 12; v++) all.push(msg(`E${e}`, v));
    let seed = 17;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const delivered = [...all, ...all.filter(() => rnd() < 0.3)];
    for (let i = delivered.length - 1; i > 0; i--) {
      const j = Math.floor(rnd() * (i + 1));
      [delivered[i], delivered[j]] = [delivered[j], delivered[i]];
    }
    for (const m of delivered) await s.handle(m, ap);
    const byEntity = new Map<string, number[]>();
    for (const [e, v] of pendingWrites(db)) byEntity.set(e, [...(byEntity.get(e) ?? []), v]);
    for (let e = 0; e < 6; e++) assert.deepEqual(byEntity.get(`E${e}`), Array.from({ length: 12 }, (_, i) => i + 1), `E${e} in order, once each`);
    assert.deepEqual(await s.listParked(), []);
    assert.deepEqual(await s.listConflicts(), []);
  });
}

test("a failing apply rolls back the version and the parked release with it", async () => {
  const db = await backends[0].db();
  const s = sequencer(db);
  await s.handle(msg("X", 2), async () => {});
  await assert.rejects(s.handle(msg("X", 1), async (_tx, rec) => {
    if (rec.version === 2) throw new Error("projection write failed");
  }), /projection write failed/);
  assert.equal(await s.currentVersion("X"), 0, "nothing applied");
  assert.deepEqual((await s.listParked()).map((p) => p.parkedVersions), [[2]], "still parked");
});
