// SPDX-License-Identifier: Apache-2.0
/**
 * Every metric the broker emits, declared once: name, kind, help, labels. Emitters pass the
 * name to the MetricsSink (src/observability/telemetry.ts); an exporter (e.g. prom-client)
 * builds its registry from this table.
 */
export type MetricKind = "counter" | "histogram" | "gauge";

export interface MetricDef {
  readonly name: string;
  readonly kind: MetricKind;
  readonly help: string;
  readonly labels: readonly string[];
}

function def(name: string, kind: MetricKind, help: string, labels: readonly string[]): MetricDef {
  return { name, kind, help, labels };
}

export const METRICS = {
  appendDuration: def("sluice_append_duration_seconds", "histogram", "Time from an append being queued to its publication (durable with durability always).", ["topic"]),
  fsyncDuration: def("sluice_fsync_duration_seconds", "histogram", "Duration of one fdatasync of a partition's active segment.", ["topic"]),
  appendedRecords: def("sluice_records_appended_total", "counter", "Records appended (published) to partitions.", ["topic"]),
  partitionFaults: def("sluice_partition_faults_total", "counter", "Partitions made read-only by an I/O error (each is then reopened from disk).", ["topic"]),
  partitionRecoveries: def("sluice_partition_recoveries_total", "counter", "Faulted partitions reopened from disk.", ["topic"]),
} as const satisfies Record<string, MetricDef>;
