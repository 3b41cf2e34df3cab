// SPDX-License-Identifier: Apache-2.0
/**
 * The Broker contract as executable tests. `defineConformanceSuite(name, factory)` registers
 * node:test tests that any `Broker` implementation must pass: the embedded `openBroker()`,
 * `connect()` to a `sluice serve` process, and future engines (e.g. PostgreSQL).
 *
 * The tests live by area in conformance-topics.ts, conformance-produce.ts,
 * conformance-groups.ts, conformance-commits.ts, conformance-replay.ts, conformance-contracts.ts
 * (the consumer contracts end to end, application state in SQLite), conformance-queues.ts
 * conformance-queue-results.ts, conformance-queue-declare.ts, conformance-queue-browse.ts,
 * conformance-queue-events.ts, conformance-queue-options.ts and conformance-queue-limits.ts (shared helpers:
 * conformance-helpers.ts).
 * Rules for them: they only use the public `Broker` interface and error classes; every test
 * uses its own topic and group names (a factory may hand out the same broker repeatedly);
 * waits are conditions with deadlines, never sleeps.
 *
 * @example
 * defineConformanceSuite("embedded", async () => {
 *   const dir = mkdtempSync(join(tmpdir(), "c-"));
 *   const broker = await openBroker({ dataDir: dir });
 *   return { broker, cleanup: async () => { await broker.close(); rmSync(dir, { recursive: true }); } };
 * });
 */
import { test } from "node:test";
import type { Broker } from "../types.js";
import type { DefineTest } from "./conformance-helpers.js";
import { groupTests } from "./conformance-groups.js";
import { commitTests } from "./conformance-commits.js";
import { replayTests } from "./conformance-replay.js";
import { contractTests } from "./conformance-contracts.js";
import { produceTests } from "./conformance-produce.js";
import { queueResultTests } from "./conformance-queue-results.js";
import { queueDeclareTests } from "./conformance-queue-declare.js";
import { queueBrowseTests } from "./conformance-queue-browse.js";
import { queueEventTests } from "./conformance-queue-events.js";
import { queueScheduleTests } from "./conformance-queue-schedules.js";
import { queueOptionTests } from "./conformance-queue-options.js";
import { queueFlowTests } from "./conformance-queue-flows.js";
import { queueGroupTests } from "./conformance-queue-groups.js";
import { queueLimitTests } from "./conformance-queue-limits.js";
import { queueTests } from "./conformance-queues.js";
import { topicTests } from "./conformance-topics.js";

export interface ConformanceTarget {
  broker: Broker;
  /**
   * Optional: close the broker and open it again on the same storage (a restart), returning
   * the new broker; `cleanup` then closes that one. Tests of durability use it when present.
   */
  reopen?(): Promise<Broker>;
  cleanup(): Promise<void>;
}

/**
 * What a target offers, for an engine that does not have every capability yet: the suite
 * registers only the tests of what is offered (default: everything). A target that leaves
 * something out says so where it calls the suite; nothing is registered and then skipped.
 */
/** The queue areas of the suite, in registration (report) order. */
export const QUEUE_AREAS = {
  queueTests,
  queueResultTests,
  queueDeclareTests,
  queueBrowseTests,
  queueEventTests,
  queueScheduleTests,
  queueOptionTests,
  queueFlowTests,
  queueLimitTests,
  queueGroupTests,
} as const;
export type QueueArea = keyof typeof QUEUE_AREAS;

export interface ConformanceScope {
  /** Work queues: every queue area (true, the default), none (false), or the areas listed. */
  queues?: boolean | readonly QueueArea[];
  /** Key-compacted topics (`cleanupPolicy: "compact"`). Default true. */
  compaction?: boolean;
}

export function defineConformanceSuite(name: string, factory: () => Promise<ConformanceTarget>, scope: ConformanceScope = {}): void {
  const t: DefineTest = (title, fn, timeoutMs = 30_000) => {
    test(`[${name}] ${title}`, { timeout: timeoutMs }, async () => {
      const target = await factory();
      try {
        await fn(target.broker, { reopen: target.reopen?.bind(target) });
      } finally {
        await target.cleanup();
      }
    });
  };
  // Registration order is report order: keep it.
  topicTests(t, { compaction: scope.compaction ?? true });
  produceTests(t);
  groupTests(t);
  commitTests(t);
  replayTests(t);
  contractTests(t);
  const queues = scope.queues ?? true;
  if (queues === false) return;
  for (const [area, register] of Object.entries(QUEUE_AREAS) as [QueueArea, (t: DefineTest) => void][]) {
    if (queues === true || queues.includes(area)) register(t);
  }
}
