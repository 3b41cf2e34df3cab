// SPDX-License-Identifier: Apache-2.0
/**
 * The scrape-time metrics (METRICS entries with `source: "scrape"`): computed from the broker's
 * state when an exporter collects, never by a polling timer. One `collect()` per scrape reads
 * topics, group offsets, queue stats and the data directory's file system, and returns plain
 * samples; the exporter (prometheus.ts) turns them into series.
 *
 * The cost and the output are bounded: at most `maxGroupPartitions` group x partition label
 * sets, `maxTopicPartitions` topic x partition ones and `maxQueues` queues, in name order, and
 * nothing more is started once `collectBudgetMs` has passed; whatever is left out is counted
 * in `sluice_metrics_series_dropped_total`. Rates (backlog growth, drain time) come from the
 * samples of earlier scrapes within `rateWindowMs`, kept per group (a few numbers each, and
 * only for groups that still exist).
 */
import type { GroupCoordination } from "../store/group-coordination.js";
import { statfs } from "node:fs/promises";
import { CorruptRecordError } from "../errors.js";
import type { StorageEngine } from "../store/engine.js";
import type { QueueStats } from "../queues/types.js";
import type { PartitionDescription, TopicDescription } from "../types.js";
import { METRICS, type MetricDef } from "./metrics.js";
import type { Clock, MetricLabels } from "./telemetry.js";

/** One value of one scrape-time metric. */
export interface Sample {
  metric: MetricDef;
  value: number;
  labels?: MetricLabels;
}

/** Caps on what one scrape reads and exports (docs/metrics.md, "Cardinality"). */
export interface CollectorLimits {
  /** Group x partition label sets exported (lag, lag seconds, headroom). Default 2000. */
  maxGroupPartitions?: number;
  /** Topic x partition label sets exported (retained bytes, high watermark, cleaner and archive figures). Default 10000. */
  maxTopicPartitions?: number;
  /** Queues exported. Default 1000. */
  maxQueues?: number;
  /** Past this much time a scrape starts no further group or queue. Default 5000 ms. */
  collectBudgetMs?: number;
  /** Window over which backlog growth and drain time are measured. Default 60000 ms. */
  rateWindowMs?: number;
}

/** What the collector reads; the embedded broker provides it. */
export interface CollectSource {
  readonly dataDir: string;
  readonly engine: Pick<StorageEngine, "listTopics" | "describeTopic" | "read" | "getCommitted" | "listCommittedGroups">;
  readonly coordinator: Pick<GroupCoordination, "activeGroups" | "generation">;
  readonly telemetry: { readonly clock: Clock };
  listQueues(): Promise<string[]>;
  /** A queue's stats and the name of its dead-letter queue (null: none). */
  queueMetrics(name: string): Promise<{ stats: QueueStats; deadLetter: string | null }>;
}

interface RatePoint {
  /** Monotonic ms. */
  t: number;
  backlog: number;
  produced: number;
  consumed: number;
}

/** Past this many points per group the oldest are dropped (very frequent scrapes). */
const MAX_RATE_POINTS = 64;

interface Scrape {
  out: Sample[];
  deadline: number;
  dropped: number;
}

const s = (metric: MetricDef, value: number, labels?: MetricLabels): Sample => ({ metric, value, labels });

/**
 * The cleaner's figures of a compacted partition and the archive's of an archived one, as
 * describeTopic reports them (absent fields: not that kind of topic, or another engine).
 */
function storageFigures(out: Sample[], p: PartitionDescription, labels: MetricLabels): void {
  if (p.cleanerDirtyRatio !== undefined) {
    out.push(s(METRICS.cleanerDirtyRatio, p.cleanerDirtyRatio, labels));
    out.push(s(METRICS.cleanerBytesReclaimed, p.bytesReclaimed ?? 0, labels));
    out.push(s(METRICS.cleanerPasses, p.cleanerPasses ?? 0, labels));
    if (p.lastCleanedAt != null) out.push(s(METRICS.cleanerLastPass, p.lastCleanedAt / 1000, labels));
    if (p.cleanerPassProgress != null) out.push(s(METRICS.cleanerPassProgress, p.cleanerPassProgress, labels));
  }
  if (p.archivedBytes !== undefined) {
    out.push(s(METRICS.archiveBytes, p.archivedBytes, labels));
    out.push(s(METRICS.archiveSegments, p.archivedSegments ?? 0, labels));
    out.push(s(METRICS.archiveLagBytes, p.archiveLagBytes ?? 0, labels));
    out.push(s(METRICS.archiveReadBytes, p.archiveReadBytes ?? 0, labels));
  }
}

export class BrokerCollector {
  private readonly maxGroupPartitions: number;
  private readonly maxTopicPartitions: number;
  private readonly maxQueues: number;
  private readonly budgetMs: number;
  private readonly windowMs: number;
  private dropped = 0;
  private readonly rates = new Map<string, RatePoint[]>();

  constructor(
    private readonly src: CollectSource,
    limits: CollectorLimits = {},
  ) {
    this.maxGroupPartitions = limits.maxGroupPartitions ?? 2000;
    this.maxTopicPartitions = limits.maxTopicPartitions ?? 10_000;
    this.maxQueues = limits.maxQueues ?? 1000;
    this.budgetMs = limits.collectBudgetMs ?? 5000;
    this.windowMs = limits.rateWindowMs ?? 60_000;
  }

  async collect(): Promise<Sample[]> {
    // Real time for the budget and the cost (the telemetry clock may be a test's fake one).
    const started = performance.now();
    const sc: Scrape = { out: [], deadline: started + this.budgetMs, dropped: 0 };
    const topics = await this.topics(sc);
    await this.groups(sc, topics);
    await this.queues(sc);
    await this.dataDir(sc);
    this.dropped += sc.dropped;
    sc.out.push(s(METRICS.seriesDropped, this.dropped));
    sc.out.push(s(METRICS.collectDuration, (performance.now() - started) / 1000));
    return sc.out;
  }

  /** Per topic: skew; per partition: retained bytes, high watermark, cleaner and archive figures. */
  private async topics(sc: Scrape): Promise<Map<string, TopicDescription>> {
    const out = new Map<string, TopicDescription>();
    let used = 0;
    for (const name of (await this.src.engine.listTopics()).sort()) {
      let d: TopicDescription;
      try {
        d = await this.src.engine.describeTopic(name);
      } catch {
        continue; // deleted since listed
      }
      out.set(name, d);
      let total = 0;
      let hottest = 0;
      for (const p of d.partitions) {
        total += p.highWatermark;
        hottest = Math.max(hottest, p.highWatermark);
      }
      sc.out.push(s(METRICS.partitionSkew, total === 0 ? 0 : hottest / total, { topic: name }));
      if (used + d.partitions.length > this.maxTopicPartitions) {
        sc.dropped += d.partitions.length;
        continue;
      }
      used += d.partitions.length;
      for (const p of d.partitions) {
        const labels = { topic: name, partition: p.partition };
        sc.out.push(s(METRICS.retainedBytes, p.sizeBytes, labels));
        sc.out.push(s(METRICS.partitionHighWatermark, p.highWatermark, labels));
        storageFigures(sc.out, p, labels);
      }
    }
    return out;
  }

  /** Every group with members here or committed offsets, in name order, up to the caps. */
  private async groups(sc: Scrape, topics: Map<string, TopicDescription>): Promise<void> {
    const found = new Map<string, { group: string; topic: string; members: number }>();
    for (const c of await this.src.engine.listCommittedGroups()) found.set(`${c.group}\u0000${c.topic}`, { ...c, members: 0 });
    for (const a of await this.src.coordinator.activeGroups()) found.set(`${a.group}\u0000${a.topic}`, a);
    const seen = new Set<string>();
    const timestamps = new Map<string, number | null>();
    let used = 0;
    for (const k of [...found.keys()].sort()) {
      const g = found.get(k)!;
      const t = topics.get(g.topic);
      if (t === undefined) continue;
      const n = t.partitions.length;
      if (used + n > this.maxGroupPartitions || performance.now() > sc.deadline) {
        sc.dropped += n;
        continue;
      }
      used += n;
      const rateKey = `${k}\u0000${t.topicId}`;
      if (await this.group(sc, g.group, t, rateKey, timestamps)) seen.add(rateKey);
      const labels = { group: g.group, topic: g.topic };
      sc.out.push(s(METRICS.groupMembers, g.members, labels));
      sc.out.push(s(METRICS.groupRebalances, await this.src.coordinator.generation(g.group, g.topic), labels));
    }
    for (const k of this.rates.keys()) if (!seen.has(k)) this.rates.delete(k);
  }

  /** One group on one topic: lag, lag age and headroom per partition, then its rates. */
  private async group(sc: Scrape, group: string, t: TopicDescription, rateKey: string, timestamps: Map<string, number | null>): Promise<boolean> {
    let committed;
    try {
      committed = await this.src.engine.getCommitted(group, t.name);
    } catch {
      return false; // the topic went away since it was described
    }
    const clock = this.src.telemetry.clock;
    const now = clock.now();
    const retentionMs = t.config.retentionMs;
    let backlog = 0;
    let produced = 0;
    let consumed = 0;
    for (const p of t.partitions) {
      const c = committed.get(p.partition)?.offset ?? null;
      // The first record the group still needs: its committed offset, within what is kept.
      const from = Math.min(Math.max(c ?? p.logStartOffset, p.logStartOffset), p.highWatermark);
      const lag = p.highWatermark - from;
      backlog += lag;
      produced += p.highWatermark;
      consumed += from;
      const labels = { group, topic: t.name, partition: p.partition };
      sc.out.push(s(METRICS.groupLagRecords, lag, labels));
      if (lag === 0) {
        // Nothing needed yet: the next record it will need gets the whole retention period.
        sc.out.push(s(METRICS.groupLagSeconds, 0, labels));
        sc.out.push(s(METRICS.retentionHeadroom, retentionMs >= 0 ? retentionMs / 1000 : Infinity, labels));
        continue;
      }
      const ts = await this.timestampAt(t.name, p.partition, from, timestamps);
      if (ts === null) continue; // unreadable there: no age rather than a wrong one
      sc.out.push(s(METRICS.groupLagSeconds, Math.max(0, now - ts) / 1000, labels));
      sc.out.push(s(METRICS.retentionHeadroom, retentionMs >= 0 ? (ts + retentionMs - now) / 1000 : Infinity, labels));
    }
    this.rate(sc, { group, topic: t.name }, rateKey, { t: clock.monotonicMs(), backlog, produced, consumed });
    return true;
  }

  /** Timestamp of the first readable record at or after `offset` (null: none readable). */
  private async timestampAt(topic: string, partition: number, offset: number, memo: Map<string, number | null>): Promise<number | null> {
    const key = `${topic}\u0000${partition}\u0000${offset}`;
    const known = memo.get(key);
    if (known !== undefined) return known;
    let ts: number | null = null;
    let at = offset;
    // A few steps past empty reads (a batch ending before `offset`); never a scan.
    for (let step = 0; step < 4 && ts === null; step++) {
      try {
        const r = await this.src.engine.read(topic, partition, at, 1);
        const rec = r.records.find((x) => x.offset >= offset);
        if (rec !== undefined) ts = rec.timestamp;
        else if (r.nextOffset > at) at = r.nextOffset;
        else break;
      } catch (e) {
        if (e instanceof CorruptRecordError && e.nextOffset !== undefined && e.nextOffset > at) at = e.nextOffset;
        else break;
      }
    }
    memo.set(key, ts);
    return ts;
  }

  /**
   * Backlog growth and drain time from the oldest point within the window to now. Produce rate
   * = high watermarks' growth, consume rate = committed positions' growth (records removed by
   * retention before being consumed count as consumed: they left the backlog).
   */
  private rate(sc: Scrape, labels: MetricLabels, key: string, point: RatePoint): void {
    const pts = this.rates.get(key) ?? [];
    this.rates.set(key, pts);
    // A high watermark going backwards means another topic incarnation: start over.
    if (pts.length > 0 && point.produced < pts[pts.length - 1].produced) pts.length = 0;
    pts.push(point);
    while (pts.length > 2 && point.t - pts[1].t >= this.windowMs) pts.shift();
    if (pts.length > MAX_RATE_POINTS) pts.shift();
    const first = pts[0];
    const dt = (point.t - first.t) / 1000;
    if (pts.length < 2 || dt <= 0) return; // one scrape: no rate yet
    const produceRate = (point.produced - first.produced) / dt;
    const consumeRate = (point.consumed - first.consumed) / dt;
    sc.out.push(s(METRICS.groupBacklogGrowth, (point.backlog - first.backlog) / dt, labels));
    const net = consumeRate - produceRate;
    const drain = point.backlog === 0 ? 0 : net > 0 ? point.backlog / net : -1;
    sc.out.push(s(METRICS.groupDrainSeconds, drain, labels));
  }

  private async queues(sc: Scrape): Promise<void> {
    const names = (await this.src.listQueues()).sort();
    const listed = new Set(names);
    const stats = new Map<string, { stats: QueueStats; deadLetter: string | null }>();
    for (const [i, name] of names.entries()) {
      if (i >= this.maxQueues || performance.now() > sc.deadline) {
        sc.dropped += names.length - i;
        break;
      }
      try {
        stats.set(name, await this.src.queueMetrics(name));
      } catch {
        continue; // deleted since listed
      }
    }
    for (const [name, { stats: q, deadLetter }] of stats) {
      const labels = { queue: name };
      sc.out.push(s(METRICS.queueWaiting, q.waiting, labels));
      sc.out.push(s(METRICS.queueDelayed, q.delayed, labels));
      sc.out.push(s(METRICS.queueInFlight, q.inFlight, labels));
      sc.out.push(s(METRICS.queueBlockedByKey, q.blockedByKey, labels));
      sc.out.push(s(METRICS.queueWaitingChildren, q.waitingChildren ?? 0, labels));
      sc.out.push(s(METRICS.queueDepth, q.depth, labels));
      sc.out.push(s(METRICS.queueBytes, q.bytes, labels));
      sc.out.push(s(METRICS.queueOldestWaitingAge, q.oldestWaitingAgeMs / 1000, labels));
      sc.out.push(s(METRICS.queueOldestLeaseAge, q.oldestLeaseAgeMs / 1000, labels));
      sc.out.push(s(METRICS.queueCompleted, q.completed, labels));
      sc.out.push(s(METRICS.queueRedeliveries, q.redeliveries, labels));
      sc.out.push(s(METRICS.queueRetries, q.retries, labels));
      sc.out.push(s(METRICS.queueDeadLettered, q.deadLettered, labels));
      // The dead-letter queue exists once something was moved there (or it was used).
      if (deadLetter === null || !listed.has(deadLetter)) continue;
      let dlq = stats.get(deadLetter)?.stats;
      if (dlq === undefined) dlq = await this.src.queueMetrics(deadLetter).then((x) => x.stats, () => undefined);
      if (dlq !== undefined) sc.out.push(s(METRICS.queueDeadLetterDepth, dlq.depth, labels));
    }
  }

  private async dataDir(sc: Scrape): Promise<void> {
    if (this.src.dataDir === "") return; // another engine, no directory of ours
    try {
      const st = await statfs(this.src.dataDir);
      sc.out.push(s(METRICS.dataDirFree, st.bavail * st.bsize));
      sc.out.push(s(METRICS.dataDirSize, st.blocks * st.bsize));
    } catch {
      /* the directory is gone or unreadable: the series are absent */
    }
  }
}
