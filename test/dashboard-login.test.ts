// SPDX-License-Identifier: Apache-2.0
/**
 * The web dashboard on a server with users and tokens (docs/dashboard.md "Logging in"): its
 * files load without credentials, the page asks for a login only when the API answers 401,
 * a wrong password gets the server's generic error, a user sees exactly what the policy lets
 * it see (ACL-4) and a refused action shows its error and changes nothing, log out and a
 * revoked token return to the login form, and the password never reaches localStorage, a URL
 * or a cookie. `GET /v1/whoami` answers who the caller is. An open server shows no login.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { openBroker } from "../src/broker/broker.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { tempDir, waitUntil } from "../src/testing/helpers.js";
import { chromiumPath, ROOT } from "./fixtures/chromium.js";

const WAIT_MS = 15_000;
const PASSWORD = "correct horse " + "battery staple";

type Broker = Awaited<ReturnType<typeof openBroker>>;

interface Setup {
  broker: Broker;
  server: ServerHandle;
  base: string;
  creds: CredentialStore;
  token: { token: string; id: string };
}

/**
 * alice may describe the topics starting with "orders." and the queue "emails" (not purge it),
 * carol is admin on the cluster, dave belongs to tenant "acme"; a token logs in as alice.
 */
async function setUp(data: string): Promise<Setup> {
  const creds = await CredentialStore.open(data);
  for (const u of ["alice", "carol", "dave"]) await creds.addUser(u, PASSWORD, 4096);
  const { token, info } = await creds.createToken("alice");
  const policy = await PolicyStore.open(data);
  await policy.addRule({ principal: "alice", effect: "allow", operation: "describe", resourceType: "topic", pattern: "prefix", name: "orders." });
  await policy.addRule({ principal: "alice", effect: "allow", operation: "describe", resourceType: "queue", pattern: "literal", name: "emails" });
  await policy.addRule({ principal: "carol", effect: "allow", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });
  await policy.addRule({ principal: "dave", effect: "allow", operation: "admin", resourceType: "cluster", pattern: "literal", name: "" });
  await policy.setTenant("acme", ["dave"]);
  const broker = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  for (const t of ["orders.created", "orders.paid", "payroll"]) await broker.createTopic(t, { partitions: 1 });
  await broker.queue("emails").enqueueBatch([{ data: "one" }, { data: "two" }]);
  await broker.queue("payroll-runs").enqueueBatch([{ data: "march" }]);
  // A failure allowance larger than the default, so the test never waits for it to refill;
  // the page's own count of failed logins is asserted below.
  const server = await startServer({ broker, port: 0, httpPort: 0, dataDir: data, auth: { failureLimit: { burst: 20 } } });
  return { broker, server, base: `http://127.0.0.1:${server.httpPort}`, creds, token: { token, id: info.id } };
}

const basic = (user: string, pw: string): string => "Basic " + Buffer.from(`${user}:${pw}`).toString("base64");

test("GET /v1/whoami names the caller, its tenant and what it may do on the cluster; the dashboard's files need no login, the API does", async () => {
  using dir = tempDir("sluice-dashboard-login-");
  const s = await setUp(join(dir.dir, "data"));
  try {
    const whoami = async (auth?: string): Promise<[number, unknown]> => {
      const r = await fetch(`${s.base}/v1/whoami`, { headers: auth ? { authorization: auth } : {} });
      return [r.status, await r.json()];
    };
    assert.deepEqual(await whoami(basic("alice", PASSWORD)), [200, { principal: "alice", tenant: null, superuser: false, cluster: [] }]);
    assert.deepEqual(await whoami(`Bearer ${s.token.token}`), [200, { principal: "alice", tenant: null, superuser: false, cluster: [] }]);
    const carol = (await whoami(basic("carol", PASSWORD)))[1] as { superuser: boolean; cluster: string[] };
    assert.equal(carol.superuser, true);
    assert.ok(carol.cluster.includes("describe") && carol.cluster.includes("admin"));
    // A tenant's principal reaches nothing of the cluster, whatever its rules say (ACL-2).
    assert.deepEqual(await whoami(basic("dave", PASSWORD)), [200, { principal: "dave", tenant: "acme", superuser: false, cluster: [] }]);
    const [status, body] = await whoami();
    assert.equal(status, 401);
    assert.equal((body as { error: { code: string } }).error.code, "AUTHENTICATION_FAILED");
    assert.deepEqual(await whoami(basic("alice", "wrong")), [401, body], "a wrong password gets the same answer as none");

    for (const path of ["/", "/dashboard", "/dashboard/app.js", "/dashboard/login.js", "/dashboard/style.css"]) {
      assert.equal((await fetch(`${s.base}${path}`)).status, 200, `${path} without credentials`);
    }
    for (const path of ["/v1/topics", "/metrics", "/dashboard/nope.js", "/nothing-here"]) {
      assert.equal((await fetch(`${s.base}${path}`)).status, 401, `${path} without credentials`);
    }
  } finally {
    await s.server.close();
    await s.broker.close();
  }
});

test("in a browser: log in, see only what the policy allows, a refused purge changes nothing, log out; a revoked token ends the login", async () => {
  using dir = tempDir("sluice-dashboard-login-");
  const s = await setUp(join(dir.dir, "data"));
  let browser: Browser | null = null;
  try {
    browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
    // The context would answer the browser's own password prompt with alice's password: the
    // page must never let the browser do that (its own form is the only way in).
    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, httpCredentials: { username: "alice", password: PASSWORD } });
    const page = await context.newPage();
    const problems: string[] = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    const seen: { path: string; status: number; url: string }[] = [];
    page.on("response", (r) => seen.push({ path: new URL(r.url()).pathname, status: r.status(), url: r.url() }));
    const refusals = (): number => seen.filter((r) => r.status === 401).length;

    await page.goto(`${s.base}/dashboard#topics`);
    await page.locator("#login-form").waitFor({ timeout: WAIT_MS });
    assert.equal(await page.locator("#main").isVisible(), false, "no pages before the login");
    assert.deepEqual(seen.filter((r) => r.path.startsWith("/v1/")).map((r) => `${r.path} ${r.status}`), ["/v1/whoami 401"], "one question, then nothing until a login");
    await shoot(page, "dashboard-login.png");

    // Wrong password and unknown user: the server's one generic answer, nothing more.
    const message = page.locator("#login-message");
    for (const [user, pw] of [["alice", "not it"], ["mallory", PASSWORD]]) {
      await page.fill("#login-user", user);
      await page.fill("#login-password", pw);
      await Promise.all([page.waitForResponse((r) => r.url().endsWith("/v1/whoami"), { timeout: WAIT_MS }), page.click("#login-submit")]);
      await message.filter({ hasText: /\S/ }).waitFor({ timeout: WAIT_MS });
      assert.equal((await message.textContent())?.trim(), "AUTHENTICATION_FAILED: authentication failed", `${user}: the generic error`);
    }
    assert.equal(await page.locator("#main").isVisible(), false);

    await page.fill("#login-user", "alice");
    await page.fill("#login-password", PASSWORD);
    await page.click("#login-submit");
    await page.locator("#who-name").filter({ hasText: /^alice$/ }).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.locator("#login").isVisible(), false);
    assert.equal(await page.locator("#login-password").inputValue(), "", "the typed password is cleared");
    // Exactly the topics alice may see, none other (ACL-4).
    await waitUntil(async () => (await page.locator("#page-topics .topic").count()) === 2, "the two orders topics listed", WAIT_MS);
    assert.deepEqual(await page.locator("#page-topics .topic").evaluateAll((els) => els.map((e) => e.getAttribute("data-topic"))), ["orders.created", "orders.paid"]);
    assert.doesNotMatch((await page.locator("body").textContent()) ?? "", /payroll/);

    // Overview: alice may not describe the cluster, so /metrics is not even asked for.
    await page.click("#tab-overview");
    await page.getByText(/needs describe on the cluster, which alice may not do/).waitFor({ timeout: WAIT_MS });
    assert.equal(seen.filter((r) => r.path === "/metrics").length, 0);

    await refusedPurge(page, s.broker);
    await shoot(page, "dashboard-login-forbidden.png");
    assert.equal(refusals(), 3, "failed logins the page cost: the first question and the two wrong attempts");

    // The password is in this tab's sessionStorage only: never localStorage, a URL or a cookie.
    const secrets = [PASSWORD, Buffer.from(`alice:${PASSWORD}`).toString("base64"), encodeURIComponent(PASSWORD)];
    const local = await inPage<string>(page, "JSON.stringify({ ...localStorage })");
    const session = await inPage<string>(page, "JSON.stringify({ ...sessionStorage })");
    const cookies = JSON.stringify(await context.cookies()) + (await inPage<string>(page, "document.cookie"));
    for (const secret of secrets) {
      assert.ok(!local.includes(secret), "not in localStorage");
      assert.ok(!cookies.includes(secret), "not in a cookie");
      assert.ok(!page.url().includes(secret), "not in the page's URL");
      for (const r of seen) assert.ok(!r.url.includes(secret), `not in the URL of ${r.path}`);
    }
    assert.ok(session.includes(Buffer.from(`alice:${PASSWORD}`).toString("base64")), "kept in sessionStorage");

    // Log out: the page forgets the credential and shows the form, asking the server nothing.
    await page.click("#logout");
    await page.locator("#login-message").filter({ hasText: /^Logged out\.$/ }).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.locator("#main").isVisible(), false);
    assert.equal(await inPage<number>(page, "sessionStorage.length"), 0, "nothing left in sessionStorage");
    assert.equal(refusals(), 3, "no failed login spent on logging out");

    await tokenEndsWithRevoke(page, s);
    assert.deepEqual(problems, [], "no script errors in the page");
  } finally {
    await browser?.close();
    await s.server.close();
    await s.broker.close();
  }
});

/** Purge… on a queue alice may see but not purge: the broker's error, with its code, and every job still there. */
async function refusedPurge(page: Page, broker: Broker): Promise<void> {
  await page.click("#tab-queues");
  const purge = page.locator('tr[data-queue="emails"]').getByRole("button", { name: "Purge…" });
  await purge.waitFor({ timeout: WAIT_MS });
  assert.deepEqual(await page.locator("#page-queues tr[data-queue]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-queue"))), ["emails"], "only the queue alice may see");
  page.once("dialog", (d) => void d.accept());
  await purge.click();
  await page.locator("#notice").filter({ hasText: 'FORBIDDEN: not allowed: purge on queue "emails" for alice' }).waitFor({ timeout: WAIT_MS });
  assert.equal((await broker.queue("emails").stats()).depth, 2, "nothing purged");
}

/** A token logs in as alice; revoked meanwhile, the next poll's 401 brings the form back with one line. */
async function tokenEndsWithRevoke(page: Page, s: Setup): Promise<void> {
  await page.check("#login-with-token");
  await page.fill("#login-token", s.token.token);
  await page.click("#login-submit");
  await page.locator("#who-name").filter({ hasText: /^alice$/ }).waitFor({ timeout: WAIT_MS });
  await page.locator('#page-queues tr[data-queue="emails"]').waitFor({ timeout: WAIT_MS });
  assert.equal((await inPage<string>(page, "JSON.stringify({ ...localStorage })")).includes(s.token.token), false, "the token is not in localStorage");
  assert.ok(await s.creds.revokeToken(s.token.id));
  const line = page.locator("#login-message");
  await line.filter({ hasText: /no longer accepts this login/ }).waitFor({ timeout: WAIT_MS });
  assert.equal((await line.textContent())?.trim(), "The server no longer accepts this login (AUTHENTICATION_FAILED: authentication failed): log in again.");
  assert.equal(await page.locator("#main").isVisible(), false);
  assert.equal(await inPage<number>(page, "sessionStorage.length"), 0, "the refused token is forgotten");
}

test("in a browser: a server without users or tokens shows the pages at once, with no login and nobody named", async () => {
  using dir = tempDir("sluice-dashboard-login-");
  const broker = await openBroker({ dataDir: join(dir.dir, "data"), retentionCheckIntervalMs: 0 });
  const server = await startServer({ broker, port: 0, httpPort: 0 });
  let browser: Browser | null = null;
  try {
    const r = await fetch(`http://127.0.0.1:${server.httpPort}/v1/whoami`);
    assert.equal(r.status, 200);
    assert.equal(((await r.json()) as { principal: unknown; superuser: boolean }).principal, null);
    browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${server.httpPort}/dashboard`);
    await page.locator("#page-overview").waitFor({ timeout: WAIT_MS });
    assert.equal(await page.locator("#login").isVisible(), false);
    assert.equal(await page.locator("#who").isVisible(), false);
    assert.match((await page.locator("footer").textContent()) ?? "", /no users or tokens/);
  } finally {
    await browser?.close();
    await server.close();
    await broker.close();
  }
});

/** An expression evaluated in the page (the test is compiled without the DOM's types). */
function inPage<T>(page: Page, expression: string): Promise<T> {
  return page.evaluate<T>(expression);
}

async function shoot(page: Page, name: string): Promise<void> {
  const dir = join(ROOT, "test-artifacts");
  mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: join(dir, name), fullPage: true });
}
