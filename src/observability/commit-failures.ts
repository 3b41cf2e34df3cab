// SPDX-License-Identifier: Apache-2.0
/**
 * Counts failed offset commits per group (`sluice_group_commit_failures_total`) without the
 * group code knowing about metrics: subscriptions get the engine through this view, whose
 * `commitOffsets` counts a rejection and rethrows it unchanged. Every other member is the
 * engine's own (bound once, so the view adds one map lookup per call).
 */
import type { StorageEngine } from "../store/engine.js";
import { METRICS } from "./metrics.js";
import { noopMetrics, type MetricsSink } from "./telemetry.js";

export function countCommitFailures(engine: StorageEngine, metrics: MetricsSink): StorageEngine {
  if (metrics === noopMetrics) return engine;
  const commitOffsets: StorageEngine["commitOffsets"] = (group, topic, offsets) =>
    engine.commitOffsets(group, topic, offsets).catch((e: unknown) => {
      metrics.count(METRICS.commitFailures.name, 1, { group, topic });
      throw e;
    });
  const bound = new Map<PropertyKey, unknown>([["commitOffsets", commitOffsets]]);
  return new Proxy(engine, {
    get(target, key) {
      const known = bound.get(key);
      if (known !== undefined) return known;
      const v: unknown = Reflect.get(target, key, target);
      if (typeof v !== "function") return v;
      const f = (v as (...a: unknown[]) => unknown).bind(target);
      bound.set(key, f);
      return f;
    },
  });
}
