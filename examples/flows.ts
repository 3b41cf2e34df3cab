// Flows and tenant groups: a parent job runs once all its children finished, with their
// results; one tenant's burst does not hold up another's jobs.
// Run: node dist/examples/flows.js  (data dir: $SLUICE_DATA or ./data/example-flows)
import { openBroker } from "sluice";

await using broker = await openBroker({ dataDir: process.env.SLUICE_DATA ?? "./data/example-flows" });

type Step = { step: "render"; page: number } | { step: "publish"; report: string };
const reports = broker.queue<Step>("reports", { groupConcurrency: 2 }); // ≤ 2 jobs of one tenant at once

// One durable write for the whole tree: the parent waits (state "waiting-children") until
// every child finished.
const flow = await reports.enqueueFlow({
  data: { step: "publish", report: "q3" },
  group: "tenant-a",
  children: [1, 2, 3].map((page) => ({ data: { step: "render", page }, group: "tenant-a" })),
});
console.log(`stored a flow: parent ${flow.id}, children ${flow.children.map((c) => c.id).join(", ")}`);
console.log(`parent is ${(await reports.getJob(flow.id))?.state}`);

const done = new AbortController();
await reports.process(
  async (job) => {
    if (job.data.step === "render") return `page ${job.data.page} rendered`; // the child's result
    const pages = await job.childResults(); // every child has finished by now
    console.log(`publishing ${job.data.report} from:`, Object.values(pages).map((p) => p.result));
    done.abort();
  },
  { concurrency: 4, signal: done.signal },
);
