// SPDX-License-Identifier: Apache-2.0
/**
 * The courses service, on PostgreSQL: it publishes courses (each one's thumbnail is rendered by
 * a work queue) and records course completions. A completion row and its CourseCompleted fact
 * are written in ONE transaction (the transactional outbox): a rolled-back completion is never
 * announced, a committed one always is, exactly once, by the OutboxRelay, keyed by learner (so
 * one learner's facts stay in order on one partition of the retained topic).
 */
import type pg from "pg";
import { addToOutboxPg, OutboxRelay, PgOutboxStore, type Broker } from "sluice";
import type { Completion, Names } from "./runtime.js";
import { QUEUE_CONFIG } from "./workers.js";

export interface Course {
  id: string;
  title: string;
  /** Uploaded artwork; "corrupt" ones fail every thumbnail attempt. */
  image: string;
}

export const COURSES: Course[] = [
  { id: "ts-101", title: "TypeScript Foundations", image: "ts-101.png" },
  { id: "sql-201", title: "Relational Modelling", image: "sql-201.png" },
  { id: "ops-110", title: "Running Services Safely", image: "ops-110.png" },
  // The one title that the first search indexer cannot handle (it is not ASCII): the poison message.
  { id: "phys-120", title: "Introducción a la física", image: "phys-120.png" },
  { id: "art-130", title: "Drawing for Engineers", image: "art-130.corrupt" },
];

/** Deterministic enrolment: 12 learners, each completing 3 courses; exactly one completes phys-120. */
export function plannedCompletions(): Completion[] {
  const out: Completion[] = [];
  const ascii = COURSES.filter((c) => c.id !== "phys-120");
  for (let l = 0; l < 12; l++) {
    const learnerId = `learner-${String(l).padStart(2, "0")}`;
    const courses = l === 7 ? [ascii[0], COURSES[3], ascii[2]] : [ascii[l % 4], ascii[(l + 1) % 4], ascii[(l + 2) % 4]];
    courses.forEach((c, i) => out.push({ learnerId, courseId: c.id, courseTitle: c.title, score: 60 + ((l * 7 + i * 13) % 41) }));
  }
  return out;
}

export class CoursesService {
  readonly relay: OutboxRelay;
  readonly outbox: PgOutboxStore;

  constructor(
    private readonly pool: pg.Pool,
    private readonly broker: Broker,
    private readonly names: Names,
  ) {
    this.outbox = new PgOutboxStore(pool, { pollIntervalMs: 50 });
    this.relay = new OutboxRelay(broker, this.outbox, { topic: names.completions, name: "courses", idleWaitMs: 100 });
  }

  async init(): Promise<void> {
    await this.pool.query(`CREATE TABLE IF NOT EXISTS courses (id text PRIMARY KEY, title text NOT NULL, image text NOT NULL);
      CREATE TABLE IF NOT EXISTS completions (learner_id text, course_id text REFERENCES courses(id), score integer NOT NULL, completed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (learner_id, course_id))`);
    await this.outbox.ensureSchema();
  }

  /** Saves a course and asks for its thumbnail; the dedupe id makes a retried publish ask once. */
  async publishCourse(c: Course): Promise<void> {
    await this.pool.query("INSERT INTO courses (id, title, image) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING", [c.id, c.title, c.image]);
    await this.broker.queue(this.names.thumbnails, QUEUE_CONFIG).enqueue({ courseId: c.id, image: c.image }, { dedupeId: `thumbnail:${c.id}` });
  }

  /**
   * The completion and its outbox row commit together or not at all. `failAfterInsert`
   * simulates the application failing after both inserts (e.g. a grading rule rejecting it).
   */
  async completeCourse(c: Completion, failAfterInsert = false): Promise<boolean> {
    const client = await this.pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("INSERT INTO completions (learner_id, course_id, score) VALUES ($1, $2, $3)", [c.learnerId, c.courseId, c.score]);
      await addToOutboxPg(client, { aggregateType: "learner", aggregateId: c.learnerId, type: "CourseCompleted", payload: { ...c } });
      if (failAfterInsert) throw new Error("grading rule rejected the completion");
      await client.query("COMMIT");
      return true;
    } catch {
      await client.query("ROLLBACK");
      return false;
    } finally {
      client.release();
    }
  }

  async completionCount(): Promise<number> {
    return Number((await this.pool.query("SELECT count(*) AS n FROM completions")).rows[0].n);
  }

  async close(): Promise<void> {
    await this.outbox.close();
  }
}
