// SPDX-License-Identifier: Apache-2.0
/**
 * The scripted workload of the crash-point enumeration (crash-points.ts); it records every
 * outcome it sees in the ledger (crash-ledger.ts). The workload is a function of its seed: record sizes and
 * contents, batch shapes and concurrency come from a seeded PRNG, the wall clock only moves
 * when the workload sleeps (a virtual Date.now(), so a nack delay can not expire between two
 * steps on a slow machine) and every such wait is arranged so that nothing else can happen
 * meanwhile, so on the crash model's file system (calls complete in call order) it issues the
 * same I/O operations in the same order on every run.
 *
 * Phases (`ctx.phase`) name the step each I/O operation belongs to, so a report can say how
 * many crash points of, say, the segment roll were tried. The phases enumerated exhaustively
 * by default are DEFAULT_EXHAUSTIVE_PHASES. The script (Workload.run) is one method per group
 * of phases, in order; the operations it is made of record what they issue and what is
 * acknowledged in the ledger.
 */
import { openBroker, type EmbeddedBroker } from "../broker/broker.js";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import type { FaultyFileSystem } from "./faulty-fs.js";
import { tagOf, tagValue, type BatchEntry, type CommitEntry, type JobState, type Ledger, type ProducerEntry, type RecordEntry, type RetentionEntry } from "./crash-ledger.js";
import type { Job, Queue, QueueConfig, Worker } from "../queues/types.js";
import type { Message, PublishReceipt, Subscription, TopicConfig } from "../types.js";

export const CP_TOPIC = "cp.events";
export const CP_RETAINED = "cp.retained";
export const CP_QUEUE = "cp.jobs";
export const CP_DLQ = "cp.jobs.dlq";
export const CP_GROUP = "cp.group";
export const CP_TOPIC_CONFIG: TopicConfig = { partitions: 2, segmentBytes: 2048 };
export const CP_RETAINED_CONFIG: TopicConfig = { partitions: 1, segmentBytes: 1024, retentionBytes: 2048 };
export const CP_QUEUE_CONFIG: QueueConfig = {
  maxAttempts: 3,
  segmentBytes: 16 * 1024,
  maxMessageBytes: 4096,
  visibilityTimeoutMs: 60_000,
  backoff: { type: "fixed", minDelayMs: 20, maxDelayMs: 20 },
};
/** Nack delay used by the workload; it then waits NACK_WAIT_MS with a full worker, so the redelivery order does not depend on timing. */
const NACK_DELAY_MS = 5;
const NACK_WAIT_MS = 30;

/**
 * Phases enumerated exhaustively by default: a segment roll with idempotent producer state in
 * flight, the first group commit (it creates the offsets log), and one queue settle of each
 * kind (ack, nack with delay, dead-letter, which also creates the DLQ). Other phases: open,
 * create-topics, init-producers, publish, publish-enospc, publish-retry, fill, publish-more,
 * consume, commit-fail, commit-snapshot, enqueue, work, nack-again, ack-held,
 * dead-letter-max, ack-batch, redrive, publish-retained, retention, close, reopen,
 * after-reopen.
 */
export const DEFAULT_EXHAUSTIVE_PHASES = ["roll", "commit", "ack", "nack", "dead-letter"];

export class CrashedError extends Error {
  constructor() {
    super("the file system crashed");
  }
}

// ───────────────────────────── context ─────────────────────────────

export interface WorkloadContext {
  readonly fs: FaultyFileSystem;
  readonly dataDir: string;
  readonly ledger: Ledger;
  readonly rng: () => number;
  /** Current phase (each counted I/O operation is attributed to it). */
  phaseName: string;
  /** Moves the (virtual) wall clock on by `ms`: the only way time passes for the broker during the workload. */
  advanceClock(ms: number): void;
}

/** Runs the workload; resolves when it is done, rejects with CrashedError once the file system crashed. */
export class Workload {
  broker: EmbeddedBroker | null = null;
  private closables: { close(): Promise<unknown> }[] = [];
  private crashed: Promise<never>;
  private plain = 0;
  private jobSeq = 0;

  constructor(readonly ctx: WorkloadContext) {
    this.crashed = ctx.fs.whenCrashed().then(() => {
      throw new CrashedError();
    });
    this.crashed.catch(() => {});
  }

  private get L(): Ledger {
    return this.ctx.ledger;
  }
  phase(name: string): void {
    this.ctx.phaseName = name;
  }
  /** Awaits `p`, or throws CrashedError as soon as the file system crashed. */
  async step<T>(p: Promise<T>): Promise<T> {
    if (this.ctx.fs.isCrashed) {
      p.catch(() => {});
      throw new CrashedError();
    }
    p.catch(() => {});
    return Promise.race([p, this.crashed]);
  }
  /** Lets `ms` pass: the virtual wall clock moves on at once, then timers that became due run. */
  private sleep(ms: number): Promise<void> {
    this.ctx.advanceClock(ms);
    return this.step(new Promise<void>((r) => setTimeout(r, ms)));
  }
  /** An error that is neither the crash nor an injected fault: the workload itself is wrong. */
  private unexpected(what: string, e: unknown): void {
    if (this.ctx.fs.isCrashed || this.L.frozen) return;
    this.L.errors.push(`${what}: ${(e as Error)?.stack ?? String(e)}`);
  }

  /** Closes what the abandoned workload holds open (subscriptions, workers, the broker) without waiting long. */
  async abandon(): Promise<boolean> {
    const all = [...this.closables.map((c) => c.close()), ...(this.broker ? [this.broker.close()] : [])];
    for (const p of all) p.catch(() => {});
    let timer: NodeJS.Timeout | undefined;
    const settled = await Promise.race([Promise.allSettled(all).then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), 2000)))]);
    clearTimeout(timer);
    return settled;
  }

  private async open(): Promise<EmbeddedBroker> {
    const b = await this.step(openBroker({ dataDir: this.ctx.dataDir, fs: this.ctx.fs, retentionCheckIntervalMs: 0 }));
    this.broker = b;
    return b;
  }

  // ─────────── topics and producers ───────────

  private async createTopic(b: EmbeddedBroker, name: string, config: TopicConfig): Promise<void> {
    this.L.topics.set(name, "pending");
    await this.step(b.createTopic(name, config));
    this.L.topics.set(name, "acked");
  }

  private async initProducer(b: EmbeddedBroker, name: string, topic: string, partition: number): Promise<ProducerEntry> {
    const id = await this.step(b.initProducer());
    const p: ProducerEntry = { name, producerId: id.producerId, epoch: id.producerEpoch, topic, partition, nextSeq: 0, batches: [] };
    this.L.producers.push(p);
    return p;
  }

  /** Sends one idempotent batch of `n` records (sizes in [min, max]); the returned promise never rejects. */
  private sendBatch(b: EmbeddedBroker, p: ProducerEntry, n: number, min: number, max: number): { batch: BatchEntry; done: Promise<boolean> } {
    const batch: BatchEntry = { producer: p, seq: p.nextSeq, tags: [], status: "pending", offset: null, duplicate: false };
    p.nextSeq += n;
    for (let i = 0; i < n; i++) {
      const tag = `${p.name}.${batch.seq + i}`;
      const value = tagValue(tag, this.ctx.rng, min, max);
      batch.tags.push(tag);
      this.L.records.set(tag, { tag, topic: p.topic, partition: p.partition, value, status: "pending", offset: null, batch });
    }
    p.batches.push(batch);
    return { batch, done: this.publish(b, batch) };
  }

  /** (Re)sends `batch`; resolves true if acknowledged, false on an error. */
  private publish(b: EmbeddedBroker, batch: BatchEntry): Promise<boolean> {
    const p = batch.producer;
    const records = batch.tags.map((t) => ({ value: this.L.records.get(t)!.value, partition: p.partition }));
    batch.status = "pending";
    for (const t of batch.tags) this.L.records.get(t)!.status = "pending";
    return b.publishBatch(p.topic, records, { producerId: p.producerId, producerEpoch: p.epoch, baseSequence: batch.seq }).then(
      (rs: PublishReceipt[]) => {
        if (this.L.frozen) return true;
        batch.status = "acked";
        batch.offset = rs[0].offset;
        batch.duplicate = rs[0].duplicate;
        rs.forEach((r, i) => {
          const e = this.L.records.get(batch.tags[i])!;
          e.status = "acked";
          e.offset = r.offset;
        });
        return true;
      },
      () => {
        if (!this.L.frozen) {
          batch.status = "failed";
          for (const t of batch.tags) this.L.records.get(t)!.status = "failed";
        }
        return false;
      },
    );
  }

  /** A plain (non-idempotent) publish; never rejects. */
  private publishPlain(b: EmbeddedBroker, topic: string, partition: number, min: number, max: number): Promise<boolean> {
    const tag = `X${this.plain++}`;
    const value = tagValue(tag, this.ctx.rng, min, max);
    const e: RecordEntry = { tag, topic, partition, value, status: "pending", offset: null, batch: null };
    this.L.records.set(tag, e);
    return b.publish(topic, value, { partition }).then(
      (r) => {
        if (this.L.frozen) return true;
        e.status = "acked";
        e.offset = r.offset;
        return true;
      },
      (err) => {
        if (!this.L.frozen) e.status = "failed";
        this.unexpected(`publish ${tag}`, err);
        return false;
      },
    );
  }

  /** One round: every producer sends 1..maxBatches batches at once (several in flight), plus maybe a plain publish. */
  private async round(b: EmbeddedBroker, producers: ProducerEntry[], maxBatches: number, plain: boolean): Promise<BatchEntry[]> {
    const rng = this.ctx.rng;
    const sent: { batch: BatchEntry; done: Promise<boolean> }[] = [];
    for (const p of producers) {
      const k = 1 + Math.floor(rng() * maxBatches);
      for (let i = 0; i < k; i++) sent.push(this.sendBatch(b, p, 1 + Math.floor(rng() * 2), 60, 200));
    }
    const extra = plain ? [this.publishPlain(b, CP_TOPIC, 1, 60, 200)] : [];
    await this.step(Promise.all([...sent.map((s) => s.done), ...extra]));
    return sent.map((s) => s.batch);
  }

  /** Segment files of a partition, from the data dir (a test tool may look; no engine internals). */
  private segments(topic: string, partition: number): { count: number; activeSize: number; sizes: number[]; active: string } {
    const dir = join(this.ctx.dataDir, "topics", topic, String(partition));
    const logs = readdirSync(dir).filter((n) => /^\d{20}\.log$/.test(n)).sort();
    const sizes = logs.map((n) => statSync(join(dir, n)).size);
    return { count: logs.length, activeSize: logs.length === 0 ? 0 : sizes[sizes.length - 1], sizes, active: join(dir, logs[logs.length - 1] ?? "") };
  }
  private activeSize(topic: string, partition: number): number {
    return this.segments(topic, partition).activeSize;
  }
  private segmentCount(topic: string, partition: number): number {
    return this.segments(topic, partition).count;
  }

  // ─────────── consumer group ───────────

  private commitIssued(partition: number, value: number): CommitEntry {
    const key = `${CP_GROUP}|${CP_TOPIC}|${partition}`;
    let c = this.L.commits.get(key);
    if (!c) this.L.commits.set(key, (c = { group: CP_GROUP, topic: CP_TOPIC, partition, acked: null, issued: null }));
    c.issued = Math.max(c.issued ?? -1, value);
    return c;
  }
  /** Commits `msg` (offset + 1); resolves true when acknowledged, false on an error. */
  private commit(msg: Message): Promise<boolean> {
    const c = this.commitIssued(msg.partition, msg.offset + 1);
    return msg.commit().then(
      () => {
        if (!this.L.frozen) c.acked = Math.max(c.acked ?? -1, msg.offset + 1);
        return true;
      },
      () => false,
    );
  }

  // ─────────── queues ───────────

  private newJob(): { tag: string; data: string } {
    const tag = `J${this.jobSeq++}`;
    const data = tagValue(tag, this.ctx.rng, 380, 560);
    this.L.jobs.set(tag, { tag, data, acked: "none", pending: "Q", lives: [{ queue: CP_QUEUE, id: null, attempts: [] }], redrives: { issued: 0, acked: 0 } });
    return { tag, data };
  }
  private enqueueBatch(q: Queue<string>, n: number, opts: { delayMs?: number } = {}): Promise<void> {
    const jobs = Array.from({ length: n }, () => this.newJob());
    return q.enqueueBatch(jobs.map((j) => ({ data: j.data, ...opts }))).then(
      (rs) => {
        if (this.L.frozen) return;
        this.L.queues.set(CP_QUEUE, "acked");
        rs.forEach((r, i) => {
          const j = this.L.jobs.get(jobs[i].tag)!;
          j.acked = "Q";
          j.pending = null;
          j.lives[0].id = r.id;
        });
      },
      (e) => this.unexpected("enqueue", e),
    );
  }
  private async next(it: AsyncIterator<Job<string>>): Promise<Job<string>> {
    const r = await this.step(it.next());
    if (r.done) throw new Error("worker ended");
    const j = r.value;
    const tag = tagOf(j.data);
    if (tag !== null && this.L.jobs.has(tag) && !this.L.frozen) this.L.jobLife(tag, CP_QUEUE, j.id).attempts.push(j.attempt);
    return j;
  }
  private settle(job: Job<string>, how: "ack" | "nack" | "dlq"): Promise<void> {
    const tag = tagOf(job.data)!;
    const e = this.L.jobs.get(tag)!;
    const target: JobState = how === "ack" ? "done" : how === "dlq" || job.attempt >= CP_QUEUE_CONFIG.maxAttempts! ? "DLQ" : "Q";
    e.pending = target;
    const p = how === "ack" ? job.ack() : how === "nack" ? job.nack({ delayMs: NACK_DELAY_MS, reason: "retry later" }) : job.nack({ requeue: false, reason: "poison" });
    return this.step(
      p.then(() => {
        if (this.L.frozen) return;
        e.acked = target;
        e.pending = null;
      }),
    );
  }

  // ─────────── the script, phase by phase ───────────

  async run(): Promise<void> {
    this.phase("open");
    const b = await this.open();
    const [p1, p2, p3] = await this.createTopicsAndProducers(b);
    await this.publishRounds(b, [p1, p2, p3]);
    await this.publishThroughEnospc(b, p1, p2);
    await this.rollSegment(b, p1, p2);
    this.phase("publish-more");
    for (let r = 0; r < 4; r++) await this.round(b, [p1, p2, p3], 3, r % 2 === 0);
    await this.consumeAndCommit(b);
    const q = await this.enqueueJobs(b);
    const poison = await this.settleEachKind(q);
    await this.ackBatches(q);
    await this.redrivePoison(b, poison);
    await this.enforceRetention(b);
    const reopened = await this.closeAndReopen(b);
    await this.afterReopen(reopened, [p1, p3]);
    this.phase("end");
  }

  private async createTopicsAndProducers(b: EmbeddedBroker): Promise<ProducerEntry[]> {
    this.phase("create-topics");
    await this.createTopic(b, CP_TOPIC, CP_TOPIC_CONFIG);
    await this.createTopic(b, CP_RETAINED, CP_RETAINED_CONFIG);
    this.phase("init-producers");
    const p1 = await this.initProducer(b, "A", CP_TOPIC, 0);
    const p2 = await this.initProducer(b, "B", CP_TOPIC, 0);
    const p3 = await this.initProducer(b, "C", CP_TOPIC, 1);
    return [p1, p2, p3];
  }

  /** Idempotent publishing, several batches of each producer in flight. */
  private async publishRounds(b: EmbeddedBroker, producers: ProducerEntry[]): Promise<void> {
    const [p1] = producers;
    this.phase("publish");
    for (let r = 0; r < 3; r++) await this.round(b, producers, 2, r === 1);
    // Make room for the whole of the next round in the active segment, so the fault injected
    // next hits its write.
    for (let guard = 0; guard < 16 && CP_TOPIC_CONFIG.segmentBytes! - this.activeSize(CP_TOPIC, 0) < 800; guard++) await this.step(this.sendBatch(b, p1, 1, 150, 150).done);
  }

  /** A write that fails (disk full): every batch of that round fails and is retried, in order. */
  private async publishThroughEnospc(b: EmbeddedBroker, p1: ProducerEntry, p2: ProducerEntry): Promise<void> {
    this.phase("publish-enospc");
    this.ctx.fs.failNext("write", "ENOSPC", { pathIncludes: this.segments(CP_TOPIC, 0).active });
    const round = [this.sendBatch(b, p1, 1, 100, 180), this.sendBatch(b, p2, 2, 60, 120), this.sendBatch(b, p1, 1, 100, 180)];
    await this.step(Promise.all(round.map((x) => x.done)));
    const failed = round.map((x) => x.batch).filter((x) => x.status === "failed");
    if (failed.length === 0) this.unexpected("publish-enospc", new Error("the injected ENOSPC failed no batch"));
    this.phase("publish-retry");
    const retried = await this.step(Promise.all(failed.map((x) => this.publish(b, x))));
    if (retried.some((ok) => !ok)) this.unexpected("publish-retry", new Error("a retry after ENOSPC failed"));
  }

  /**
   * Fills the active segment of partition 0 until one batch of ~300 B fits and two do not,
   * then sends four such batches at once: one round whose batches straddle a segment roll.
   */
  private async rollSegment(b: EmbeddedBroker, p1: ProducerEntry, p2: ProducerEntry): Promise<void> {
    this.phase("fill");
    const segBytes = CP_TOPIC_CONFIG.segmentBytes!;
    for (let guard = 0; guard < 64; guard++) {
      const free = segBytes - this.activeSize(CP_TOPIC, 0);
      if (free >= 300 && free < 580) break;
      const size = free >= 580 ? Math.min(200, free - 420) : 200;
      await this.step(this.sendBatch(b, p1, 1, Math.max(60, size - 70), Math.max(60, size - 70)).done);
    }
    this.phase("roll");
    const before = this.segmentCount(CP_TOPIC, 0);
    const rollBatches = [this.sendBatch(b, p1, 1, 230, 230), this.sendBatch(b, p2, 1, 230, 230), this.sendBatch(b, p1, 1, 230, 230), this.sendBatch(b, p2, 1, 230, 230)];
    await this.step(Promise.all(rollBatches.map((x) => x.done)));
    if (this.segmentCount(CP_TOPIC, 0) !== before + 1) this.L.notes.push(`roll phase: expected one roll of ${CP_TOPIC}/0, saw ${this.segmentCount(CP_TOPIC, 0) - before}`);
  }

  /**
   * Consumer group: the first commit creates the offsets log; later ones append (coalesced);
   * one fails (injected), so the next is written as a snapshot.
   */
  private async consumeAndCommit(b: EmbeddedBroker): Promise<void> {
    const sub: Subscription<string> = b.subscribe<string>(CP_TOPIC, { group: CP_GROUP, start: "earliest" });
    this.closables.push(sub);
    const it = sub[Symbol.asyncIterator]();
    const nextMsg = async (): Promise<Message<string>> => {
      const r = await this.step(it.next());
      if (r.done) throw new Error("subscription ended");
      return r.value;
    };
    this.phase("consume");
    let m = await nextMsg();
    this.phase("commit");
    await this.step(this.commit(m));
    this.phase("consume");
    const commits: Promise<boolean>[] = [];
    for (let i = 0; i < 8; i++) {
      m = await nextMsg();
      if (i % 2 === 1) commits.push(this.commit(m));
    }
    await this.step(Promise.all(commits));
    this.phase("commit-fail");
    this.ctx.fs.failNext("datasync", "EIO", { pathIncludes: `${CP_GROUP}.log` });
    m = await nextMsg();
    if (await this.step(this.commit(m))) this.unexpected("commit-fail", new Error("the injected commit failure did not fail the commit"));
    m = await nextMsg();
    this.phase("commit-snapshot");
    await this.step(this.commit(m));
    this.phase("consume");
    await this.step(sub.close());
  }

  /** Work queue: two batches at once, then one by one, the last delayed far into the future. */
  private async enqueueJobs(b: EmbeddedBroker): Promise<Queue<string>> {
    const q = b.queue<string>(CP_QUEUE, CP_QUEUE_CONFIG);
    this.L.queues.set(CP_QUEUE, "pending");
    this.phase("enqueue");
    await this.step(Promise.all([this.enqueueBatch(q, 5), this.enqueueBatch(q, 5)]));
    for (let i = 0; i < 5; i++) await this.step(this.enqueueBatch(q, 2 + Math.floor(this.ctx.rng() * 5)));
    await this.step(this.enqueueBatch(q, 1, { delayMs: 10 * 60_000 }));
    return q;
  }

  /**
   * One worker (prefetch 1) settles one job of each kind: ack, nack with delay, dead-letter,
   * nack again, ack of a held job, nack at maxAttempts (dead-letters it). Returns the job
   * dead-lettered explicitly (the poison job).
   */
  private async settleEachKind(q: Queue<string>): Promise<Job<string>> {
    this.phase("work");
    const w1: Worker<string> = q.work({ prefetch: 1, consumerId: "cp-worker-1" });
    this.closables.push(w1);
    const it1 = w1[Symbol.asyncIterator]();
    let j = await this.next(it1);
    this.phase("ack");
    await this.settle(j, "ack");
    this.phase("work");
    const retry = await this.next(it1);
    this.phase("nack");
    await this.settle(retry, "nack");
    this.phase("work");
    // The worker (prefetch 1) now holds the next job until the nacked one is visible again, so
    // the nacked job is the next one granted whatever the timing.
    const poison = await this.next(it1);
    await this.sleep(NACK_WAIT_MS);
    this.phase("dead-letter");
    await this.settle(poison, "dlq");
    this.phase("work");
    j = await this.next(it1); // the retried job, attempt 2
    this.phase("nack-again");
    await this.settle(j, "nack");
    this.phase("work");
    const hold = await this.next(it1);
    await this.sleep(NACK_WAIT_MS);
    this.phase("ack-held");
    await this.settle(hold, "ack");
    this.phase("work");
    j = await this.next(it1); // attempt 3 = maxAttempts: this nack dead-letters it
    this.phase("dead-letter-max");
    await this.settle(j, "nack");
    this.phase("work");
    await this.step(w1.close());
    return poison;
  }

  /** Several acks sharing one journal append. */
  private async ackBatches(q: Queue<string>): Promise<void> {
    const w2: Worker<string> = q.work({ prefetch: 4, consumerId: "cp-worker-2" });
    this.closables.push(w2);
    const it2 = w2[Symbol.asyncIterator]();
    for (let r = 0; r < 2; r++) {
      const jobs: Job<string>[] = [];
      for (let i = 0; i < 4; i++) jobs.push(await this.next(it2));
      this.phase("ack-batch");
      await this.step(Promise.all(jobs.map((x) => this.settle(x, "ack"))));
      this.phase("work");
    }
    await this.step(w2.close());
  }

  /** Redrives the poison job from the dead-letter queue back to its source. */
  private async redrivePoison(b: EmbeddedBroker, poison: Job<string>): Promise<void> {
    const dlq = b.queue<string>(CP_DLQ);
    const poisonTag = tagOf(poison.data)!;
    const pe = this.L.jobs.get(poisonTag)!;
    this.phase("redrive");
    pe.redrives.issued++;
    pe.pending = "Q";
    const rd = await this.step(dlq.redrive({ filter: { ids: [poison.id] } }));
    if (!this.L.frozen) {
      if (rd.moved !== 1) this.unexpected("redrive", new Error(`redrive moved ${rd.moved} jobs, expected 1`));
      pe.redrives.acked++;
      pe.acked = "Q";
      pe.pending = null;
      pe.lives.push({ queue: CP_QUEUE, id: null, attempts: [] });
    }
  }

  /** Retention: several small segments, then enforceRetention() deletes the oldest. */
  private async enforceRetention(b: EmbeddedBroker): Promise<void> {
    this.phase("publish-retained");
    // Until the segments after the oldest hold more than retentionBytes: retention then deletes at least the oldest.
    const enough = (): boolean => {
      const { sizes } = this.segments(CP_RETAINED, 0);
      return sizes.length >= 3 && sizes.slice(1).reduce((a, z) => a + z, 0) > CP_RETAINED_CONFIG.retentionBytes!;
    };
    for (let i = 0; i < 32 && !enough(); i++) await this.step(this.publishPlain(b, CP_RETAINED, 0, 260, 300));
    const ret: RetentionEntry = { topic: CP_RETAINED, partition: 0, acked: 0, bound: (await this.step(b.describeTopic(CP_RETAINED))).partitions[0].highWatermark, issued: true };
    this.L.retention.set(`${CP_RETAINED}|0`, ret);
    this.phase("retention");
    await this.step(b.enforceRetention());
    ret.acked = (await this.step(b.describeTopic(CP_RETAINED))).partitions[0].logStartOffset;
    if (ret.acked === 0) this.L.notes.push("retention phase deleted nothing");
  }

  /** Clean close and reopen: snapshots, .clean markers, queue compaction, then recovery. */
  private async closeAndReopen(b: EmbeddedBroker): Promise<EmbeddedBroker> {
    this.phase("close");
    await this.step(b.close());
    this.broker = null;
    this.phase("reopen");
    return this.open();
  }

  /** The reopened broker takes new batches of old producers, commits and settles. */
  private async afterReopen(b: EmbeddedBroker, producers: ProducerEntry[]): Promise<void> {
    this.phase("after-reopen");
    await this.round(b, producers, 2, false);
    const sub2: Subscription<string> = b.subscribe<string>(CP_TOPIC, { group: CP_GROUP, start: "earliest" });
    this.closables.push(sub2);
    const itb = sub2[Symbol.asyncIterator]();
    const r2 = await this.step(itb.next());
    if (!r2.done) await this.step(this.commit(r2.value));
    await this.step(sub2.close());
    const q2 = b.queue<string>(CP_QUEUE);
    const w3: Worker<string> = q2.work({ prefetch: 4, consumerId: "cp-worker-3" });
    this.closables.push(w3);
    const it3 = w3[Symbol.asyncIterator]();
    const jobs: Job<string>[] = [];
    for (let i = 0; i < 4; i++) jobs.push(await this.next(it3));
    await this.step(Promise.all(jobs.map((x) => this.settle(x, "ack"))));
    await this.step(w3.close());
    await this.step(this.enqueueBatch(q2, 3));
  }
}
