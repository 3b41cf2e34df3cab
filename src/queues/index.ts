// SPDX-License-Identifier: Apache-2.0
/** Durable work queues: the policy layer over any engine's queue store. See docs/queues.md. */
export { QueueManager, EmbeddedQueue, type QueueManagerOptions } from "./manager.js";
export { resolveQueueConfig, validateQueueName, MAX_PREFETCH, type ResolvedQueueConfig } from "./config.js";
export { retryDelayMs } from "./backoff.js";
export type { QueueHostApi, HostQueue, PushWorker, DeliveredJob } from "./host-api.js";
export type * from "./types.js";
