// SPDX-License-Identifier: Apache-2.0
/** Durable work queues (issue 3). See docs/queues.md. */
export { QueueManager, QueueHandle, type QueueManagerOptions } from "./manager.js";
export { resolveQueueConfig, validateQueueName, type ResolvedQueueConfig } from "./queue.js";
export { retryDelayMs } from "./backoff.js";
export type * from "./types.js";
