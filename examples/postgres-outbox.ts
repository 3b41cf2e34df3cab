// Topics in PostgreSQL, and a record published in the same transaction as the row it announces.
// Run: node dist/examples/postgres-outbox.js
//   (PostgreSQL: $SLUICE_PG_URL or postgres://postgres@127.0.0.1:5432/postgres; schema sluice_example)
import pg from "pg";
import { openBroker } from "sluice";
import { postgresEngine } from "sluice/postgres";

const url = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
await using broker = await openBroker({ engine: postgresEngine({ connectionString: url, schema: "sluice_example" }) });
if (!(await broker.listTopics()).includes("orders")) await broker.createTopic("orders", { partitions: 2 });

const pool = new pg.Pool({ connectionString: url });
await pool.query("CREATE TABLE IF NOT EXISTS sluice_example.orders (id text PRIMARY KEY, total numeric NOT NULL)");

// The order row and its event commit together, or neither does.
const id = `order-${Date.now()}`;
const client = await pool.connect();
try {
  await client.query("BEGIN");
  await client.query("INSERT INTO sluice_example.orders (id, total) VALUES ($1, $2)", [id, 42]);
  const receipt = await broker.publish("orders", { id, total: 42 }, { key: id, transaction: client });
  await client.query("COMMIT");
  console.log(`order ${id} stored and published at ${receipt.partition}:${receipt.offset}`);
} catch (e) {
  await client.query("ROLLBACK");
  throw e;
} finally {
  client.release();
}

// Consumers read it like any other record.
for await (const msg of broker.subscribe<{ id: string; total: number }>("orders", { group: `example-${id}`, start: "earliest" })) {
  if (msg.value.id !== id) continue;
  console.log("consumed", msg.value);
  await msg.commit();
  break;
}
await pool.end();
