// SPDX-License-Identifier: Apache-2.0
/**
 * Checkout: an order row and its OrderAccepted fact commit in one PostgreSQL transaction (the
 * transactional outbox), so there is never an order without its fact or a fact without its
 * order. The relay publishes outbox rows to the orders topic keyed by order id, as an
 * idempotent producer whose state lives in the same database: killed anywhere, it never
 * publishes a row twice (OUTBOX-1).
 */
import { addToOutboxPg, OutboxRelay, PgOutboxStore, type Broker } from "sluice";
import type pg from "pg";
import { TOPIC, type OrderAccepted } from "./setup.js";

export async function createOrdersSchema(pool: pg.Pool): Promise<PgOutboxStore> {
  await pool.query("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, sku TEXT NOT NULL, quantity INT NOT NULL, total INT NOT NULL)");
  const outbox = new PgOutboxStore(pool);
  await outbox.ensureSchema();
  return outbox;
}

/** One checkout: the order and its fact, one transaction. */
export async function placeOrder(pool: pg.Pool, order: OrderAccepted): Promise<void> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    await c.query("INSERT INTO orders (id, customer, sku, quantity, total) VALUES ($1, $2, $3, $4, $5)", [order.orderId, order.customer, order.sku, order.quantity, order.total]);
    // Keyed by order id: every fact about one order lands in one partition, in order.
    await addToOutboxPg(c, { aggregateType: "order", aggregateId: order.orderId, type: "OrderAccepted", messageId: `order-accepted:${order.orderId}`, payload: order });
    await c.query("COMMIT");
  } catch (e) {
    await c.query("ROLLBACK");
    throw e;
  } finally {
    c.release();
  }
}

/** The deterministic order set of this run: customers, SKUs and totals (a few above the fraud threshold). */
export function orderSet(n: number): OrderAccepted[] {
  const skus = ["book", "lamp", "chair"];
  return Array.from({ length: n }, (_, i) => ({
    orderId: `o-${String(i).padStart(3, "0")}`,
    customer: `c-${i % 7}`,
    sku: skus[i % skus.length],
    quantity: 1 + (i % 3),
    total: i % 10 === 9 ? 1_500 : 20 * (1 + (i % 13)),
  }));
}

/**
 * Runs the relay (woken by LISTEN/NOTIFY) until the outbox is empty; a service runs it for
 * good. A relay that is stopped and started again (as here, between the two halves of the
 * orders) resumes from the producer state in the database.
 */
export async function relayUntilEmpty(broker: Broker, outbox: PgOutboxStore): Promise<number> {
  const relay = new OutboxRelay(broker, outbox, { topic: TOPIC, name: "orders-relay", idleWaitMs: 50 });
  const ac = new AbortController();
  const running = relay.run(ac.signal);
  const started = Date.now();
  while ((await relay.backlog()).rows > 0) {
    if (Date.now() - started > 30_000) throw new Error("outbox relay did not drain within 30 s");
    await new Promise((r) => setTimeout(r, 20));
  }
  ac.abort();
  await running;
  return relay.publishedRows;
}
