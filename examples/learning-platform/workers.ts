// SPDX-License-Identifier: Apache-2.0
/**
 * The two work queues. Both retry a failed job a bounded number of times with backoff, then move
 * it to the queue's dead-letter queue with its attempt history:
 * - thumbnail: renders course artwork; a corrupt upload fails every attempt and is dead-lettered.
 * - certificate-generation: renders a learner's certificate into PostgreSQL through an inbox
 *   (a job delivered twice, e.g. after a lost lease, writes one certificate); the renderer times
 *   out once for one learner, and the retry succeeds.
 */
import type pg from "pg";
import { Inbox, PgInboxStore, type Broker, type QueueConfig } from "sluice";
import { waitFor } from "./runtime.js";

export const QUEUE_CONFIG: QueueConfig = {
  maxAttempts: 3,
  backoff: { type: "fixed", minDelayMs: 25 },
  visibilityTimeoutMs: 10_000,
  dedupeWindowMs: 3_600_000,
};

export interface WorkerCounts {
  rendered: number;
  attempts: number;
  duplicates: number;
}

/** Works the thumbnail queue until it is empty (done or dead-lettered). */
export async function renderThumbnails(broker: Broker, queueName: string): Promise<WorkerCounts> {
  const queue = broker.queue<{ courseId: string; image: string }>(queueName, QUEUE_CONFIG);
  const counts: WorkerCounts = { rendered: 0, attempts: 0, duplicates: 0 };
  const ac = new AbortController();
  const working = queue.process(
    async (job) => {
      counts.attempts++;
      if (job.data.image.endsWith(".corrupt")) throw new Error(`cannot decode ${job.data.image}: truncated image data`);
      counts.rendered++;
    },
    { concurrency: 2, signal: ac.signal, codeVersion: "thumbnailer-1" },
  );
  try {
    await waitFor(async () => (await queue.stats()).depth === 0, `queue ${queueName} to drain`);
  } finally {
    ac.abort();
    await working;
  }
  return counts;
}

export interface CertificateJob {
  learnerId: string;
  courseId: string;
  courseTitle: string;
}

export async function initCertificates(pool: pg.Pool): Promise<void> {
  await pool.query("CREATE TABLE IF NOT EXISTS certificates (learner_id text, course_id text, title text NOT NULL, PRIMARY KEY (learner_id, course_id))");
}

/** Works the certificate queue until `expected` certificates exist and the queue is empty. */
export async function renderCertificates(broker: Broker, queueName: string, pool: pg.Pool, flakyLearner: string): Promise<WorkerCounts> {
  const queue = broker.queue<CertificateJob>(queueName, QUEUE_CONFIG);
  const inbox = new Inbox(new PgInboxStore(pool), { consumer: "certificates" });
  const counts: WorkerCounts = { rendered: 0, attempts: 0, duplicates: 0 };
  const ac = new AbortController();
  const working = queue.process(
    async (job) => {
      counts.attempts++;
      // The PDF renderer times out on the first attempt for one learner: a transient failure.
      if (job.data.learnerId === flakyLearner && job.attempt === 1) throw new Error("PDF renderer timed out");
      const r = await inbox.handle(job, (c) => c.query("INSERT INTO certificates (learner_id, course_id, title) VALUES ($1, $2, $3)", [job.data.learnerId, job.data.courseId, job.data.courseTitle]));
      if (r.duplicate) counts.duplicates++;
      else counts.rendered++;
    },
    { concurrency: 4, signal: ac.signal, codeVersion: "certificates-1" },
  );
  try {
    await waitFor(async () => (await queue.stats()).depth === 0, `queue ${queueName} to drain`);
  } finally {
    ac.abort();
    await working;
  }
  return counts;
}
