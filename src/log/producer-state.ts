// SPDX-License-Identifier: Apache-2.0
/**
 * Idempotent-producer state of one partition (see ProducerStateManager below).
 */

/**
 * Batches remembered per producer and partition for duplicate detection of retries (Kafka
 * keeps 5). The idempotent client never has more than this many batches of one partition in
 * flight (src/client/producer.ts imports it), so a retry of any stored batch is recognised and
 * answered with its original offsets (invariant PROD-2).
 */
export const PRODUCER_BATCHES_KEPT = 5;
