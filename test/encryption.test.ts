// SPDX-License-Identifier: Apache-2.0
// Encryption at rest (docs/security.md, "Encryption at rest"; ENC-1..3 in docs/ARCHITECTURE.md):
// round trips embedded and through a server, key rotation, missing keys, tampering, restarts.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { openSync, readdirSync, readFileSync, readSync, rmSync, statSync, writeFileSync, writeSync, closeSync } from "node:fs";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { CorruptRecordError, EncryptionConfigError, EncryptionKeyMissingError, ValidationError } from "../src/errors.js";
import { Keyring, type KeyringSpec } from "../src/log/keyring.js";
import { BatchCipher } from "../src/log/batch-crypto.js";
import { encodeBatch, readHeader, verifyBatch, BATCH_ATTR_ENCRYPTED, HEADER_SIZE } from "../src/log/record-batch.js";
import { startServer } from "../src/server/index.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import { applyTopology, parseTopology, planIsEmpty, planTopology } from "../src/topology/index.js";

const k = (): string => randomBytes(32).toString("base64");
const SECRET = "payload-7f3a-do-not-leak";

/** Every file under `dir`, recursively. */
function files(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...files(p));
    else out.push(p);
  }
  return out;
}

/** The files of `dir` containing `needle` (as UTF-8 bytes). */
function filesWith(dir: string, needle: string): string[] {
  const n = Buffer.from(needle, "utf8");
  return files(dir).filter((f) => readFileSync(f).includes(n));
}

/** The first segment file of a topic partition or queue log directory. */
function segmentOf(dir: string): string {
  return join(dir, readdirSync(dir).filter((f) => /^\d{20}\.log$/.test(f)).sort()[0]);
}

async function drain(b: EmbeddedBroker, topic: string, from = 0): Promise<string[]> {
  const out: string[] = [];
  let off = from;
  for (;;) {
    const r = await b.fetch(topic, 0, off);
    if (r.records.length === 0) return out;
    for (const m of r.records) out.push(String(m.value));
    off = r.nextOffset;
  }
}

test("keyring: valid spec, ids only in JSON and inspect, bad specs are EncryptionConfigError without key material", async () => {
  const key = k();
  const kr = Keyring.from({ active: "k1", keys: { k1: key } });
  assert.equal(kr.activeId, "k1");
  assert.ok(!JSON.stringify(kr).includes(key));
  const { inspect } = await import("node:util");
  assert.ok(!inspect(kr).includes(key));
  assert.ok(!inspect(kr, { showHidden: true }).includes(key));
  const bad: unknown[] = [
    null,
    { active: "k1", keys: {} },
    { active: "k2", keys: { k1: key } },
    { active: "k1", keys: { k1: key.slice(0, 20) } },
    { active: "k1", keys: { k1: "!!" + key.slice(2) } },
    { active: "k1", keys: { "bad id": key } },
    { active: "k1", keys: { k1: key }, extra: 1 },
  ];
  for (const spec of bad) {
    assert.throws(() => Keyring.from(spec), (e: unknown) => e instanceof EncryptionConfigError && !(e as Error).message.includes(key.slice(0, 20)), JSON.stringify(spec)?.slice(0, 40));
  }
  using d = tempDir("sluice-enc-");
  const file = join(d.dir, "keys.json");
  writeFileSync(file, `{"active":"k1","keys":{"k1":"${key}"`); // not JSON
  await assert.rejects(Keyring.fromFile(file), (e: unknown) => e instanceof EncryptionConfigError && !(e as Error).message.includes(key));
  await assert.rejects(Keyring.fromFile(join(d.dir, "missing.json")), EncryptionConfigError);
  await assert.rejects(openBroker({ dataDir: join(d.dir, "data"), encryptionKeys: file }), EncryptionConfigError);
  assert.equal(Keyring.fromEnv({}), null);
  assert.equal(Keyring.fromEnv({ SLUICE_ENCRYPTION_KEYS: JSON.stringify({ active: "a", keys: { a: key } }) })!.activeId, "a");
});

test("batch cipher: header stays clear, AAD binds offset and log, tampering is refused", () => {
  const kr = Keyring.from({ active: "k1", keys: { k1: k() } });
  const c = new BatchCipher(kr, "topic:id-1/0", "t/0");
  const plain = encodeBatch([{ key: null, value: Buffer.from(SECRET), valueKind: 1, timestamp: 1000, headers: null }]);
  const sealed = c.seal(Buffer.from(plain), 42);
  assert.ok(!sealed.includes(Buffer.from(SECRET)));
  const h = verifyBatch(sealed, 0, sealed.length);
  assert.equal(h.baseOffset, 42);
  assert.equal(h.count, 1);
  assert.equal(h.firstTimestamp, 1000);
  assert.ok((h.attributes & BATCH_ATTR_ENCRYPTED) !== 0);
  const open = c.open(sealed, 0, h);
  assert.ok(open.buf.subarray(HEADER_SIZE).equals(plain.subarray(HEADER_SIZE)));
  // Another log (topic incarnation / partition) cannot open it.
  assert.throws(() => new BatchCipher(kr, "topic:id-1/1", "t/1").open(sealed, 0, h), /authentication/);
  // Another offset: the header's base offset is authenticated.
  const moved = Buffer.from(sealed);
  moved.writeUInt32BE(43, 20);
  assert.throws(() => c.open(moved, 0, readHeader(moved, 0)), /authentication/);
  // A flipped ciphertext bit.
  const flipped = Buffer.from(sealed);
  flipped[HEADER_SIZE + 20] ^= 1;
  assert.throws(() => c.open(flipped, 0, h), /authentication/);
  // A keyring without the key: typed, never garbage.
  const other = Keyring.from({ active: "k2", keys: { k2: k() } });
  assert.throws(() => new BatchCipher(other, "topic:id-1/0", "t/0").open(sealed, 0, h), EncryptionKeyMissingError);
  assert.throws(() => new BatchCipher(null, "topic:id-1/0", "t/0").open(sealed, 0, h), EncryptionKeyMissingError);
});

test("config: encrypted needs keys, refuses compaction, cannot change; unencrypted topics unchanged", async () => {
  using d = tempDir("sluice-enc-");
  const plain = await openBroker({ dataDir: join(d.dir, "a"), retentionCheckIntervalMs: 0 });
  try {
    await assert.rejects(plain.createTopic("t", { encrypted: true }), EncryptionConfigError);
    await assert.rejects(plain.queue("q", { encrypted: true }).enqueue("x"), EncryptionConfigError);
  } finally {
    await plain.close();
  }
  const b = await openBroker({ dataDir: join(d.dir, "b"), retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1: k() } } });
  try {
    await assert.rejects(b.createTopic("c", { encrypted: true, cleanupPolicy: "compact" }), ValidationError);
    await assert.rejects(b.createTopic("x", { encrypted: "yes" as unknown as boolean }), ValidationError);
    await b.queue("q", { encrypted: true }).enqueue("x");
    await assert.rejects(b.queue("q", { encrypted: false }).enqueue("y"), ValidationError);
    await assert.rejects(b.queue("q").upsertSchedule("s", { everyMs: 60_000, data: SECRET } as never), (e: unknown) => e instanceof ValidationError && /encrypted/.test((e as Error).message));
    // An encrypted queue's jobs never land in an unencrypted dead-letter queue.
    await b.queue("plain-dlq").enqueue("placeholder");
    const src = b.queue("src", { encrypted: true, deadLetter: "plain-dlq" });
    await src.enqueue(`${SECRET}-src`);
    const w = src.work();
    const job = (await w[Symbol.asyncIterator]().next()).value!;
    await assert.rejects(job.nack({ requeue: false, reason: "x" }), (e: unknown) => e instanceof ValidationError && /not/.test((e as Error).message));
    await w.close();
    assert.equal((await b.queue("plain-dlq").stats()).waiting, 1);
    await b.createTopic("clear");
    await b.publish("clear", SECRET);
    // An unencrypted topic stores its payload as before (and is not touched by encryption).
    assert.equal(filesWith(join(d.dir, "b", "topics", "clear"), SECRET).length, 1);
  } finally {
    await b.close();
  }
  assert.deepEqual(filesWith(join(d.dir, "b", "queues"), `${SECRET}-src`), []);
});

test("embedded: publish, fetch, subscribe and queues round-trip; nothing in clear on disk; restart recovers", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const keys: KeyringSpec = { active: "k1", keys: { k1: k() } };
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  await b.createTopic("t", { encrypted: true, segmentBytes: 4096 });
  for (let i = 0; i < 50; i++) await b.publishBatch("t", [{ value: `${SECRET}-${i}`, key: `key-${i}`, headers: { h: `${SECRET}-h` } }]);
  const sub = b.subscribe("t", { group: "g", start: "earliest" });
  const seen: string[] = [];
  for await (const m of sub) {
    seen.push(String(m.value));
    await m.commit();
    if (seen.length === 50) break;
  }
  assert.equal(seen[49], `${SECRET}-49`);
  const q = b.queue<{ s: string }>("jobs", { encrypted: true, resultRetentionMs: 60_000 });
  await q.enqueue({ s: SECRET });
  await q.enqueue({ s: `${SECRET}-fail` });
  const w = q.work({ visibilityTimeoutMs: 5000 });
  const it = w[Symbol.asyncIterator]();
  const j1 = (await it.next()).value!;
  assert.equal(j1.data.s, SECRET);
  await j1.progress({ p: SECRET });
  await j1.ack({ result: SECRET });
  const j2 = (await it.next()).value!;
  await j2.nack({ requeue: false, reason: `${SECRET}-reason` });
  await w.close();
  await waitUntil(async () => (await b.queue("jobs.dlq").stats()).waiting === 1, "dead letter");
  assert.equal((await q.getJob(j1.id))?.result !== undefined, true);
  await b.close();
  assert.deepEqual(filesWith(dataDir, SECRET), []);
  assert.deepEqual(filesWith(dataDir, "key-7"), []);

  // Restart: recovery, producer state and reads work; the queue state comes back.
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  const all = await drain(b, "t");
  assert.equal(all.length, 50);
  assert.equal(all[10], `${SECRET}-10`);
  assert.ok((await b.describeTopic("t")).partitions[0].highWatermark === 50);
  const job = await b.queue<{ s: string }>("jobs").getJob(j1.id);
  assert.deepEqual((job as { result?: unknown })?.result, { result: SECRET });
  const dl = b.queue<{ s: string }>("jobs.dlq").work();
  const dj = (await dl[Symbol.asyncIterator]().next()).value!;
  assert.equal(dj.data.s, `${SECRET}-fail`);
  await dj.ack();
  await dl.close();
  await b.close();
  assert.deepEqual(filesWith(dataDir, SECRET), []);
});

test("rotation: k1 then k2 active, both readable after restart; without k1 old batches raise ENCRYPTION_KEY_MISSING", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const k1 = k();
  const k2 = k();
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1 } } });
  await b.createTopic("t", { encrypted: true });
  await b.publish("t", "old");
  const oldJob = await b.queue("q", { encrypted: true }).enqueue("old-job");
  await b.close();
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k2", keys: { k1, k2 } } });
  await b.publish("t", "new");
  await b.queue("q").enqueue("new-job");
  await b.close();
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k2", keys: { k1, k2 } } });
  assert.deepEqual(await drain(b, "t"), ["old", "new"]);
  const w = b.queue("q").work();
  const it = w[Symbol.asyncIterator]();
  const got = [String((await it.next()).value!.data), String((await it.next()).value!.data)];
  assert.deepEqual(got.sort(), ["new-job", "old-job"]);
  await w.close();
  await b.close();
  // k1 gone: the new batch reads, the old one is a typed error, never garbage; the old job is
  // not delivered, and not lost either (given back, no attempt counted).
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k2", keys: { k2 } } });
  try {
    await assert.rejects(b.fetch("t", 0, 0), (e: unknown) => e instanceof EncryptionKeyMissingError && e.keyId === "k1");
    assert.deepEqual(await drain(b, "t", 1), ["new"]);
    // The same typed error through a server.
    const server = await startServer({ broker: b, port: 0, httpPort: null, dataDir });
    const client = await connect({ url: server.url });
    try {
      await assert.rejects(client.fetch("t", 0, 0), (e: unknown) => e instanceof EncryptionKeyMissingError && e.keyId === "k1" && e.where === "t/0");
      assert.equal(String((await client.fetch("t", 0, 1)).records[0].value), "new");
    } finally {
      await client.close();
      await server.close();
    }
    const w2 = b.queue("q").work();
    const only = (await w2[Symbol.asyncIterator]().next()).value!;
    assert.equal(only.data, "new-job");
    await only.ack();
    await waitUntil(async () => (await b.queue("q").stats()).delayed === 1, "the old job given back");
    await w2.close();
    const st = await b.queue("q").stats();
    assert.equal(st.unreadable, 0);
    assert.equal(st.deadLettered, 0);
  } finally {
    await b.close();
  }
  // k1 back: the old job is still there, readable.
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k2", keys: { k1, k2 } } });
  try {
    const info = await b.queue("q").getJob(oldJob.id);
    assert.equal(info?.data, "old-job");
    assert.equal(info?.state, "delayed");
    assert.equal(info?.attempts, 1); // the delivery before the restart; the give-backs counted none
  } finally {
    await b.close();
  }
  // No keys at all: the broker opens (retention and recovery need none), reads and writes are typed errors.
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  try {
    await assert.rejects(b.fetch("t", 0, 1), EncryptionKeyMissingError);
    await assert.rejects(b.publish("t", "x"), EncryptionKeyMissingError);
    await assert.rejects(b.queue("q").enqueue("x"), EncryptionKeyMissingError);
  } finally {
    await b.close();
  }
});

test("tampering: an altered batch on disk (CRC fixed up) is CORRUPT_RECORD, never served; the rest stays readable", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const keys = { active: "k1", keys: { k1: k() } };
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  await b.createTopic("t", { encrypted: true });
  await b.publish("t", "first");
  await b.publish("t", "second");
  await b.close();
  const seg = segmentOf(join(dataDir, "topics", "t", "0"));
  const fd = openSync(seg, "r+");
  try {
    const head = Buffer.alloc(HEADER_SIZE);
    readSync(fd, head, 0, HEADER_SIZE, 0);
    const len = head.readUInt32BE(0);
    const batch = Buffer.alloc(len);
    readSync(fd, batch, 0, len, 0);
    batch[len - 20] ^= 0x40; // a ciphertext byte
    // Recompute the CRC, as an attacker would: only the GCM tag can tell.
    const { crc32c } = await import("../src/log/crc32c.js");
    batch.writeUInt32BE(crc32c(batch, 8, len, crc32c(batch, 0, 4)), 4);
    writeSync(fd, batch, 0, len, 0);
  } finally {
    closeSync(fd);
  }
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  try {
    await assert.rejects(b.fetch("t", 0, 0), (e: unknown) => e instanceof CorruptRecordError && e.nextOffset === 1);
    assert.deepEqual(await drain(b, "t", 1), ["second"]);
  } finally {
    await b.close();
  }
  assert.ok(statSync(seg).size > 0);
});

test("server: client publishes (encoded batches), fetch, subscribe push and remote queues see clear values; disk holds none", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const broker = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1: k() } } });
  const server = await startServer({ broker, port: 0, httpPort: null, dataDir });
  const client = await connect({ url: server.url });
  try {
    await client.createTopic("t", { encrypted: true, partitions: 2 });
    for (let i = 0; i < 20; i++) await client.publish("t", { s: `${SECRET}-${i}` }, { key: `k${i}` });
    const f = await client.fetch("t", 0, 0);
    assert.ok(f.records.length > 0);
    assert.match(JSON.stringify(f.records[0].value), new RegExp(SECRET));
    const sub = client.subscribe<{ s: string }>("t", { group: "g", start: "earliest" });
    const seen = new Set<string>();
    await withTimeout(
      (async () => {
        for await (const m of sub) {
          seen.add(m.value.s);
          await m.commit();
          if (seen.size === 20) break;
        }
      })(),
      20_000,
      "subscription",
    );
    assert.ok(seen.has(`${SECRET}-19`));
    const q = client.queue<{ s: string }>("rq", { encrypted: true });
    await q.enqueue({ s: SECRET });
    const w = q.work();
    const j = (await w[Symbol.asyncIterator]().next()).value!;
    assert.equal(j.data.s, SECRET);
    await j.ack();
    await w.close();
  } finally {
    await client.close();
    await server.close();
    await broker.close();
  }
  assert.deepEqual(filesWith(dataDir, SECRET), []);
});

test("recovery after an unclean shutdown: encrypted active segment scanned, torn tail cut, producer state rebuilt, without keys too", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const keys = { active: "k1", keys: { k1: k() } };
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  await b.createTopic("t", { encrypted: true });
  const p = await b.initProducer();
  await b.publishBatch("t", [{ value: "a" }, { value: "b" }], { ...p, baseSequence: 0 });
  await b.publishBatch("t", [{ value: "c" }], { ...p, baseSequence: 2 });
  await b.close();
  // As after a crash: no clean marker, no indexes or producer snapshot, and a torn write at the end.
  const part = join(dataDir, "topics", "t", "0");
  for (const f of readdirSync(part)) if (f === ".clean" || f.endsWith(".index") || f.endsWith(".timeindex") || f === "producers.json") rmSync(join(part, f));
  const seg = segmentOf(part);
  const intact = statSync(seg).size;
  const torn = readFileSync(seg).subarray(0, 70);
  writeFileSync(seg, Buffer.concat([readFileSync(seg), torn]));
  // Recovery needs no keys: the broker opens, and the torn tail is cut.
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0 });
  assert.equal((await b.describeTopic("t")).partitions[0].highWatermark, 3);
  await b.close();
  assert.equal(statSync(seg).size, intact);
  for (const f of readdirSync(part)) if (f === ".clean") rmSync(join(part, f));
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  try {
    assert.deepEqual(await drain(b, "t"), ["a", "b", "c"]);
    // The producer state came back from the clear headers: a retry is a duplicate.
    const r = await b.publishBatch("t", [{ value: "c" }], { ...p, baseSequence: 2 });
    assert.equal(r[0].duplicate, true);
    await b.publish("t", "d");
    assert.deepEqual(await drain(b, "t", 3), ["d"]);
  } finally {
    await b.close();
  }
});

test("topology files declare encrypted topics and queues; re-applying plans nothing", async () => {
  using d = tempDir("sluice-enc-");
  const b = await openBroker({ dataDir: join(d.dir, "data"), retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1: k() } } });
  try {
    const topo = parseTopology("topics:\n  - name: pay\n    encrypted: true\nqueues:\n  - name: mail\n    encrypted: true\n");
    await applyTopology(b, await planTopology(b, topo));
    assert.equal((await b.describeTopic("pay")).config.encrypted, true);
    assert.equal((await b.queue("mail").settings()).encrypted, true);
    assert.equal((await b.queue("mail.dlq").settings()).encrypted, true);
    assert.ok(planIsEmpty(await planTopology(b, topo)));
  } finally {
    await b.close();
  }
});

test("archive: encrypted segments are archived as stored (ciphertext) and read back decrypted, by fetch, time and raw reads", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const archiveDir = join(d.dir, "archive");
  const keys = { active: "k1", keys: { k1: k() } };
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
  try {
    await b.createTopic("t", { encrypted: true, segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: archiveDir } });
    for (let i = 0; i < 300; i++) await b.publishBatch("t", [{ value: `${SECRET}-${i}`, timestamp: 1_000_000 + i }]);
    await b.enforceRetention(Date.now());
    const p = (await b.describeTopic("t")).partitions[0];
    assert.equal(p.logStartOffset, 0);
    assert.ok((p.archivedSegments ?? 0) > 0, "segments were archived");
    assert.deepEqual(filesWith(archiveDir, SECRET), []);
    await b.close();
    b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: keys });
    const all = await drain(b, "t");
    assert.equal(all.length, 300);
    assert.equal(all[0], `${SECRET}-0`);
    assert.equal(await b.offsetForTimestamp("t", 0, 1_000_000 + 3), 3);
    // The subscription's raw reads (the server's push path) start in the archive.
    const sub = b.subscribe("t", { group: "g", start: "earliest" });
    const seen: string[] = [];
    for await (const m of sub) {
      seen.push(String(m.value));
      if (seen.length === 300) break;
    }
    assert.equal(seen[5], `${SECRET}-5`);
  } finally {
    await b.close();
  }
  assert.deepEqual(filesWith(dataDir, SECRET), []);
});

test("a batch whose key is missing ends a read after the readable batches before it (fetch and raw reads)", async () => {
  using d = tempDir("sluice-enc-");
  const dataDir = join(d.dir, "data");
  const k1 = k();
  const k2 = k();
  let b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1 } } });
  await b.createTopic("t", { encrypted: true });
  await b.publish("t", "a");
  await b.close();
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k2", keys: { k1, k2 } } });
  await b.publish("t", "b");
  await b.close();
  b = await openBroker({ dataDir, retentionCheckIntervalMs: 0, encryptionKeys: { active: "k1", keys: { k1 } } });
  try {
    const r = await b.fetch("t", 0, 0);
    assert.deepEqual(r.records.map((m) => String(m.value)), ["a"]);
    assert.equal(r.nextOffset, 1);
    await assert.rejects(b.fetch("t", 0, 1), (e: unknown) => e instanceof EncryptionKeyMissingError && e.keyId === "k2");
    // The subscription path (raw reads): the readable record first, then the typed error.
    const sub = b.subscribe("t", { group: "g", start: "earliest" });
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const m of sub) seen.push(String(m.value));
      })(),
      EncryptionKeyMissingError,
    );
    assert.deepEqual(seen, ["a"]);
  } finally {
    await b.close();
  }
});
