// SPDX-License-Identifier: Apache-2.0
/**
 * A worked system: a learning platform on sluice (design: README.md beside this file).
 * Run: `npm run example:learning` (embedded; data in $SLUICE_DATA, default ./data/learning-platform),
 * or with SLUICE_URL=sluice://host:port against `sluice serve`. PostgreSQL: $SLUICE_PG_URL
 * (default postgres://postgres@127.0.0.1:5432/postgres); each run works in a schema of its own
 * and drops it at the end. Exits 1 if any of the outcomes it checks does not hold.
 */
import Database from "better-sqlite3";
import { rmSync } from "node:fs";
import { join } from "node:path";
import type pg from "pg";
import { redriveTopic, type Broker } from "sluice";
import { startServer, type ServerHandle } from "sluice/server";
import { analyticsMember, analyticsTotals, FakeMailer, initAnalytics, Notifications, type ConsumerCounts } from "./consumers.js";
import { COURSES, CoursesService, plannedCompletions } from "./courses.js";
import { childMember, CHILD_FLAG, crashAndRebalance } from "./drill.js";
import { printSummary } from "./report.js";
import { brokerUrl, Checks, createSchema, dataDir, dropSchema, log, namesFor, newRunId, openTheBroker, pgPool, runUntilCaughtUp, waitFor, type Names } from "./runtime.js";
import { checksumOf, rebuildSearch, SearchProjection } from "./search.js";
import { initCertificates, QUEUE_CONFIG, renderCertificates, renderThumbnails } from "./workers.js";

const count = async (pool: pg.Pool, sql: string): Promise<number> => Number((await pool.query(sql)).rows[0].n);
const topicRecords = async (broker: Broker, topic: string): Promise<number> => (await broker.describeTopic(topic)).partitions.reduce((s, p) => s + p.highWatermark - p.logStartOffset, 0);

/** Courses are published and their thumbnails rendered: bounded retries, one dead letter. */
async function catalog(broker: Broker, courses: CoursesService, names: Names, checks: Checks): Promise<void> {
  for (const c of COURSES) await courses.publishCourse(c);
  await courses.publishCourse(COURSES[0]); // a retried publish: the dedupe id keeps one job
  const t = await renderThumbnails(broker, names.thumbnails);
  const stats = await broker.queue(names.thumbnails, QUEUE_CONFIG).stats();
  const dlq = await broker.queue(`${names.thumbnails}.dlq`).stats();
  log(`thumbnails: ${t.rendered} rendered in ${t.attempts} attempts; ${stats.deadLettered} dead-lettered after 3 attempts (in ${names.thumbnails}.dlq: ${dlq.depth})`);
  checks.check(t.rendered === COURSES.length - 1 && stats.deadLettered === 1 && dlq.depth === 1, "corrupt thumbnail dead-lettered after bounded retries, the others rendered once", `${t.rendered} rendered, ${stats.deadLettered} dead-lettered`);
  checks.check(t.attempts === COURSES.length - 1 + 3, "the corrupt thumbnail was tried exactly maxAttempts (3) times", `${t.attempts} attempts in all`);
}

/** Completions are written with their outbox rows while the relay runs; one transaction rolls back. */
async function complete(broker: Broker, courses: CoursesService, names: Names, checks: Checks): Promise<number> {
  const relayAc = new AbortController();
  const relaying = courses.relay.run(relayAc.signal);
  const planned = plannedCompletions();
  for (const c of planned) await courses.completeCourse(c);
  const rejected = await courses.completeCourse({ learnerId: "learner-99", courseId: "ts-101", courseTitle: COURSES[0].title, score: 100 }, true);
  try {
    await waitFor(async () => (await courses.relay.backlog()).rows === 0 && courses.relay.publishedRows >= planned.length, "the relay to publish the outbox");
  } finally {
    relayAc.abort();
    await relaying;
  }
  const committed = await courses.completionCount();
  const published = await topicRecords(broker, names.completions);
  log(`courses: ${committed} completions committed (1 rolled back), relay published ${courses.relay.publishedRows} CourseCompleted facts keyed by learner`);
  checks.check(!rejected && committed === planned.length && published === committed, "outbox: every committed completion published once, the rolled-back one never", `${published} published / ${committed} committed`);
  return committed;
}

/** The search group with the v1 indexer, the poison fact dead-lettered, the fix, the redrive. */
async function searchWithPoison(broker: Broker, search: SearchProjection, names: Names, expected: number, checks: Checks): Promise<void> {
  await runUntilCaughtUp(broker, "search", names.completions, (s) => search.run(1, s));
  const dead = (await broker.fetch(names.searchDlq, 0, 0)).records;
  const h = (k: string): string => (dead[0] ? Buffer.from(dead[0].headers[k] ?? new Uint8Array()).toString() : "");
  log(`search v1: ${search.counts.applied} indexed, ${search.counts.deadLettered} dead-lettered: ${h("sluice-dlq-error-class")} "${h("sluice-dlq-error")}" (failure class ${h("sluice-dlq-failure-class")}, from offset ${h("sluice-dlq-source-offset")})`);
  checks.check(dead.length === 1 && search.counts.applied === expected - 1 && h("sluice-dlq-failure-class") === "permanent", "the poison fact landed in the dead-letter topic; the other facts went on", `${dead.length} dead letter(s), ${search.counts.applied} indexed`);
  // The fix ships (indexer v2); the dead letter goes back to course-completed.
  const r = await redriveTopic(broker, names.searchDlq);
  log(`search: indexer v2 deployed; redriveTopic moved ${r.redriven} dead letter back to course-completed`);
  await runUntilCaughtUp(broker, "search", names.completions, (s) => search.run(2, s));
  const doc = search.liveState()["learner-07"]?.["phys-120"];
  checks.check(r.redriven === 1 && search.counts.applied === expected && doc !== undefined, "after the fix the redriven fact was indexed", doc ? `learner-07 phys-120 terms [${doc.terms}]` : "missing");
}

/** The notifications group (inbox, effect gate, certificate requests), then the certificate worker. */
async function notifyAndCertify(broker: Broker, pool: pg.Pool, names: Names, db: Database.Database, courses: CoursesService, expected: number, checks: Checks): Promise<Notifications> {
  const notifications = new Notifications(db, broker, names, new FakeMailer());
  await runUntilCaughtUp(broker, "notifications", names.completions, (s) => notifications.run(s));
  await printSummary("after notifications ran, before the certificate worker", broker, names, courses.relay);
  const certs = await renderCertificates(broker, names.certificates, pool, "learner-04");
  const stats = await broker.queue(names.certificates, QUEUE_CONFIG).stats();
  const sent = notifications.mailer.sent.size;
  log(`notifications: ${notifications.counts.applied} recorded, ${sent} e-mails sent; certificates: ${certs.rendered} rendered, ${stats.retries} retries after renderer timeouts`);
  checks.check(notifications.rows() === expected && sent === expected, "notifications: one notification and one e-mail per completion", `${notifications.rows()} rows, ${sent} e-mails`);
  checks.check((await count(pool, "SELECT count(*) AS n FROM certificates")) === expected && stats.retries >= 1 && stats.deadLettered === 0, "certificates: one per completion, the timed-out one retried and rendered");
  return notifications;
}

/** The redriven fact reached notifications and analytics too: each inbox skips it. */
async function redrivenEverywhere(broker: Broker, pool: pg.Pool, names: Names, notifications: Notifications, search: SearchProjection, expected: number, checks: Checks): Promise<void> {
  await runUntilCaughtUp(broker, "notifications", names.completions, (s) => notifications.run(s));
  const analytics: ConsumerCounts = { applied: 0, duplicates: 0 };
  await runUntilCaughtUp(broker, "analytics", names.completions, (s) => analyticsMember(broker, pool, names.completions, { name: "member-1", signal: s, counts: analytics }));
  const certStats = await broker.queue(names.certificates, QUEUE_CONFIG).stats();
  log(`notifications: ${notifications.counts.duplicates} duplicate skipped; analytics: ${analytics.duplicates} duplicate skipped; certificate enqueue deduplicated (queue backlog ${certStats.depth})`);
  checks.check(notifications.counts.duplicates === 1 && notifications.rows() === expected && [...notifications.mailer.sent.values()].every((n) => n === 1), "notifications: the redriven fact was a duplicate, no second e-mail");
  checks.check(analytics.duplicates === 1 && analytics.applied === 0 && (await analyticsTotals(pool)).completions === expected, "analytics: the redriven fact was a duplicate");
  checks.check(certStats.depth === 0 && (await count(pool, "SELECT count(*) AS n FROM certificates")) === expected, "certificates: no second job for the redriven fact");
  const inboxes: [string, number][] = [["notifications (SQLite)", notifications.processed()], ["search (SQLite)", search.processed()]];
  for (const consumer of ["analytics", "certificates"]) inboxes.push([`${consumer} (PostgreSQL)`, await count(pool, `SELECT count(*) AS n FROM processed_messages WHERE consumer_name = '${consumer}'`)]);
  for (const [name, n] of inboxes) checks.check(n === expected, `inbox ${name}: every completion processed once`, `${n} of ${expected}`);
}

async function scenario(broker: Broker, pool: pg.Pool, names: Names, schema: string, childUrl: () => Promise<string>, checks: Checks): Promise<void> {
  const dir = dataDir();
  await broker.createTopic(names.completions, { partitions: 4, retentionMs: -1 });
  await broker.createTopic(names.searchDlq, { partitions: 1, retentionMs: -1 });
  const courses = new CoursesService(pool, broker, names);
  const notificationsDb = new Database(join(dir, `notifications-${names.run}.db`));
  const searchDb = new Database(join(dir, `search-${names.run}.db`));
  try {
    await courses.init();
    await initAnalytics(pool);
    await initCertificates(pool);
    log("\n== 1. catalog: thumbnails (work queue, bounded retries, dead letters)");
    await catalog(broker, courses, names, checks);
    log("\n== 2. completions: PostgreSQL transaction + outbox, relay to the retained topic");
    const expected = await complete(broker, courses, names, checks);
    await printSummary("before the consumer groups ran", broker, names, courses.relay);

    log("\n== 3. analytics: a consumer crash (SIGKILL) and a rebalance");
    await crashAndRebalance(broker, pool, names, schema, await childUrl(), expected, checks);

    log("\n== 4. notifications (inbox + effect gate) and certificate generation (work queue)");
    const notifications = await notifyAndCertify(broker, pool, names, notificationsDb, courses, expected, checks);
    log("\n== 5. search: poison fact → dead-letter topic → fix → redrive");
    const search = new SearchProjection(searchDb, broker, names);
    await searchWithPoison(broker, search, names, expected, checks);
    log("\n== 6. the redriven fact reaches every group again: inboxes keep it from applying twice");
    await redrivenEverywhere(broker, pool, names, notifications, search, expected, checks);
    log("\n== 7. search projection rebuilt by replaying the retained topic");
    const rebuilt = await rebuildSearch(broker, names);
    const live = checksumOf(search.liveState());
    log(`search: rebuilt from ${rebuilt.records} records, checksum ${rebuilt.checksum.slice(0, 16)}…; live projection ${live.slice(0, 16)}…`);
    checks.check(rebuilt.checksum === live, "rebuilt search projection's checksum equals the live one");
    await printSummary("at the end", broker, names, courses.relay);
  } finally {
    await courses.close();
    notificationsDb.close();
    searchDb.close();
    for (const f of [`notifications-${names.run}.db`, `search-${names.run}.db`]) for (const s of ["", "-wal", "-shm"]) rmSync(join(dir, f + s), { force: true });
  }
}

async function main(): Promise<number> {
  const names = namesFor(newRunId());
  const schema = `lp_${names.run}`;
  const checks = new Checks();
  log(`learning platform, run ${names.run}: broker ${brokerUrl() ? `server ${brokerUrl()}` : `embedded in ${join(dataDir(), "broker")}`}; PostgreSQL schema ${schema}; SQLite in ${dataDir()}`);
  await createSchema(schema);
  const pool = pgPool(schema);
  const { broker, embedded } = await openTheBroker(names);
  const held: { server: ServerHandle | null } = { server: null };
  // The crash drill's child joins the group from another process: through the server we were
  // given, or through one started on our embedded broker.
  const childUrl = async (): Promise<string> => brokerUrl() ?? (held.server ??= await startServer({ broker: embedded!, port: 0, httpPort: null })).url;
  try {
    await scenario(broker, pool, names, schema, childUrl, checks);
  } catch (e) {
    checks.check(false, "the scenario ran to its end", (e as Error)?.stack ?? String(e));
  } finally {
    await held.server?.close();
    for (const t of [names.completions, names.searchDlq]) await broker.deleteTopic(t).catch(() => {});
    await broker.close();
    await pool.end();
    await dropSchema(schema);
  }
  log(`\n${checks.summary()}`);
  return checks.failures.length === 0 ? 0 : 1;
}

if (process.argv[2] === CHILD_FLAG) await childMember();
else process.exit(await main());
