// SPDX-License-Identifier: Apache-2.0
// SCRAM-SHA-256 key derivation and messages (src/security/auth/scram.ts) against RFC 7677's
// example, the client and server state machines against each other, and the credential store.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { clientKeyOf, passwordMatches, saltedPassword, serverKeyOf, signature, storedKeyOf, xor } from "../src/security/auth/scram.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { ClientLogin } from "../src/client/auth.js";
import { ServerAuth } from "../src/server/auth.js";
import { AuthenticationError, ValidationError } from "../src/errors.js";
import { tempDir } from "../src/testing/helpers.js";
import type { Logger } from "../src/observability/telemetry.js";

const silent = { debug() {}, info() {}, warn() {}, error() {} } as unknown as Logger;

test("RFC 7677 example: the client proof and the server signature", () => {
  const clientFirstBare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
  const serverFirst = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
  const withoutProof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
  const authMessage = `${clientFirstBare},${serverFirst},${withoutProof}`;
  const salted = saltedPassword("pencil", Buffer.from("W22ZaJ0SNY7soEsUEjb6gQ==", "base64"), 4096);
  const clientKey = clientKeyOf(salted);
  const proof = xor(clientKey, signature(storedKeyOf(clientKey), authMessage));
  assert.equal(proof.toString("base64"), "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
  assert.equal(signature(serverKeyOf(salted), authMessage).toString("base64"), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
});

test("client and server complete a SCRAM exchange; the server proves it has the keys", async () => {
  using dir = tempDir("sluice-scram-");
  const store = await CredentialStore.open(dir.dir);
  await store.addUser("alice", "correct horse", 4096);
  const server = new ServerAuth(store, silent);
  assert.equal(await server.required(), true);
  const login = new ClientLogin({ username: "alice", password: "correct horse" });
  const exchange = server.begin("10.0.0.1");
  const first = await exchange.step(login.first());
  assert.equal(first.kind, "challenge");
  const done = await exchange.step(login.challenge(first.kind === "challenge" ? first.message : ""));
  assert.equal(done.kind, "done");
  assert.equal(done.kind === "done" && done.principal, "alice");
  login.finish({ auth: { message: done.kind === "done" ? done.message : "" } });
  // A server without the keys cannot forge the final signature.
  assert.throws(() => login.finish({ auth: { message: "v=" + Buffer.alloc(32).toString("base64") } }), AuthenticationError);
  assert.throws(() => login.finish({}), AuthenticationError);
});

test("wrong password, unknown user, expired and revoked tokens give the same error", async () => {
  using dir = tempDir("sluice-scram-");
  let now = 1_000_000;
  const store = await CredentialStore.open(dir.dir, { now: () => now });
  await store.addUser("alice", "correct horse", 4096);
  const expiring = await store.createToken("ci", { ttlMs: 1000 });
  const revoked = await store.createToken("ci");
  assert.equal(await store.revokeToken(revoked.info.id), true);
  const server = new ServerAuth(store, silent, { failureLimit: { burst: 100 } });
  const scram = async (user: string, password: string): Promise<unknown> => {
    const login = new ClientLogin({ username: user, password });
    const ex = server.begin("10.0.0.2");
    const first = await ex.step(login.first());
    return ex.step(login.challenge(first.kind === "challenge" ? first.message : ""));
  };
  assert.equal(((await server.begin("10.0.0.2").step({ mechanism: "BEARER", token: expiring.token })) as { principal: string }).principal, "ci");
  now += 1000;
  const errors: unknown[] = [];
  for (const attempt of [
    () => scram("alice", "wrong password"),
    () => scram("mallory", "correct horse"),
    () => server.begin("10.0.0.2").step({ mechanism: "BEARER", token: expiring.token }),
    () => server.begin("10.0.0.2").step({ mechanism: "BEARER", token: revoked.token }),
    () => server.begin("10.0.0.2").step(undefined),
  ]) {
    errors.push(await attempt().then(() => null, (e: unknown) => e));
  }
  for (const e of errors) {
    assert.ok(e instanceof AuthenticationError, String(e));
    assert.equal(e.code, "AUTHENTICATION_FAILED");
    assert.equal(e.message, "authentication failed");
    assert.equal(e.retriable, false);
  }
});

test("failures are limited per source: past the burst even the right password is refused", async () => {
  using dir = tempDir("sluice-scram-");
  let now = 0;
  const store = await CredentialStore.open(dir.dir);
  await store.addUser("alice", "correct horse", 4096);
  const server = new ServerAuth(store, silent, { failureLimit: { burst: 3, refillMs: 1000 }, now: () => now });
  const token = (await store.createToken("alice")).token;
  for (let i = 0; i < 3; i++) await assert.rejects(server.begin("10.0.0.3").step({ mechanism: "BEARER", token: "slt_wrong" }), AuthenticationError);
  await assert.rejects(server.begin("10.0.0.3").step({ mechanism: "BEARER", token }), AuthenticationError);
  // Another source is not affected; the limited one recovers as the bucket refills.
  assert.equal(((await server.begin("10.0.0.4").step({ mechanism: "BEARER", token })) as { principal: string }).principal, "alice");
  now += 1000;
  assert.equal(((await server.begin("10.0.0.3").step({ mechanism: "BEARER", token })) as { principal: string }).principal, "alice");
});

test("the store keeps salted keys and token hashes only, written atomically with owner-only access", async () => {
  using dir = tempDir("sluice-scram-");
  const store = await CredentialStore.open(dir.dir);
  await store.addUser("alice", "plaintext-password-1", 4096);
  const { token } = await store.createToken("ci-bot", { ttlMs: 60_000 });
  const again = await CredentialStore.open(dir.dir);
  assert.deepEqual(again.listUsers().map((u) => u.name), ["alice"]);
  assert.equal(again.tokenPrincipal(token), "ci-bot");
  assert.ok(passwordMatches("plaintext-password-1", again.user("alice")!));
  assert.ok(!passwordMatches("plaintext-password-2", again.user("alice")!));
  const secDir = join(dir.dir, "security");
  assert.equal(statSync(secDir).mode & 0o777, 0o700);
  assert.deepEqual(readdirSync(secDir), ["credentials.json"]);
  const text = readFileSync(join(secDir, "credentials.json"), "utf8");
  assert.ok(!text.includes("plaintext-password-1"));
  assert.ok(!text.includes(token) && !text.includes(token.slice(4)));
  assert.equal(await again.removeUser("alice"), true);
  assert.equal(await again.removeUser("alice"), false);
  await assert.rejects(again.addUser("bad name", "long enough"), ValidationError);
  await assert.rejects(again.addUser("bob", "short"), ValidationError);
  await assert.rejects(again.addUser("bob", "long enough", 1000), ValidationError);
});
