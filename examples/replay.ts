// A durable log: rebuild state by replaying history, then seek by time.
// Run: node dist/examples/replay.js  (data dir: $SLUICE_DATA or ./data/example-replay)
import { openBroker } from "sluice";

await using broker = await openBroker({ dataDir: process.env.SLUICE_DATA ?? "./data/example-replay" });
if (!(await broker.listTopics()).includes("balances")) await broker.createTopic("balances", { partitions: 1 });

const start = Date.now();
for (const [account, delta] of [["a", 10], ["b", 5], ["a", -3], ["c", 1], ["b", 2]] as const) {
  await broker.publish("balances", { account, delta }, { key: account, partition: 0 });
}

// Replay from the beginning of retained history to rebuild the state.
const state = new Map<string, number>();
const { partitions } = await broker.describeTopic("balances");
let offset = partitions[0].logStartOffset;
for (;;) {
  const batch = await broker.fetch("balances", 0, offset, { maxBytes: 1 << 20 });
  for (const r of batch.records) {
    const { account, delta } = r.value as { account: string; delta: number };
    state.set(account, (state.get(account) ?? 0) + delta);
  }
  if (batch.nextOffset >= batch.highWatermark) break;
  offset = batch.nextOffset;
}
console.log("rebuilt:", Object.fromEntries(state));

// Seek by time: the first offset written at or after `start` (this run's records).
console.log("this run starts at offset", await broker.offsetForTimestamp("balances", 0, start));
