// SPDX-License-Identifier: Apache-2.0
/**
 * Every metric the broker emits, declared once: name, kind, help, labels. Emitters pass the
 * name to the MetricsSink (src/observability/telemetry.ts); an exporter (e.g. the Prometheus
 * one in prometheus.ts) builds its registry from this table, and docs/metrics.md lists it (a
 * test compares the two).
 *
 * `source: "event"` metrics are emitted on the hot path through the sink; `source: "scrape"`
 * ones are computed when an exporter collects (broker-collector.ts), from the broker's state,
 * never by polling timers. Labels are only topic, partition, group and queue: their number is
 * bounded by what exists, and the scrape-time ones are capped further (docs/metrics.md).
 */
export type MetricKind = "counter" | "histogram" | "gauge";
export type MetricSource = "event" | "scrape";

export interface MetricDef {
  readonly name: string;
  readonly kind: MetricKind;
  readonly help: string;
  readonly labels: readonly string[];
  readonly source: MetricSource;
}

function def(name: string, kind: MetricKind, help: string, labels: readonly string[], source: MetricSource = "event"): MetricDef {
  return { name, kind, help, labels, source };
}
const scraped = (name: string, kind: MetricKind, help: string, labels: readonly string[]): MetricDef => def(name, kind, help, labels, "scrape");

const TP = ["topic", "partition"] as const;
const GTP = ["group", "topic", "partition"] as const;
const GT = ["group", "topic"] as const;
const Q = ["queue"] as const;

export const METRICS = {
  // ── hot path (emitted through the MetricsSink) ──
  appendDuration: def("sluice_append_duration_seconds", "histogram", "Time from an append being queued to its publication (durable with durability always).", TP),
  fsyncDuration: def("sluice_fsync_duration_seconds", "histogram", "Duration of one fdatasync of a partition's active segment.", TP),
  appendedRecords: def("sluice_records_appended_total", "counter", "Records appended (published) to partitions.", TP),
  appendedBytes: def("sluice_bytes_appended_total", "counter", "Bytes of record batches appended (published) to partitions, in the storage format.", TP),
  partitionFaults: def("sluice_partition_faults_total", "counter", "Partitions made read-only by an I/O error (each is then reopened from disk).", ["topic"]),
  partitionRecoveries: def("sluice_partition_recoveries_total", "counter", "Faulted partitions reopened from disk.", ["topic"]),
  commitFailures: def("sluice_group_commit_failures_total", "counter", "Offset commits of a consumer group that failed (the records since the last commit are delivered again).", GT),

  // ── computed at scrape time (broker-collector.ts) ──
  groupLagRecords: scraped("sluice_group_lag_records", "gauge", "Records in the partition the group has not committed (high watermark minus committed offset, or minus log start when nothing is committed).", GTP),
  groupLagSeconds: scraped("sluice_group_lag_seconds", "gauge", "Age of the oldest record the group has not committed: now minus its timestamp; 0 when caught up.", GTP),
  retentionHeadroom: scraped("sluice_group_retention_headroom_seconds", "gauge", "Time until time retention may delete the oldest record the group still needs (its timestamp + retentionMs - now; negative when overdue); the topic's whole retention when caught up; +Inf without time retention.", GTP),
  groupBacklogGrowth: scraped("sluice_group_backlog_growth_records_per_second", "gauge", "Change of the group's total lag per second (produce rate minus consume rate) over the last minute of scrapes; positive = falling behind.", GT),
  groupDrainSeconds: scraped("sluice_group_drain_time_seconds", "gauge", "Estimated time to consume the group's backlog at the current rates: backlog / (consume rate - produce rate); 0 when caught up; -1 when not draining.", GT),
  groupRebalances: scraped("sluice_group_rebalances_total", "counter", "Rebalances of the group (its generation) since the broker started.", GT),
  groupMembers: scraped("sluice_group_members", "gauge", "Members of the group connected to this broker.", GT),
  retainedBytes: scraped("sluice_partition_retained_bytes", "gauge", "Bytes the partition holds on disk (all its segments).", TP),
  partitionHighWatermark: scraped("sluice_partition_high_watermark", "gauge", "Next offset to be published in the partition (records appended since the topic was created).", TP),
  cleanerDirtyRatio: scraped("sluice_cleaner_dirty_ratio", "gauge", "Share of the partition's sealed bytes not yet covered by a compaction pass (compacted topics; 1 after a restart until the first pass).", TP),
  cleanerBytesReclaimed: scraped("sluice_cleaner_bytes_reclaimed_total", "counter", "Bytes removed from the partition by compaction since the broker started (compacted topics).", TP),
  cleanerPasses: scraped("sluice_cleaner_passes_total", "counter", "Compaction passes completed on the partition since the broker started (compacted topics).", TP),
  cleanerLastPass: scraped("sluice_cleaner_last_pass_timestamp_seconds", "gauge", "When the partition's last compaction pass completed (compacted topics; absent until the first pass since the broker started).", TP),
  cleanerPassProgress: scraped("sluice_cleaner_pass_progress_ratio", "gauge", "Share of the partition's running compaction pass done (compacted topics; absent while no pass runs).", TP),
  archiveBytes: scraped("sluice_archive_bytes", "gauge", "Bytes of the partition's archived segments (topics with an archive).", TP),
  archiveSegments: scraped("sluice_archive_segments", "gauge", "Segments of the partition held in the archive (topics with an archive).", TP),
  archiveLagBytes: scraped("sluice_archive_lag_bytes", "gauge", "Bytes of local segments retention is waiting to delete that are not archived yet (topics with an archive); above 0 while archiving is slow or failing.", TP),
  archiveReadBytes: scraped("sluice_archive_read_bytes_total", "counter", "Bytes of record batches served from the partition's archive to reads since the broker started (topics with an archive).", TP),
  partitionSkew: scraped("sluice_topic_partition_skew_ratio", "gauge", "Share of the topic's appended records held by its hottest partition (1/partitions when even, 1 when all in one).", ["topic"]),
  queueWaiting: scraped("sluice_queue_waiting", "gauge", "Jobs visible and deliverable now.", Q),
  queueDelayed: scraped("sluice_queue_delayed", "gauge", "Jobs not yet visible (delay or retry backoff).", Q),
  queueInFlight: scraped("sluice_queue_in_flight", "gauge", "Jobs leased to a worker and not yet settled.", Q),
  queueBlockedByKey: scraped("sluice_queue_blocked_by_key", "gauge", "Keyed jobs held behind an earlier job of the same key.", Q),
  queueWaitingChildren: scraped("sluice_queue_waiting_children", "gauge", "Flow parents waiting for their children to finish.", Q),
  queueDepth: scraped("sluice_queue_depth", "gauge", "All live jobs: waiting + delayed + in flight + blocked by key + waiting for children.", Q),
  queueBytes: scraped("sluice_queue_bytes", "gauge", "Bytes of the live jobs' payloads.", Q),
  queueOldestWaitingAge: scraped("sluice_queue_oldest_waiting_age_seconds", "gauge", "How long the oldest waiting job has been deliverable; 0 when none waits.", Q),
  queueOldestLeaseAge: scraped("sluice_queue_oldest_lease_age_seconds", "gauge", "Age of the oldest lease still held by a worker; 0 when none.", Q),
  queueDeadLetterDepth: scraped("sluice_queue_dead_letter_depth", "gauge", "Live jobs in the queue's dead-letter queue (absent when it has none).", Q),
  queueCompleted: scraped("sluice_queue_completed_total", "counter", "Jobs acknowledged since the queue was opened.", Q),
  queueRedeliveries: scraped("sluice_queue_redeliveries_total", "counter", "Deliveries of a job after its first (after a retry or a lost lease) since the queue was opened.", Q),
  queueRetries: scraped("sluice_queue_retries_total", "counter", "Failed attempts scheduled for retry since the queue was opened.", Q),
  queueDeadLettered: scraped("sluice_queue_dead_lettered_total", "counter", "Jobs the queue has moved to its dead-letter queue.", Q),
  dataDirFree: scraped("sluice_data_dir_free_bytes", "gauge", "Space available to the broker on the data directory's file system.", []),
  dataDirSize: scraped("sluice_data_dir_size_bytes", "gauge", "Size of the data directory's file system.", []),
  seriesDropped: scraped("sluice_metrics_series_dropped_total", "counter", "Label sets (group x partition, topic x partition, queue) left out of scrapes because a cap or the collection time budget was reached.", []),
  collectDuration: scraped("sluice_metrics_collect_duration_seconds", "gauge", "Time the last scrape spent computing the broker's scrape-time metrics.", []),
} as const satisfies Record<string, MetricDef>;
