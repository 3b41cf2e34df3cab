// SPDX-License-Identifier: Apache-2.0
// Mutual TLS with the principal taken from the client certificate (docs/security.md "Client
// certificates (mutual TLS)", AUTH-5..7): a verified certificate logs in as the principal its
// rules give, over the protocol and HTTPS, without a password or token; authorization then
// applies to that principal; explicit credentials win over the certificate; a certificate no
// rule applies to is refused; every such login is audited with mechanism TLS; bad rules stop
// the start; mapped certificates count as principals for the loopback rule.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect, type RemoteBrokerHandle } from "../src/client/index.js";
import { AuthenticationError, BrokerError, TlsConfigError, ValidationError } from "../src/errors.js";
import { NodeFileSystem } from "../src/log/io.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { listAuditRecords } from "../src/security/audit/reader.js";
import type { AuditRecord } from "../src/security/audit/record.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { startServer, type ServerHandle, type ServerTlsOptions } from "../src/server/index.js";
import { resolveServeConfig } from "../src/cli/serve.js";
import { tempDir, withTimeout } from "../src/testing/helpers.js";
import { makeCa, makeLeaf, type CertFiles } from "./fixtures/tls-certs.js";
import { grantAdmin } from "./fixtures/acl.js";
import { spawnServer } from "./fixtures/server-spawn.js";

const CLI = join(fileURLToPath(new URL(".", import.meta.url)), "..", "src", "cli", "main.js");
const PASSWORD = "carol-password";
/** alice by CN; "/OU=svc/CN=Alice" lower-cased; "/OU=ops/CN=bob" upper-cased. */
const RULES = ["RULE:^CN=([^,]+),OU=svc$/$1/L", "RULE:^CN=([^,]+),OU=ops$/$1/U", "CN"];

let dir: ReturnType<typeof tempDir>;
let data: string;
let ca: CertFiles;
let serverFiles: CertFiles;
let certs: Record<"alice" | "svcAlice" | "opsBob" | "stranger", CertFiles>;
let carolToken: string;
let broker: EmbeddedBroker;
let server: ServerHandle;

function tlsOptions(extra: Partial<ServerTlsOptions> = {}): ServerTlsOptions {
  return { certFile: serverFiles.cert, keyFile: serverFiles.key, caFile: ca.cert, requestClientCert: true, principalRules: RULES, watchIntervalMs: 0, ...extra };
}

before(async () => {
  dir = tempDir("sluice-mtls-principal-");
  data = join(dir.dir, "data");
  ca = makeCa(dir.dir, "ca");
  serverFiles = makeLeaf(dir.dir, ca, { name: "server", cn: "localhost", serial: 1 });
  const client = (name: string, serial: number, subject: string): CertFiles => makeLeaf(dir.dir, ca, { name, cn: "", serial, client: true, subject });
  certs = {
    alice: client("alice", 2, "/O=Acme/CN=alice"),
    svcAlice: client("svc-alice", 3, "/OU=svc/CN=Alice"),
    opsBob: client("ops-bob", 4, "/OU=ops/CN=bob"),
    stranger: client("stranger", 5, "/O=Nobody"),
  };
  const store = await CredentialStore.open(data);
  await store.addUser("carol", PASSWORD, 4096);
  carolToken = (await store.createToken("carol")).token;
  const policy = await PolicyStore.open(data);
  for (const [principal, topic] of [["alice", "alice-topic"], ["BOB", "bob-topic"], ["carol", "carol-topic"]]) {
    await policy.addRule({ principal, effect: "allow", operation: "publish", resourceType: "topic", pattern: "literal", name: topic });
  }
  broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  for (const t of ["alice-topic", "bob-topic", "carol-topic"]) await broker.createTopic(t, { partitions: 1 });
  server = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, tls: tlsOptions(), auth: { failureLimit: { burst: 1000 } } });
});

after(async () => {
  await server.close();
  await broker.close();
  dir.cleanup();
});

const withCert = (c: CertFiles): { caFile: string; certFile: string; keyFile: string } => ({ caFile: ca.cert, certFile: c.cert, keyFile: c.key });

/** The error code a rejected promise failed with ("ok" when it did not fail). */
async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return "ok";
  } catch (err) {
    return err instanceof BrokerError ? err.code : String(err);
  }
}

/** Publishes to each topic: which were allowed, which refused (FORBIDDEN, or absent: not found). */
async function reach(c: RemoteBrokerHandle): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const t of ["alice-topic", "bob-topic", "carol-topic"]) out[t] = await outcome(c.publish(t, "hello"));
  return out;
}

const DENIED = /^(FORBIDDEN|TOPIC_NOT_FOUND)$/;

function assertOnly(got: Record<string, string>, allowed: string): void {
  for (const [topic, result] of Object.entries(got)) {
    if (topic === allowed) assert.equal(result, "ok", `${topic}: ${JSON.stringify(got)}`);
    else assert.match(result, DENIED, `${topic}: ${JSON.stringify(got)}`);
  }
}

function https(path: string, o: { cert?: CertFiles; authorization?: string; body?: unknown }): Promise<number> {
  return withTimeout(
    new Promise<number>((resolve, reject) => {
      const body = o.body === undefined ? undefined : JSON.stringify(o.body);
      const req = httpsRequest(
        {
          host: "127.0.0.1",
          port: server.httpPort!,
          path,
          method: body === undefined ? "GET" : "POST",
          ca: readFileSync(ca.cert),
          ...(o.cert ? { cert: readFileSync(o.cert.cert), key: readFileSync(o.cert.key) } : {}),
          headers: { ...(body ? { "content-type": "application/json" } : {}), ...(o.authorization ? { authorization: o.authorization } : {}) },
          agent: false,
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
      req.end(body);
    }),
    10_000,
    `HTTPS ${path}`,
  );
}

const publishOverHttps = (topic: string, o: { cert?: CertFiles; authorization?: string }): Promise<number> =>
  https(`/v1/topics/${topic}/records`, { ...o, body: { records: [{ value: "hello" }] } });

test("a client certificate with CN=alice logs in as alice over the protocol, and the ACL applies to alice", async () => {
  assert.equal(server.authRequired, true);
  await using c = await connect({ url: server.url, tls: withCert(certs.alice) });
  assertOnly(await reach(c), "alice-topic");
});

test("RULE with L and U: the first rule that applies decides, with its case folding", async () => {
  await using svc = await connect({ url: server.url, tls: withCert(certs.svcAlice) });
  assertOnly(await reach(svc), "alice-topic");
  await using ops = await connect({ url: server.url, tls: withCert(certs.opsBob) });
  assertOnly(await reach(ops), "bob-topic");
});

test("over HTTPS a request without Authorization is the certificate's principal", async () => {
  assert.ok([200, 201].includes(await publishOverHttps("alice-topic", { cert: certs.alice })));
  assert.ok([403, 404].includes(await publishOverHttps("bob-topic", { cert: certs.alice })));
  assert.ok([200, 201].includes(await publishOverHttps("bob-topic", { cert: certs.opsBob })));
});

test("explicit credentials win over the certificate, and are checked as without one", async () => {
  await using scram = await connect({ url: server.url, tls: withCert(certs.alice), auth: { username: "carol", password: PASSWORD } });
  assertOnly(await reach(scram), "carol-topic");
  await using token = await connect({ url: server.url, tls: withCert(certs.alice), auth: { token: carolToken } });
  assertOnly(await reach(token), "carol-topic");
  // A wrong password is a failed login, not a fallback to the certificate.
  await assert.rejects(connect({ url: server.url, tls: withCert(certs.alice), auth: { username: "carol", password: "wrong-password" } }), AuthenticationError);
  assert.ok([200, 201].includes(await publishOverHttps("carol-topic", { cert: certs.alice, authorization: `Bearer ${carolToken}` })));
  assert.ok([403, 404].includes(await publishOverHttps("alice-topic", { cert: certs.alice, authorization: `Bearer ${carolToken}` })));
  assert.equal(await publishOverHttps("alice-topic", { cert: certs.alice, authorization: "Bearer slt_wrong" }), 401);
});

test("a certificate no rule applies to is refused with the generic authentication error", async () => {
  const err = await connect({ url: server.url, tls: withCert(certs.stranger) }).then(
    () => null,
    (e: unknown) => e,
  );
  assert.ok(err instanceof AuthenticationError, String(err));
  assert.equal(err.message, "authentication failed");
  assert.equal(await publishOverHttps("alice-topic", { cert: certs.stranger }), 401);
  // Its owner may still log in with a password.
  await using c = await connect({ url: server.url, tls: withCert(certs.stranger), auth: { username: "carol", password: PASSWORD } });
  assertOnly(await reach(c), "carol-topic");
});

test("certificate logins are audited as auth.login with mechanism TLS", async () => {
  // A server of its own, closed before the log is read (HTTP successes are written at once,
  // failures too; close writes what was still being counted).
  const own = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, tls: tlsOptions(), auth: { failureLimit: { burst: 1000 } } });
  const since = Date.now();
  try {
    const c = await connect({ url: own.url, tls: withCert(certs.opsBob) });
    await c.close();
    await assert.rejects(connect({ url: own.url, tls: withCert(certs.stranger) }), AuthenticationError);
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpsRequest(
        { host: "127.0.0.1", port: own.httpPort!, path: "/v1/topics", ca: readFileSync(ca.cert), cert: readFileSync(certs.svcAlice.cert), key: readFileSync(certs.svcAlice.key), agent: false },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
      req.end();
    });
    assert.equal(status, 200);
  } finally {
    await own.close();
  }
  const records = (await listAuditRecords(new NodeFileSystem(), data, { limit: 10_000 })).filter((r: AuditRecord) => r.op === "auth.login" && r.time >= since);
  const find = (resource: string, principal: string, result: string): AuditRecord | undefined =>
    records.find((r) => r.resource === resource && r.principal === principal && r.result === result && r.details.mechanism === "TLS");
  assert.ok(find("protocol", "BOB", "ok"), JSON.stringify(records));
  assert.ok(find("http", "alice", "ok"), JSON.stringify(records));
  const refused = find("protocol", "O=Nobody", "AUTHENTICATION_FAILED");
  assert.ok(refused, JSON.stringify(records));
  assert.equal(refused.details.reason, "no principal rule matches the client certificate");
});

test("bad rules, or rules without a required client certificate, stop the start with TlsConfigError", async () => {
  const cases: [Partial<ServerTlsOptions>, RegExp][] = [
    [{ principalRules: ["RULE:^CN=(.*$/$1/L"] }, /invalid regular expression/],
    [{ principalRules: ["DEFAULT"] }, /DEFAULT/],
    [{ principalRules: ["CN"], requestClientCert: false }, /principalRules needs tls\.requestClientCert/],
  ];
  for (const [extra, message] of cases) {
    const err = await startServer({ broker, port: 0, httpPort: null, tls: tlsOptions(extra) }).then(
      (s) => s.close().then(() => null),
      (e: unknown) => e,
    );
    assert.ok(err instanceof TlsConfigError, `${JSON.stringify(extra)}: ${String(err)}`);
    assert.match(err.message, message);
    assert.ok(!err.message.includes("\n"));
  }
});

function cli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, ...args], {
    encoding: "utf8",
    timeout: 30_000,
    env: { ...process.env, SLUICE_URL: "", SLUICE_DATA: "", SLUICE_TLS_CA: "", SLUICE_TLS_CLIENT_CERT: "", SLUICE_TLS_CLIENT_KEY: "", SLUICE_USER: "", SLUICE_TOKEN: "" },
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

test("sluice serve refuses a bad rule in one line, before opening anything", () => {
  const r = cli(["serve", "--data", join(dir.dir, "never"), "--tls-cert", serverFiles.cert, "--tls-key", serverFiles.key, "--tls-ca", ca.cert, "--tls-client-auth", "required", "--tls-principal-rules", "RULE:^CN=(.*)$/$2/"]);
  assert.equal(r.status, 1, r.stderr);
  assert.equal(r.stderr.trim(), 'error [TLS_CONFIG]: tls principal rules: "RULE:^CN=(.*)$/$2/": the replacement names $2 but the regex has 1 group(s) (from --tls-principal-rules)');
  const noClientAuth = cli(["serve", "--data", join(dir.dir, "never"), "--tls-principal-rules", "CN"]);
  assert.equal(noClientAuth.status, 1);
  assert.match(noClientAuth.stderr, /--tls-principal-rules needs --tls-client-auth required/);
});

test("mapped client certificates count as principals for the loopback rule", async () => {
  using empty = tempDir("sluice-mtls-open-");
  // No users or tokens: refused on a non-loopback host without a mapping...
  const refused = await startServer({ broker, host: "0.0.0.0", port: 0, httpPort: null, dataDir: empty.dir, tls: tlsOptions({ principalRules: undefined }) }).then(
    (s) => s.close().then(() => null),
    (e: unknown) => e,
  );
  assert.ok(refused instanceof ValidationError && /refusing to listen/.test(refused.message), String(refused));
  // ...served with one, and every client must log in (here: with its certificate).
  const mapped = await startServer({ broker, host: "0.0.0.0", port: 0, httpPort: null, dataDir: empty.dir, tls: tlsOptions() });
  try {
    assert.equal(mapped.authRequired, true);
    await using c = await connect({ url: `sluice+tls://127.0.0.1:${mapped.port}`, tls: withCert(certs.alice) });
    await assert.rejects(connect({ url: `sluice+tls://127.0.0.1:${mapped.port}`, tls: withCert(certs.stranger) }), AuthenticationError);
  } finally {
    await mapped.close();
  }
});

test("sluice serve --tls-client-auth required --tls-principal-rules: CLI commands log in with --tls-client-cert", { timeout: 90_000 }, async () => {
  using own = tempDir("sluice-mtls-cli-");
  const ownData = join(own.dir, "data");
  await grantAdmin(ownData, "alice");
  const srv = await spawnServer([
    "--data", ownData, "--port", "0", "--http-port", "off", "--log-level", "info",
    "--tls-cert", serverFiles.cert, "--tls-key", serverFiles.key, "--tls-ca", ca.cert,
    "--tls-client-auth", "required", "--tls-principal-rules", "RULE:^CN=([^,]+),OU=svc$/$1/L,CN",
  ]);
  try {
    assert.ok(srv.stdout.some((l) => l.includes('"authRequired":true')), srv.stdout.join("\n"));
    const as = (c: CertFiles): string[] => ["--url", srv.url, "--tls-ca", ca.cert, "--tls-client-cert", c.cert, "--tls-client-key", c.key];
    const created = cli(["topics", "create", "by-cert", ...as(certs.svcAlice)]);
    assert.equal(created.status, 0, created.stderr);
    const listed = cli(["topics", "list", "--json", ...as(certs.alice)]);
    assert.equal(listed.status, 0, listed.stderr);
    assert.match(listed.stdout, /by-cert/);
    const stranger = cli(["topics", "list", ...as(certs.stranger)]);
    assert.equal(stranger.status, 1);
    assert.equal(stranger.stderr.trim(), "error [AUTHENTICATION_FAILED]: authentication failed");
    // The first rule does not apply to OU=ops; CN gives "bob", who has no rule: logged in, but denied.
    const bob = cli(["topics", "create", "by-bob", ...as(certs.opsBob)]);
    assert.equal(bob.status, 1);
    assert.match(bob.stderr, /^error \[FORBIDDEN\]/);
    const noCert = cli(["topics", "list", "--url", srv.url, "--tls-ca", ca.cert]);
    assert.equal(noCert.status, 1);
    assert.match(noCert.stderr, /client certificate/);
    const half = cli(["topics", "list", "--url", srv.url, "--tls-ca", ca.cert, "--tls-client-cert", certs.alice.cert]);
    assert.equal(half.status, 2);
    assert.match(half.stderr, /--tls-client-cert and --tls-client-key go together/);
  } finally {
    srv.proc.kill("SIGTERM");
    await srv.exited;
  }
});

test("serve config: the rules from a flag, SLUICE_TLS_PRINCIPAL_RULES or a config file array; checked at once", () => {
  const tls = ["--data", "d", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem", "--tls-client-auth", "required"];
  assert.deepEqual(resolveServeConfig([...tls, "--tls-principal-rules", "SAN:email,CN"], {}).tlsPrincipalRules, ["SAN:email,CN"]);
  const fromEnv = resolveServeConfig(tls, { SLUICE_TLS_PRINCIPAL_RULES: "RULE:^CN=([^,]+),OU=svc$/$1/L,CN" });
  assert.deepEqual(fromEnv.tlsPrincipalRules, ["RULE:^CN=([^,]+),OU=svc$/$1/L,CN"]);
  assert.equal(fromEnv.tlsClientAuth, "required");
  const file = join(dir.dir, "serve.json");
  writeFileSync(file, JSON.stringify({ tlsPrincipalRules: ["RULE:^CN=([^,]+),OU=svc$/$1/L", "CN"] }));
  assert.deepEqual(resolveServeConfig([...tls, "--config", file], {}).tlsPrincipalRules, ["RULE:^CN=([^,]+),OU=svc$/$1/L", "CN"]);
  writeFileSync(file, JSON.stringify({ tlsPrincipalRules: ["CN", 7] }));
  assert.throws(() => resolveServeConfig([...tls, "--config", file], {}), (e: unknown) => e instanceof ValidationError && /expected a string or an array of strings/.test(e.message));
  assert.throws(() => resolveServeConfig(tls, { SLUICE_TLS_PRINCIPAL_RULES: "SAN:ip" }), (e: unknown) => e instanceof TlsConfigError && /\(from SLUICE_TLS_PRINCIPAL_RULES\)$/.test(e.message));
  assert.throws(() => resolveServeConfig([...tls, "--tls-client-auth", "maybe"], {}), (e: unknown) => e instanceof ValidationError && /expected required or none/.test(e.message));
  assert.throws(() => resolveServeConfig(["--data", "d", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-auth", "required"], {}), (e: unknown) => e instanceof ValidationError && /needs --tls-ca/.test(e.message));
});
