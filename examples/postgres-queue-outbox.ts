// Queues in PostgreSQL, and a job enqueued in the same transaction as the row it is about.
// Run: node dist/examples/postgres-queue-outbox.js
//   (PostgreSQL: $SLUICE_PG_URL or postgres://postgres@127.0.0.1:5432/postgres; schema sluice_example_jobs)
import pg from "pg";
import { openBroker } from "sluice";
import { postgresEngine } from "sluice/postgres";

const url = process.env.SLUICE_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
await using broker = await openBroker({ engine: postgresEngine({ connectionString: url, schema: "sluice_example_jobs" }) });
const emails = broker.queue<{ userId: string }>("welcome-emails");
await emails.stats().catch(() => {}); // opened before any transaction uses it

const pool = new pg.Pool({ connectionString: url });
await pool.query("CREATE TABLE IF NOT EXISTS sluice_example_jobs.users (id text PRIMARY KEY)");

/** Inserts the user and enqueues its welcome email in one transaction; commits or rolls back. */
async function signUp(userId: string, commit: boolean): Promise<string> {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await client.query("INSERT INTO sluice_example_jobs.users (id) VALUES ($1)", [userId]);
    const job = await emails.enqueue({ userId }, { transaction: client });
    await client.query(commit ? "COMMIT" : "ROLLBACK");
    return job.id;
  } catch (e) {
    await client.query("ROLLBACK");
    throw e;
  } finally {
    client.release();
  }
}

// The user row and its job commit together, or neither does.
const id = `user-${Date.now()}`;
await signUp(`${id}-abandoned`, false); // rolled back: no user, no job, no job id used
const jobId = await signUp(id, true);
console.log(`user ${id} stored, welcome email queued as job ${jobId}`);

// Workers see the job once the transaction committed.
const stop = new AbortController();
await emails.process(
  async (job) => {
    console.log("sending welcome email to", job.data.userId);
    if (job.data.userId === id) stop.abort();
  },
  { signal: stop.signal },
);
await pool.end();
