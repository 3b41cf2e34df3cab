// SPDX-License-Identifier: Apache-2.0
/**
 * The Prometheus exporter: a MetricsSink backed by a prom-client Registry. Every entry of
 * METRICS (metrics.ts) becomes one prom-client metric, so the table stays the one source of
 * names, kinds, help texts and label names. Hot-path ("event") metrics are updated as the
 * broker emits them; "scrape" metrics are computed when the registry is read, through one
 * collect callback per scrape (broker-collector.ts), so nothing polls on a timer.
 *
 * Embedded: `openBroker({ dataDir, metrics: { registry } })`; server: `sluice serve` serves the
 * registry on `GET /metrics` of its HTTP port. Published as `sluice/metrics` (loaded only by
 * those who use it, with prom-client). See docs/metrics.md.
 */
import { Counter, Gauge, Histogram, type LabelValues, type Registry } from "prom-client";
import { ValidationError } from "../errors.js";
import { METRICS, type MetricDef } from "./metrics.js";
import type { Logger, MetricLabels, MetricsSink } from "./telemetry.js";
import { BrokerCollector, type CollectorLimits, type CollectSource, type Sample } from "./broker-collector.js";

/** Durations: 100 µs (a page-cache append) to 30 s (a stuck disk). */
export const SECONDS_BUCKETS: readonly number[] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
/** Sizes: 64 B to 64 MiB, by powers of 4. */
export const BYTES_BUCKETS: readonly number[] = [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864];

export { METRICS, type MetricDef } from "./metrics.js";
export type { CollectorLimits } from "./broker-collector.js";

export interface PrometheusOptions extends CollectorLimits {
  /** The prom-client registry to register the broker's metrics on (one broker per registry). */
  registry: Registry;
}

type AnyMetric = Counter<string> | Gauge<string> | Histogram<string>;

/** prom-client takes string and number label values as they are (no copy on the hot path). */
const labelValues = (labels: MetricLabels): LabelValues<string> => labels as LabelValues<string>;

/**
 * A MetricsSink writing to prom-client metrics, built from METRICS. Created unregistered;
 * `register()` adds the metrics to the registry, `unregister()` removes them again.
 */
export class PrometheusSink implements MetricsSink {
  readonly registry: Registry;
  private readonly byName = new Map<string, AnyMetric>();
  private readonly scraped: { def: MetricDef; metric: Counter<string> | Gauge<string> }[] = [];
  private collectFn: (() => Promise<Sample[]>) | null = null;
  private pending: Promise<void> | null = null;
  private registered = false;
  private onError: (e: unknown) => void = () => {};

  constructor(opts: { registry: Registry }) {
    this.registry = opts.registry;
    const refresh = (): Promise<void> => this.refresh();
    for (const d of Object.values(METRICS) as MetricDef[]) {
      const base = { name: d.name, help: d.help, labelNames: [...d.labels], registers: [] };
      const collect = d.source === "scrape" ? refresh : undefined;
      let m: AnyMetric;
      if (d.kind === "counter") m = new Counter({ ...base, collect });
      else if (d.kind === "gauge") m = new Gauge({ ...base, collect });
      else m = new Histogram({ ...base, buckets: [...(d.name.endsWith("_bytes") ? BYTES_BUCKETS : SECONDS_BUCKETS)] });
      this.byName.set(d.name, m);
      if (d.source === "scrape" && !(m instanceof Histogram)) this.scraped.push({ def: d, metric: m });
    }
  }

  /** Adds every metric to the registry. ValidationError when the registry already has them. */
  register(): this {
    if (this.registered) return this;
    this.checkFree();
    for (const m of this.byName.values()) this.registry.registerMetric(m);
    this.registered = true;
    return this;
  }

  /** ValidationError when the registry already has one of the broker's metrics. */
  checkFree(): void {
    for (const name of this.byName.keys()) {
      if (this.registry.getSingleMetric(name) !== undefined)
        throw new ValidationError(`the registry already has ${name}: use one registry per broker (or close the other broker first)`);
    }
  }

  /** Removes the metrics from the registry (a closed broker's series disappear). */
  unregister(): void {
    if (!this.registered) return;
    for (const name of this.byName.keys()) this.registry.removeSingleMetric(name);
    this.registered = false;
  }

  /** The function computing the scrape-time metrics (null: they are exported empty). */
  setCollector(fn: (() => Promise<Sample[]>) | null, onError?: (e: unknown) => void): void {
    this.collectFn = fn;
    if (onError) this.onError = onError;
  }

  count(name: string, value = 1, labels?: MetricLabels): void {
    const m = this.byName.get(name);
    // A metric call must never fail the operation it measures (e.g. an append): a name or
    // label set that does not match the table is dropped.
    try {
      if (m instanceof Counter) labels ? m.inc(labelValues(labels), value) : m.inc(value);
    } catch {
      /* dropped, see above */
    }
  }

  observe(name: string, value: number, labels?: MetricLabels): void {
    const m = this.byName.get(name);
    try {
      if (m instanceof Histogram) labels ? m.observe(labelValues(labels), value) : m.observe(value);
    } catch {
      /* dropped, see count() */
    }
  }

  gauge(name: string, value: number, labels?: MetricLabels): void {
    const m = this.byName.get(name);
    try {
      if (m instanceof Gauge) labels ? m.set(labelValues(labels), value) : m.set(value);
    } catch {
      /* dropped, see count() */
    }
  }

  /**
   * Recomputes every scrape-time metric once per scrape: prom-client calls each metric's
   * collect at the start of `registry.metrics()`, all before the first resolves, so they share
   * one computation. Series of groups, queues or topics that are gone disappear (reset first).
   */
  private refresh(): Promise<void> {
    if (this.pending !== null) return this.pending;
    const run = (async () => {
      let samples: Sample[] = [];
      try {
        samples = this.collectFn === null ? [] : await this.collectFn();
      } catch (e) {
        this.onError(e);
      }
      for (const s of this.scraped) s.metric.reset();
      for (const s of samples) this.apply(s);
    })();
    this.pending = run;
    // prom-client calls every metric's collect in one synchronous loop: those calls share this
    // run, and the next scrape (a later task) computes afresh.
    queueMicrotask(() => {
      if (this.pending === run) this.pending = null;
    });
    return run;
  }

  private apply(s: Sample): void {
    const m = this.byName.get(s.metric.name);
    const labels = labelValues(s.labels ?? {});
    try {
      if (m instanceof Gauge) m.set(labels, s.value);
      else if (m instanceof Counter) m.inc(labels, s.value);
    } catch {
      /* dropped, see count() */
    }
  }
}

/**
 * A MetricsSink that registers every METRICS entry on `registry`. The scrape-time metrics stay
 * empty until a broker is attached; `openBroker({ metrics: { registry } })` does both.
 */
export function prometheusMetrics(opts: { registry: Registry }): PrometheusSink {
  return new PrometheusSink(opts).register();
}

/** Sends every measurement to both sinks (a user's own sink next to the exporter). */
export function teeMetrics(a: MetricsSink, b: MetricsSink): MetricsSink {
  return {
    count: (n, v, l) => (a.count(n, v, l), b.count(n, v, l)),
    observe: (n, v, l) => (a.observe(n, v, l), b.observe(n, v, l)),
    gauge: (n, v, l) => (a.gauge(n, v, l), b.gauge(n, v, l)),
  };
}

/**
 * What `openBroker({ metrics })` uses: the sink to hand to the engine before it opens, and
 * `attach` once the broker is open (registers the metrics and the collector; returns the
 * detach to call on close).
 */
export function brokerExporter(opts: PrometheusOptions, other: MetricsSink | undefined): { sink: MetricsSink; attach(src: CollectSource, logger: Logger): () => void } {
  const prom = new PrometheusSink(opts);
  prom.checkFree(); // before the broker opens anything
  return {
    sink: other === undefined ? prom : teeMetrics(prom, other),
    attach(src, logger) {
      prom.register();
      const collector = new BrokerCollector(src, opts);
      prom.setCollector(() => collector.collect(), (e) => logger.warn({ err: e }, "metrics collection failed"));
      return () => {
        prom.setCollector(null);
        prom.unregister();
      };
    },
  };
}
export { contractMetrics, CONTRACT_METRICS, type ContractMetricsOptions } from "./contract-metrics.js";
