// SPDX-License-Identifier: Apache-2.0
/**
 * What every role of the learning platform shares: the broker (embedded, or a server when
 * SLUICE_URL is set), the PostgreSQL pool on a schema of its own, the run's names, and the
 * helpers that keep the scenario deterministic (wait on conditions with deadlines, never sleep
 * for luck) and make it check its own outcomes.
 */
import { randomBytes } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";
import { connect, openBroker, SchemaRegistry, type Broker, type EmbeddedBroker } from "sluice";

export interface Completion {
  learnerId: string;
  courseId: string;
  courseTitle: string;
  score: number;
}

/** Names of this run: topics and queues carry a run id, so a reused data dir or server starts clean. */
export interface Names {
  run: string;
  completions: string;
  searchDlq: string;
  certificates: string;
  thumbnails: string;
}

export function namesFor(run: string): Names {
  return {
    run,
    completions: `course-completed-${run}`,
    searchDlq: `course-completed-${run}.search-dlq`,
    certificates: `certificate-generation-${run}`,
    thumbnails: `thumbnail-${run}`,
  };
}

export const newRunId = (): string => randomBytes(3).toString("hex");

export const dataDir = (): string => {
  const dir = process.env.SLUICE_DATA ?? "./data/learning-platform";
  mkdirSync(dir, { recursive: true });
  return dir;
};

/** The server to use, if any (an empty SLUICE_URL counts as unset). */
export const brokerUrl = (): string | undefined => process.env.SLUICE_URL || undefined;

export const pgUrl = (): string => process.env.SLUICE_PG_URL || "postgres://postgres@127.0.0.1:5432/postgres";

/** Every CourseCompleted is checked against this before it is written (by the relay, and by a redrive). */
export function schemasFor(names: Names): SchemaRegistry {
  const schemas = new SchemaRegistry();
  schemas.topic(names.completions).add("CourseCompleted", 1, {
    type: "object",
    properties: { learnerId: { type: "string" }, courseId: { type: "string" }, courseTitle: { type: "string" }, score: { type: "integer", minimum: 0, maximum: 100 } },
    required: ["learnerId", "courseId", "courseTitle", "score"],
  });
  return schemas;
}

/**
 * The one difference between the two modes: SLUICE_URL set → a client of `sluice serve`. The
 * embedded broker is returned too, so that members in other processes can reach it.
 */
export async function openTheBroker(names: Names, url = brokerUrl()): Promise<{ broker: Broker; embedded: EmbeddedBroker | null }> {
  const schemas = schemasFor(names);
  if (url) return { broker: await connect({ url, schemas }), embedded: null };
  const embedded = await openBroker({ dataDir: join(dataDir(), "broker"), schemas });
  return { broker: embedded, embedded };
}

/** A pool whose sessions see only this run's schema (`search_path`). */
export function pgPool(schema: string, max = 6): pg.Pool {
  return new pg.Pool({ connectionString: pgUrl(), options: `-c search_path=${schema}`, max });
}

export async function createSchema(schema: string): Promise<void> {
  const c = new pg.Client({ connectionString: pgUrl() });
  await c.connect();
  try {
    await c.query(`CREATE SCHEMA ${schema}`);
  } finally {
    await c.end();
  }
}

export async function dropSchema(schema: string): Promise<void> {
  const c = new pg.Client({ connectionString: pgUrl() });
  await c.connect();
  try {
    await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await c.end();
  }
}

/** Polls `cond` until it holds; throws naming `what` after `timeoutMs`. */
export async function waitFor(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000, everyMs = 20): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * Runs a consumer until its group has no lag on `topic` (and `done()` holds), then stops it
 * through its signal and waits for it to drain: consumers here stop on conditions, not time.
 */
export async function runUntilCaughtUp(broker: Broker, group: string, topic: string, consumer: (signal: AbortSignal) => Promise<unknown>, done: () => boolean | Promise<boolean> = () => true, timeoutMs = 20_000): Promise<void> {
  const ac = new AbortController();
  let failed: unknown = null;
  const running = consumer(ac.signal).catch((e: unknown) => {
    failed = e;
  });
  try {
    await waitFor(async () => failed !== null || ((await broker.groupLag(group, topic)).totalRecords === 0 && (await done())), `group ${group} to catch up on ${topic}`, timeoutMs);
  } finally {
    ac.abort();
    await running;
  }
  if (failed) throw failed;
}

/** Invariants the scenario checks about itself; any failure makes the process exit 1. */
export class Checks {
  readonly failures: string[] = [];
  private passed = 0;

  check(ok: boolean, what: string, detail = ""): void {
    if (ok) this.passed++;
    else this.failures.push(detail ? `${what} (${detail})` : what);
    console.log(`  ${ok ? "ok  " : "FAIL"} ${what}${detail ? `: ${detail}` : ""}`);
  }

  summary(): string {
    return `${this.passed} checks passed, ${this.failures.length} failed`;
  }
}

export const log = (line: string): void => console.log(line);
