// SPDX-License-Identifier: Apache-2.0
/**
 * The ledger of the crash-point enumeration: every outcome the workload (crash-workload.ts)
 * saw acknowledged, or issued without an answer, before the crash; the recovery check
 * (crash-check.ts) holds the recovered broker to it. Records and jobs are named by a tag
 * that their value starts with (`<tag>|<padding>`), so whatever is read back can be matched
 * to its entry.
 */

export type Status = "pending" | "acked" | "failed";

export interface RecordEntry {
  tag: string;
  topic: string;
  partition: number;
  value: string;
  status: Status;
  offset: number | null;
  batch: BatchEntry | null;
}

export interface BatchEntry {
  producer: ProducerEntry;
  seq: number;
  tags: string[];
  status: Status;
  /** Offset of the first record, once acknowledged. */
  offset: number | null;
  duplicate: boolean;
}

export interface ProducerEntry {
  name: string;
  producerId: number;
  epoch: number;
  topic: string;
  partition: number;
  nextSeq: number;
  batches: BatchEntry[];
}

export interface CommitEntry {
  group: string;
  topic: string;
  partition: number;
  /** Highest committed value acknowledged / issued (stored value = next offset to read). */
  acked: number | null;
  issued: number | null;
}

/** Where a job is: not enqueued, waiting in the source queue, in the dead-letter queue, or done. */
export type JobState = "none" | "Q" | "DLQ" | "done";

export interface JobLife {
  queue: string;
  id: string | null;
  /** Attempts handed to the workload (each one's DELIVER was durable). */
  attempts: number[];
}

export interface JobEntry {
  tag: string;
  data: string;
  /** State after the last acknowledged operation. */
  acked: JobState;
  /** State an issued but unacknowledged operation may have reached. */
  pending: JobState | null;
  lives: JobLife[];
  redrives: { issued: number; acked: number };
}

export interface RetentionEntry {
  topic: string;
  partition: number;
  /** Log start after the last acknowledged enforceRetention(). */
  acked: number;
  /** High watermark when the last enforceRetention() was issued (the log start can not pass it). */
  bound: number;
  issued: boolean;
}

export class Ledger {
  frozen = false;
  topics = new Map<string, Status>();
  records = new Map<string, RecordEntry>();
  producers: ProducerEntry[] = [];
  commits = new Map<string, CommitEntry>();
  jobs = new Map<string, JobEntry>();
  queues = new Map<string, Status>();
  retention = new Map<string, RetentionEntry>();
  /** Unexpected errors of the workload (not caused by the crash). */
  errors: string[] = [];
  /** Free-form facts for the report. */
  notes: string[] = [];

  /** Ignore anything reported after the power loss. */
  freeze(): void {
    this.frozen = true;
  }
  jobLife(tag: string, queue: string, id: string | null): JobLife {
    const j = this.jobs.get(tag)!;
    let life = id === null ? undefined : j.lives.find((l) => l.queue === queue && l.id === id);
    if (!life) {
      life = j.lives.find((l) => l.queue === queue && l.id === null);
      if (life && id !== null) life.id = id;
    }
    if (!life) j.lives.push((life = { queue, id, attempts: [] }));
    return life;
  }
}

/** A value for `tag`: `<tag>|` padded with seeded letters to a length in [min, max]. */
export function tagValue(tag: string, rng: () => number, min: number, max: number): string {
  const n = min + Math.floor(rng() * (max - min + 1));
  let s = tag + "|";
  while (s.length < n) s += String.fromCharCode(97 + Math.floor(rng() * 26));
  return s;
}

/** The tag of a value written by the workload (`<tag>|<padding>`), or null. */
export function tagOf(value: unknown): string | null {
  if (typeof value !== "string") return null;
  const i = value.indexOf("|");
  return i > 0 ? value.slice(0, i) : null;
}
