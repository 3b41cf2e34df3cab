// SPDX-License-Identifier: Apache-2.0
/**
 * Value, header and durability types shared by topics (src/types.ts) and work queues
 * (src/queues/types.ts). They live here so that the two public contracts depend on this file
 * and never on each other (src/types.ts imports the queue contract for `Broker.queue`).
 */

export type Durability = "always" | "interval" | "never";

/** A value as the producer hands it over. Buffers/Uint8Arrays are stored as raw bytes,
 * strings as UTF-8, anything else as JSON; the consumer gets back the same kind. */
export type PublishValue = Uint8Array | string | number | boolean | null | object;

export type Headers = Record<string, string | Uint8Array>;
