// SPDX-License-Identifier: Apache-2.0
/**
 * Work queues of the PostgreSQL engine: not yet implemented, and saying so.
 *
 * Why an object at all: StorageEngine requires `queues`. Opening or deleting a queue rejects
 * with a ValidationError naming the limitation (not retriable: retrying cannot help), so a
 * broker on this engine runs topics, consumer groups and idempotent producers and refuses
 * queue calls clearly instead of pretending to store jobs. Listing answers with no queues,
 * which is the truth: this engine holds none.
 */
import { ValidationError } from "../../errors.js";
import type { OpenQueueRequest, QueueStore, StoredQueue } from "../queue-store.js";

const MESSAGE = "work queues are not yet available on the PostgreSQL engine (topics, consumer groups and idempotent producers are); use the disk engine for queues";

export class UnsupportedQueueStore implements QueueStore {
  async open(name: string, _req: OpenQueueRequest): Promise<StoredQueue> {
    throw new ValidationError(`cannot open queue ${JSON.stringify(name)}: ${MESSAGE}`);
  }
  async list(): Promise<string[]> {
    return [];
  }
  async delete(name: string): Promise<void> {
    throw new ValidationError(`cannot delete queue ${JSON.stringify(name)}: ${MESSAGE}`);
  }
}
