// SPDX-License-Identifier: Apache-2.0
/**
 * The groups reading the orders topic, each at its own pace with its own committed offsets:
 *
 * - fraud: flags large orders; keys in parallel, each in order (processOrdered), each fact
 *   applied once (inbox in the fraud database);
 * - analytics: revenue per SKU, a batch per transaction (inbox.handleBatch);
 * - notifications: sends the order-confirmation e-mail through the effect gate (an effect
 *   ledger beside the e-mail log), so a redelivery never sends twice. Version "defective" has a
 *   bug: it suppresses the e-mails of a range of offsets (see main.ts for the repair by replay).
 */
import { EffectGate, Inbox, processOrdered, readEnvelope, sqliteDatabase, SqliteInboxStore, type Broker, type Message } from "sluice";
import type Database from "better-sqlite3";
import { TOPIC, untilCaughtUp, type OrderAccepted, type OrderFact } from "./setup.js";

const isAccepted = (msg: Message<OrderFact>): msg is Message<OrderFact> & { value: OrderAccepted } => readEnvelope(msg.headers)?.type === "OrderAccepted";

export async function runFraud(broker: Broker, db: Database.Database): Promise<void> {
  db.exec("CREATE TABLE IF NOT EXISTS fraud_flags (order_id TEXT PRIMARY KEY, total INT NOT NULL)");
  const inbox = new Inbox(new SqliteInboxStore(db), { consumer: "fraud" });
  const stop = untilCaughtUp(broker, "fraud");
  const sub = broker.subscribe<OrderFact>(TOPIC, { group: "fraud", start: "earliest", signal: stop.signal });
  await processOrdered(
    sub,
    async (msg) => {
      if (!isAccepted(msg)) return;
      await inbox.handle(msg, (tx) => {
        if (msg.value.total > 1_000) tx.prepare("INSERT INTO fraud_flags (order_id, total) VALUES (?, ?)").run(msg.value.orderId, msg.value.total);
      });
    },
    { concurrency: 4, signal: stop.signal },
  );
  await sub.close();
  await stop.done;
}

export async function runAnalytics(broker: Broker, db: Database.Database): Promise<void> {
  db.exec("CREATE TABLE IF NOT EXISTS revenue (sku TEXT PRIMARY KEY, orders INT NOT NULL, total INT NOT NULL)");
  const inbox = new Inbox(new SqliteInboxStore(db), { consumer: "analytics" });
  const stop = untilCaughtUp(broker, "analytics");
  const sub = broker.subscribe<OrderFact>(TOPIC, { group: "analytics", start: "earliest", signal: stop.signal });
  const add = db.prepare("INSERT INTO revenue (sku, orders, total) VALUES (?, 1, ?) ON CONFLICT (sku) DO UPDATE SET orders = orders + 1, total = total + excluded.total");
  for await (const batch of sub.batches({ maxMessages: 50, maxWaitMs: 10 })) {
    // One transaction per batch: the facts not seen before, and their ids, together.
    await inbox.handleBatch(batch.messages.filter(isAccepted), (_tx, fresh) => {
      for (const m of fresh) add.run(m.value.sku, m.value.total);
    });
    await batch.commit();
  }
  await stop.done;
}

/** The e-mail provider, played by a table: one row per e-mail actually sent. */
export function openMailbox(db: Database.Database): { send(to: string, orderId: string): void; sentPerOrder(): Map<string, number> } {
  db.exec("CREATE TABLE IF NOT EXISTS sent_emails (n INTEGER PRIMARY KEY AUTOINCREMENT, recipient TEXT NOT NULL, order_id TEXT NOT NULL)");
  return {
    send: (to, orderId) => void db.prepare("INSERT INTO sent_emails (recipient, order_id) VALUES (?, ?)").run(to, orderId),
    sentPerOrder: () => new Map((db.prepare("SELECT order_id, count(*) AS n FROM sent_emails GROUP BY order_id").all() as { order_id: string; n: number }[]).map((r) => [r.order_id, r.n])),
  };
}

export interface NotificationsRun {
  /** Offsets whose e-mail the defective version suppressed, per partition. */
  suppressed: Map<number, number[]>;
  performed: number;
  skipped: number;
  deferred: number;
}

/**
 * The notifications consumer. `defectiveRange` plants the bug: facts at offsets in
 * [from, to) of any partition are committed without their e-mail. In replay mode (messages
 * the group had already processed before a reset carry `msg.replay`) the gate files the
 * intended e-mail for review instead of sending: reconciliation later sends only those never sent.
 */
export async function runNotifications(broker: Broker, gate: EffectGate, mailbox: ReturnType<typeof openMailbox>, defectiveRange: { from: number; to: number } | null): Promise<NotificationsRun> {
  const run: NotificationsRun = { suppressed: new Map(), performed: 0, skipped: 0, deferred: 0 };
  const stop = untilCaughtUp(broker, "notifications");
  const sub = broker.subscribe<OrderFact>(TOPIC, { group: "notifications", start: "earliest", signal: stop.signal });
  for await (const msg of sub) {
    if (isAccepted(msg)) {
      if (defectiveRange && msg.offset >= defectiveRange.from && msg.offset < defectiveRange.to) {
        run.suppressed.set(msg.partition, [...(run.suppressed.get(msg.partition) ?? []), msg.offset]);
      } else {
        const order = msg.value;
        const r = await gate.perform(`order-confirmation:${order.orderId}`, () => mailbox.send(order.customer, order.orderId), { replay: msg.replay, intent: { to: order.customer, orderId: order.orderId } });
        if (r.outcome === "performed") run.performed++;
        else if (r.outcome === "skipped") run.skipped++;
        else if (r.outcome === "deferred") run.deferred++;
        else throw new Error(`e-mail for ${order.orderId} is uncertain: a person must check the provider`);
      }
    }
    await msg.commit();
  }
  await stop.done;
  return run;
}

export function notificationsGate(db: Database.Database): EffectGate {
  return new EffectGate(sqliteDatabase(db), { consumer: "notifications" });
}
