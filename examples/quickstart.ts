// Publish to a topic, consume it as a consumer group, commit, check lag.
// Run: node dist/examples/quickstart.js  (data dir: $SLUICE_DATA or ./data/example-quickstart)
import { openBroker } from "sluice";

await using broker = await openBroker({ dataDir: process.env.SLUICE_DATA ?? "./data/example-quickstart" });

if (!(await broker.listTopics()).includes("orders")) {
  await broker.createTopic("orders", { partitions: 4, retentionMs: 7 * 86_400_000 });
}

// Same key → same partition → ordered. The ack means the record is on disk (fdatasync).
const receipt = await broker.publish("orders", { id: "o-1", total: 42 }, { key: "customer-7", headers: { source: "web" } });
console.log(`stored at partition ${receipt.partition}, offset ${receipt.offset}`);

await broker.publishBatch("orders", [
  { key: "customer-8", value: { id: "o-2", total: 7 } },
  { key: "customer-7", value: { id: "o-3", total: 13 } },
]);

// A consumer group: `start` applies only when the group has no committed offset yet.
await using sub = broker.subscribe<{ id: string; total: number }>("orders", { group: "billing", start: "earliest" });
let billed = 0;
for await (const msg of sub) {
  console.log(`billing ${msg.value.id} (${msg.value.total}) from ${msg.partition}@${msg.offset}`);
  // "Processed through this message" (no +1 arithmetic). Commits made while an offsets write
  // is in flight share the next one: no await needed; `await` it to wait until it is durable.
  void msg.commit();
  if (++billed === 3) break; // leaving the loop closes the subscription, which writes the commits
}

const lag = await broker.groupLag("billing", "orders");
console.log(`lag: ${lag.totalRecords} records, ${lag.maxLagMs} ms`);
