// SPDX-License-Identifier: Apache-2.0
/**
 * Structured processing logs of the server: one JSON line per job settlement and per offset
 * commit, with where it happened and how it ended, never the payload. Levels say how much an
 * operator sees by default: acks, releases and commits at `debug` (a line per message would
 * drown a busy server's `info` log), nacks (retries) at `info`, dead letters at `warn`.
 *
 *   { system: "sluice", kind: "queue", destination, consumer, jobId, attempt, result,
 *     messageId?, type?, schemaVersion?, reason? }
 *   { system: "sluice", kind: "stream", destination, group, partition, offset, result: "commit" }
 *
 * The level check comes first, so a disabled level costs one boolean test per settlement.
 */
import type { Logger } from "../observability/telemetry.js";

export type JobResult = "ack" | "nack" | "dead-letter" | "release" | "retry-after";

/** The parts of a delivered job a processing line reads (headers as stored: name, bytes). */
export interface LoggedJob {
  readonly id: string;
  readonly attempt: number;
  readonly stored: { readonly headers: [string, Buffer][] | null };
}

const LEVEL: Record<JobResult, "debug" | "info" | "warn"> = { ack: "debug", release: "debug", nack: "info", "dead-letter": "warn", "retry-after": "info" };
/** Envelope headers copied into the line (docs/patterns.md#envelope); nothing else of the job. */
const ENVELOPE: [string, string][] = [
  ["sluice-message-id", "messageId"],
  ["sluice-type", "type"],
  ["sluice-schema-version", "schemaVersion"],
];

export class ProcessingLog {
  private readonly debug: boolean;
  private readonly info: boolean;

  constructor(private readonly logger: Logger) {
    // Loggers without isLevelEnabled (the silent default) are asked for every line.
    this.debug = logger.isLevelEnabled?.("debug") ?? true;
    this.info = logger.isLevelEnabled?.("info") ?? true;
  }

  job(queue: string, consumer: string, job: LoggedJob, result: JobResult, reason?: string): void {
    const level = LEVEL[result];
    if ((level === "debug" && !this.debug) || (level === "info" && !this.info)) return;
    const line: Record<string, unknown> = { system: "sluice", kind: "queue", destination: queue, consumer, jobId: job.id, attempt: job.attempt, result };
    for (const [name, value] of job.stored.headers ?? []) {
      const field = ENVELOPE.find(([h]) => h === name);
      if (field) line[field[1]] = field[1] === "schemaVersion" ? Number(value.toString("utf8")) : value.toString("utf8");
    }
    if (reason !== undefined) line.reason = reason.slice(0, 500);
    this.logger[level](line, `job ${result}`);
  }

  commit(topic: string, group: string, partition: number, offset: number): void {
    if (!this.debug) return;
    this.logger.debug({ system: "sluice", kind: "stream", destination: topic, group, partition, offset, result: "commit" }, "offset commit");
  }
}
