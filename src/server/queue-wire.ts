// SPDX-License-Identifier: Apache-2.0
/**
 * Moved to src/wire/queue.ts. These re-exports remain only for src/server/remote-queue.ts and
 * src/client/queue.ts, which the queue refactor switches to src/wire; delete this file with
 * that change.
 */
export { decodeEnqueueRecords, decodeJobBatch, encodeSettleItems, type WireJob } from "../wire/queue.js";
