// SPDX-License-Identifier: Apache-2.0
/**
 * Moved to src/wire/ (frame codec, records, errors, the operation table). These re-exports
 * remain only for src/server/remote-queue.ts and src/client/queue.ts, which the queue refactor
 * switches to src/wire; delete this file with that change.
 */
export { Op, type Frame } from "../wire/index.js";
export { decodePublishRecords, encodePublishRecords } from "../wire/records.js";
export { errorToWire, wireToError, type WireError } from "../wire/errors.js";
