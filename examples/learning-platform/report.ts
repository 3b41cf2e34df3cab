// SPDX-License-Identifier: Apache-2.0
/**
 * What an operator watches: per consumer group, the records not yet processed (lag) and the
 * age of the oldest one; per queue, the backlog (depth), the oldest waiting job's age, retries
 * and dead letters; the outbox's unpublished rows. Printed as a table from the Broker API
 * (groupLag, queue stats) and the relay.
 */
import type { Broker, OutboxRelay } from "sluice";
import type { Names } from "./runtime.js";
import { QUEUE_CONFIG } from "./workers.js";

export const GROUPS = ["notifications", "analytics", "search"] as const;

const pad = (s: string | number, n: number): string => String(s).padEnd(n);
const age = (ms: number): string => (ms === 0 ? "-" : ms < 10_000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`);

export async function printSummary(title: string, broker: Broker, names: Names, relay: OutboxRelay): Promise<void> {
  console.log(`\n--- ${title} ---`);
  const outbox = await relay.backlog();
  console.log(`outbox: ${outbox.rows} unpublished rows, oldest ${age(outbox.oldestAgeMs)}`);
  const members = new Map((await broker.listGroups({ topic: names.completions })).map((g) => [g.group, g.members]));
  console.log(`${pad("group", 36)}${pad("members", 9)}${pad("lag", 6)}oldest unprocessed`);
  for (const g of GROUPS) {
    const lag = await broker.groupLag(g, names.completions);
    console.log(`${pad(`${g} @ course-completed`, 36)}${pad(members.get(g) ?? 0, 9)}${pad(lag.totalRecords, 6)}${age(lag.maxLagMs)}`);
  }
  console.log(`${pad("queue", 36)}${pad("backlog", 9)}${pad("oldest", 10)}${pad("done", 6)}${pad("retries", 9)}dead-lettered`);
  for (const [label, q] of [["certificate-generation", names.certificates], ["thumbnail", names.thumbnails]] as const) {
    const s = await broker.queue(q, QUEUE_CONFIG).stats(); // the config every handle of the queue passes
    console.log(`${pad(label, 36)}${pad(s.depth, 9)}${pad(age(s.oldestWaitingAgeMs), 10)}${pad(s.completed, 6)}${pad(s.retries, 9)}${s.deadLettered}`);
  }
  const dlq = await broker.describeTopic(names.searchDlq);
  const dead = dlq.partitions.reduce((s, p) => s + p.highWatermark - p.logStartOffset, 0);
  console.log(`dead-letter topic course-completed.search-dlq: ${dead} records`);
}
