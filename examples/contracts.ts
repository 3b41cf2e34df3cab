// SPDX-License-Identifier: Apache-2.0
/**
 * Consumer contracts (docs/patterns.md): an order service writes an order and its
 * OrderAccepted fact in one SQLite transaction (the outbox); the relay publishes it exactly
 * once; a billing consumer applies each fact once through the inbox, keys in parallel and in
 * order per key. Run: `node dist/examples/contracts.js` (data in $SLUICE_DATA or ./data).
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import { mkdirSync } from "node:fs";
import { addToOutbox, Inbox, openBroker, OutboxRelay, processOrdered, SchemaRegistry, SqliteInboxStore, SqliteOutboxStore } from "sluice";

const dataDir = process.env.SLUICE_DATA ?? "./data";
mkdirSync(dataDir, { recursive: true });

// Schemas: every OrderAccepted published to "orders" is checked before it is written.
const schemas = new SchemaRegistry();
schemas.topic("orders").add("OrderAccepted", 1, {
  type: "object",
  properties: { orderId: { type: "string" }, customer: { type: "string" }, total: { type: "integer", minimum: 0 } },
  required: ["orderId", "customer", "total"],
});

await using broker = await openBroker({ dataDir: join(dataDir, "broker"), schemas });
if (!(await broker.listTopics()).includes("orders")) await broker.createTopic("orders", { partitions: 4 });

// The order service: the order row and its outbox row commit together, or neither does.
const app = new Database(join(dataDir, "orders.db"));
app.pragma("journal_mode = WAL");
app.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT, total INTEGER)");
const outbox = new SqliteOutboxStore(app);
await outbox.ensureSchema();
const run = Date.now().toString(36);
const placeOrder = app.transaction((id: string, customer: string, total: number) => {
  app.prepare("INSERT INTO orders (id, customer, total) VALUES (?, ?, ?)").run(id, customer, total);
  addToOutbox(app, { aggregateType: "order", aggregateId: customer, type: "OrderAccepted", payload: { orderId: id, customer, total } });
});
for (let i = 0; i < 12; i++) placeOrder(`o-${run}-${i}`, `customer-${i % 3}`, 10 * (i + 1));

// The relay: publishes each outbox row once, keyed by customer (one customer's orders stay in order).
const relay = new OutboxRelay(broker, outbox, { topic: "orders" });
while ((await relay.runOnce()) > 0);

// Billing: each OrderAccepted applied once (inbox), customers in parallel, each in order.
const ledger = new Database(join(dataDir, "billing.db"));
ledger.exec("CREATE TABLE IF NOT EXISTS charges (order_id TEXT PRIMARY KEY, customer TEXT, total INTEGER)");
const inbox = new Inbox(new SqliteInboxStore(ledger), { consumer: "billing" });
const ac = new AbortController();
const backlog = (await broker.groupLag("billing", "orders")).totalRecords; // this demo stops once caught up
const sub = broker.subscribe<{ orderId: string; customer: string; total: number }>("orders", { group: "billing", start: "earliest", signal: ac.signal });
let charged = 0;
let seen = 0;
await processOrdered(
  sub,
  async (msg) => {
    const r = await inbox.handle(msg, (db) => db.prepare("INSERT INTO charges (order_id, customer, total) VALUES (?, ?, ?)").run(msg.value.orderId, msg.value.customer, msg.value.total));
    if (!r.duplicate) charged++;
    if (++seen === backlog) ac.abort(); // a service would keep running
  },
  { concurrency: 8, signal: ac.signal },
);
await sub.close();
const total = (ledger.prepare("SELECT count(*) AS n FROM charges").get() as { n: number }).n;
console.log(`published ${relay.publishedRows} outbox rows; billing charged ${charged} new orders (${total} in its ledger)`);
app.close();
ledger.close();
