// SPDX-License-Identifier: Apache-2.0
/**
 * The work-queue half of what the server needs from a broker (`BrokerHost` in
 * src/broker/host.ts): today's queue surface, which the embedded broker implements.
 *
 * Owned by the queue refactor (src/queues, src/server/remote-queue.ts, src/client/queue.ts),
 * which extends it with what the server's queue operations need (push-mode workers, enqueues
 * of wire records) so that src/server/remote-queue.ts needs no casts or `instanceof` probes.
 */
import type { Queue, QueueConfig } from "./types.js";

export interface QueueHostApi {
  /** A handle on a queue, created on first use. */
  queue<T = unknown>(name: string, config?: QueueConfig): Queue<T>;
  listQueues(): Promise<string[]>;
  /** Durably deletes a queue and its jobs; `QueueNotFoundError` if there is none. */
  deleteQueue(name: string): Promise<void>;
}
