// SPDX-License-Identifier: Apache-2.0
/**
 * The audit log: `<dataDir>/audit/audit.log`, an append-only file of hash-chained records
 * (record.ts, docs/storage-format.md "Audit log").
 *
 * - AUD-1: `append` resolves only after a write + fdatasync covering its record; the file's
 *   directory entry was made durable when the log was opened (FS-2). Appends made while one
 *   round is being written share the next round: one write, one fdatasync.
 * - AUD-2: records are sealed in file order at write time from the last durable record (`seq`
 *   + 1, `prev` = its hash), so the chain has no holes even when a round fails: a failed round
 *   is cut off the file (truncate to the durable end) and its appends are rejected.
 * - AUD-3: on open a torn tail (what a crash during an append leaves: an incomplete frame, a
 *   CRC-failing last frame, a zero fill) is truncated and logged; any other damage is kept,
 *   logged, and reported by `verifyAuditLog` (verify.ts). Opening walks the file with a
 *   bounded window (frame-reader.ts) and keeps only the last record's sequence and hash.
 *
 * The file is not rotated: it grows by a few hundred bytes per administrative operation.
 */
import { StorageError } from "../../errors.js";
import { join, type FileHandle, type FileSystem } from "../../log/io.js";
import { silentLogger, type Logger } from "../../observability/telemetry.js";
import { readFrames } from "./frame-reader.js";
import { boundEntry, decodePayload, GENESIS_HASH, sealRecord, type AuditEntry, type AuditRecord } from "./record.js";

export const AUDIT_DIR = "audit";
export const AUDIT_FILE = "audit.log";
/** Appends sealed into one round at most (one write + one fdatasync). */
const MAX_ROUND = 256;

export interface AuditLogOptions {
  dataDir: string;
  fs: FileSystem;
  /** Wall clock (ms since epoch) for record times. Default Date.now. */
  now?: () => number;
  logger?: Logger;
}

interface Pending {
  entry: AuditEntry;
  resolve: (r: AuditRecord) => void;
  reject: (e: unknown) => void;
}

/** The path of the audit log of a data dir. */
export function auditLogPath(dataDir: string): string {
  return join(dataDir, AUDIT_DIR, AUDIT_FILE);
}

export class AuditLog {
  private queue: Pending[] = [];
  private flushing: Promise<void> | null = null;
  private closed = false;
  /** Set when a failed round could not be cut off the file: no further append is safe. */
  private broken: unknown = null;

  private constructor(
    private readonly fh: FileHandle,
    private readonly opts: AuditLogOptions,
    /** End of the last durable record: where the next round is written. */
    private end: number,
    private seq: number,
    private hash: string,
    private lastTime: number,
  ) {}

  /** Opens (creating when missing) the audit log of `dataDir`, cutting a torn tail (AUD-3). */
  static async open(opts: AuditLogOptions): Promise<AuditLog> {
    const { fs } = opts;
    const log = opts.logger ?? silentLogger;
    const dir = join(opts.dataDir, AUDIT_DIR);
    await fs.mkdir(dir); // FS-2
    const path = join(dir, AUDIT_FILE);
    const fh = await fs.open(path, "create");
    try {
      // FS-2: the file's entry is durable before any record in it is acknowledged. Every open
      // syncs it: a file created by a process that ended before syncing it looks the same.
      await fs.fsyncDir(dir);
      const size = await fh.size();
      let end = 0;
      let seq = 0;
      let hash = GENESIS_HASH;
      let time = 0;
      for await (const it of readFrames(fh, size)) {
        if (it.kind === "frame" || it.kind === "damaged") {
          end = it.end;
          if (it.kind === "damaged") log.error({ path, position: it.pos, why: it.why }, "audit log damaged; run `sluice audit verify`");
          const d = it.kind === "frame" ? decodePayload(it.payload) : null;
          // The chain goes on from the last record that can be read, even one that fails
          // its hash: verify reports it; appends must not stop because of it.
          if (d?.ok) ({ seq, hash, time } = d.record);
        } else if (it.kind === "lost") {
          log.error({ path, position: it.pos, why: it.why }, "audit log damaged; run `sluice audit verify`");
          end = size;
        } else {
          log.warn({ path, position: it.pos, bytes: size - it.pos, why: it.why }, "audit log: torn tail truncated");
          await fh.truncate(it.pos);
          await fh.datasync();
          end = it.pos;
        }
      }
      return new AuditLog(fh, opts, end, seq, hash, time);
    } catch (e) {
      await fh.close().catch(() => {});
      throw e;
    }
  }

  /** The last durable record's sequence number (0: none) and hash. */
  get last(): { seq: number; hash: string } {
    return { seq: this.seq, hash: this.hash };
  }

  /** Appends a record; resolves with it once durable (AUD-1). */
  append(entry: AuditEntry): Promise<AuditRecord> {
    if (this.closed) return Promise.reject(new StorageError("the audit log is closed"));
    if (this.broken !== null) return Promise.reject(new StorageError("the audit log failed and must be reopened", this.broken));
    return new Promise<AuditRecord>((resolve, reject) => {
      this.queue.push({ entry, resolve, reject });
      this.flushing ??= this.flush();
    });
  }

  private async flush(): Promise<void> {
    try {
      while (this.queue.length > 0) await this.round(this.queue.splice(0, MAX_ROUND));
    } finally {
      this.flushing = null;
    }
  }

  /** One write + fdatasync for `items`, sealed after the last durable record (AUD-2). */
  private async round(items: Pending[]): Promise<void> {
    if (this.broken !== null) {
      for (const it of items) it.reject(new StorageError("the audit log failed and must be reopened", this.broken));
      return;
    }
    let seq = this.seq;
    let prev = this.hash;
    // Times never go backwards in the file, so `list --since` can stop early.
    const time = Math.max(this.lastTime, (this.opts.now ?? Date.now)());
    const frames: Buffer[] = [];
    const records: AuditRecord[] = [];
    for (const it of items) {
      const { record, frame } = sealRecord(boundEntry(it.entry), ++seq, time, prev);
      prev = record.hash;
      frames.push(frame);
      records.push(record);
    }
    const bytes = frames.reduce((n, f) => n + f.length, 0);
    try {
      await this.fh.write(frames, this.end);
      await this.fh.datasync();
    } catch (e) {
      // Cut the round off so the next one is written where the durable records end.
      await this.fh.truncate(this.end).catch((err) => (this.broken = err));
      const err = new StorageError("audit log write failed", e);
      for (const it of items) it.reject(err);
      return;
    }
    this.end += bytes;
    this.seq = seq;
    this.hash = prev;
    this.lastTime = time;
    items.forEach((it, i) => it.resolve(records[i]));
  }

  /** Waits for appends in flight, then closes the file. Later appends are refused. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.flushing !== null) await this.flushing;
    await this.fh.close();
  }
}
