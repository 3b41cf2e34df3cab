// SPDX-License-Identifier: Apache-2.0
/**
 * Broker conformance tests, the consumer contracts end to end (src/contracts/): what the inbox,
 * the outbox relay, the version sequencer with the effect gate, ordered processing and
 * projection rebuilds rely on the broker for, on any target: uncommitted records redelivered
 * after a restart or a rebalance, an idempotent re-publish answered as a duplicate (across a
 * restart), `msg.replay` after a reset, per-partition order, bounded replays by fetch.
 *
 * The application's state lives in SQLite in a temp dir (conformance-app-db.ts), so the tests
 * need no service besides the target. Registered by `defineConformanceSuite`
 * (src/testing/conformance.ts), whose rules they follow.
 */
import assert from "node:assert/strict";
import { Inbox } from "../contracts/inbox.js";
import { SqliteInboxStore, type SqliteDatabase } from "../contracts/stores/sqlite-inbox.js";
import { OutboxRelay, type RelayBroker } from "../contracts/outbox-relay.js";
import { addToOutbox, SqliteOutboxStore, type SqliteTxDatabase } from "../contracts/stores/sqlite-outbox.js";
import { envelope, messageIdOf, readEnvelope } from "../contracts/envelope.js";
import { VersionSequencer, type SequenceOutcome } from "../contracts/sequencer.js";
import { EffectGate, type EffectOutcome } from "../contracts/effects.js";
import { processOrdered } from "../contracts/ordered.js";
import { projectionChecksum, rebuildProjection } from "../contracts/rebuild.js";
import type { Broker, ConsumedRecord, Message, PublishReceipt, PublishRecord } from "../types.js";
import { take, uniq, type ConformanceKit, type DefineTest } from "./conformance-helpers.js";
import { openAppDb, type AppDb } from "./conformance-app-db.js";
import { waitUntil, withTimeout } from "./helpers.js";

export function contractTests(t: DefineTest): void {
  t("inbox: a stream redelivered after a consumer restart (and a broker restart) is applied once, per message and in batches; its offsets are stored with the writes", inboxAcrossRestart);
  t("inbox: records handled but not committed before a rebalance are redelivered to the next owner and skipped", inboxAcrossRebalance);
  t("outbox: a relay killed after the broker took its batch re-publishes it after a restart; the broker answers a duplicate; every row once, in aggregate order", outboxAcrossRelayCrash);
  t("sequencer: each version applied once in order; a replay after a reset is marked, refused as stale and repeats no effect", sequencerReplay);
  t("ordered processing: one key's records in order under concurrency; the group's offsets end at the log end", orderedProcessing);
  t("rebuild: a snapshot plus a bounded replay, and a full replay, give the live projection's checksum, also after a restart", rebuildMatchesLive);
}

// ---- inbox (INBOX-1) ----

const LEDGER = "CREATE TABLE ledger (id TEXT NOT NULL, amount INTEGER NOT NULL)"; // no key: a double apply shows

/** `n` payments with envelope ids, then `retried` of them again (a producer retry with the same envelope). */
function payments(topic: string, n: number, retried: number): PublishRecord[] {
  const recs = Array.from({ length: n }, (_, i) => ({ key: `acct-${i % 7}`, value: { amount: 1 + (i % 3) }, headers: envelope({ type: "PaymentCaptured", messageId: `${topic}-${i}` }) }));
  return [...recs, ...Array.from({ length: retried }, (_, i) => recs[(i * 5) % n])];
}

const expectedSum = (n: number): number => Array.from({ length: n }, (_, i) => 1 + (i % 3)).reduce((a, b) => a + b, 0);

function ledger(app: AppDb): { rows: number; distinct: number; sum: number } {
  const r = app.db.prepare("SELECT count(*) AS n, count(DISTINCT id) AS d, coalesce(sum(amount), 0) AS s FROM ledger").get() as { n: number; d: number; s: number };
  return { rows: r.n, distinct: r.d, sum: r.s };
}

type Payment = { amount: number };

/** Handles messages through the inbox in delivery order; counts fresh ones and duplicates. */
async function handleAll(inbox: Inbox<SqliteDatabase>, msgs: Message<Payment>[]): Promise<{ fresh: number; duplicates: number }> {
  let fresh = 0;
  let duplicates = 0;
  for (const m of msgs) {
    const r = await inbox.handle(m, (tx) => void tx.prepare("INSERT INTO ledger (id, amount) VALUES (?, ?)").run(messageIdOf(m.headers), m.value.amount), { storeOffset: true });
    if (r.duplicate) duplicates++;
    else fresh++;
  }
  return { fresh, duplicates };
}

/** A new member of `group` reads `n` records, handles them, commits none and leaves (a consumer crash after its transactions). */
async function inboxRunNoCommit(b: Broker, topic: string, group: string, inbox: Inbox<SqliteDatabase>, n: number): Promise<{ fresh: number; duplicates: number }> {
  const sub = b.subscribe<Payment>(topic, { group, start: "earliest" });
  try {
    return await handleAll(inbox, await take(sub, n));
  } finally {
    await sub.close();
  }
}

/** A new member of `group` reads `n` records through `sub.batches()`: one inbox transaction per batch (`handleBatch`), then the batch's commit. */
async function inboxBatchRun(b: Broker, topic: string, group: string, inbox: Inbox<SqliteDatabase>, n: number): Promise<{ fresh: number; duplicates: number }> {
  const sub = b.subscribe<Payment>(topic, { group, start: "earliest" });
  const it = sub.batches({ maxMessages: 16, maxWaitMs: 20 })[Symbol.asyncIterator]();
  const counts = { fresh: 0, duplicates: 0 };
  try {
    for (let seen = 0; seen < n; ) {
      const r = await withTimeout(it.next(), 10_000, `batches: ${seen} of ${n} records`);
      if (r.done) break;
      const out = await inbox.handleBatch(r.value.messages, (tx, fresh) => {
        for (const m of fresh) tx.prepare("INSERT INTO ledger (id, amount) VALUES (?, ?)").run(messageIdOf(m.headers), m.value.amount);
      }, { storeOffset: true });
      counts.fresh += out.fresh.length;
      counts.duplicates += out.duplicates;
      seen += r.value.messages.length;
      await r.value.commit();
    }
    return counts;
  } finally {
    await sub.close();
  }
}

async function inboxAcrossRestart(first: Broker, kit: ConformanceKit): Promise<void> {
  let b = first;
  const topic = uniq("inbox");
  const group = uniq("g");
  const app = await openAppDb(LEDGER);
  try {
    const inbox = new Inbox(new SqliteInboxStore(app.db), { consumer: "ledger" });
    await b.createTopic(topic, { partitions: 3 });
    const records = payments(topic, 90, 15);
    await b.publishBatch(topic, records);
    // First run: everything handled, nothing committed to the broker (INBOX-1's crash window).
    assert.deepEqual(await inboxRunNoCommit(b, topic, group, inbox, records.length), { fresh: 90, duplicates: 15 }, "the retried publishes are duplicates");
    if (kit.reopen) b = await kit.reopen();
    // Second run, in batches: the broker redelivers every record; the inbox applies none again.
    assert.deepEqual(await inboxBatchRun(b, topic, group, inbox, records.length), { fresh: 0, duplicates: records.length });
    assert.deepEqual(ledger(app), { rows: 90, distinct: 90, sum: expectedSum(90) }, "each payment applied once");
    const stored = await inbox.startOffsets(topic);
    const desc = await b.describeTopic(topic);
    for (const p of desc.partitions) assert.equal(stored.get(p.partition) ?? 0, p.highWatermark, `partition ${p.partition}: the stored next offset is the log end`);
    await waitUntil(async () => (await b.groupLag(group, topic)).totalRecords === 0, "the group's commits cover every record");
  } finally {
    app.close();
  }
}

async function inboxAcrossRebalance(b: Broker): Promise<void> {
  const topic = uniq("inbox-rb");
  const group = uniq("g");
  const app = await openAppDb(LEDGER);
  try {
    const inbox = new Inbox(new SqliteInboxStore(app.db), { consumer: "ledger" });
    await b.createTopic(topic, { partitions: 4 });
    const records = payments(topic, 120, 0);
    await b.publishBatch(topic, records);
    // Member a handles 60 records and commits (awaited) only the first 30 of them.
    const a = b.subscribe<Payment>(topic, { group, start: "earliest" });
    const got = await take(a, 60);
    assert.deepEqual(await handleAll(inbox, got), { fresh: 60, duplicates: 0 });
    await Promise.all(got.slice(0, 30).map((m) => m.commit()));
    // Member b joins, then a leaves: b owns every partition from the group's commits on, so
    // it is handed the 30 records a handled and did not commit, once each, then the rest.
    const other = b.subscribe<Payment>(topic, { group, start: "earliest" });
    await a.close();
    const rest = await take(other, 120 - 30);
    const counts = await handleAll(inbox, rest);
    await Promise.all(rest.map((m) => m.commit()));
    await other.close();
    assert.deepEqual(counts, { fresh: 60, duplicates: 30 }, "the uncommitted records came again and were skipped");
    assert.deepEqual(ledger(app), { rows: 120, distinct: 120, sum: expectedSum(120) }, "each payment applied once");
    assert.equal((await b.groupLag(group, topic)).totalRecords, 0);
  } finally {
    app.close();
  }
}

// ---- outbox (OUTBOX-1) ----

/** One application transaction: `n` orders of one aggregate with their outbox rows; rolled back unless `commit`. */
function insertOrders(app: AppDb, aggregate: string, n: number, commit: boolean): string[] {
  const ids: string[] = [];
  const tx = app.db.transaction(() => {
    for (let i = 0; i < n; i++) {
      const id = uniq("order");
      app.db.prepare("INSERT INTO orders (id) VALUES (?)").run(id);
      ids.push(addToOutbox(app.db, { aggregateType: "order", aggregateId: aggregate, type: "OrderAccepted", payload: { id, aggregate, n: i } }));
    }
    if (!commit) throw new Error("rolled back");
  });
  try {
    tx();
  } catch (e) {
    if (commit) throw e;
    return [];
  }
  return ids;
}

/** Application writes: `txs` transactions over 6 aggregates, every 7th rolled back. */
function writeOrders(app: AppDb, committed: Map<string, string[]>, txs: number): void {
  for (let i = 0; i < txs; i++) {
    const agg = `agg-${i % 6}`;
    committed.set(agg, [...(committed.get(agg) ?? []), ...insertOrders(app, agg, 1 + (i % 4), i % 7 !== 3)]);
  }
}

async function readTopic(b: Broker, topic: string): Promise<ConsumedRecord[]> {
  const out: ConsumedRecord[] = [];
  for (const p of (await b.describeTopic(topic)).partitions) {
    for (let offset = p.logStartOffset; offset < p.highWatermark; ) {
      const r = await b.fetch(topic, p.partition, offset);
      out.push(...r.records);
      offset = r.nextOffset;
    }
  }
  return out;
}

/** Every committed row's message exactly once, no other; one aggregate's in insertion order. */
function checkPublished(records: ConsumedRecord[], committed: Map<string, string[]>): void {
  const ids = records.map((r) => readEnvelope(r.headers)!.messageId);
  const counts = new Map<string, number>();
  for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
  assert.deepEqual([...counts].filter(([, n]) => n > 1), [], "no row published twice");
  const expected = [...committed.values()].flat();
  assert.deepEqual([...ids].sort(), [...expected].sort(), "every committed row published, no rolled-back one");
  for (const [agg, list] of committed) {
    const seen = records.filter((r) => Buffer.from(r.key!).toString() === agg).map((r) => readEnvelope(r.headers)!.messageId);
    assert.deepEqual(seen, list, `aggregate ${agg} in order`);
  }
}

/** The relay's view of a broker, with `publishBatch` wrapped (`get` is read at each call: the broker may be reopened). */
function relayBroker(get: () => Broker, publish: (p: Promise<PublishReceipt[]>) => Promise<PublishReceipt[]>): RelayBroker {
  return {
    describeTopic: (t) => get().describeTopic(t),
    initProducer: (id) => get().initProducer(id),
    publishBatch: (t, recs, o) => publish(get().publishBatch(t, recs, o)),
  };
}

async function outboxAcrossRelayCrash(first: Broker, kit: ConformanceKit): Promise<void> {
  let b = first;
  const topic = uniq("outbox");
  const app = await openAppDb("CREATE TABLE orders (id TEXT PRIMARY KEY)");
  try {
    await b.createTopic(topic, { partitions: 3 });
    const store = new SqliteOutboxStore(app.db, { pollIntervalMs: 5 });
    await store.ensureSchema();
    const committed = new Map<string, string[]>();
    writeOrders(app, committed, 20);
    // A relay the broker takes a round of batches from, killed before it marks their rows published.
    const taken: Promise<PublishReceipt[]>[] = [];
    const dying = relayBroker(() => b, (p) => (taken.push(p), p.then(() => Promise.reject(new Error("relay killed after the broker took its batch")))));
    await assert.rejects(new OutboxRelay(dying, store, { topic, batchSize: 25 }).runOnce(), /relay killed/);
    const original = (await Promise.all(taken)).flat();
    if (kit.reopen) b = await kit.reopen();
    // A new relay on the same database first re-publishes exactly the pending round: the
    // broker recognises every batch of it (same producer, epoch and sequences) as stored.
    const receipts: PublishReceipt[] = [];
    const relay = new OutboxRelay(relayBroker(() => b, async (p) => (receipts.push(...(await p)), p)), store, { topic, batchSize: 25 });
    assert.equal(await relay.runOnce(), 25, "the pending round");
    assert.ok(receipts.length === 25 && receipts.every((r) => r.duplicate), "the broker answers the re-published round as a duplicate");
    const at = (rs: PublishReceipt[]) => rs.map((r) => `${r.partition}@${r.offset}`).sort();
    assert.deepEqual(at(receipts), at(original), "with the offsets it gave the first time");
    receipts.length = 0;
    writeOrders(app, committed, 15);
    while ((await relay.runOnce()) > 0);
    assert.ok(receipts.length > 0 && receipts.every((r) => !r.duplicate), "later rounds are new records");
    assert.equal((await relay.backlog()).rows, 0);
    checkPublished(await readTopic(b, topic), committed);
  } finally {
    app.close();
  }
}

// ---- sequencer (SEQ-1) and effects (EFFECT-1) under a replay ----

type Versioned = { entity: string; v: number; body: string };

/** Per entity (one key, so one partition, in publish order): v1, v3 early, v2, v2 again (a retry), v4; or `versions`. */
function versioned(entities: number, versions = [1, 3, 2, 2, 4]): PublishRecord[] {
  const out: PublishRecord[] = [];
  for (const v of versions) {
    for (let e = 0; e < entities; e++) {
      const entity = `E${e}`;
      out.push({ key: entity, value: { entity, v, body: `${entity}@${v}` }, headers: envelope({ type: "EntityChanged", messageId: `${entity}-v${v}` }) });
    }
  }
  return out;
}

interface Delivery {
  entity: string;
  version: number;
  replay: boolean;
  outcome: SequenceOutcome;
  effects: EffectOutcome[];
}

async function sequencerReplay(b: Broker): Promise<void> {
  const topic = uniq("versions");
  const group = uniq("g");
  const app = await openAppDb();
  try {
    const seq = new VersionSequencer<SqliteTxDatabase, Message<Versioned>>(app.sql, { consumer: "projector", entityOf: (m) => ({ entityId: m.value.entity, version: m.value.v }) });
    const gate = new EffectGate(app.sql, { consumer: "projector" });
    const applied: string[] = [];
    const sent: string[] = [];
    // The handler: sequence the record; send one notification per version it applied, through
    // the effect gate, in replay mode when the broker marks the delivery a replay.
    const handle = async (m: Message<Versioned>): Promise<Delivery> => {
      const r = await seq.handle(m, (_tx, rec) => void applied.push(`${rec.entityId}@${rec.version}`));
      const effects: EffectOutcome[] = [];
      for (const v of r.applied) effects.push((await gate.perform(`notify-${m.value.entity}-${v}`, () => void sent.push(`${m.value.entity}@${v}`), { replay: m.replay })).outcome);
      return { entity: m.value.entity, version: m.value.v, replay: m.replay, outcome: r.outcome, effects };
    };
    const run = async (n: number): Promise<Delivery[]> => {
      const sub = b.subscribe<Versioned>(topic, { group, start: "earliest" });
      try {
        const out: Delivery[] = [];
        for (const m of await take(sub, n)) {
          out.push(await handle(m));
          await m.commit();
        }
        return out;
      } finally {
        await sub.close();
      }
    };
    await b.createTopic(topic, { partitions: 2 });
    await b.publishBatch(topic, versioned(6));
    const firstPass = await run(30);
    const ordered = (list: string[], e: string) => list.filter((x) => x.startsWith(`${e}@`));
    for (let e = 0; e < 6; e++) {
      const mine = firstPass.filter((d) => d.entity === `E${e}`).map((d) => [d.version, d.outcome]);
      assert.deepEqual(mine, [[1, "applied"], [3, "parked"], [2, "applied"], [2, "duplicate"], [4, "applied"]], `E${e}: the broker kept the entity's order`);
      assert.deepEqual(ordered(applied, `E${e}`), [1, 2, 3, 4].map((v) => `E${e}@${v}`), `E${e}: applied once each, in order`);
    }
    assert.equal(sent.length, 24, "one notification per applied version");
    // Back to the start: every record is a replay, refused as stale; nothing applied or sent again.
    await b.resetGroup(group, topic, "earliest");
    const replayed = await run(30);
    assert.ok(replayed.every((d) => d.replay && d.outcome === "duplicate" && d.effects.length === 0), "replays are marked and refused");
    assert.equal(applied.length, 24);
    // Past the replay mark, new versions are no replays: applied, and their effects performed.
    await b.publishBatch(topic, versioned(6, [5]));
    const fresh = await run(6);
    assert.deepEqual(fresh.map((d) => [d.replay, d.outcome, d.effects]), Array.from({ length: 6 }, () => [false, "applied", ["performed"]]));
    assert.equal(sent.length, 30);
    assert.equal(new Set(sent).size, 30, "no notification sent twice");
    assert.deepEqual(await seq.listParked(), []);
    assert.deepEqual(await gate.review(), [], "nothing deferred or uncertain");
  } finally {
    app.close();
  }
}

// ---- ordered processing (ORD-1) ----

async function orderedProcessing(b: Broker): Promise<void> {
  const topic = uniq("ordered");
  const group = uniq("g");
  const n = 600;
  await b.createTopic(topic, { partitions: 4 });
  await b.publishBatch(topic, Array.from({ length: n }, (_, i) => ({ key: `order-${i % 20}`, value: { order: i % 20, seq: Math.floor(i / 20) } })));
  const seen = new Map<number, number>();
  const running = new Set<number>();
  // Violations are collected, not thrown: a throw would be retried by processOrdered and could pass the second time.
  const violations: string[] = [];
  let handled = 0;
  const ac = new AbortController();
  const sub = b.subscribe<{ order: number; seq: number }>(topic, { group, start: "earliest", signal: ac.signal });
  const done = processOrdered(
    sub,
    async (m) => {
      const { order, seq } = m.value;
      if (running.has(order)) violations.push(`order ${order}: two records at once`);
      if (seq !== (seen.get(order) ?? -1) + 1) violations.push(`order ${order}: ${seq} after ${seen.get(order)}`);
      running.add(order);
      // Yield so that other keys' handlers interleave with this one.
      if (seq % 3 === 0) await new Promise((r) => setImmediate(r));
      running.delete(order);
      seen.set(order, seq);
      handled++;
    },
    { concurrency: 8, signal: ac.signal },
  );
  try {
    await waitUntil(async () => handled === n && (await b.groupLag(group, topic)).totalRecords === 0, () => `every record handled (${handled} of ${n}) and committed`, 30_000);
  } finally {
    ac.abort();
    await done;
    await sub.close();
  }
  assert.deepEqual(violations, [], "each key's records one at a time, in offset order");
}

// ---- projection rebuild ----

type OrderEvent = { order: string; version: number; total: number };
type Projection = Record<string, { version: number; total: number }>;

const applyEvent = (s: Projection, r: ConsumedRecord): void => {
  const e = r.value as OrderEvent;
  s[e.order] = { version: e.version, total: (s[e.order]?.total ?? 0) + e.total };
};
const versionOf = (r: ConsumedRecord) => ({ entityId: (r.value as OrderEvent).order, version: (r.value as OrderEvent).version });

/** A new member of `group` applies `n` records to `state`, commits them, and leaves; returns the next offset per partition. */
async function project(b: Broker, topic: string, group: string, state: Projection, n: number, next: Record<number, number>): Promise<void> {
  const sub = b.subscribe<OrderEvent>(topic, { group, start: "earliest" });
  try {
    const got = await take(sub, n);
    for (const m of got) {
      applyEvent(state, m);
      next[m.partition] = m.offset + 1;
    }
    await Promise.all(got.map((m) => m.commit()));
  } finally {
    await sub.close();
  }
}

async function rebuildMatchesLive(first: Broker, kit: ConformanceKit): Promise<void> {
  let b = first;
  const topic = uniq("rebuild");
  const group = uniq("g");
  await b.createTopic(topic, { partitions: 3 });
  const events: OrderEvent[] = [];
  for (let v = 1; v <= 12; v++) for (let o = 0; o < 10; o++) events.push({ order: `o${o}`, version: v, total: o + v });
  const publish = (evs: OrderEvent[]) => b.publishBatch(topic, evs.map((e) => ({ key: e.order, value: e })));
  // The live projection, with a snapshot (state and offsets) taken half way.
  const live: Projection = {};
  const next: Record<number, number> = {};
  await publish(events.slice(0, 60));
  await project(b, topic, group, live, 60, next);
  const snapshot = { offsets: { ...next }, state: structuredClone(live) };
  await publish(events.slice(60));
  await project(b, topic, group, live, 60, next);
  const ends = async () => Object.fromEntries((await b.describeTopic(topic)).partitions.map((p) => [p.partition, p.highWatermark]));
  const fromSnapshot = await rebuildProjection<Projection>({ broker: b, topic, snapshot, apply: applyEvent, versionOf });
  assert.equal(fromSnapshot.records, 60, "only the records after the snapshot");
  assert.equal(projectionChecksum(fromSnapshot.state), projectionChecksum(live));
  assert.deepEqual(fromSnapshot.offsets, await ends(), "the offsets to store with the state are the log ends");
  assert.deepEqual(fromSnapshot.offsets, next, "the live consumer's positions");
  // After a restart the topic replays the same: a full rebuild gives the same state, no gaps.
  if (kit.reopen) b = await kit.reopen();
  const full = await rebuildProjection<Projection>({ broker: b, topic, initial: () => ({}), apply: applyEvent, versionOf });
  assert.equal(full.records, 120);
  assert.deepEqual(full.gaps, [], "every order's versions contiguous");
  assert.equal(projectionChecksum(full.state), projectionChecksum(live));
  assert.deepEqual(full.offsets, await ends());
}
