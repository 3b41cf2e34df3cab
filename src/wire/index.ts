// SPDX-License-Identifier: Apache-2.0
/**
 * The wire protocol (docs/protocol.md), shared by src/client and src/server: frames
 * (frame.ts), the binary writer and reader (codec.ts), values and records (records.ts), queue
 * bodies (queue.ts), errors (errors.ts) and the operation table (ops.ts).
 */
export * from "./frame.js";
export * from "./codec.js";
export * from "./records.js";
export * from "./queue.js";
export * from "./errors.js";
export * from "./ops.js";
