// SPDX-License-Identifier: Apache-2.0
/**
 * Fulfillment. The coordinator (group "fulfillment") reads OrderAccepted, records its decision
 * in PostgreSQL through the inbox, and sends a ReserveInventory command with a *stable* command
 * id (`reserve:<order id>`) to the inventory queue. It sends the command again on every
 * delivery, duplicates included: a crash between the decision and the send must not lose the
 * command, and the stable id makes a second send harmless.
 *
 * Inventory workers compete for the queue. The handler stores the command id with its result
 * and the InventoryReserved / InventoryRejected fact (an outbox row) in one SQLite transaction;
 * a command id seen before returns the stored result and changes nothing.
 */
import { addToOutbox, causedBy, Inbox, OutboxRelay, PgInboxStore, readEnvelope, SQLITE_OUTBOX_SCHEMA, SqliteOutboxStore, type Broker, type Job, type Queue } from "sluice";
import type Database from "better-sqlite3";
import type pg from "pg";
import { INVENTORY_CONFIG, INVENTORY_QUEUE, TOPIC, type OrderAccepted, type OrderFact } from "./setup.js";

export interface ReserveInventory {
  commandId: string;
  orderId: string;
  sku: string;
  quantity: number;
}
export interface ReservationResult {
  commandId: string;
  reserved: boolean;
  remaining: number;
}

export async function createFulfillmentSchema(pool: pg.Pool): Promise<void> {
  await pool.query("CREATE TABLE IF NOT EXISTS fulfillment_decisions (order_id TEXT PRIMARY KEY, command_id TEXT NOT NULL, decided_at BIGINT NOT NULL)");
}

/**
 * The coordinator. `crashAfter`: the member stops without committing its last messages after
 * this many (a crash between the command send and the commit); the next member gets them again.
 * Returns the commands sent.
 */
export async function runCoordinator(broker: Broker, pool: pg.Pool, opts: { crashAfter?: number; signal?: AbortSignal }): Promise<{ sent: number; jobIds: string[] }> {
  const inbox = new Inbox(new PgInboxStore(pool), { consumer: "fulfillment" });
  const inventory = broker.queue<ReserveInventory>(INVENTORY_QUEUE, INVENTORY_CONFIG);
  const sub = broker.subscribe<OrderFact>(TOPIC, { group: "fulfillment", start: "earliest", signal: opts.signal });
  let sent = 0;
  let handled = 0;
  const jobIds: string[] = [];
  for await (const msg of sub) {
    const env = readEnvelope(msg.headers);
    if (env?.type === "OrderAccepted") {
      const order = msg.value as OrderAccepted;
      const commandId = `reserve:${order.orderId}`;
      await inbox.handle(msg, (tx) => tx.query("INSERT INTO fulfillment_decisions (order_id, command_id, decided_at) VALUES ($1, $2, $3)", [order.orderId, commandId, Date.now()]));
      const cmd: ReserveInventory = { commandId, orderId: order.orderId, sku: order.sku, quantity: order.quantity };
      const job = await inventory.enqueue(cmd, { key: order.sku, headers: causedBy(env, { type: "ReserveInventory", kind: "command", messageId: commandId }) });
      jobIds.push(job.id);
      sent++;
    }
    handled++;
    // The planted crash: the last few messages were acted on but never committed.
    if (opts.crashAfter !== undefined && handled >= opts.crashAfter) break;
    if (opts.crashAfter === undefined || handled < opts.crashAfter - 3) await msg.commit();
  }
  await sub.close();
  return { sent, jobIds };
}

export function createInventory(db: Database.Database, stock: Record<string, number>): void {
  db.exec(`CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INT NOT NULL);
           CREATE TABLE IF NOT EXISTS reservations (command_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, result TEXT NOT NULL)`);
  db.exec(SQLITE_OUTBOX_SCHEMA);
  for (const [sku, n] of Object.entries(stock)) db.prepare("INSERT INTO stock (sku, available) VALUES (?, ?) ON CONFLICT DO NOTHING").run(sku, n);
}

export interface InventoryCounters {
  handled: number;
  duplicates: number;
}

/** One inventory worker's handler: stored result on duplicates, else reserve + fact, one transaction. */
export function inventoryHandler(db: Database.Database, counters: InventoryCounters): (job: Job<ReserveInventory>) => ReservationResult {
  const reserve = db.transaction((cmd: ReserveInventory): ReservationResult => {
    const seen = db.prepare("SELECT result FROM reservations WHERE command_id = ?").get(cmd.commandId) as { result: string } | undefined;
    if (seen) {
      counters.duplicates++;
      return JSON.parse(seen.result) as ReservationResult;
    }
    const row = db.prepare("SELECT available FROM stock WHERE sku = ?").get(cmd.sku) as { available: number };
    const reserved = row.available >= cmd.quantity;
    const remaining = reserved ? row.available - cmd.quantity : row.available;
    if (reserved) db.prepare("UPDATE stock SET available = ? WHERE sku = ?").run(remaining, cmd.sku);
    const result: ReservationResult = { commandId: cmd.commandId, reserved, remaining };
    db.prepare("INSERT INTO reservations (command_id, order_id, result) VALUES (?, ?, ?)").run(cmd.commandId, cmd.orderId, JSON.stringify(result));
    const fact: OrderFact = { orderId: cmd.orderId, commandId: cmd.commandId, reserved };
    addToOutbox(db, { aggregateType: "order", aggregateId: cmd.orderId, type: reserved ? "InventoryReserved" : "InventoryRejected", messageId: `reserved:${cmd.commandId}`, payload: fact });
    return result;
  });
  return (job) => {
    counters.handled++;
    return reserve(job.data);
  };
}

/** Competing workers until the queue is empty (each handler's return value is kept as the job's result), then the inventory outbox relayed to the topic. */
export async function runInventoryWorkers(broker: Broker, db: Database.Database, workers: number): Promise<InventoryCounters> {
  const counters: InventoryCounters = { handled: 0, duplicates: 0 };
  const q: Queue<ReserveInventory> = broker.queue<ReserveInventory>(INVENTORY_QUEUE, INVENTORY_CONFIG);
  const ac = new AbortController();
  const running = Array.from({ length: workers }, (_, i) => q.process(inventoryHandler(db, counters), { concurrency: 2, signal: ac.signal, consumerId: `inventory-${i}` }));
  try {
    const started = Date.now();
    for (;;) {
      const s = await q.stats();
      if (s.depth === 0) break;
      if (Date.now() - started > 30_000) throw new Error(`inventory queue not drained within 30 s (depth ${s.depth})`);
      await new Promise((r) => setTimeout(r, 20));
    }
  } finally {
    ac.abort(); // the workers finish the jobs in hand, then stop
    await Promise.all(running);
  }
  const outbox = new SqliteOutboxStore(db);
  const relay = new OutboxRelay(broker, outbox, { topic: TOPIC, name: "inventory-relay" });
  while ((await relay.runOnce()) > 0);
  return counters;
}
