// SPDX-License-Identifier: Apache-2.0
/**
 * A lease of the disk engine (Q-3: one object per delivery, its identity), and once handed out
 * also the job it leases. JobState creates and ends them; the queue hands them out.
 */
import type { DeadLetterInfo } from "../../../queues/types.js";
import type { GrantedJob, Lease, LeaseConsumer, PreparedRecord, ValueKind } from "../../queue-store.js";
import { decodeJobFields, type DecodedJobFields } from "./records.js";

/**
 * A lease of the disk engine, and once handed out also the job it leases (`GrantedJob`): one
 * object per delivery, and the lease's identity. The job's fields are read from its
 * record on access (most consumers read few of them; `process()` in a hot loop reads none).
 */
export class DiskLease implements Lease, GrantedJob {
  readonly jobId: string;
  /** Set once the lease ended (settled, released, expired, lost); a later use is stale. */
  ended = false;
  /** The job's record, set when the lease is handed out. */
  rec: PreparedRecord | null = null;
  /** Its consumer's lease count (null for a lease restored from disk). */
  held: HeldCount | null = null;
  private decoded: DecodedJobFields | null = null;
  private receiptText: string | null = null;
  constructor(
    readonly off: number,
    readonly attempt: number,
    public deadlineMono: number,
    public deadlineWall: number,
    public startedMono: number,
    /** null for a lease restored from disk (its holder is gone). */
    readonly consumer: LeaseConsumer | null,
    readonly consumerId: string,
    readonly codeVersion: string | undefined,
  ) {
    this.jobId = String(off);
  }
  get receipt(): string {
    return (this.receiptText ??= `${this.off}.${this.attempt}`);
  }
  get deadline(): number {
    return this.deadlineWall;
  }
  get lease(): Lease {
    return this;
  }
  get id(): string {
    return this.jobId;
  }
  private record(): PreparedRecord {
    if (this.rec === null) throw new Error(`job ${this.off} was not handed out`);
    return this.rec;
  }
  get value(): Buffer | null {
    return this.record().value;
  }
  get valueKind(): ValueKind {
    return this.record().valueKind;
  }
  get enqueuedAt(): number {
    return this.record().timestamp;
  }
  private fields(): DecodedJobFields {
    return (this.decoded ??= decodeJobFields(this.record()));
  }
  get key(): string | null {
    return this.fields().key;
  }
  get headers(): [string, Buffer][] | null {
    return this.fields().headers;
  }
  get redriveCount(): number {
    return this.fields().redriveCount;
  }
  get deadLetter(): DeadLetterInfo | null {
    return this.fields().deadLetter;
  }
}

/** Leases a consumer holds in this queue. */
export interface HeldCount {
  readonly consumer: LeaseConsumer;
  n: number;
}
