// SPDX-License-Identifier: Apache-2.0
/**
 * The telemetry seam: one object with a logger, a metrics sink and a clock, passed from
 * `openBroker()` / `startServer()` down to the engine, the partition logs, the queues and the
 * connections. Every part has a no-op default, so nothing needs a telemetry object to work,
 * and tests can swap the clock or capture metrics without patching globals.
 */

/** Any pino-compatible logger (pino, or anything with these four methods). The default is silent. */
export interface Logger {
  debug(obj: object | string, msg?: string): void;
  info(obj: object | string, msg?: string): void;
  warn(obj: object | string, msg?: string): void;
  error(obj: object | string, msg?: string): void;
  /** Whether a level is logged (pino has it): lets hot paths skip building a line nobody reads. */
  isLevelEnabled?(level: string): boolean;
}

export type MetricLabels = Readonly<Record<string, string | number>>;

/**
 * Where measurements go. Names are declared once in src/observability/metrics.ts (the table a
 * Prometheus registry is built from); a sink never needs to know them in advance.
 */
export interface MetricsSink {
  /** Adds `value` (default 1) to a counter. */
  count(name: string, value?: number, labels?: MetricLabels): void;
  /** One observation of a distribution (durations in seconds, sizes in bytes). */
  observe(name: string, value: number, labels?: MetricLabels): void;
  /** Sets a gauge. */
  gauge(name: string, value: number, labels?: MetricLabels): void;
}

/** Time as the broker reads it: wall time for stored timestamps, monotonic time for durations. */
export interface Clock {
  /** Milliseconds since the epoch (record timestamps, retention, segment age). */
  now(): number;
  /** Monotonic milliseconds (durations, rates, lease deadlines): never jumps with the wall clock. */
  monotonicMs(): number;
}

export interface Telemetry {
  readonly logger: Logger;
  readonly metrics: MetricsSink;
  readonly clock: Clock;
}

const noop = (): void => {};
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop, isLevelEnabled: () => false };
export const noopMetrics: MetricsSink = { count: noop, observe: noop, gauge: noop };
export const systemClock: Clock = { now: () => Date.now(), monotonicMs: () => performance.now() };

/** A complete telemetry object from a partial one (missing parts are no-ops, the clock is the system's). */
export function telemetry(t: Partial<Telemetry> = {}): Telemetry {
  return { logger: t.logger ?? silentLogger, metrics: t.metrics ?? noopMetrics, clock: t.clock ?? systemClock };
}

export const noopTelemetry: Telemetry = telemetry();
