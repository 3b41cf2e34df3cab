// SPDX-License-Identifier: Apache-2.0
/**
 * Counts failed offset commits per group (`sluice_group_commit_failures_total`): subscriptions
 * call the counter from the one place they write offsets (GroupSubscription.writeOffsets).
 * Without a metrics sink there is no counter, and the commit path does no extra work.
 */
import { METRICS } from "./metrics.js";
import { noopMetrics, type MetricsSink } from "./telemetry.js";

export function commitFailureCounter(metrics: MetricsSink): ((group: string, topic: string) => void) | undefined {
  if (metrics === noopMetrics) return undefined;
  return (group, topic) => metrics.count(METRICS.commitFailures.name, 1, { group, topic });
}
