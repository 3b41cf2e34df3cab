// SPDX-License-Identifier: Apache-2.0
/** The async-iterator protocol of a worker (embedded and remote): `break` out of `for await` closes it. */
import type { Job } from "./types.js";

export interface IterableWorker<T> {
  next(): Promise<IteratorResult<Job<T>>>;
  close(): Promise<void>;
}

export function workerIterator<T>(w: IterableWorker<T>): AsyncIterator<Job<T>> {
  return {
    next: () => w.next(),
    return: async () => {
      await w.close();
      return { value: undefined, done: true };
    },
  };
}
