// SPDX-License-Identifier: Apache-2.0
/**
 * The order-fulfillment reference system, end to end (design: README.md beside this file).
 * Run: `npm run example:orders` (embedded), or with SLUICE_URL=sluice://host:port against a
 * server. PostgreSQL from SLUICE_PG_URL (default the local server); SQLite files in SLUICE_DATA.
 * It checks its own outcome and exits 1 if any check fails.
 */
import { existsSync, rmSync } from "node:fs";
import type { Broker } from "sluice";
import { check, INVENTORY_CONFIG, INVENTORY_QUEUE, openSystem, TOPIC, untilCaughtUp, type System } from "./setup.js";
import { createOrdersSchema, orderSet, placeOrder, relayUntilEmpty } from "./checkout.js";
import { notificationsGate, openMailbox, runAnalytics, runFraud, runNotifications } from "./consumers.js";
import { createFulfillmentSchema, createInventory, runCoordinator, runInventoryWorkers } from "./fulfillment.js";
import { liveChecksum, rebuild, runProjector, takeSnapshot } from "./projection.js";

const ORDERS = 30;
const OTHER_GROUPS = ["fraud", "analytics", "order-status", "fulfillment"];
const SQLITE = ["fraud", "analytics", "notifications", "mail", "inventory", "order-status"];

const sys = await openSystem();
try {
  console.log(`order fulfillment on ${sys.mode}; PostgreSQL schema ${sys.schema}; SQLite in ${sys.dataDir}`);
  await freshStart(sys);
  const db = Object.fromEntries(SQLITE.map((n) => [n, sys.sqlite(n)]));
  const { broker } = sys;

  console.log("\n1. checkout: orders and OrderAccepted facts through the PostgreSQL outbox");
  const outbox = await createOrdersSchema(sys.pg);
  const orders = orderSet(ORDERS);
  for (const o of orders.slice(0, 20)) await placeOrder(sys.pg, o);
  let relayed = await relayUntilEmpty(broker, outbox);
  for (const o of orders.slice(20)) await placeOrder(sys.pg, o);
  relayed += await relayUntilEmpty(broker, outbox); // a new relay object resumes the producer state
  await outbox.close();
  check(relayed === ORDERS && (await topicSize(broker)) === ORDERS, `${ORDERS} orders committed, each fact published once (${relayed} rows relayed)`);

  console.log("\n2. fraud, analytics, notifications (defective version) and order-status consume as separate groups");
  const mailbox = openMailbox(db.mail);
  const gate = notificationsGate(db.notifications);
  const defective = await runNotifications(broker, gate, mailbox, { from: 3, to: 6 });
  await Promise.all([runFraud(broker, db.fraud), runAnalytics(broker, db.analytics), runProjector(broker, db["order-status"])]);
  const snapshot = takeSnapshot(db["order-status"]);
  const suppressed = [...defective.suppressed.values()].flat().length;
  const flagged = count(db.fraud, "fraud_flags");
  check(flagged === orders.filter((o) => o.total > 1_000).length, `fraud flagged ${flagged} large orders`);
  check(sum(db.analytics, "SELECT sum(orders) AS n FROM revenue") === ORDERS, "analytics counted every order once");
  check(defective.performed === ORDERS - suppressed && suppressed > 0, `notifications sent ${defective.performed} e-mails; the defect suppressed ${suppressed}`);

  console.log("\n3. fulfillment: decisions, ReserveInventory commands, competing inventory workers");
  await createFulfillmentSchema(sys.pg);
  createInventory(db.inventory, { book: 40, lamp: 8, chair: 40 });
  const crashed = await runCoordinator(broker, sys.pg, { crashAfter: 12 }); // stops without committing its last 4
  const caughtUp = untilCaughtUp(broker, "fulfillment");
  const resumed = await runCoordinator(broker, sys.pg, { signal: caughtUp.signal });
  await caughtUp.done;
  const commands = crashed.sent + resumed.sent;
  const inv = await runInventoryWorkers(broker, db.inventory, 3);
  const decisions = Number((await sys.pg.query("SELECT count(*) AS n FROM fulfillment_decisions")).rows[0].n);
  check(decisions === ORDERS, `coordinator recorded ${decisions} decisions (once each, though ${commands - ORDERS} orders came again after its crash)`);
  check(commands > ORDERS && inv.duplicates === commands - ORDERS, `workers handled ${inv.handled} commands; ${inv.duplicates} duplicates got the stored result`);
  check(count(db.inventory, "reservations") === ORDERS, "one reservation per order");
  const lastJob = await broker.queue(INVENTORY_QUEUE, INVENTORY_CONFIG).getJob(resumed.jobIds.at(-1)!);
  const kept = lastJob?.result as { commandId: string; reserved: boolean } | undefined;
  const stored = kept && (db.inventory.prepare("SELECT result FROM reservations WHERE command_id = ?").get(kept.commandId) as { result: string } | undefined);
  check(lastJob?.state === "completed" && stored?.result === JSON.stringify(kept), `job ${lastJob?.id} completed; its result (${kept?.commandId}, reserved: ${kept?.reserved}) is readable by id`);
  check(stockConsistent(db.inventory, orders), "stock fell by exactly the reserved quantities");
  check((await topicSize(broker)) === 2 * ORDERS, "each reservation outcome published once (InventoryReserved / InventoryRejected)");

  console.log("\n4. the groups catch up on the reservation facts");
  const coordinatorDone = untilCaughtUp(broker, "fulfillment");
  await Promise.all([
    runFraud(broker, db.fraud),
    runAnalytics(broker, db.analytics),
    runProjector(broker, db["order-status"]),
    runNotifications(broker, gate, mailbox, null),
    runCoordinator(broker, sys.pg, { signal: coordinatorDone.signal }).then(() => coordinatorDone.done),
  ]);
  check(sum(db["order-status"], "SELECT count(*) AS n FROM order_status WHERE version = 2") === ORDERS, "order-status shows every order reserved or rejected");

  console.log("\n5. repair the notifications defect: reset that group alone to the start of the range, replay, reconcile");
  const before = await committedOffsets(broker, OTHER_GROUPS);
  const start = Object.fromEntries([...defective.suppressed].map(([p, offs]) => [p, Math.min(...offs)]));
  const plan = await broker.resetGroup("notifications", TOPIC, { partitions: start }, { dryRun: true });
  console.log(`  dry run: ${plan.partitions.map((p) => `p${p.partition} ${p.previous} -> ${p.next}`).join(", ")}`);
  await broker.resetGroup("notifications", TOPIC, { partitions: start });
  const replayed = await runNotifications(broker, gate, mailbox, null);
  check(replayed.performed === 0 && replayed.deferred === suppressed, `replay performed nothing new; filed ${replayed.deferred} e-mails for review, skipped ${replayed.skipped} already sent`);
  const rec = await gate.reconcile((e) => {
    const { to, orderId } = e.intent as { to: string; orderId: string };
    mailbox.send(to, orderId);
  });
  check(rec.released === suppressed, `reconciliation sent the ${rec.released} e-mails never sent`);
  const sent = mailbox.sentPerOrder();
  check(orders.every((o) => sent.get(o.orderId) === 1), "every order has exactly one confirmation e-mail");
  check(JSON.stringify(await committedOffsets(broker, OTHER_GROUPS)) === JSON.stringify(before), "other groups' offsets untouched");

  console.log("\n6. rebuild the order-status projection from its snapshot plus replay");
  const live = liveChecksum(db["order-status"]);
  db["order-status"].close();
  for (const suffix of ["", "-wal", "-shm"]) rmSync(sys.sqlitePath("order-status") + suffix, { force: true });
  const rebuilt = await rebuild(broker, sys.sqlite("order-status"), snapshot);
  check(rebuilt.gaps === 0, `replayed ${rebuilt.replayed} records after the snapshot; every order's versions contiguous`);
  check(rebuilt.checksum === live, `rebuilt checksum ${rebuilt.checksum.slice(0, 12)} equals the live one`);

  await printSummary(broker);
  console.log("\norder fulfillment: all checks passed");
} catch (e) {
  console.error(e instanceof Error ? e.message : e);
  process.exitCode = 1;
} finally {
  await sys.close();
}

/** A run starts from nothing: this example's topic, queue and SQLite files from a former run go. */
async function freshStart(s: System): Promise<void> {
  if ((await s.broker.listTopics()).includes(TOPIC)) await s.broker.deleteTopic(TOPIC);
  await s.broker.createTopic(TOPIC, { partitions: 4 });
  await s.broker.queue(INVENTORY_QUEUE, INVENTORY_CONFIG).purge();
  for (const n of SQLITE) for (const suffix of ["", "-wal", "-shm"]) if (existsSync(s.sqlitePath(n) + suffix)) rmSync(s.sqlitePath(n) + suffix);
}

async function topicSize(broker: Broker): Promise<number> {
  return (await broker.describeTopic(TOPIC)).partitions.reduce((n, p) => n + p.highWatermark - p.logStartOffset, 0);
}

async function committedOffsets(broker: Broker, groups: string[]): Promise<Record<string, (number | null)[]>> {
  const out: Record<string, (number | null)[]> = {};
  for (const g of groups) out[g] = (await broker.groupLag(g, TOPIC)).partitions.map((p) => p.committedOffset);
  return out;
}

function count(db: import("better-sqlite3").Database, table: string): number {
  return sum(db, `SELECT count(*) AS n FROM ${table}`);
}
function sum(db: import("better-sqlite3").Database, sql: string): number {
  return Number((db.prepare(sql).get() as { n: number | null }).n ?? 0);
}

function stockConsistent(db: import("better-sqlite3").Database, orders: ReturnType<typeof orderSet>): boolean {
  const initial: Record<string, number> = { book: 40, lamp: 8, chair: 40 };
  const reserved = db.prepare("SELECT order_id FROM reservations WHERE json_extract(result, '$.reserved') = 1").all() as { order_id: string }[];
  for (const r of reserved) {
    const o = orders.find((x) => x.orderId === r.order_id)!;
    initial[o.sku] -= o.quantity;
  }
  const stock = db.prepare("SELECT sku, available FROM stock").all() as { sku: string; available: number }[];
  return stock.every((s) => s.available === initial[s.sku] && s.available >= 0);
}

async function printSummary(broker: Broker): Promise<void> {
  console.log("\nbacklog, oldest age and lag");
  console.log("  group           lag records  lag ms");
  for (const g of [...OTHER_GROUPS, "notifications"]) {
    const lag = await broker.groupLag(g, TOPIC);
    console.log(`  ${g.padEnd(15)} ${String(lag.totalRecords).padStart(11)}  ${String(lag.maxLagMs).padStart(6)}`);
  }
  const s = await broker.queue(INVENTORY_QUEUE, INVENTORY_CONFIG).stats();
  console.log(`  queue ${INVENTORY_QUEUE}: depth ${s.depth}, completed ${s.completed}, dead-lettered ${s.deadLettered}, oldest waiting ${s.oldestWaitingAgeMs} ms`);
}
