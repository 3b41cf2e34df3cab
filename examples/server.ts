// Server mode: the same Broker API over the network. In production the server is
// `npx sluice serve --data ./data`; this file starts one in-process (on a free port) so it
// runs on its own. Run: node dist/examples/server.js
import { openBroker, connect } from "sluice";
import { startServer } from "sluice/server";

await using embedded = await openBroker({ dataDir: process.env.SLUICE_DATA ?? "./data/example-server" });
const server = await startServer({ broker: embedded, port: 0, httpPort: null });

try {
  // The only line that changes between embedded and server mode:
  await using broker = await connect({ url: process.env.SLUICE_URL ?? server.url });

  if (!(await broker.listTopics()).includes("clicks")) await broker.createTopic("clicks", { partitions: 2 });
  const r = await broker.publish("clicks", { page: "/pricing" }, { key: "visitor-1" });
  console.log(`published over the network to ${r.partition}@${r.offset}`);

  await using sub = broker.subscribe<{ page: string }>("clicks", { group: "analytics", start: "earliest" });
  for await (const msg of sub) {
    console.log(`received ${msg.value.page} from ${msg.partition}@${msg.offset}`);
    await msg.commit();
    if ((await broker.groupLag("analytics", "clicks")).totalRecords === 0) break;
  }

  const jobs = broker.queue<{ n: number }>("thumbnails");
  await jobs.enqueue({ n: 1 });
  const ac = new AbortController();
  for await (const job of jobs.work({ signal: ac.signal })) {
    console.log(`job ${job.data.n} leased by this connection; acking`);
    await job.ack();
    ac.abort();
  }
} finally {
  await server.close();
}
