// SPDX-License-Identifier: Apache-2.0
/**
 * What a compacted topic asks of the records it accepts (invariant CMP-1 in
 * docs/ARCHITECTURE.md): every record has a key, because the cleaner (cleaner.ts) keeps the
 * latest record *per key* and a keyless record has no "latest". Refused before anything is
 * stored, on every publish path: the embedded publisher (per record, so one bad record fails
 * alone), and the log's append and appendEncoded (client batches through the server).
 */
import { ValidationError } from "../errors.js";
import { HEADER_SIZE } from "./record-batch.js";

export type CleanupPolicy = "delete" | "compact" | "compact,delete";

/** True when the policy includes key compaction. */
export function isCompacted(policy: CleanupPolicy | undefined): boolean {
  return policy === "compact" || policy === "compact,delete";
}

/** The error for a keyless record on a compacted topic (VALIDATION, not retriable, HTTP 400). */
export function keyRequiredError(topic: string, index: number): ValidationError {
  return new ValidationError(`record ${index}: topic ${JSON.stringify(topic)} is compacted (cleanupPolicy includes "compact"), so every record needs a key`);
}

const ATTR_KEY_NULL = 0x04;

/**
 * Index of the first record without a key in an encoded batch, or -1. Call only on a batch
 * validateEncodedBatch accepted (every length was checked there).
 */
export function firstKeylessRecord(buf: Buffer, count: number): number {
  let p = HEADER_SIZE;
  for (let i = 0; i < count; i++) {
    let bodyLen = 0;
    let mul = 1;
    for (;;) {
      const b = buf[p++];
      bodyLen += (b & 0x7f) * mul;
      if ((b & 0x80) === 0) break;
      mul *= 128;
    }
    if ((buf[p] & ATTR_KEY_NULL) !== 0) return i;
    p += bodyLen;
  }
  return -1;
}
