// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's key → latest offset map (Kafka's SkimpyOffsetMap), with a memory bound.
 *
 * A key is stored as its 16-byte MD5 digest, never as its bytes, so an entry costs the same
 * whatever the key's length: OFFSET_MAP_ENTRY_BYTES is the estimate per entry (digest string,
 * number, Map slot). When the map holds `capacity` keys it refuses new ones; the cleaner then
 * cleans the prefix of the log the map covers and continues in another pass (cleaner.ts).
 * Two keys with the same digest would be merged (one's older records dropped by the other's
 * newer ones); with MD5 over keys this is as unlikely as in Kafka, which accepts the same.
 */
import { createHash } from "node:crypto";

/** Estimated bytes of one entry (declared once; the map's capacity derives from it). */
export const OFFSET_MAP_ENTRY_BYTES = 112;
/** Default memory of one cleaning pass's map (per pass, one pass at a time per engine). */
export const DEFAULT_CLEANER_MAP_BYTES = 32 * 1024 * 1024;

export class OffsetMap {
  private readonly m = new Map<string, number>();
  readonly capacity: number;

  constructor(maxBytes: number = DEFAULT_CLEANER_MAP_BYTES) {
    this.capacity = Math.max(1, Math.floor(maxBytes / OFFSET_MAP_ENTRY_BYTES));
  }

  static digest(key: Uint8Array): string {
    return createHash("md5").update(key).digest("base64");
  }

  get size(): number {
    return this.m.size;
  }

  /** Records `offset` as the latest of `key`; false (nothing changed) if the map is full and the key is new. */
  put(key: Uint8Array, offset: number): boolean {
    const d = OffsetMap.digest(key);
    if (this.m.size >= this.capacity && !this.m.has(d)) return false;
    this.m.set(d, offset);
    return true;
  }

  /** The latest offset recorded for `key`, or undefined. */
  get(key: Uint8Array): number | undefined {
    return this.m.get(OffsetMap.digest(key));
  }
}
