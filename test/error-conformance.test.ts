// SPDX-License-Identifier: Apache-2.0
/**
 * One conformance test per error code of the registry (src/errors.ts): the same failure,
 * caused embedded (`openBroker`), through a client (`connect` to a server on that broker) and
 * over HTTP, raises the same class with the same code and `retriable`, and HTTP answers the
 * class's status (404 not found, 409 conflicts, 429/503 retriable overload). A code a mode
 * cannot produce says why (e.g. TIMEOUT is the client's own). Every registered code must have
 * a scenario here, so a new error class cannot go untested.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { openSync, writeSync, closeSync, readdirSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import type { BrokerHost } from "../src/broker/host.js";
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { BrokerError, ERROR_CLASSES, errorSpec, type ErrorClass } from "../src/errors.js";
import { encodeBatch, stampBatch } from "../src/log/record-batch.js";
import type { Job } from "../src/queues/types.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { FaultyFileSystem } from "../src/testing/faulty-fs.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { wrapHost } from "./fixtures/host-wrapper.js";
import { envelope, ENVELOPE_HEADERS, readEnvelope } from "../src/contracts/envelope.js";
import { SchemaRegistry } from "../src/contracts/schemas.js";
import { decodeFrame, encodeFrame, encodePreamble, FrameReader, Op, wireToError, type WireError } from "../src/wire/index.js";

type Api = EmbeddedBroker | RemoteBrokerHandle;

interface Env {
  embedded: EmbeddedBroker;
  remote: RemoteBrokerHandle;
  server: ServerHandle;
  dataDir: string;
}

/** How one code is caused in each mode; a mode that cannot cause it gives the reason. */
interface Scenario {
  /** Through the Broker API: run on the embedded broker and through a client. */
  api?: (b: Api, env: Env) => Promise<unknown>;
  /** Only on the embedded broker's host interface (not the Broker API). */
  embedded?: (env: Env) => Promise<unknown>;
  /** Only through a client (the failure is the client's or the wire's). */
  remote?: (env: Env) => Promise<unknown>;
  /** The same failure as an HTTP request. */
  http?: (env: Env) => { method: string; path: string; body?: unknown; rawBody?: string; headers?: Record<string, string> };
  /** Why a mode is missing. */
  why?: string;
}

const TOPIC = "errs";

let env: Env;
let dir: { dir: string; cleanup(): void };

before(async () => {
  dir = tempDir("sluice-errs-");
  const embedded = await openBroker({ dataDir: dir.dir, retentionCheckIntervalMs: 0 });
  await embedded.createTopic(TOPIC, { partitions: 2 });
  await embedded.createTopic("small", { maxMessageBytes: 100 });
  await embedded.publish(TOPIC, "first", { partition: 0 });
  const server = await startServer({ broker: embedded, port: 0, httpPort: 0 });
  const remote = await connect({ url: server.url });
  env = { embedded, remote, server, dataDir: dir.dir };
});

after(async () => {
  await env.remote.close();
  await env.server.close({ graceMs: 100 });
  await env.embedded.close();
  dir.cleanup();
});

async function http(req: { method: string; path: string; body?: unknown; rawBody?: string; headers?: Record<string, string> }, port: number): Promise<{ status: number; error: WireError }> {
  const res = await fetch(`http://127.0.0.1:${port}${req.path}`, {
    method: req.method,
    headers: { "content-type": "application/json", ...req.headers },
    body: req.rawBody ?? (req.body === undefined ? undefined : JSON.stringify(req.body)),
  });
  const json = (await res.json()) as { error: WireError };
  return { status: res.status, error: json.error };
}

async function caught(p: Promise<unknown>): Promise<BrokerError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof BrokerError, `a BrokerError, not ${String(e)}`);
    return e;
  }
  assert.fail("the call succeeded");
}

function expectClass(e: BrokerError, cls: ErrorClass, mode: string): void {
  assert.equal(e.constructor, cls, `${mode}: class ${e.constructor.name}, expected ${cls.name}`);
  assert.equal(e.code, cls.spec.code, `${mode}: code`);
  assert.equal(e.retriable, cls.spec.retriable, `${mode}: retriable`);
}

/** A raw connection that completed the handshake (or not), collecting decoded error frames. */
async function rawErrorFrame(port: number, preamble: Buffer, after?: Buffer): Promise<BrokerError> {
  const s = netConnect({ host: "127.0.0.1", port });
  const reader = new FrameReader(1 << 20);
  const errors: BrokerError[] = [];
  let helloDone = false;
  s.on("data", (c: Buffer) => {
    reader.push(c);
    for (let raw = reader.next(); raw !== null; raw = reader.next()) {
      const f = decodeFrame(raw);
      if (f.flags & 2) errors.push(wireToError(f.meta as unknown as WireError));
      else helloDone = true;
    }
  });
  s.on("error", () => {});
  await new Promise<void>((resolve) => s.once("connect", () => resolve()));
  s.write(preamble);
  if (after) {
    s.write(encodeFrame(Op.Hello, 0, 1, {}));
    await waitUntil(() => helloDone, "hello answered");
    s.write(after);
  }
  await waitUntil(() => errors.length > 0, "an error frame");
  s.destroy();
  return errors[0];
}

async function nextJob(w: AsyncIterable<Job<unknown>>): Promise<Job<unknown>> {
  const r = await w[Symbol.asyncIterator]().next();
  assert.ok(!r.done);
  return r.value;
}

/** A well-formed batch whose checksum no longer matches. */
function badBatch(): Buffer {
  const b = encodeBatch([{ key: null, value: Buffer.from("v"), valueKind: 0, timestamp: 1000, headers: null }]);
  stampBatch(b, 0);
  b[b.length - 2] ^= 1;
  return b;
}

let seq = 0;
const uniq = (p: string): string => `${p}-${++seq}`;

const SCENARIOS: Record<string, Scenario> = {
  VALIDATION: {
    api: (b) => b.resetGroup("g", TOPIC, "bogus" as "earliest"),
    http: () => ({ method: "POST", path: `/v1/groups/g/topics/${TOPIC}/reset`, body: { to: "bogus" } }),
  },
  INVALID_NAME: {
    api: (b) => b.createTopic("bad name!"),
    http: () => ({ method: "POST", path: "/v1/topics", body: { name: "bad name!" } }),
  },
  NOT_FOUND: {
    why: "a base class: the broker raises the specific subclasses; the HTTP port raises it for a path naming nothing",
    http: () => ({ method: "GET", path: "/v1/nothing-here" }),
  },
  TOPIC_NOT_FOUND: {
    api: (b) => b.describeTopic("missing-topic"),
    http: () => ({ method: "GET", path: "/v1/topics/missing-topic" }),
  },
  PARTITION_NOT_FOUND: {
    api: (b) => b.fetch(TOPIC, 9, 0),
    http: () => ({ method: "GET", path: `/v1/topics/${TOPIC}/partitions/9/records` }),
  },
  QUEUE_NOT_FOUND: {
    api: (b) => b.deleteQueue("missing-queue"),
    http: () => ({ method: "DELETE", path: "/v1/queues/missing-queue" }),
  },
  CONFLICT: { why: "a base class: the broker raises TOPIC_EXISTS or GROUP_ACTIVE" },
  TOPIC_EXISTS: {
    api: (b) => b.createTopic(TOPIC),
    http: () => ({ method: "POST", path: "/v1/topics", body: { name: TOPIC } }),
  },
  GROUP_ACTIVE: {
    // A member of group "active" is joined (see the test); nobody may reset the group now.
    api: (b) => b.resetGroup("active", TOPIC, "earliest"),
    http: () => ({ method: "POST", path: `/v1/groups/active/topics/${TOPIC}/reset`, body: { to: "earliest" } }),
  },
  RECORD_TOO_LARGE: {
    api: (b) => b.publish("small", "x".repeat(500)),
    http: () => ({ method: "POST", path: "/v1/topics/small/records", body: { records: [{ value: "x".repeat(500) }] } }),
  },
  OFFSET_OUT_OF_RANGE: {
    api: (b) => b.fetch(TOPIC, 0, 1000),
    http: () => ({ method: "GET", path: `/v1/topics/${TOPIC}/partitions/0/records?offset=1000` }),
  },
  CORRUPT_RECORD: {
    // Topic "corrupt" has a damaged batch on disk (see the test).
    api: (b) => b.fetch("corrupt", 0, 0),
    http: () => ({ method: "GET", path: "/v1/topics/corrupt/partitions/0/records?offset=0" }),
  },
  INVALID_BATCH: {
    why: "encoded batches are a host operation (PUBLISH_ENCODED), not part of the Broker API or HTTP",
    embedded: (e) => e.embedded.publishEncoded(TOPIC, 0, badBatch()),
    remote: (e) => e.remote.transport.rpc.PublishEncoded({ topic: TOPIC, partition: 0 }, { body: badBatch(), retry: false }),
  },
  STORAGE_FULL: { why: "needs a failing disk: see the storage test below" },
  STORAGE_ERROR: { why: "needs a failing disk: see the storage test below" },
  ARCHIVE_CORRUPT: { why: "needs a topic with an archive whose copy was damaged after archiving: test/archive.test.ts" },
  AUDIT_CORRUPT: { why: "raised only by `sluice audit verify` on an altered audit log file, never by the broker: test/audit-broker.test.ts" },
  DATA_DIR_LOCKED: {
    why: "raised when opening a data directory (openBroker, sluice serve, the CLI), before any client or HTTP request can exist; test/data-dir-lock.test.ts covers each opener",
    embedded: (e) => openBroker({ dataDir: e.dataDir, retentionCheckIntervalMs: 0 }),
  },
  OUT_OF_ORDER_SEQUENCE: {
    api: async (b) => {
      const p = await b.initProducer();
      await b.publishBatch(TOPIC, [{ value: 1, partition: 1 }], { ...p, baseSequence: 0 });
      // A gap: sequence 1 was never sent.
      return b.publishBatch(TOPIC, [{ value: 1, partition: 1 }], { ...p, baseSequence: 5 });
    },
    why: "HTTP publishes carry no producer fields",
  },
  PRODUCER_FENCED: {
    api: async (b) => {
      const old = await b.initProducer();
      await b.initProducer(old.producerId);
      return b.publishBatch(TOPIC, [{ value: 1, partition: 1 }], { ...old, baseSequence: 0 });
    },
    why: "HTTP publishes carry no producer fields",
  },
  BROKER_CLOSED: { why: "needs a closed broker: see the closed-broker test below" },
  TIMEOUT: {
    why: "the client's own request deadline",
    remote: async (e) => {
      const c = await connect({ url: e.server.url, requestTimeoutMs: 100 });
      try {
        const hwm = (await c.describeTopic("small")).partitions[0].highWatermark;
        // A long-poll at the end of the log whose wait is not added to the deadline.
        return await c.transport.request(Op.Fetch, { topic: "small", partition: 0, offset: hwm, maxWaitMs: 5000 }, null, { retry: false });
      } finally {
        await c.close();
      }
    },
  },
  ABORTED: {
    api: async (b) => {
      // A long-poll at the end of the log, given up by the caller.
      const hwm = (await b.describeTopic("small")).partitions[0].highWatermark;
      const ac = new AbortController();
      const p = b.fetch("small", 0, hwm, { maxWaitMs: 30_000, signal: ac.signal });
      setTimeout(() => ac.abort(), 50);
      return p;
    },
    why: "HTTP requests carry no abort signal",
  },
  CONNECTION_CLOSED: {
    why: "the client's own connection",
    remote: () => connect({ url: "sluice://127.0.0.1:1", connectTimeoutMs: 2000 }),
  },
  NOT_ASSIGNED: {
    api: async (b) => {
      const name = uniq("assigned");
      await b.createTopic(name);
      await b.publish(name, "m");
      const sub = b.subscribe(name, { group: "g", start: "earliest" });
      const msg = (await sub[Symbol.asyncIterator]().next()).value!;
      await sub.close();
      return msg.commit();
    },
    why: "HTTP has no subscriptions",
  },
  LEASE_EXPIRED: {
    api: async (b) => {
      const q = b.queue<string>(uniq("lease"), { visibilityTimeoutMs: 100 });
      await q.enqueue("x");
      const w = q.work({ prefetch: 1 });
      const job = await nextJob(w);
      await waitUntil(() => job.signal.aborted, "the lease is lost", 10_000);
      try {
        return await job.ack();
      } finally {
        await w.close();
      }
    },
    why: "HTTP has no workers",
  },
  JOB_ACTIVE: {
    api: async (b) => {
      const q = b.queue<string>(uniq("remove-active"));
      const { id } = await q.enqueue("x");
      const w = q.work({ prefetch: 1 });
      await nextJob(w);
      try {
        return await q.remove(id);
      } finally {
        await w.close();
      }
    },
    why: "an active job needs a worker, which HTTP has not",
  },
  QUEUE_FULL: {
    api: async (b) => {
      const q = b.queue<string>("full-queue", { maxDepth: 1 });
      await q.enqueue("one").catch(() => {});
      return q.enqueue("two");
    },
    http: () => ({ method: "POST", path: "/v1/queues/full-queue/jobs", body: { jobs: [{ data: "three" }] } }),
  },
  PERMANENT: { why: "thrown by application job handlers, never by the broker" },
  RATE_LIMITED: { why: "thrown by application job handlers (process() gives the job back), never by the broker" },
  INVALID_ENVELOPE: {
    why: "raised by envelope() / readEnvelope() in the application's own process (src/contracts/envelope.ts)",
    embedded: async () => readEnvelope({ [ENVELOPE_HEADERS.type]: "T" }),
  },
  SCHEMA_VIOLATION: {
    why: "validated where the registry lives: in the embedded broker, or in the client process before sending (not over HTTP)",
    embedded: async (e) => {
      const b = await openBroker({ dataDir: join(e.dataDir, "schemas"), retentionCheckIntervalMs: 0, schemas: orderSchemas() });
      try {
        await b.createTopic(TOPIC);
        return await b.publish(TOPIC, {}, { headers: envelope({ type: "T" }) });
      } finally {
        await b.close();
      }
    },
    remote: async (e) => {
      const c = await connect({ url: e.server.url, schemas: orderSchemas() });
      try {
        return await c.publishBatch(TOPIC, [{ value: { n: 1 }, headers: envelope({ type: "T" }) }, { value: {}, headers: envelope({ type: "T" }) }]);
      } finally {
        await c.close();
      }
    },
  },
  SCHEMA_INCOMPATIBLE: {
    why: "raised when the application registers a schema version (src/contracts/schemas.ts)",
    embedded: async () => new SchemaRegistry().topic(TOPIC).add("T", 1, { type: "object" }).add("T", 2, { type: "object", required: ["n"] }),
  },
  PROTOCOL: {
    why: "the wire protocol's",
    remote: (e) => e.remote.transport.request(99 as Op, {}, null, { retry: false }),
  },
  FRAME_TOO_LARGE: {
    why: "the wire protocol's",
    remote: async (e) => {
      const head = Buffer.alloc(14);
      head.writeUInt32BE(64 * 1024 * 1024, 0);
      throw await rawErrorFrame(e.server.port, encodePreamble(), head);
    },
  },
  PROTOCOL_BAD_MAGIC: {
    why: "the wire protocol's",
    remote: async (e) => {
      throw await rawErrorFrame(e.server.port, Buffer.from("GET / HT", "latin1"));
    },
  },
  UNSUPPORTED_VERSION: {
    why: "the wire protocol's",
    remote: (e) => connect({ url: e.server.url, protocolVersions: { min: 7, max: 9 } }),
  },
  INTERNAL: { why: "an unexpected exception in the server: see the internal-error test below" },
  FORBIDDEN: {
    why: "an HTTP request another site could have made",
    http: () => ({ method: "POST", path: "/v1/topics", body: { name: "csrf" }, headers: { origin: "https://evil.example" } }),
  },
  BODY_TOO_LARGE: {
    why: "an HTTP request body",
    http: () => ({ method: "POST", path: "/v1/topics/small/records", rawBody: JSON.stringify({ records: [{ value: "y".repeat(2 * 1024 * 1024) }] }) }),
  },
  TLS_CONFIG: {
    why: "TLS settings: checked when a server starts and when a client connects",
    embedded: (e) => startServer({ broker: e.embedded, port: 0, httpPort: null, tls: { certFile: join(e.dataDir, "missing.crt"), keyFile: join(e.dataDir, "missing.key") } }),
    remote: () => connect({ url: "sluice://127.0.0.1:1", tls: {} }),
  },
  TLS_HANDSHAKE: {
    why: "the client's TLS handshake (test/tls.test.ts covers untrusted certificates and old versions)",
    remote: (e) => connect({ url: e.server.url.replace("sluice://", "sluice+tls://"), connectTimeoutMs: 5000 }),
  },
  ENCRYPTION_CONFIG: {
    why: "a keyring is checked when a broker opens; a topic declared encrypted needs one (test/encryption.test.ts covers queues and key files)",
    embedded: (e) => openBroker({ dataDir: join(e.dataDir, "enc-config"), encryptionKeys: { active: "k1", keys: {} } }),
    api: (b) => b.createTopic("enc-without-keys", { encrypted: true }),
  },
  ENCRYPTION_KEY_MISSING: { why: "needs encrypted data written with a key the broker's keyring no longer has: test/encryption.test.ts (rotation)" },
  QUOTA_EXCEEDED: { why: "needs a server with tenants and a storage quota: test/quota-storage.test.ts covers the protocol and HTTP" },
  AUTHENTICATION_FAILED: { why: "needs a server with users or tokens: test/auth-handshake.test.ts and test/auth-http.test.ts cover the handshake and HTTP" },
};

test("every registered error code has a scenario", () => {
  assert.deepEqual(Object.keys(SCENARIOS).sort(), ERROR_CLASSES.map((c) => c.spec.code).sort());
});

function orderSchemas(): SchemaRegistry {
  const schemas = new SchemaRegistry();
  schemas.topic(TOPIC).add("T", 1, { type: "object", required: ["n"] });
  return schemas;
}

/** Damages the first batch of topic "corrupt" on disk (its CRC no longer matches). */
async function corruptTopic(e: Env): Promise<void> {
  await e.embedded.createTopic("corrupt");
  await e.embedded.publish("corrupt", "will be damaged");
  const partDir = join(e.dataDir, "topics", "corrupt", "0");
  const seg = readdirSync(partDir).find((f) => f.endsWith(".log"))!;
  const fd = openSync(join(partDir, seg), "r+");
  writeSync(fd, Buffer.from([0xff, 0xff]), 0, 2, 70);
  closeSync(fd);
}

async function checkCode(code: string): Promise<void> {
  const s = SCENARIOS[code];
  const cls = ERROR_CLASSES.find((c) => c.spec.code === code)!;
  assert.ok(s.api || s.embedded || s.remote || s.http || s.why, `${code}: a scenario or a reason`);
  if (s.api) {
    expectClass(await caught(s.api(env.embedded, env)), cls, "embedded");
    expectClass(await caught(s.api(env.remote, env)), cls, "remote");
  }
  if (s.embedded) expectClass(await caught(s.embedded(env)), cls, "embedded");
  if (s.remote) expectClass(await caught(s.remote(env)), cls, "remote");
  if (s.http && env.server.httpPort !== null) {
    const r = await http(s.http(env), env.server.httpPort);
    assert.equal(r.status, cls.spec.httpStatus, `${code}: HTTP status`);
    assert.equal(r.error.code, code);
    assert.equal(r.error.retriable, cls.spec.retriable);
    expectClass(wireToError(r.error), cls, "HTTP body");
  }
}

for (const code of Object.keys(SCENARIOS)) {
  const s = SCENARIOS[code];
  if (!s.api && !s.embedded && !s.remote && !s.http) continue;
  test(`${code}: the same class, code and retriable embedded, remote and over HTTP`, async () => {
    let stop: (() => Promise<void>) | null = null;
    if (code === "GROUP_ACTIVE") {
      const sub = env.embedded.subscribe(TOPIC, { group: "active" });
      void sub[Symbol.asyncIterator]().next().catch(() => {});
      await waitUntil(async () => (await env.embedded.resetGroup("active", TOPIC, "earliest").catch((e: unknown) => e)) instanceof BrokerError, "the member joined");
      stop = () => sub.close();
    }
    if (code === "CORRUPT_RECORD") await corruptTopic(env);
    try {
      await checkCode(code);
    } finally {
      await stop?.();
    }
  });
}

test("the HTTP statuses fit: 404 not found, 409 conflicts, 429 or 503 retriable overload", () => {
  for (const c of ERROR_CLASSES) {
    const { code, httpStatus, retriable } = c.spec;
    if (code.endsWith("NOT_FOUND")) assert.equal(httpStatus, 404, code);
    if (["CONFLICT", "TOPIC_EXISTS", "GROUP_ACTIVE", "NOT_ASSIGNED", "LEASE_EXPIRED", "PRODUCER_FENCED", "OUT_OF_ORDER_SEQUENCE"].includes(code)) assert.equal(httpStatus, 409, code);
    if (["QUEUE_FULL", "STORAGE_FULL", "STORAGE_ERROR"].includes(code)) assert.ok(httpStatus === 429 || httpStatus === 503, code);
    if (retriable && httpStatus !== 409) assert.ok([429, 503, 504].includes(httpStatus), `${code}: retriable, status ${httpStatus}`);
    assert.equal(errorSpec(code), c.spec);
  }
});

/** A second broker on a disk that fails, behind its own server. */
async function withBroker(fn: (b: EmbeddedBroker, r: RemoteBrokerHandle, httpPort: number, fs: FaultyFileSystem) => Promise<void>, host?: (b: EmbeddedBroker) => BrokerHost): Promise<void> {
  using tmp = tempDir("sluice-errs-2-");
  const fs = new FaultyFileSystem();
  const b = await openBroker({ dataDir: tmp.dir, fs, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker: host ? host(b) : b, port: 0, httpPort: 0 });
  const r = await connect({ url: srv.url, reconnectTimeoutMs: 1000 });
  try {
    await fn(b, r, srv.httpPort!, fs);
  } finally {
    await r.close();
    await srv.close({ graceMs: 100 });
    await b.close();
  }
}

for (const [code, errno] of [
  ["STORAGE_FULL", "ENOSPC"],
  ["STORAGE_ERROR", "EIO"],
] as const) {
  test(`${code}: the same class, code and retriable embedded, remote and over HTTP`, async () => {
    await withBroker(async (b, r, httpPort, fs) => {
      await b.createTopic("disk");
      fs.failAlways("write", errno, join("disk", "0"));
      const cls = ERROR_CLASSES.find((c) => c.spec.code === code)!;
      for (const [mode, api] of [
        ["embedded", b],
        ["remote", r],
      ] as const) {
        const p = await api.initProducer();
        expectClass(await caught(api.publishBatch("disk", [{ value: "v" }], { ...p, baseSequence: 0 })), cls, mode);
      }
      const res = await http({ method: "POST", path: "/v1/topics/disk/records", body: { records: [{ value: "v" }] } }, httpPort);
      assert.equal(res.status, cls.spec.httpStatus);
      expectClass(wireToError(res.error), cls, "HTTP body");
      fs.clearFaults();
    });
  });
}

test("BROKER_CLOSED: the same class, code and retriable embedded, remote and over HTTP", async () => {
  await withBroker(async (b, r, httpPort) => {
    await b.close();
    const cls = ERROR_CLASSES.find((c) => c.spec.code === "BROKER_CLOSED")!;
    expectClass(await caught(b.listTopics()), cls, "embedded");
    expectClass(await caught(r.listTopics()), cls, "remote");
    const res = await http({ method: "GET", path: "/v1/topics" }, httpPort);
    assert.equal(res.status, cls.spec.httpStatus);
    expectClass(wireToError(res.error), cls, "HTTP body");
  });
});

test("INTERNAL: an unexpected exception in the server reaches a client and HTTP as InternalError", async () => {
  // A host whose listTopics fails with a plain Error, as a bug would.
  const failing = (b: EmbeddedBroker): BrokerHost => wrapHost(b, { listTopics: () => Promise.reject(new TypeError("a bug")) });
  await withBroker(async (_b, r, httpPort) => {
    const cls = ERROR_CLASSES.find((c) => c.spec.code === "INTERNAL")!;
    expectClass(await caught(r.listTopics()), cls, "remote");
    const res = await http({ method: "GET", path: "/v1/topics" }, httpPort);
    assert.equal(res.status, 500);
    expectClass(wireToError(res.error), cls, "HTTP body");
  }, failing);
});
