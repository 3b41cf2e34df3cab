// SPDX-License-Identifier: Apache-2.0
/**
 * The on-disk storage engine: topics (directories of partition logs, src/log), committed group
 * offsets (group-offsets.ts), producer ids and work queues (queues/) under one data dir, which
 * it holds locked while open (FS-3).
 *
 *   <dataDir>/.lock                              holder of the directory lock (informational)
 *   <dataDir>/topics/<name>/topic.json          name, topicId, createdAt, config
 *   <dataDir>/topics/<name>/<partition>/...      PartitionLog files
 *   <dataDir>/groups/<group>.json|.log           committed offsets, keyed by topic + topicId
 *   <dataDir>/producers.json                     next producer id, bumped epochs
 *   <dataDir>/queues/...                         work queues (queues/store.ts)
 *   <dataDir>/trash/, <dataDir>/tmp/             deletion and creation staging (emptied on open)
 *
 * Invariant TOPIC-1: a topic directory appears (rename) only complete, and disappears (rename
 * to trash) before its files are removed. Committed offsets carry the topicId, so deleting and
 * re-creating a name never resurrects old data or old positions.
 */
import { randomUUID } from "node:crypto";
import { join, resolve, sep } from "node:path";
import { OffsetOutOfRangeError, PartitionNotFoundError, ProducerFencedError, TopicExistsError, TopicNotFoundError, ValidationError, BrokerClosedError, InvalidBatchError, EncryptionConfigError } from "../../errors.js";
import { readJsonFile, writeFileAtomic, type DirLock, type FileSystem } from "../../log/io.js";
import { noopTelemetry, type Logger, type Telemetry } from "../../observability/telemetry.js";
import { METRICS } from "../../observability/metrics.js";
import { PartitionLog } from "../../log/partition-log.js";
import { FsArchiveStore } from "../../log/archive/fs-archive-store.js";
import { partitionPrefix } from "../../log/archive/manifest.js";
import { PartitionArchive } from "../../log/archive/partition-archive.js";
import { HEADER_SIZE, readHeader, type PreparedRecord, type ProducerInfo, type StoredRecord } from "../../log/record-batch.js";
import type { PartitionDescription, TopicConfig, TopicDescription } from "../../types.js";
import type { AppendResult, CommittedOffset, EncodedBatches, EngineTopic, OffsetReset, PartitionOffsets, StorageEngine } from "../engine.js";
import { validateName } from "../names.js";
import { resolveTopicConfig } from "../topic-config.js";
import { DiskQueueStore } from "./queues/store.js";
import { GroupOffsets, OFFSETS_LOG_COMPACT_BYTES } from "./group-offsets.js";
import { nextRecoveryDelay, RECOVERY_MIN_DELAY_MS } from "./recovery-backoff.js";
import { CLEANER_IO_BYTES_PER_SEC, IoBudget } from "../../log/io-budget.js";
import { isCompacted } from "../../log/compaction-policy.js";
import { MIN_CLEANABLE_DIRTY_RATIO } from "../../log/cleaner.js";
import { DEFAULT_CLEANER_MAP_BYTES, MAX_CLEANER_MAP_BYTES } from "../../log/offset-map.js";
import { BatchCipher } from "../../log/batch-crypto.js";
import { ENCRYPTION_KEYS_ENV, resolveKeyring, type EncryptionKeys, type Keyring } from "../../log/keyring.js";

type CleanerFigures = Required<Pick<PartitionDescription, "cleanerDirtyRatio" | "bytesReclaimed" | "lastCleanedAt" | "cleanerPasses" | "cleanerPassProgress">>;
type ArchiveFigures = Required<Pick<PartitionDescription, "archivedBytes" | "archivedSegments" | "archiveStartOffset" | "archiveLagBytes" | "archiveReadBytes">>;

/** A compacted partition's cleaner figures for describeTopic. */
function cleanerFigures(l: PartitionLog): CleanerFigures {
  const s = l.cleanerStats();
  return { cleanerDirtyRatio: s.dirtyRatio, bytesReclaimed: s.bytesReclaimed, lastCleanedAt: s.lastCleanedAt, cleanerPasses: s.passes, cleanerPassProgress: s.passProgress };
}

/** An archived partition's archive figures for describeTopic (none without an archive). */
function archiveFigures(l: PartitionLog): ArchiveFigures | Record<string, never> {
  const s = l.archiveStats();
  if (s === null) return {};
  return { archivedBytes: s.archivedBytes, archivedSegments: s.archivedSegments, archiveStartOffset: s.startOffset, archiveLagBytes: s.lagBytes, archiveReadBytes: s.readBytes };
}

interface Topic extends EngineTopic {
  dir: string;
  logs: PartitionLog[];
}

export interface DiskEngineOptions {
  dataDir: string;
  fs: FileSystem;
  /** Logger, metrics sink and clock (default: no-ops, system clock). */
  telemetry?: Telemetry;
  /** Overrides the telemetry's logger. */
  logger?: Logger;
  /** Length at which a group's offsets log is folded into its snapshot (tests lower it). */
  offsetsLogCompactBytes?: number;
  /** How often the cleaner looks for compaction work (compacted topics only). Default CLEANER_INTERVAL_MS; 0: never (call compact()). */
  cleanerIntervalMs?: number;
  /**
   * Bytes per second the cleaner may read plus write, over all partitions (Kafka's
   * log.cleaner.io.max.bytes.per.second). Default CLEANER_IO_BYTES_PER_SEC; Infinity: unthrottled.
   */
  cleanerIoBytesPerSec?: number;
  /**
   * Memory of one compaction pass's key map (Kafka's log.cleaner.dedupe.buffer.size): 21.3
   * bytes per distinct key (offset-map.ts); a partition with more keys in its dirty range is
   * compacted in several passes. Default DEFAULT_CLEANER_MAP_BYTES (64 MiB, 3.1 M keys).
   */
  cleanerMapBytes?: number;
  /**
   * Keys for encryption at rest (docs/security.md, "Encryption at rest"): a Keyring, its JSON
   * spec, or the path of a key file (read on open). Needed to create, write and read
   * `encrypted` topics and queues; never written into the data dir (ENC-3).
   */
  encryptionKeys?: EncryptionKeys | null;
}

/** Default period of the background cleaner (key compaction, src/log/cleaner.ts). */
export const CLEANER_INTERVAL_MS = 15_000;

export class DiskEngine implements StorageEngine {
  readonly kind = "disk";
  /** The encoded-batch capability: client batches stored as sent, raw reads for the server's push. */
  readonly encoded: EncodedBatches = {
    appendEncoded: (topic, partition, batch, signal) => this.appendEncoded(topic, partition, batch, signal),
    readRaw: (topic, partition, offset, maxBytes, maxRecords) => (this.closed ? Promise.reject(new BrokerClosedError()) : this.log(topic, partition).readRaw(offset, maxBytes, maxRecords)),
  };
  private readonly dataDir: string;
  private readonly fs: FileSystem;
  private readonly logger: Logger;
  private readonly telemetry: Telemetry;
  private readonly offsetsLogCompactBytes: number;
  /** Work queues under `<dataDir>/queues/` (src/store/disk/queues/). */
  readonly queues: DiskQueueStore;
  private topics = new Map<string, Topic>();
  private groups = new Map<string, GroupOffsets>();
  private producerFile: { nextId: number; epochs: Record<string, number> } = { nextId: 0, epochs: {} };
  private adminLock: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** The data directory's exclusive lock, held while open (FS-3). */
  private dirLock: DirLock | null = null;
  /** Partitions being reopened after a fault, by `${topicId}/${partition}`. */
  private recovering = new Map<string, Promise<void>>();
  /** Ends the backoff waits of scheduled recoveries (on close). */
  private recoveryWakers = new Set<() => void>();
  /** One I/O budget for the cleaner of every partition (io-budget.ts): it never starves the writers. */
  private readonly cleanerBudget: IoBudget;
  private readonly cleanerMapBytes: number;
  private readonly cleanerIntervalMs: number;
  private cleanerTimer: NodeJS.Timeout | null = null;
  private cleaning: Promise<void> = Promise.resolve();
  private readonly encryptionKeys: EncryptionKeys | null;
  /** Resolved from `encryptionKeys` on open; null: no encryption at rest. */
  private keyring: Keyring | null = null;

  constructor(opts: DiskEngineOptions) {
    this.dataDir = resolve(opts.dataDir);
    this.fs = opts.fs;
    this.telemetry = opts.telemetry ?? noopTelemetry;
    this.logger = opts.logger ?? this.telemetry.logger;
    this.offsetsLogCompactBytes = opts.offsetsLogCompactBytes ?? OFFSETS_LOG_COMPACT_BYTES;
    this.cleanerIntervalMs = opts.cleanerIntervalMs ?? CLEANER_INTERVAL_MS;
    const ioRate = opts.cleanerIoBytesPerSec ?? CLEANER_IO_BYTES_PER_SEC;
    if (!(ioRate > 0)) throw new ValidationError(`cleanerIoBytesPerSec must be a positive number or Infinity, got ${ioRate}`);
    this.cleanerBudget = new IoBudget(ioRate);
    this.cleanerMapBytes = opts.cleanerMapBytes ?? DEFAULT_CLEANER_MAP_BYTES;
    if (!(Number.isSafeInteger(this.cleanerMapBytes) && this.cleanerMapBytes >= 1024 * 1024 && this.cleanerMapBytes <= MAX_CLEANER_MAP_BYTES)) {
      throw new ValidationError(`cleanerMapBytes must be an integer from 1 MiB to ${MAX_CLEANER_MAP_BYTES} bytes, got ${this.cleanerMapBytes}`);
    }
    this.encryptionKeys = opts.encryptionKeys ?? null;
    this.queues = new DiskQueueStore({ dir: this.inside("queues"), fs: this.fs, telemetry: { ...this.telemetry, logger: this.logger }, keyring: () => this.keyring });
  }

  /** FS-1: every path the engine touches stays inside the data dir. */
  private inside(...parts: string[]): string {
    const p = resolve(this.dataDir, ...parts);
    if (p !== this.dataDir && !p.startsWith(this.dataDir + sep)) throw new ValidationError(`path escapes data dir: ${p}`);
    return p;
  }

  /**
   * Takes the data directory's exclusive lock first (FS-3: a second opener, in this process or
   * another, gets DataDirLockedError and nothing is changed), then loads everything.
   */
  async open(): Promise<void> {
    const { fs } = this;
    // A bad key file fails the open before anything is touched (EncryptionConfigError).
    this.keyring = await resolveKeyring(this.encryptionKeys);
    await fs.mkdir(this.dataDir);
    this.dirLock = await fs.lock(this.dataDir);
    try {
      await this.load();
      if (this.cleanerIntervalMs > 0) this.scheduleCleaner();
    } catch (e) {
      await this.dirLock.release();
      this.dirLock = null;
      throw e;
    }
  }

  private async load(): Promise<void> {
    const { fs } = this;
    for (const d of ["topics", "groups", "trash", "tmp"]) await fs.mkdir(this.inside(d));
    // Leftovers of interrupted deletes/creates are garbage by construction (TOPIC-1).
    for (const d of ["trash", "tmp"]) for (const n of await fs.readdir(this.inside(d))) await fs.rm(this.inside(d, n));
    this.producerFile = (await readJsonFile<typeof this.producerFile>(fs, this.inside("producers.json"))) ?? this.producerFile;
    for (const name of (await fs.readdir(this.inside("topics"))).sort()) {
      const meta = await readJsonFile<EngineTopic>(fs, this.inside("topics", name, "topic.json"));
      if (!meta) {
        this.logger.warn({ dir: name }, "ignoring topic directory without topic.json");
        continue;
      }
      const config = resolveTopicConfig(meta.config);
      const t: Topic = { ...meta, config, dir: this.inside("topics", name), logs: [] };
      for (let p = 0; p < config.partitions; p++) t.logs.push(await this.openLog(t, p));
      this.topics.set(name, t);
    }
    // A group has a snapshot (<group>.json), a log of later commits (<group>.log), or both.
    const groupNames = new Set<string>();
    for (const n of await fs.readdir(this.inside("groups"))) {
      if (n.endsWith(".tmp")) await fs.unlink(this.inside("groups", n));
      else if (n.endsWith(".json")) groupNames.add(n.slice(0, -5));
      else if (n.endsWith(".log")) groupNames.add(n.slice(0, -4));
    }
    for (const name of groupNames) this.groups.set(name, await GroupOffsets.open(fs, this.inside("groups"), name, this.logger, this.offsetsLogCompactBytes));
    await this.queues.start();
  }

  private openLog(t: Topic, p: number): Promise<PartitionLog> {
    return PartitionLog.open({
      fs: this.fs,
      dir: join(t.dir, String(p)),
      topic: t.name,
      partition: p,
      config: t.config,
      logger: this.logger,
      telemetry: this.telemetry,
      onFault: () => this.scheduleRecovery(t, p),
      archive: t.config.archive ? (logStart) => this.openArchive(t, p, logStart) : undefined,
      cleanerBudget: this.cleanerBudget,
      cipher: this.cipherOf(t, p),
    });
  }

  /** ENC-2: a topic's batches are bound to its incarnation and partition (online and archived alike). */
  private cipherOf(t: Topic, p: number): BatchCipher | undefined {
    return t.config.encrypted ? new BatchCipher(this.keyring, `topic:${t.topicId}/${p}`, `${t.name}/${p}`) : undefined;
  }

  /** The background cleaner: one run at a time, then the next after the interval (never overlapping). */
  private scheduleCleaner(): void {
    this.cleanerTimer = setTimeout(() => {
      this.cleanerTimer = null;
      this.cleaning = this.compact(this.telemetry.clock.now(), MIN_CLEANABLE_DIRTY_RATIO)
        .catch((e: unknown) => this.logger.error({ err: e }, "compaction failed"))
        .finally(() => {
          if (!this.closed) this.scheduleCleaner();
        });
    }, this.cleanerIntervalMs);
    this.cleanerTimer.unref();
  }

  /**
   * Key compaction of every partition of every compacted topic, one partition at a time
   * (src/log/cleaner.ts), those with at least `minDirtyRatio` of their sealed bytes dirty. A
   * partition that fails is logged and skipped.
   */
  async compact(now = this.telemetry.clock.now(), minDirtyRatio = 0): Promise<void> {
    for (const t of [...this.topics.values()]) {
      if (!isCompacted(t.config.cleanupPolicy)) continue;
      for (const l of [...t.logs]) {
        if (this.closed) return;
        if (minDirtyRatio > 0 && l.cleanerStats().dirtyRatio < minDirtyRatio) continue;
        await l.compact(now, this.cleanerMapBytes).catch((e: unknown) => this.logger.error({ err: e, topic: t.name, partition: l.partition }, "compaction of a partition failed"));
      }
    }
  }

  /**
   * The archive of a partition of a topic with `archive` (src/log/archive/, ARC-1..4). The
   * archive directory is the one place the engine writes outside the data dir (FS-1): the
   * operator names it in the topic config.
   */
  private openArchive(t: Topic, p: number, logStart: number): Promise<PartitionArchive> {
    const store = new FsArchiveStore(this.fs, t.config.archive!.dir);
    const target = { topic: t.name, topicId: t.topicId, partition: p, prefix: partitionPrefix(t.name, t.topicId, p) };
    return PartitionArchive.open({ fs: this.fs, store, target, logger: this.logger, retentionMs: () => t.config.archiveRetentionMs, cipher: this.cipherOf(t, p) }, logStart);
  }

  /**
   * A faulted partition (an I/O error left its files in doubt) is closed and reopened from
   * disk, which runs recovery (LOG-7) and rebuilds its producer state (PROD-1). Until then
   * appends get a retriable StorageError; reads keep working. Retried with backoff while the
   * disk keeps failing.
   */
  private scheduleRecovery(t: Topic, p: number, delayMs = RECOVERY_MIN_DELAY_MS): void {
    const key = `${t.topicId}/${p}`;
    if (this.recovering.has(key) || this.closed) return;
    const run = (async () => {
      await new Promise<void>((r) => {
        const wake = (): void => {
          clearTimeout(timer);
          this.recoveryWakers.delete(wake);
          r();
        };
        const timer = setTimeout(wake, delayMs);
        this.recoveryWakers.add(wake);
      });
      if (this.closed || this.topics.get(t.name) !== t) return;
      const old = t.logs[p];
      try {
        await old.close();
        const fresh = await this.openLog(t, p);
        if (this.closed || this.topics.get(t.name) !== t) {
          await fresh.close();
          return;
        }
        t.logs[p] = fresh;
        this.logger.info({ topic: t.name, partition: p, highWatermark: fresh.highWatermark }, "partition recovered from disk after an I/O error");
        this.telemetry.metrics.count(METRICS.partitionRecoveries.name, 1, { topic: t.name });
      } catch (e) {
        this.logger.error({ err: e, topic: t.name, partition: p }, "partition recovery failed; retrying");
        this.recovering.delete(key);
        this.scheduleRecovery(t, p, nextRecoveryDelay(delayMs));
      }
    })().finally(() => {
      if (this.recovering.get(key) === run) this.recovering.delete(key);
    });
    this.recovering.set(key, run);
  }

  /** Reopens a partition from disk now (the same as automatic recovery after a fault). */
  async recoverPartition(topic: string, partition: number): Promise<void> {
    const t = this.topic(topic);
    this.log(topic, partition);
    await this.recovering.get(`${t.topicId}/${partition}`);
    this.scheduleRecovery(t, partition, 0);
    await this.recovering.get(`${t.topicId}/${partition}`);
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const r = this.adminLock.then(fn, fn);
    this.adminLock = r.catch(() => {});
    return r;
  }

  private check(): void {
    if (this.closed) throw new BrokerClosedError();
  }

  createTopic(name: string, config: Required<TopicConfig>): Promise<EngineTopic> {
    validateName("topic", name);
    return this.serial(async () => {
      this.check();
      if (this.topics.has(name)) throw new TopicExistsError(name);
      if (config.encrypted && this.keyring === null) throw new EncryptionConfigError(`topic ${JSON.stringify(name)} cannot be encrypted: no encryption keys are configured (encryptionKeys, --encryption-key-file or ${ENCRYPTION_KEYS_ENV})`);
      const meta: EngineTopic = { name, topicId: randomUUID(), createdAt: this.telemetry.clock.now(), config };
      // Named by id alone: name + id could exceed the 255-byte file name limit.
      const staging = this.inside("tmp", meta.topicId);
      await this.fs.mkdir(staging);
      await writeFileAtomic(this.fs, join(staging, "topic.json"), JSON.stringify(meta));
      for (let p = 0; p < config.partitions; p++) await this.fs.mkdir(join(staging, String(p)));
      await this.fs.rename(staging, this.inside("topics", name));
      await this.fs.fsyncDir(this.inside("topics"));
      const t: Topic = { ...meta, dir: this.inside("topics", name), logs: [] };
      for (let p = 0; p < config.partitions; p++) t.logs.push(await this.openLog(t, p));
      this.topics.set(name, t);
      return meta;
    });
  }

  alterTopic(name: string, changes: { retentionMs?: number; retentionBytes?: number }): Promise<EngineTopic> {
    validateName("topic", name);
    return this.serial(async () => {
      this.check();
      const t = this.topics.get(name);
      if (!t) throw new TopicNotFoundError(name);
      const meta: EngineTopic = { name: t.name, topicId: t.topicId, createdAt: t.createdAt, config: { ...t.config, ...changes } };
      // Durable first (temp file, fdatasync, rename, directory fsync): a crash leaves the old or
      // the new metadata whole, and the change is acknowledged only once stored.
      await writeFileAtomic(this.fs, join(t.dir, "topic.json"), JSON.stringify(meta));
      // The partition logs share this config object (openLog): retention reads the new values
      // at its next check.
      Object.assign(t.config, changes);
      return { ...meta, config: { ...meta.config } };
    });
  }

  deleteTopic(name: string): Promise<void> {
    validateName("topic", name);
    return this.serial(async () => {
      this.check();
      const t = this.topics.get(name);
      if (!t) throw new TopicNotFoundError(name);
      this.topics.delete(name);
      // A reopen in progress sees the topic gone and closes what it opened.
      await Promise.all(t.logs.map((_, p) => this.recovering.get(`${t.topicId}/${p}`)));
      await Promise.all(t.logs.map((l) => l.close()));
      const trash = this.inside("trash", t.topicId);
      await this.fs.rename(t.dir, trash);
      await this.fs.fsyncDir(this.inside("topics"));
      await this.fs.rm(trash);
    });
  }

  async listTopics(): Promise<string[]> {
    return [...this.topics.keys()].sort();
  }

  private topic(name: string): Topic {
    const t = this.topics.get(name);
    if (!t) {
      validateName("topic", name);
      throw new TopicNotFoundError(name);
    }
    return t;
  }

  async getTopic(name: string): Promise<EngineTopic> {
    const t = this.topic(name);
    return { name: t.name, topicId: t.topicId, createdAt: t.createdAt, config: t.config };
  }

  log(topic: string, partition: number): PartitionLog {
    const t = this.topic(topic);
    if (!Number.isInteger(partition) || partition < 0 || partition >= t.logs.length) throw new PartitionNotFoundError(topic, partition);
    return t.logs[partition];
  }

  async describeTopic(name: string): Promise<TopicDescription> {
    const t = this.topic(name);
    return {
      name: t.name,
      topicId: t.topicId,
      createdAt: t.createdAt,
      config: { ...t.config },
      partitions: t.logs.map((l, i) => ({
        partition: i,
        logStartOffset: l.logStartOffset,
        logEndOffset: l.logEndOffset,
        highWatermark: l.highWatermark,
        sizeBytes: l.sizeBytes,
        segments: l.segmentCount,
        ...(isCompacted(t.config.cleanupPolicy) ? cleanerFigures(l) : {}),
        ...archiveFigures(l),
      })),
    };
  }

  async append(topic: string, partition: number, records: PreparedRecord[], producer?: ProducerInfo, signal?: AbortSignal) {
    this.check();
    if (producer) this.checkProducerEpoch(producer);
    return this.log(topic, partition).append(records, producer, signal);
  }

  private async appendEncoded(topic: string, partition: number, batch: Buffer, signal?: AbortSignal): Promise<AppendResult & { count: number }> {
    this.check();
    if (batch.length < HEADER_SIZE) throw new InvalidBatchError(`batch of ${batch.length} bytes is shorter than a batch header`);
    const h = readHeader(batch, 0);
    if (h.producerId >= 0) this.checkProducerEpoch({ producerId: h.producerId, producerEpoch: h.producerEpoch, baseSequence: h.baseSequence });
    const r = await this.log(topic, partition).appendEncoded(batch, signal);
    return { ...r, count: h.count };
  }

  read(topic: string, partition: number, offset: number, maxBytes: number): Promise<{ records: StoredRecord[]; nextOffset: number }> {
    // A closed engine serves nothing: its files may be going away (the next owner's, perhaps).
    if (this.closed) return Promise.reject(new BrokerClosedError());
    return this.log(topic, partition).read(offset, maxBytes);
  }

  waitFor(topic: string, partition: number, offset: number, maxWaitMs: number, signal?: AbortSignal): Promise<boolean> {
    return this.log(topic, partition).waitFor(offset, maxWaitMs, signal);
  }

  async offsets(topic: string, partition: number): Promise<PartitionOffsets> {
    const l = this.log(topic, partition);
    return { logStartOffset: l.logStartOffset, highWatermark: l.highWatermark, logEndOffset: l.logEndOffset };
  }

  offsetForTimestamp(topic: string, partition: number, ts: number): Promise<number> {
    return this.log(topic, partition).offsetForTimestamp(ts);
  }

  async enforceRetention(now = this.telemetry.clock.now()): Promise<void> {
    // One partition that cannot run retention (e.g. its archive is unreachable, ARC-1: then it
    // deletes nothing) does not hold back the others; the first error is raised at the end.
    let first: unknown = null;
    for (const t of [...this.topics.values()]) {
      for (const l of t.logs) {
        try {
          await l.enforceRetention(now);
        } catch (e) {
          this.logger.error({ err: e, topic: t.name, partition: l.partition }, "retention failed for a partition");
          first ??= e;
        }
      }
    }
    if (first !== null) throw first;
  }

  allocateProducer(producerId?: number): Promise<{ producerId: number; producerEpoch: number }> {
    return this.serial(async () => {
      this.check();
      const f = this.producerFile;
      let id: number;
      let epoch: number;
      if (producerId === undefined) {
        id = f.nextId++;
        epoch = 0;
      } else {
        if (!Number.isSafeInteger(producerId) || producerId < 0 || producerId >= f.nextId)
          throw new ValidationError(`unknown producer id ${producerId}`);
        id = producerId;
        epoch = (f.epochs[String(id)] ?? 0) + 1;
        if (epoch > 32767) throw new ValidationError(`producer ${id} has exhausted its epochs; allocate a new id`);
        f.epochs[String(id)] = epoch;
      }
      await writeFileAtomic(this.fs, this.inside("producers.json"), JSON.stringify(f));
      return { producerId: id, producerEpoch: epoch };
    });
  }

  /**
   * Fencing: once initProducer(id) has bumped the epoch, older epochs are refused on every
   * partition at once, not only where the new epoch has already written.
   */
  checkProducerEpoch(p: ProducerInfo): void {
    if (!Number.isSafeInteger(p.producerId) || p.producerId < 0 || p.producerId >= this.producerFile.nextId)
      throw new ValidationError(`unknown producer id ${p.producerId}; call initProducer() first`);
    const current = this.producerFile.epochs[String(p.producerId)] ?? 0;
    if (p.producerEpoch < current)
      throw new ProducerFencedError(`producer ${p.producerId} epoch ${p.producerEpoch} is fenced by epoch ${current}`);
    if (p.producerEpoch > current) throw new ValidationError(`producer ${p.producerId} epoch ${p.producerEpoch} was never issued`);
  }

  private groupStore(group: string): GroupOffsets {
    validateName("group", group);
    let g = this.groups.get(group);
    if (!g) {
      g = GroupOffsets.create(this.fs, this.inside("groups"), group, this.offsetsLogCompactBytes);
      this.groups.set(group, g);
    }
    return g;
  }

  async getCommitted(group: string, topic: string): Promise<Map<number, CommittedOffset>> {
    const t = this.topic(topic);
    const g = this.groups.get(validateName("group", group));
    return g ? g.get(topic, t.topicId) : new Map();
  }

  async recentResets(group: string, topic: string): Promise<OffsetReset[]> {
    const t = this.topic(topic);
    const g = this.groups.get(validateName("group", group));
    return g ? g.resets(topic, t.topicId) : [];
  }

  async listCommittedGroups(): Promise<{ group: string; topic: string }[]> {
    this.check();
    const out: { group: string; topic: string }[] = [];
    for (const [group, g] of this.groups) {
      for (const { topic, topicId } of g.topics()) {
        // Offsets of a deleted (or deleted and re-created) topic belong to no live group.
        if (this.topics.get(topic)?.topicId === topicId) out.push({ group, topic });
      }
    }
    return out.sort((a, b) => (a.group === b.group ? (a.topic < b.topic ? -1 : 1) : a.group < b.group ? -1 : 1));
  }

  /** No fence argument: groups on the disk engine are coordinated in process, which checks ownership before the call (GRP-1). */
  async commitOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void> {
    const t = this.checkOffsets(topic, offsets);
    return this.groupStore(group).commit(topic, t.topicId, offsets);
  }

  async resetOffsets(group: string, topic: string, offsets: Map<number, number>): Promise<void> {
    const t = this.checkOffsets(topic, offsets);
    // META-4: the offsets and the replay marks they leave go into one record.
    return this.groupStore(group).reset(topic, t.topicId, offsets);
  }

  private checkOffsets(topic: string, offsets: Map<number, number>): Topic {
    this.check();
    const t = this.topic(topic);
    for (const [p, o] of offsets) {
      if (!Number.isInteger(p) || p < 0 || p >= t.logs.length) throw new PartitionNotFoundError(topic, p);
      if (!Number.isSafeInteger(o) || o < 0) throw new ValidationError(`invalid offset ${o}`);
      // META-3: a committed position never lies beyond what the log holds (with durability
      // "always" the high watermark is durable, so this holds after any crash too).
      const l = t.logs[p];
      if (o > l.highWatermark) throw new OffsetOutOfRangeError(topic, p, o, l.logStartOffset, l.highWatermark);
    }
    return t;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.adminLock;
    this.closed = true;
    if (this.cleanerTimer !== null) clearTimeout(this.cleanerTimer);
    for (const wake of this.recoveryWakers) wake();
    await Promise.all(this.recovering.values());
    await this.queues.close();
    for (const g of this.groups.values()) await g.close();
    for (const t of this.topics.values()) await Promise.all(t.logs.map((l) => l.close()));
    // A compaction run stops at the next batch once its partition is closed (cleaner.ts).
    await this.cleaning;
    // Last: nothing of this engine writes to the directory any more.
    await this.dirLock?.release();
    this.dirLock = null;
  }
}
