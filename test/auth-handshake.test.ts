// SPDX-License-Identifier: Apache-2.0
// Authentication in the protocol handshake against a real server (docs/protocol.md §1.1,
// docs/security.md#authentication): SCRAM and token logins, the one generic error, what an
// unauthenticated connection may do (AUTH-1), failure limits per source (AUTH-4), and the
// loopback rule (AUTH-3).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect as netConnect, type Socket } from "node:net";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { AuthenticationError, ValidationError, type BrokerError } from "../src/errors.js";
import { FrameReader, Op, decodeFrame, encodeFrame, encodePreamble, wireToError, type WireError } from "../src/wire/index.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { grantAdmin } from "./fixtures/acl.js";

let dir: ReturnType<typeof tempDir>;
let broker: EmbeddedBroker;
let server: ServerHandle;
let token: string;
const PASSWORD = "s3cret-for-alice";

before(async () => {
  dir = tempDir("sluice-auth-hs-");
  const dataDir = join(dir.dir, "data");
  broker = await openBroker({ dataDir });
  const store = await CredentialStore.open(dataDir);
  await store.addUser("alice", PASSWORD, 4096);
  token = (await store.createToken("ci-bot", { ttlMs: 3_600_000 })).token;
  await grantAdmin(dataDir, "alice", "ci-bot");
  server = await startServer({ broker, port: 0, httpPort: null, dataDir, limits: { handshakeTimeoutMs: 400 }, auth: { failureLimit: { burst: 1000 } } });
});

after(async () => {
  await server.close();
  await broker.close();
  dir.cleanup();
});

/** Opens a raw socket, sends `bytes`, and collects decoded frames until the server closes it. */
async function raw(port: number, bytes: Buffer[]): Promise<{ errors: BrokerError[]; closed: Promise<void>; socket: Socket }> {
  const s = netConnect({ host: "127.0.0.1", port });
  const reader = new FrameReader(1 << 20);
  const errors: BrokerError[] = [];
  s.on("data", (c: Buffer) => {
    reader.push(c);
    for (let r = reader.next(); r !== null; r = reader.next()) {
      const f = decodeFrame(r);
      if (f.flags & 2) errors.push(wireToError(f.meta as unknown as WireError));
    }
  });
  s.on("error", () => {});
  const closed = new Promise<void>((resolve) => s.once("close", () => resolve()));
  await new Promise<void>((resolve) => s.once("connect", () => resolve()));
  for (const b of bytes) s.write(b);
  return { errors, closed, socket: s };
}

test("a SCRAM user and a bearer token can log in and use the broker", async () => {
  assert.equal(server.authRequired, true);
  const a = await connect({ url: server.url, auth: { username: "alice", password: PASSWORD } });
  await a.createTopic("auth-hs", { partitions: 1 });
  assert.ok((await a.listTopics()).includes("auth-hs"));
  await a.close();
  const t = await connect({ url: server.url, auth: { token } });
  assert.ok((await t.listTopics()).includes("auth-hs"));
  await t.close();
});

test("no credentials, a wrong password, an unknown user or a bad token: the same AuthenticationError", async () => {
  const attempts = [
    () => connect({ url: server.url, connectTimeoutMs: 5000 }),
    () => connect({ url: server.url, auth: { username: "alice", password: "not the password" } }),
    () => connect({ url: server.url, auth: { username: "nobody", password: PASSWORD } }),
    () => connect({ url: server.url, auth: { token: "slt_not-a-token" } }),
  ];
  for (const attempt of attempts) {
    const e = await attempt().then(
      () => null,
      (err: unknown) => err,
    );
    assert.ok(e instanceof AuthenticationError, String(e));
    assert.equal(e.message, "authentication failed");
    assert.equal(e.retriable, false);
  }
});

test("before authenticating, a frame other than HELLO is refused and the connection closed", async () => {
  const c = await raw(server.port, [encodePreamble(), encodeFrame(Op.ListTopics, 0, 1, {})]);
  await c.closed;
  assert.equal(c.errors[0]?.code, "PROTOCOL");
  // A HELLO with credentials first, then a request before the SCRAM exchange finished.
  const d = await raw(server.port, [encodePreamble(), encodeFrame(Op.Hello, 0, 1, { auth: { mechanism: "SCRAM-SHA-256", message: "n,,n=alice,r=abc" } }), encodeFrame(Op.ListTopics, 0, 2, {})]);
  await d.closed;
  assert.equal(d.errors.at(-1)?.code, "PROTOCOL");
});

test("unauthenticated connections declaring huge frames are closed without allocating them", async (t) => {
  const huge = Buffer.alloc(4);
  huge.writeUInt32BE(0xfffffff0);
  global.gc?.();
  const before = process.memoryUsage().rss;
  const conns = await Promise.all(Array.from({ length: 200 }, () => raw(server.port, [encodePreamble(), huge])));
  await Promise.all(conns.map((c) => c.closed));
  const growth = process.memoryUsage().rss - before;
  t.diagnostic(`RSS growth for 200 connections declaring 4 GiB frames: ${(growth / 1048576).toFixed(1)} MiB`);
  for (const c of conns) assert.equal(c.errors[0]?.code, "FRAME_TOO_LARGE");
  // 200 x 4 GiB declared; allocation of even one would show. Sockets and buffers cost a few MiB.
  assert.ok(growth < 64 * 1024 * 1024, `RSS grew by ${(growth / 1048576).toFixed(1)} MiB`);
  await waitUntil(() => server.connectionCount() === 0, "server dropped the connections");
});

test("a connection that sends nothing is closed after the handshake deadline", async () => {
  const started = performance.now();
  const c = await raw(server.port, []);
  await c.closed;
  const ms = performance.now() - started;
  assert.ok(ms >= 350 && ms < 3000, `closed after ${ms.toFixed(0)} ms`);
  const d = await raw(server.port, [encodePreamble()]);
  await d.closed;
  assert.equal(d.errors[0]?.code, "PROTOCOL");
});

test("failed logins are limited per source: past the burst the right password is refused too", async () => {
  const limited = await startServer({ broker, port: 0, httpPort: null, dataDir: join(dir.dir, "data"), auth: { failureLimit: { burst: 2, refillMs: 60_000 } } });
  try {
    for (let i = 0; i < 2; i++) await assert.rejects(connect({ url: limited.url, auth: { username: "alice", password: "wrong" } }), AuthenticationError);
    const started = performance.now();
    await assert.rejects(connect({ url: limited.url, auth: { username: "alice", password: PASSWORD } }), AuthenticationError);
    assert.ok(performance.now() - started < 2000);
  } finally {
    await limited.close();
  }
});

test("without users or tokens the server listens on loopback only, unless told to run open", async () => {
  using empty = tempDir("sluice-auth-open-");
  const err = await startServer({ broker, host: "0.0.0.0", port: 0, httpPort: null, dataDir: empty.dir }).then(
    () => null,
    (e: unknown) => e,
  );
  assert.ok(err instanceof ValidationError, String(err));
  assert.match(err.message, /refusing to listen on 0\.0\.0\.0 without authentication.*--insecure-no-auth/);
  assert.ok(!err.message.includes("\n"));
  const open = await startServer({ broker, host: "0.0.0.0", port: 0, httpPort: null, dataDir: empty.dir, allowUnauthenticated: true });
  assert.equal(open.authRequired, false);
  await open.close();
  const loop = await startServer({ broker, port: 0, httpPort: null, dataDir: empty.dir });
  const c = await connect({ url: loop.url });
  await c.listTopics();
  await c.close();
  await loop.close();
  // With credentials, any host is fine: everyone must log in.
  const authed = await startServer({ broker, host: "0.0.0.0", port: 0, httpPort: null, dataDir: join(dir.dir, "data") });
  assert.equal(authed.authRequired, true);
  await authed.close();
});

test("a SCRAM client refuses a server that does not prove it holds the user's keys", async () => {
  // No credential store at all: the server cannot check the login, so it cannot sign it.
  const bare = await startServer({ broker, port: 0, httpPort: null });
  try {
    const e = await connect({ url: bare.url, auth: { username: "alice", password: PASSWORD } }).then(
      () => null,
      (err: unknown) => err,
    );
    assert.ok(e instanceof AuthenticationError, String(e));
    assert.match(e.message, /server did not prove/);
  } finally {
    await bare.close();
  }
});
