// SPDX-License-Identifier: Apache-2.0
/**
 * Metrics of the consumer contracts that run in the application (docs/patterns.md): entities
 * parked by a `VersionSequencer` (a missing version holds the later ones) and keys paused by an
 * `orderedProcessor`'s poison policy (never committed past until resumed or skipped). They live
 * in the application's process and database, not in the broker, so the application registers
 * them on its own registry; like the broker's scrape-time metrics they are computed when the
 * registry is read, never by a timer. Labels: `consumer` only (the names the application
 * passes), so their number is what the application registers.
 */
import { Gauge, type Registry } from "prom-client";
import type { ParkedEntity } from "../contracts/sequencer.js";
import type { PausedKey } from "../contracts/ordered.js";
import { ValidationError } from "../errors.js";
import type { MetricDef } from "./metrics.js";

const consumerGauge = (name: string, help: string): MetricDef => ({ name, kind: "gauge", help, labels: ["consumer"], source: "scrape" });

export const CONTRACT_METRICS = {
  parkedEntities: consumerGauge("sluice_consumer_parked_entities", "Entities whose next version has not arrived: their later versions are parked (VersionSequencer)."),
  parkedOldestAge: consumerGauge("sluice_consumer_parked_oldest_age_seconds", "Age of the oldest parked version; 0 when nothing is parked."),
  pausedKeys: consumerGauge("sluice_consumer_paused_keys", "Keys an ordered processor's poison policy holds (unknown defect or missing predecessor): never committed past until resumed or skipped."),
  pausedOldestAge: consumerGauge("sluice_consumer_paused_oldest_age_seconds", "How long the longest-paused key has been held; 0 when none is."),
} as const satisfies Record<string, MetricDef>;

export interface ContractMetricsOptions {
  registry: Registry;
  /** Version sequencers by consumer name. */
  sequencers?: Record<string, { listParked(): Promise<ParkedEntity[]> }>;
  /** Running ordered processors (`orderedProcessor(...)`) by consumer name. */
  processors?: Record<string, { paused(): PausedKey[] }>;
  now?: () => number;
}

/** Registers the contract gauges on `registry`; returns the function that removes them. */
export function contractMetrics(o: ContractMetricsOptions): () => void {
  const now = o.now ?? Date.now;
  for (const d of Object.values(CONTRACT_METRICS)) {
    if (o.registry.getSingleMetric(d.name) !== undefined) throw new ValidationError(`metric ${d.name} is already registered on this registry (register the contract metrics once, with every consumer)`);
  }
  const seqs = Object.entries(o.sequencers ?? {});
  const procs = Object.entries(o.processors ?? {});
  // One read of every sequencer per scrape (the parked table), shared by its two gauges.
  let parkedRead: Promise<void> | null = null;
  const readParked = (): Promise<void> =>
    (parkedRead ??= (async () => {
      for (const [consumer, s] of seqs) {
        const list = await s.listParked();
        parked.set({ consumer }, list.length);
        parkedAge.set({ consumer }, list.length === 0 ? 0 : Math.max(...list.map((e) => e.ageMs)) / 1000);
      }
    })().finally(() => (parkedRead = null)));
  const readPaused = (): void => {
    for (const [consumer, p] of procs) {
      const keys = p.paused();
      paused.set({ consumer }, keys.length);
      pausedAge.set({ consumer }, keys.length === 0 ? 0 : (now() - Math.min(...keys.map((k) => k.since))) / 1000);
    }
  };
  const gauge = (d: MetricDef, collect: () => void | Promise<void>) => new Gauge({ name: d.name, help: d.help, labelNames: ["consumer"], registers: [], collect });
  const parked = gauge(CONTRACT_METRICS.parkedEntities, readParked);
  const parkedAge = gauge(CONTRACT_METRICS.parkedOldestAge, readParked);
  const paused = gauge(CONTRACT_METRICS.pausedKeys, readPaused);
  const pausedAge = gauge(CONTRACT_METRICS.pausedOldestAge, readPaused);
  for (const g of [parked, parkedAge, paused, pausedAge]) o.registry.registerMetric(g);
  return () => {
    for (const d of Object.values(CONTRACT_METRICS)) o.registry.removeSingleMetric(d.name);
  };
}
