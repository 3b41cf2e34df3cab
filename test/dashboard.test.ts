// SPDX-License-Identifier: Apache-2.0
/**
 * The web dashboard on `sluice serve`'s HTTP port: its files are served from the built package
 * (read-only, with a strict content security policy), and a headless Chromium (Debian's package,
 * installed by scripts/ensure-tool.sh when missing) driven by playwright-core shows a group's
 * lag, redrives a dead-lettered job back to its queue through the existing HTTP routes, lists
 * job schedules and flow parents waiting for their children, and shows the cleaner's figures of
 * a compacted topic and the archive's of a topic with an archive.
 * Screenshots go to test-artifacts/ (gitignored).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";
import { openBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { NodeFileSystem } from "../src/log/io.js";
import { startServer as startInProcess } from "../src/server/index.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import type { Message } from "../src/types.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";
import { chromiumPath } from "./fixtures/chromium.js";

/** The repository (or installed package) root: this file runs as dist/test/dashboard.test.js. */
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const ARTIFACTS = join(ROOT, "test-artifacts");
/** Every wait on the page is bounded; the whole file stays well under a minute. */
const WAIT_MS = 15_000;

function tmp(): string {
  return mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-dashboard-"));
}

async function get(port: number, path: string, init: RequestInit = {}): Promise<Response> {
  return fetch(`http://127.0.0.1:${port}${path}`, { ...init, redirect: "manual" });
}

async function waitUntil(cond: () => Promise<boolean>, what: string, timeoutMs = WAIT_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function depth(port: number, queue: string): Promise<number> {
  return ((await (await get(port, `/v1/queues/${encodeURIComponent(queue)}/stats`)).json()) as { depth: number }).depth;
}

async function startServer(dir: string): Promise<SpawnedServer & { http: number }> {
  const s = await spawnServer(["--data", dir, "--port", "0", "--http-port", "0", "--log-level", "warn"]);
  assert.ok(s.httpPort, "the listening line names the HTTP port");
  return { ...s, http: s.httpPort };
}

async function stop(s: SpawnedServer): Promise<void> {
  s.proc.kill("SIGTERM");
  await s.exited;
}

test("the dashboard's files are served from the package, read-only, with a strict CSP", async () => {
  const dir = tmp();
  const server = await startServer(dir);
  try {
    for (const path of ["/", "/dashboard", "/dashboard/"]) {
      const r = await get(server.http, path);
      assert.equal(r.status, 200, path);
      assert.match(r.headers.get("content-type") ?? "", /^text\/html/);
      const csp = r.headers.get("content-security-policy") ?? "";
      assert.match(csp, /script-src 'self'/);
      assert.match(csp, /frame-ancestors 'none'/);
      assert.match(await r.text(), /<script type="module" src="\/dashboard\/app.js">/);
    }
    // Every file of the public folder is served, as a module script or style sheet.
    const publicDir = join(ROOT, "src/server/dashboard/public");
    for (const f of readdirSync(publicDir)) {
      if (f === "index.html") continue;
      const r = await get(server.http, `/dashboard/${f}`);
      assert.equal(r.status, 200, f);
      assert.match(r.headers.get("content-type") ?? "", f.endsWith(".css") ? /^text\/css/ : /^text\/javascript/, f);
      assert.equal(r.headers.get("x-content-type-options"), "nosniff");
    }
    const uplot = await get(server.http, "/dashboard/vendor/uPlot.iife.min.js");
    assert.equal(uplot.status, 200);
    assert.match(await uplot.text(), /uPlot/);
    assert.equal((await get(server.http, "/dashboard/vendor/uPlot.min.css")).status, 200);
    // Nothing else: no other file, no writes, no path tricks.
    for (const [method, path] of [
      ["GET", "/dashboard/nope.js"],
      ["GET", "/dashboard/../package.json"],
      ["GET", "/dashboard/%2e%2e/package.json"],
      ["GET", "/dashboard/vendor/uPlot.cjs.js"],
      ["POST", "/dashboard"],
      ["DELETE", "/"],
    ]) {
      const r = await get(server.http, path, { method });
      assert.equal(r.status, 404, `${method} ${path}`);
      assert.equal(((await r.json()) as { error: { code: string } }).error.code, "NOT_FOUND");
    }
    const head = await get(server.http, "/dashboard", { method: "HEAD" });
    assert.equal(head.status, 200);
  } finally {
    await stop(server);
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the package ships the dashboard's files (npm pack lists them)", () => {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  const files = new Set((JSON.parse(out) as { files: { path: string }[] }[])[0].files.map((f) => f.path));
  for (const f of readdirSync(join(ROOT, "src/server/dashboard/public"))) assert.ok(files.has(`src/server/dashboard/public/${f}`), `packed: ${f}`);
  assert.ok(files.has("dist/src/server/dashboard/static.js"));
});

async function take<T>(it: AsyncIterator<Message<T>>, n: number): Promise<Message<T>[]> {
  const out: Message<T>[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

type Client = Awaited<ReturnType<typeof connect>>;

test("in a browser: a group's lag shows, a dead-lettered job is redriven to its queue, schedules and flow parents show", async () => {
  const dir = tmp();
  const server = await startServer(dir);
  const client = await connect({ url: server.url });
  let browser: Browser | null = null;
  try {
    browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const problems: string[] = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("console", (m) => {
      if (m.type() === "error") problems.push(`console: ${m.text()} (${m.location().url})`);
    });
    await page.goto(`http://127.0.0.1:${server.http}/dashboard#groups`);
    // An empty broker: the page says what to do instead of showing an empty table.
    await page.getByText("No consumer groups yet.").waitFor({ timeout: WAIT_MS });
    // A server without users or tokens: no login form, nobody named as logged in.
    assert.equal(await page.locator("#login").isVisible(), false, "no login on an open server");
    assert.equal(await page.locator("#who").isVisible(), false);
    await groupLagShows(page, client);
    await deadLetterRedriven(page, client, server.http);
    await schedulesShow(page, client);
    await page.click("#tab-overview");
    await page.locator('[data-metric="publish-rate"]').waitFor({ timeout: WAIT_MS });
    await shoot(page, "dashboard.png");
    assert.deepEqual(problems, [], "no script errors or CSP violations in the page");
  } finally {
    await browser?.close();
    await client.close();
    await stop(server);
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A group behind by 10 records, 600 s old: its row, its charts, the group-lag check firing. */
async function groupLagShows(page: Page, client: Client): Promise<void> {
  // 20 records over 2 partitions, written 10 minutes ago; the group commits the first 5 of
  // each: 10 records of lag, 600 s old (over the group-lag check's 300 s).
  await client.createTopic("orders", { partitions: 2 });
  const past = Date.now() - 600_000;
  await client.publishBatch("orders", Array.from({ length: 20 }, (_, i) => ({ value: { n: i }, partition: i % 2, timestamp: past })));
  const sub = client.subscribe<{ n: number }>("orders", { group: "billing", start: "earliest" });
  const msgs = await take(sub[Symbol.asyncIterator](), 20);
  for (const p of [0, 1]) await msgs.filter((m) => m.partition === p)[4].commit();
  await sub.close();
  const lagCell = page.locator('tr[data-group="billing"][data-topic="orders"] td.lag-records');
  await lagCell.filter({ hasText: /^10$/ }).waitFor({ timeout: WAIT_MS });
  await waitUntil(async () => (await page.locator("#page-groups figure.chart .uplot").count()) === 2, "the groups page draws its two lag charts");
  await shoot(page, "dashboard-groups.png");
  await page.locator("#alerts-badge").filter({ hasText: /^1$/ }).waitFor({ timeout: WAIT_MS });
  await page.click("#tab-alerts");
  const rule = page.locator('[data-rule="group-lag"]');
  await rule.getByText("firing (1)").waitFor({ timeout: WAIT_MS });
  assert.match((await rule.textContent()) ?? "", /group billing on orders/);
  await shoot(page, "dashboard-alerts.png");
  await page.click("#tab-topics");
  await page.locator('[data-topic="orders"] tbody tr').nth(1).waitFor({ timeout: WAIT_MS });
  assert.match((await page.locator('[data-topic="orders"] .summary').textContent()) ?? "", /2 partitions · 20 records appended/);
  await shoot(page, "dashboard-topics.png");
}

/** A job nacked without requeue: listed and inspected in the DLQ browser, redriven (after the
 * confirmation), back in its queue; a dismissed purge sends nothing. */
async function deadLetterRedriven(page: Page, client: Client, http: number): Promise<void> {
  const emails = client.queue<string>("emails");
  await emails.enqueue("poison");
  {
    await using worker = emails.work({ prefetch: 1 });
    const j = await worker[Symbol.asyncIterator]().next();
    assert.equal(j.done, false);
    if (!j.done) await j.value.nack({ requeue: false, reason: "malformed address" });
  }
  await waitUntil(async () => (await depth(http, "emails.dlq")) === 1, "the job in emails.dlq");

  await page.click("#tab-dlq");
  const row = page.locator("tr[data-job]");
  await row.first().waitFor({ timeout: WAIT_MS });
  assert.equal(await row.count(), 1);
  await row.first().getByRole("button", { name: "Inspect" }).click();
  const details = page.locator("[data-job-details]");
  await details.getByText("malformed address").first().waitFor({ timeout: WAIT_MS });
  assert.match((await details.textContent()) ?? "", /Source queueemails/);
  await shoot(page, "dashboard-dlq.png");

  const dialogs: string[] = [];
  page.once("dialog", (d) => {
    dialogs.push(d.message());
    void d.accept();
  });
  await page.click("#dlq-redrive-one");
  await page.locator("#notice").getByText("Redrove 1 job from emails.dlq.").waitFor({ timeout: WAIT_MS });
  assert.match(dialogs[0] ?? "", /^Redrive job /, "the action asked first");
  await page.getByText("emails.dlq is empty.").waitFor({ timeout: WAIT_MS });

  // Purge asks first; dismissed, nothing is sent.
  await page.click("#tab-queues");
  const purgeButton = page.locator('tr[data-queue="emails"]').getByRole("button", { name: "Purge…" });
  await purgeButton.waitFor({ timeout: WAIT_MS });
  const asked: string[] = [];
  page.once("dialog", (d) => {
    asked.push(d.message());
    void d.dismiss();
  });
  await purgeButton.click();
  assert.match(asked[0] ?? "", /^Purge queue “emails”\?/);
  assert.equal(await depth(http, "emails"), 1, "a dismissed purge purges nothing");
  await shoot(page, "dashboard-queues.png");

  // Back in its source queue, as a redriven job with the same payload.
  {
    await using worker = emails.work({ prefetch: 1 });
    const j = await worker[Symbol.asyncIterator]().next();
    assert.equal(j.done, false);
    if (!j.done) {
      assert.equal(j.value.data, "poison");
      assert.equal(j.value.redriveCount, 1);
      await j.value.ack();
    }
  }
  assert.equal(await depth(http, "emails.dlq"), 0);
}

/** Schedules made through the client (one active cron in a time zone, one paused interval) are
 * listed on the Schedules tab, which reads only while shown; a flow parent counts as waiting
 * for children on the Queues tab. */
async function schedulesShow(page: Page, client: Client): Promise<void> {
  const schedulesAsked: string[] = [];
  page.on("request", (r) => {
    if (/\/v1\/queues\/[^/]+\/schedules$/.test(new URL(r.url()).pathname)) schedulesAsked.push(r.url());
  });
  await page.click("#tab-schedules");
  // Queues exist (emails, emails.dlq) but none has a schedule: the page says how to make one.
  await page.getByText("No job schedules.").waitFor({ timeout: WAIT_MS });
  assert.match((await page.locator("#page-schedules .empty").textContent()) ?? "", /upsertSchedule\("name", \{ cron: "\*\/5 \* \* \* \*", data \}\)/);

  const reports = client.queue<{ kind: string }>("reports");
  const nightly = await reports.upsertSchedule("nightly", { cron: "0 3 * * *", tz: "Europe/Paris", data: { kind: "nightly" } });
  await reports.upsertSchedule("heartbeat", { everyMs: 60_000, data: { kind: "ping" }, catchUp: "once" });
  await reports.pauseSchedule("heartbeat");
  await reports.enqueueFlow({ data: { kind: "summary" }, children: [{ data: { kind: "part" } }] });
  assert.ok(nightly.nextRunAt !== null, "an active cron has a next run");

  // The next poll (the tab is shown) lists both, in name order.
  const active = page.locator('#page-schedules tr[data-queue="reports"][data-schedule="nightly"]');
  const paused = page.locator('#page-schedules tr[data-queue="reports"][data-schedule="heartbeat"]');
  await active.waitFor({ timeout: WAIT_MS });
  await paused.waitFor({ timeout: WAIT_MS });
  const cells = async (row: typeof active): Promise<string[]> => (await row.locator("td").allTextContents()).map((t) => t.trim());
  const a = await cells(active);
  // The next run as the page formats times (the browser's time zone), then how far away it is.
  const nextAt = await page.evaluate(async (ms) => {
    const format = "/dashboard/format.js";
    return ((await import(format)) as { time: (ms: number | null) => string }).time(ms);
  }, nightly.nextRunAt);
  assert.deepEqual(a.slice(0, 5), ["reports", "nightly", "0 3 * * * (Europe/Paris)", "skip", "active"]);
  assert.match(a[5], new RegExp(`^${nextAt} \\(in [\\d.]+ [dhms]( \\d+ [hms])?\\)$`), a[5]);
  assert.equal(a[6], "not yet");
  assert.deepEqual(await cells(paused), ["reports", "heartbeat", "every 1 m 0 s", "once", "paused", "— (paused)", "not yet"]);
  assert.deepEqual(await page.locator("#page-schedules tbody tr").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-schedule"))), ["heartbeat", "nightly"]);
  assert.equal(await page.locator("#page-schedules button").count(), 0, "read-only: no actions");
  await shoot(page, "dashboard-schedules.png");

  await page.click("#tab-queues");
  await page.locator("#page-queues th", { hasText: /^Waiting for children$/ }).waitFor({ timeout: WAIT_MS });
  await page.locator('#page-queues tr[data-queue="reports"] td.waiting-children').filter({ hasText: /^1$/ }).waitFor({ timeout: WAIT_MS });
  // Hidden, the Schedules tab reads nothing: two more renders (at least one poll) send no request.
  const renders = async (): Promise<number> => Number((await page.locator("body").getAttribute("data-polls")) ?? 0);
  const r0 = await renders();
  await waitUntil(async () => (await renders()) >= r0 + 1, "a poll with the Queues tab shown");
  const asked = schedulesAsked.length;
  await waitUntil(async () => (await renders()) >= r0 + 3, "two more polls");
  assert.equal(schedulesAsked.length, asked, "no schedules request while the tab is hidden");
}

test("in a browser: the Topics tab shows a compacted topic's cleaner figures and an archived topic's archive figures", async () => {
  const dir = tmp();
  // In process, so the test runs compaction and retention when it wants (no timers).
  const engine = new DiskEngine({ dataDir: join(dir, "data"), fs: new NodeFileSystem(), cleanerIntervalMs: 0 });
  const broker = await openBroker({ engine, retentionCheckIntervalMs: 0 });
  const server = await startInProcess({ broker, port: 0, httpPort: 0 });
  let browser: Browser | null = null;
  try {
    await broker.createTopic("table", { segmentBytes: 1024, cleanupPolicy: "compact" });
    await broker.createTopic("cold", { segmentBytes: 4096, retentionBytes: 2 * 4096, archive: { dir: join(dir, "archive") } });
    for (let i = 0; i < 40; i++) await broker.publishBatch("table", [0, 1, 2].map((j) => ({ key: `k${(i * 3 + j) % 4}`, value: i * 3 + j, partition: 0 })));
    for (let i = 0; i < 50; i++) await broker.publishBatch("cold", Array.from({ length: 4 }, (_, j) => ({ value: `record ${i}.${j} `.repeat(12), partition: 0 })));
    await engine.compact();
    await broker.enforceRetention(Date.now());
    for (let off = 0; off < 40; ) off = (await broker.fetch("cold", 0, off)).nextOffset; // from the archive
    const table = (await broker.describeTopic("table")).partitions[0];
    const cold = (await broker.describeTopic("cold")).partitions[0];
    assert.ok(table.bytesReclaimed! > 0 && cold.archivedSegments! > 0 && cold.archiveReadBytes! > 0);

    browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const problems: string[] = [];
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    await page.goto(`http://127.0.0.1:${server.httpPort}/dashboard#topics`);
    const cleaner = page.locator('[data-topic="table"] table.cleaner tr[data-partition="0"]');
    await cleaner.waitFor({ timeout: WAIT_MS });
    const cell = async (row: typeof cleaner, cls: string): Promise<string> => ((await row.locator(`td.${cls}`).textContent()) ?? "").trim();
    const fmt = await page.evaluate(async (figures) => {
      const format = "/dashboard/format.js";
      const f = (await import(format)) as { bytes: (n: number) => string; percent: (x: number) => string; time: (ms: number) => string };
      return { reclaimed: f.bytes(figures.reclaimed), dirty: f.percent(figures.dirty), last: f.time(figures.last), archived: f.bytes(figures.archived), read: f.bytes(figures.read) };
    }, { reclaimed: table.bytesReclaimed!, dirty: table.cleanerDirtyRatio!, last: table.lastCleanedAt!, archived: cold.archivedBytes!, read: cold.archiveReadBytes! });
    assert.equal(await cell(cleaner, "cleaner-dirty"), fmt.dirty);
    assert.equal(await cell(cleaner, "cleaner-reclaimed"), fmt.reclaimed);
    assert.equal(await cell(cleaner, "cleaner-passes"), "1");
    assert.match(await cell(cleaner, "cleaner-last"), new RegExp(`^${fmt.last} \\([\\d.]+ s ago\\)$`));
    assert.equal(await cell(cleaner, "cleaner-pass"), "idle");
    assert.match((await page.locator('[data-topic="table"] .summary').textContent()) ?? "", / · compacted$/);
    assert.equal(await page.locator('[data-topic="table"] table.archive').count(), 0, "no archive table for a topic without an archive");

    const archive = page.locator('[data-topic="cold"] table.archive tr[data-partition="0"]');
    await archive.waitFor({ timeout: WAIT_MS });
    assert.equal(await cell(archive, "archive-start"), "0");
    assert.equal(await cell(archive, "archive-bytes"), fmt.archived);
    assert.equal(await cell(archive, "archive-segments"), String(cold.archivedSegments));
    assert.equal(await cell(archive, "archive-lag"), "0 B");
    assert.equal(await cell(archive, "archive-read"), fmt.read);
    assert.equal(await page.locator('[data-topic="cold"] table.cleaner').count(), 0, "no compaction table for a topic that is not compacted");
    // More archived reads between two polls: a read rate above 0 shows.
    const polls = async (): Promise<number> => Number((await page.locator("body").getAttribute("data-polls")) ?? 0);
    const p0 = await polls();
    await waitUntil(async () => (await polls()) > p0, "a poll");
    for (let off = 0; off < 120; ) off = (await broker.fetch("cold", 0, off)).nextOffset;
    await archive.locator("td.archive-read-rate").filter({ hasText: /^[1-9][\d.,]* (B|KiB|MiB)\/s$/ }).waitFor({ timeout: WAIT_MS });
    await shoot(page, "dashboard-topics-storage.png");
    assert.deepEqual(problems, [], "no script errors in the page");
  } finally {
    await browser?.close();
    await server.close();
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

async function shoot(page: Page, name: string): Promise<void> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, name);
  await page.screenshot({ path, fullPage: true });
  console.log(`# screenshot: ${path}`);
}
