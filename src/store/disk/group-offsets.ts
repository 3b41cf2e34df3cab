// SPDX-License-Identifier: Apache-2.0
/**
 * Committed offsets of one consumer group on disk (the disk engine's half of
 * `StorageEngine.commitOffsets` / `getCommitted`): a snapshot plus an append-only log of the
 * commits since (invariant META-2).
 */
import { join } from "node:path";
import { readJsonFile, writeFileAtomic, type FileHandle, type FileSystem } from "../../log/io.js";
import { crc32c } from "../../log/crc32c.js";
import type { Logger } from "../../observability/telemetry.js";
import { markAfterCommit, markAfterReset, MAX_REMEMBERED_RESETS, type CommittedOffset, type OffsetReset } from "../engine.js";

interface TopicOffsets {
  topicId: string;
  offsets: Record<string, CommittedOffset>;
  /** The last resets, newest first (absent in files written before resets were remembered). */
  resets?: OffsetReset[];
}

interface GroupFile {
  group: string;
  topics: Record<string, TopicOffsets>;
  /** Generation of the offsets log that continues this snapshot (absent: 0). */
  logEpoch?: number;
}

/**
 * A commit as logged: log epoch, topic, topicId, committedAt, [partition, next offset] pairs;
 * a reset adds `m`, the [partition, replay mark] pairs its partitions have after it (META-4:
 * the offsets and their marks in one record; logs written before marks have no `m`).
 */
interface CommitRecord {
  e: number;
  t: string;
  i: string;
  c: number;
  o: [number, number][];
  m?: [number, number][];
}

/** The offsets log is folded into the snapshot once it is this long (bounds replay on open). */
export const OFFSETS_LOG_COMPACT_BYTES = 1024 * 1024;
/** Sanity bound on one logged commit (a commit names at most every partition of a topic). */
const MAX_COMMIT_RECORD_BYTES = 16 * 1024 * 1024;
const COMMIT_RECORD_HEAD = 8; // u32 payload length, u32 CRC-32C of the payload

function applyCommit(data: GroupFile, r: CommitRecord): void {
  let t = data.topics[r.t];
  if (!t || t.topicId !== r.i) t = data.topics[r.t] = { topicId: r.i, offsets: {} };
  const marks = r.m ? new Map(r.m) : null;
  // A reset record always carries `m` (possibly empty): remember it with the offsets it replaced.
  if (marks !== null) {
    const partitions = r.o.map(([p, o]) => ({ partition: p, from: t.offsets[String(p)]?.offset ?? null, to: o }));
    t.resets = [{ at: r.c, partitions }, ...(t.resets ?? [])].slice(0, MAX_REMEMBERED_RESETS);
  }
  for (const [p, o] of r.o) {
    const key = String(p);
    // META-4: a reset names its partitions' marks; a commit keeps a mark until it reaches it.
    // A pure function of the state before the record, so replaying the log on open yields
    // what the commit made.
    const mark = marks ? marks.get(p) : markAfterCommit(t.offsets[key], o);
    t.offsets[key] = mark === undefined ? { offset: o, committedAt: r.c } : { offset: o, committedAt: r.c, replayUntil: mark };
  }
}

/**
 * Durable offsets of one group: a snapshot (`<group>.json`, replaced atomically) plus an
 * append-only log of the commits since (`<group>.log`, as Kafka's __consumer_offsets). A
 * commit appends one record with a durable write (O_DSYNC: one file operation instead of the
 * snapshot's write, sync, rename and directory sync) and concurrent commits share one append. Once the
 * log passes OFFSETS_LOG_COMPACT_BYTES, the next write is a new snapshot of everything
 * followed by emptying the log.
 *
 * Readers see only what has been written (`durable`); commits go to `staged` first, so a
 * failed write never makes an unsaved offset visible.
 *
 * Crash safety (META-2): a commit resolves only after the record holding it is durable (its
 * O_DSYNC write returned)
 * (and, when the write created the log, after the directory was synced). On open the
 * snapshot is read and the log replayed in order up to its first incomplete, damaged or
 * stale record (a torn append that was never acknowledged), which is cut off. Every snapshot
 * starts a new log epoch, stored in it and in each record logged after it: records of an
 * older epoch (a crash, or a failed write, between writing a snapshot and emptying the log)
 * are never replayed over the newer snapshot, which already holds their effect and more.
 * After any failed write the next write is a snapshot (from `staged`, as before: an
 * ambiguous commit may still be saved), which also discards what the failed append left.
 */
export class GroupOffsets {
  private durable: GroupFile;
  private staged: GroupFile;
  /** Commits applied to `staged` but not yet handed to a write. */
  private unlogged: CommitRecord[] = [];
  private log: FileHandle | null = null;
  private logSize: number;
  private snapshotNext = false;
  /** Epoch of the snapshot on disk; appended records carry it. */
  private epoch: number;
  private writing: Promise<void> | null = null;
  private queued: Promise<void> | null = null;

  private constructor(
    private fs: FileSystem,
    private dir: string,
    private snapshotPath: string,
    private logPath: string,
    data: GroupFile,
    logSize: number,
    private compactBytes: number,
  ) {
    this.durable = data;
    this.staged = structuredClone(data);
    this.logSize = logSize;
    this.epoch = data.logEpoch ?? 0;
  }

  static create(fs: FileSystem, dir: string, group: string, compactBytes: number): GroupOffsets {
    return new GroupOffsets(fs, dir, join(dir, `${group}.json`), join(dir, `${group}.log`), { group, topics: {} }, 0, compactBytes);
  }

  /** Snapshot plus replayed log; a torn or damaged log tail is cut off (durably). */
  static async open(fs: FileSystem, dir: string, group: string, logger: Logger, compactBytes: number): Promise<GroupOffsets> {
    const snapshotPath = join(dir, `${group}.json`);
    const logPath = join(dir, `${group}.log`);
    const data = (await readJsonFile<GroupFile>(fs, snapshotPath)) ?? { group, topics: {} };
    let size = 0;
    if ((await fs.stat(logPath)) !== null) {
      const buf = await fs.readFile(logPath);
      while (buf.length - size >= COMMIT_RECORD_HEAD) {
        const len = buf.readUInt32BE(size);
        if (len > MAX_COMMIT_RECORD_BYTES || len > buf.length - size - COMMIT_RECORD_HEAD) break;
        const start = size + COMMIT_RECORD_HEAD;
        if (crc32c(buf, start, start + len) !== buf.readUInt32BE(size + 4)) break;
        let r: CommitRecord;
        try {
          r = JSON.parse(buf.toString("utf8", start, start + len)) as CommitRecord;
        } catch {
          break;
        }
        if (r.e !== (data.logEpoch ?? 0)) break; // older than the snapshot: already in it
        applyCommit(data, r);
        size = start + len;
      }
      if (size < buf.length) {
        logger.warn({ file: logPath, position: size, bytesDropped: buf.length - size }, "cutting off an incomplete, damaged or stale tail of a group offsets log");
        const fh = await fs.open(logPath, "rw");
        try {
          await fh.truncate(size);
          await fh.datasync();
        } finally {
          await fh.close();
        }
      }
    }
    return new GroupOffsets(fs, dir, snapshotPath, logPath, data, size, compactBytes);
  }

  /** Topic names and incarnations this group has committed offsets for. */
  topics(): { topic: string; topicId: string }[] {
    return Object.entries(this.durable.topics).map(([topic, t]) => ({ topic, topicId: t.topicId }));
  }

  get(topic: string, topicId: string): Map<number, CommittedOffset> {
    const t = this.durable.topics[topic];
    const m = new Map<number, CommittedOffset>();
    if (!t || t.topicId !== topicId) return m;
    for (const [p, o] of Object.entries(t.offsets)) m.set(Number(p), o);
    return m;
  }

  /** The last resets on this incarnation of `topic`, newest first. */
  resets(topic: string, topicId: string): OffsetReset[] {
    const t = this.durable.topics[topic];
    return t && t.topicId === topicId ? (t.resets ?? []).map((r) => ({ at: r.at, partitions: r.partitions.map((p) => ({ ...p })) })) : [];
  }

  /** Resolves once a write that includes these offsets is durable. */
  commit(topic: string, topicId: string, offsets: Map<number, number>): Promise<void> {
    return this.stage({ e: 0, t: topic, i: topicId, c: Date.now(), o: [...offsets] });
  }

  /**
   * A reset (`StorageEngine.resetOffsets`): the offsets and the replay marks they leave, in one
   * record (META-4). Marks are computed from `staged`, the state every earlier commit has
   * already been applied to, in the order the records are written.
   */
  reset(topic: string, topicId: string, offsets: Map<number, number>): Promise<void> {
    const t = this.staged.topics[topic];
    const cur = t && t.topicId === topicId ? t.offsets : {};
    const m: [number, number][] = [];
    for (const [p, o] of offsets) {
      const mark = markAfterReset(cur[String(p)], o);
      if (mark !== undefined) m.push([p, mark]);
    }
    return this.stage({ e: 0, t: topic, i: topicId, c: Date.now(), o: [...offsets], m });
  }

  private stage(r: CommitRecord): Promise<void> {
    applyCommit(this.staged, r);
    this.unlogged.push(r);
    return this.flush();
  }

  private async run(): Promise<void> {
    const records = this.unlogged;
    this.unlogged = [];
    try {
      if (this.snapshotNext || this.logSize >= this.compactBytes) {
        // On failure `staged` keeps the values: the caller got an error (an ambiguous commit,
        // as in Kafka) and a later successful write may still save them.
        this.staged.logEpoch = this.epoch + 1;
        const text = JSON.stringify(this.staged);
        await writeFileAtomic(this.fs, this.snapshotPath, text);
        this.durable = JSON.parse(text) as GroupFile;
        this.epoch = this.durable.logEpoch!;
        if (this.logSize > 0 || this.snapshotNext) {
          const fh = await this.openLog();
          await fh.truncate(0);
          await fh.datasync();
        }
        this.logSize = 0;
        this.snapshotNext = false;
        return;
      }
      const parts: Buffer[] = [];
      let bytes = 0;
      for (const r of records) {
        r.e = this.epoch;
        const payload = Buffer.from(JSON.stringify(r), "utf8");
        const head = Buffer.allocUnsafe(COMMIT_RECORD_HEAD);
        head.writeUInt32BE(payload.length, 0);
        head.writeUInt32BE(crc32c(payload), 4);
        parts.push(head, payload);
        bytes += COMMIT_RECORD_HEAD + payload.length;
      }
      const fh = await this.openLog();
      // One I/O operation (O_DSYNC) instead of write + fdatasync: a commit's latency is what a
      // consumer that awaits its commits waits for, and each thread-pool hand-off costs
      // about half a millisecond on a busy machine.
      await fh.writeDurable(parts, this.logSize);
      this.logSize += bytes;
      for (const r of records) applyCommit(this.durable, r);
    } catch (e) {
      this.snapshotNext = true;
      throw e;
    }
  }

  private async openLog(): Promise<FileHandle> {
    if (this.log) return this.log;
    const existed = (await this.fs.stat(this.logPath)) !== null;
    const fh = await this.fs.open(this.logPath, "create");
    // A new file's directory entry must be durable before a record in it is acknowledged.
    if (!existed) await this.fs.fsyncDir(this.dir);
    this.log = fh;
    return fh;
  }

  private flush(): Promise<void> {
    if (this.queued) return this.queued;
    if (!this.writing) {
      const w = this.run().finally(() => {
        if (this.writing === w) this.writing = null;
      });
      this.writing = w;
      return w;
    }
    const q = this.writing
      .catch(() => {})
      .then(() => {
        this.queued = null;
        const w = this.run().finally(() => {
          if (this.writing === w) this.writing = null;
        });
        this.writing = w;
        return w;
      });
    this.queued = q;
    return q;
  }

  async drain(): Promise<void> {
    while (this.writing || this.queued) await (this.queued ?? this.writing)!.catch(() => {});
  }

  async close(): Promise<void> {
    await this.drain();
    const fh = this.log;
    this.log = null;
    await fh?.close();
  }
}
