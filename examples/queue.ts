// A durable work queue: enqueue, work with ack / nack / extend, and the callback form.
// Run: node dist/examples/queue.js  (data dir: $SLUICE_DATA or ./data/example-queue)
import { openBroker, PermanentError } from "sluice";

await using broker = await openBroker({ dataDir: process.env.SLUICE_DATA ?? "./data/example-queue" });

const emails = broker.queue<{ to: string; template: string }>("emails", {
  visibilityTimeoutMs: 30_000,
  maxAttempts: 5,
  backoff: { type: "exponential", minDelayMs: 1_000, maxDelayMs: 60_000 },
  deadLetter: "emails.dlq",
  dedupeWindowMs: 3_600_000, // a dedupeId repeated within an hour returns the first job's id
});

const enqueued = [
  await emails.enqueue({ to: "ada@example.com", template: "welcome" }, { key: "ada", dedupeId: "welcome:ada" }),
  await emails.enqueue({ to: "bob@example.com", template: "welcome" }, { key: "bob" }),
  await emails.enqueue({ to: "nobody", template: "welcome" }),
];
// Within the dedupe window a repeated dedupeId stores nothing: `duplicate`, with the first job's id.
const fresh = enqueued.filter((r) => !r.duplicate).length;

// Iterator form: leases, explicit settlement. At most `prefetch` unsettled jobs reach the loop.
// An ack need not be awaited: the worker keeps at most `maxPendingSettlements` (default 1000)
// acks in flight, and the loop ends (break, signal, close) only once each is durable. A failed
// ack means the lease was lost: the job is delivered again (at least once).
const ac = new AbortController();
let handled = 0;
for await (const job of emails.work({ prefetch: 8, signal: ac.signal })) {
  if (!job.data.to.includes("@")) {
    await job.nack({ requeue: false, reason: "invalid address" }); // straight to emails.dlq
  } else {
    if (job.data.template === "monthly-report") await job.extend(60_000); // a long step ahead: push the lease out (durable: one fdatasync)
    console.log(`sent ${job.data.template} to ${job.data.to} (attempt ${job.attempt})`);
    void job.ack(); // made durable in the background, many acks per fdatasync
  }
  if (++handled === fresh) ac.abort();
}

// Callback form: return = ack, throw = retry with backoff, throw PermanentError = dead-letter.
await emails.enqueue({ to: "cy@example.com", template: "reset" });
const done = new AbortController();
await emails.process(
  async (job) => {
    if (job.data.to === "nobody") throw new PermanentError("no such user");
    console.log(`processed ${job.data.template} for ${job.data.to}`);
    done.abort();
  },
  { concurrency: 4, signal: done.signal },
);

const stats = await emails.stats();
console.log(`emails: ${stats.completed} completed, ${stats.deadLettered} dead-lettered, depth ${stats.depth}`);
