// SPDX-License-Identifier: Apache-2.0
/**
 * Where an engine keeps job schedules (src/queues/schedules/): the definitions and each
 * schedule's tick state, as one document the scheduler replaces whole. Neutral types only: the
 * disk engine writes it with `writeFileAtomic` (META-1); a PostgreSQL engine would use a table.
 *
 * SCHED-1 (docs/ARCHITECTURE.md): `save` resolves only once the document is durable.
 */

/** A schedule as stored. Plain JSON: the payload and header values are base64. */
export interface StoredSchedule {
  queue: string;
  name: string;
  cron: string | null;
  everyMs: number | null;
  tz: string;
  catchUp: "skip" | "once";
  /** The payload's bytes (base64) and kind (0 bytes, 1 UTF-8, 2 JSON, 3 null). */
  value: string | null;
  valueKind: number;
  key: string | null;
  /** Header name and value bytes (base64). */
  headers: [string, string][];
  delayMs: number;
  paused: boolean;
  /** Ticks at or before this time are never due (the upsert or the last resume). */
  since: number;
  /** Grid origin of `everyMs` ticks (`anchor + k * everyMs`). */
  anchor: number;
  createdAt: number;
  updatedAt: number;
  /** The last tick whose job is known to be stored (ms), or null. */
  lastTick: number | null;
  /**
   * Ticks being enqueued when this document was written: `[tick, ticksCovered]`. After a crash
   * they are enqueued again with the same dedupe ids (the queue answers duplicates), SCHED-2.
   */
  pending: [number, number][];
}

export interface ScheduleStore {
  /** Every stored schedule (empty when none was ever saved). */
  load(): Promise<StoredSchedule[]>;
  /** Replaces the stored document; resolves once durable (SCHED-1). Calls never overlap. */
  save(all: readonly StoredSchedule[]): Promise<void>;
}
