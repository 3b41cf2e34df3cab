// SPDX-License-Identifier: Apache-2.0
/**
 * TLS on both listeners and in the client (docs/security.md): a round trip over
 * `sluice+tls://`, HTTPS probes, refusals (a plain client, an untrusted CA, TLS 1.1, bad
 * files at startup, a missing client certificate under mutual TLS), and certificate reload
 * without restart (explicit, polled, and a broken replacement that keeps the old one).
 * Certificates are made at test time with openssl (test/fixtures/tls-certs.ts).
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { get as httpsGet } from "node:https";
import { connect as tlsConnect, type ConnectionOptions } from "node:tls";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { ConnectionClosedError, TlsConfigError, TlsHandshakeError } from "../src/errors.js";
import { startServer, type ServerHandle, type ServerTlsOptions } from "../src/server/index.js";
import { tempDir, waitUntil, withTimeout } from "../src/testing/helpers.js";
import { fingerprintOf, makeCa, makeLeaf, type CertFiles } from "./fixtures/tls-certs.js";

let dir: ReturnType<typeof tempDir>;
let ca: CertFiles;
let otherCa: CertFiles;
let broker: EmbeddedBroker;

before(async () => {
  dir = tempDir("sluice-tls-");
  ca = makeCa(dir.dir, "ca");
  otherCa = makeCa(dir.dir, "other-ca");
  broker = await openBroker({ dataDir: join(dir.dir, "data"), retentionCheckIntervalMs: 0 });
});

after(async () => {
  await broker.close();
  dir.cleanup();
});

let serial = 100;
/** A fresh server certificate in its own files (so each server can replace its own). */
function serverCert(cn = "localhost"): CertFiles {
  serial++;
  return makeLeaf(dir.dir, ca, { name: `server-${serial}`, cn, serial });
}

async function tlsServer(files: CertFiles, extra: Partial<ServerTlsOptions> = {}): Promise<ServerHandle> {
  return startServer({ broker, port: 0, httpPort: 0, tls: { certFile: files.cert, keyFile: files.key, watchIntervalMs: 0, ...extra } });
}

const trusted = (): { caFile: string } => ({ caFile: ca.cert });

/** The fingerprint of the certificate a fresh TLS handshake with the binary port sees. */
function peerFingerprint(port: number, opts: ConnectionOptions = {}): Promise<string> {
  return withTimeout(
    new Promise<string>((resolve, reject) => {
      const s = tlsConnect({ host: "127.0.0.1", port, ca: readFileSync(ca.cert), ...opts }, () => {
        resolve(s.getPeerCertificate().fingerprint256);
        s.destroy();
      });
      s.on("error", reject);
    }),
    5000,
    "a TLS handshake",
  );
}

function httpsJson(port: number, path: string): Promise<{ status: number; body: unknown; fingerprint: string }> {
  return withTimeout(
    new Promise((resolve, reject) => {
      const req = httpsGet({ host: "127.0.0.1", port, path, ca: readFileSync(ca.cert), agent: false }, (res) => {
        const fingerprint = (res.socket as import("node:tls").TLSSocket).getPeerCertificate().fingerprint256;
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (text += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text), fingerprint }));
      });
      req.on("error", reject);
    }),
    5000,
    `GET ${path}`,
  );
}

test("publish, subscribe and a queue round trip over sluice+tls://", async () => {
  await using server = await tlsServer(serverCert());
  assert.ok(server.tls);
  assert.equal(server.url, `sluice+tls://127.0.0.1:${server.port}`);
  await using c = await connect({ url: server.url, tls: trusted() });
  await c.createTopic("tls-topic");
  await c.publish("tls-topic", { n: 1 });
  const sub = c.subscribe<{ n: number }>("tls-topic", { group: "g", start: "earliest" });
  const it = sub[Symbol.asyncIterator]();
  const first = await withTimeout(it.next(), 10_000, "a message over TLS");
  assert.deepEqual(first.value?.value, { n: 1 });
  await sub.close();
  const q = c.queue<string>("tls-queue");
  await q.enqueue("job-1");
  const w = q.work({ prefetch: 1 })[Symbol.asyncIterator]();
  const job = await withTimeout(w.next(), 10_000, "a job over TLS");
  assert.equal(job.value?.data, "job-1");
  await job.value?.ack();
  await w.return?.();
});

test("the client reconnects over TLS after the connection drops", async () => {
  await using server = await tlsServer(serverCert());
  await using c = await connect({ url: server.url, tls: trusted(), reconnectMinDelayMs: 10 });
  await c.createTopic("tls-reconnect");
  c.transport.destroySocketForTest();
  await withTimeout(c.publish("tls-reconnect", "after the drop"), 10_000, "a publish after reconnecting");
  assert.ok(c.transport.reconnects >= 1);
});

test("a plain client to a TLS port fails at once with a clear error", async () => {
  await using server = await tlsServer(serverCert());
  const err = await withTimeout(
    connect({ url: `sluice://127.0.0.1:${server.port}`, connectTimeoutMs: 5000 }).then(
      () => null,
      (e: unknown) => e,
    ),
    4000,
    "the plain connect to fail",
  );
  assert.ok(err instanceof ConnectionClosedError, String(err));
  assert.match(err.message, /sluice\+tls:\/\//);
});

test("a TLS client to a plain port fails with TlsHandshakeError", async () => {
  await using server = await startServer({ broker, port: 0, httpPort: null });
  const err = await connect({ url: `sluice+tls://127.0.0.1:${server.port}`, tls: trusted(), connectTimeoutMs: 5000 }).catch((e: unknown) => e);
  assert.ok(err instanceof TlsHandshakeError, String(err));
  assert.match(err.message, /does not speak TLS/);
});

test("a client that does not trust the server's CA is refused with TlsHandshakeError", async () => {
  await using server = await tlsServer(serverCert());
  for (const tls of [undefined, { caFile: otherCa.cert }]) {
    const err = await connect({ url: server.url, tls, connectTimeoutMs: 5000 }).catch((e: unknown) => e);
    assert.ok(err instanceof TlsHandshakeError, String(err));
    assert.equal(err.code, "TLS_HANDSHAKE");
    assert.equal(err.retriable, false);
    assert.match(err.message, /not trusted/);
  }
  // The certificate names localhost and 127.0.0.1, nothing else.
  const wrongName = await connect({ url: server.url, tls: { ...trusted(), servername: "elsewhere.example" }, connectTimeoutMs: 5000 }).catch((e: unknown) => e);
  assert.ok(wrongName instanceof TlsHandshakeError, String(wrongName));
});

test("TLS 1.1 is refused on the binary and the HTTPS port; TLS 1.2 is accepted", async () => {
  await using server = await tlsServer(serverCert());
  for (const port of [server.port, server.httpPort!]) {
    // The alert is the server's refusal (not the client declining to offer TLS 1.1).
    await assert.rejects(peerFingerprint(port, { minVersion: "TLSv1", maxVersion: "TLSv1.1" }), (e: Error & { code?: string }) => e.code === "ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION");
    assert.ok(await peerFingerprint(port, { maxVersion: "TLSv1.2" }));
  }
  const err = await connect({ url: server.url, tls: { ...trusted(), minVersion: "TLSv1", maxVersion: "TLSv1.1" }, connectTimeoutMs: 5000 }).catch((e: unknown) => e);
  assert.ok(err instanceof TlsHandshakeError, String(err));
  assert.match(err.message, /no TLS version in common/);
});

test("HTTPS: health, metrics route and topics with the CA", async () => {
  await using server = await tlsServer(serverCert());
  const health = await httpsJson(server.httpPort!, "/healthz");
  assert.equal(health.status, 200);
  assert.equal((health.body as { status: string }).status, "ok");
  const topics = await httpsJson(server.httpPort!, "/v1/topics");
  assert.equal(topics.status, 200);
  assert.ok(Array.isArray((topics.body as { topics: unknown[] }).topics));
});

test("bad TLS files fail startup with TlsConfigError and leave nothing listening", async () => {
  const good = serverCert();
  const other = serverCert();
  const cases: Array<[Partial<ServerTlsOptions>, RegExp]> = [
    [{ certFile: join(dir.dir, "missing.crt") }, /cannot read the TLS certificate file/],
    [{ keyFile: other.key }, /unusable TLS certificate\/key/],
    [{ certFile: ca.key }, /unusable TLS certificate\/key/],
    [{ requestClientCert: true }, /needs tls\.caFile/],
  ];
  for (const [o, re] of cases) {
    const err = await tlsServer(good, o).catch((e: unknown) => e);
    assert.ok(err instanceof TlsConfigError, String(err));
    assert.equal(err.code, "TLS_CONFIG");
    assert.match(err.message, re);
  }
  const clientErr = await connect({ url: "sluice+tls://127.0.0.1:1", tls: { caFile: join(dir.dir, "missing-ca.crt") } }).catch((e: unknown) => e);
  assert.ok(clientErr instanceof TlsConfigError, String(clientErr));
  const plainWithTls = await connect({ url: "sluice://127.0.0.1:1", tls: trusted() }).catch((e: unknown) => e);
  assert.ok(plainWithTls instanceof TlsConfigError, String(plainWithTls));
});

test("reloadTls(): new handshakes get the new certificate, existing connections keep working", async () => {
  const files = serverCert("first.localhost");
  await using server = await tlsServer(files);
  await using existing = await connect({ url: server.url, tls: trusted() });
  await existing.createTopic("tls-reload");
  const before = fingerprintOf(files.cert);
  assert.equal(await peerFingerprint(server.port), before);

  const next = serverCert("second.localhost");
  copyFileSync(next.key, files.key);
  copyFileSync(next.cert, files.cert);
  server.reloadTls();
  const after = fingerprintOf(next.cert);
  assert.notEqual(after, before);
  assert.equal(await peerFingerprint(server.port), after, "a new connection sees the new certificate");
  assert.equal((await httpsJson(server.httpPort!, "/healthz")).fingerprint, after, "so does HTTPS");
  await existing.publish("tls-reload", "still connected");
  assert.equal(existing.transport.reconnects, 0, "the existing connection was not dropped");
  await using fresh = await connect({ url: server.url, tls: trusted() });
  await fresh.publish("tls-reload", "new connection");
});

test("a broken replacement keeps the old certificate: reloadTls() throws, nothing crashes", async () => {
  const files = serverCert();
  await using server = await tlsServer(files);
  await using existing = await connect({ url: server.url, tls: trusted() });
  await existing.createTopic("tls-broken");
  const before = fingerprintOf(files.cert);
  writeFileSync(files.cert, "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n");
  assert.throws(() => server.reloadTls(), TlsConfigError);
  const other = serverCert();
  copyFileSync(other.cert, files.cert); // a valid certificate whose key is not the one in keyFile
  assert.throws(() => server.reloadTls(), /unusable TLS certificate\/key/);
  assert.equal(await peerFingerprint(server.port), before, "still the old certificate");
  await existing.publish("tls-broken", "still fine");
  await using fresh = await connect({ url: server.url, tls: trusted() });
  await fresh.publish("tls-broken", "a new connection too");
});

test("polling: replacing the files is picked up without a call", async () => {
  const files = serverCert();
  await using server = await tlsServer(files, { watchIntervalMs: 50 });
  const next = serverCert("polled.localhost");
  // Replace each file by rename, as certificate tools do (a reader never sees half a file).
  copyFileSync(next.key, `${files.key}.tmp`);
  copyFileSync(next.cert, `${files.cert}.tmp`);
  renameSync(`${files.key}.tmp`, files.key);
  renameSync(`${files.cert}.tmp`, files.cert);
  const want = fingerprintOf(next.cert);
  await waitUntil(async () => (await peerFingerprint(server.port)) === want, "the polled reload", 10_000, 50);
});

test("requestClientCert: a client without a certificate signed by caFile is refused", async () => {
  const clientCa = makeCa(dir.dir, "client-ca");
  const client = makeLeaf(dir.dir, clientCa, { name: "client-a", cn: "client-a", serial: 7, client: true });
  const stranger = makeLeaf(dir.dir, ca, { name: "client-b", cn: "client-b", serial: 8, client: true });
  await using server = await tlsServer(serverCert(), { caFile: clientCa.cert, requestClientCert: true });
  const none = await connect({ url: server.url, tls: trusted(), connectTimeoutMs: 5000 }).catch((e: unknown) => e);
  assert.ok(none instanceof TlsHandshakeError, String(none));
  assert.match(none.message, /requires a client certificate/);
  // TLS 1.3: the client's handshake is done before the server checks its certificate, so the
  // refusal may arrive as an alert or as the connection closing; either way connect() fails.
  const refused = await connect({ url: server.url, tls: { ...trusted(), certFile: stranger.cert, keyFile: stranger.key }, connectTimeoutMs: 5000 }).catch((e: unknown) => e);
  assert.ok(refused instanceof TlsHandshakeError || refused instanceof ConnectionClosedError, String(refused));
  await using c: RemoteBrokerHandle = await connect({ url: server.url, tls: { ...trusted(), certFile: client.cert, keyFile: client.key } });
  await c.createTopic("tls-mutual");
  await c.publish("tls-mutual", "with a client certificate");
});
