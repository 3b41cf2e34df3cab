// SPDX-License-Identifier: Apache-2.0
/**
 * The cleaner's key → latest offset map (Kafka's SkimpyOffsetMap), in one flat typed array
 * whose size is fixed when the pass starts: the memory of a pass is `maxBytes`, whatever the
 * keys' lengths and however many there are.
 *
 * A slot is OFFSET_MAP_SLOT_BYTES = 16 bytes: 96 bits of the key's 128-bit hash (key-hash.ts)
 * and the offset as a u32 distance from the pass's first offset, plus one (0 marks an empty
 * slot). Open addressing with linear probing, filled to at most MAX_LOAD so probes stay short:
 * OFFSET_MAP_BYTES_PER_KEY (21.3 bytes) of map per distinct key, so the default 64 MiB map
 * holds 3.1 million keys; a pass over fewer offsets allocates only what they could need. When it is full the map refuses new keys; the cleaner then cleans
 * the prefix of the log the map covers and continues in another pass (cleaner.ts).
 */
import { keyHash128 } from "./key-hash.js";

/** Bytes of one slot (96-bit key hash + u32 offset). */
export const OFFSET_MAP_SLOT_BYTES = 16;
/** Share of the slots that may hold keys (linear probing degrades past this). */
export const MAX_LOAD = 0.75;
/** Map memory per distinct key at the highest load (declared once; docs/topics.md quotes it). */
export const OFFSET_MAP_BYTES_PER_KEY = OFFSET_MAP_SLOT_BYTES / MAX_LOAD;
/** Default memory of one cleaning pass's map (per pass, one pass at a time per engine). */
export const DEFAULT_CLEANER_MAP_BYTES = 64 * 1024 * 1024;
/** Largest map a pass may allocate (a typed array of this many bytes). */
export const MAX_CLEANER_MAP_BYTES = 1024 * 1024 * 1024;
/**
 * The map bytes a pass over `offsets` offsets needs at most (one key per offset), capped at
 * `maxBytes`: a small topic's pass does not allocate the whole budget.
 */
export function mapBytesFor(offsets: number, maxBytes: number): number {
  return Math.min(maxBytes, Math.ceil((offsets + 1) * OFFSET_MAP_BYTES_PER_KEY) + OFFSET_MAP_SLOT_BYTES);
}
/** Offsets are stored as distance + 1 in a u32: a pass covers fewer offsets than this. */
const MAX_SPAN = 0xffff_fffe;

export class OffsetMap {
  /** 4 words per slot: hash words 0..2, then offset - base + 1 (0 = empty). */
  private readonly slots: Uint32Array;
  private readonly slotCount: number;
  /** Keys the map accepts before it reports full. */
  readonly capacity: number;
  private n = 0;
  private readonly h = new Uint32Array(4);

  /** @param base the lowest offset the pass will put (offsets are stored relative to it) */
  constructor(
    maxBytes: number = DEFAULT_CLEANER_MAP_BYTES,
    private readonly base = 0,
  ) {
    // At least two slots, so that a map of one key still has an empty slot to end a probe.
    this.slotCount = Math.max(2, Math.floor(maxBytes / OFFSET_MAP_SLOT_BYTES));
    this.slots = new Uint32Array(this.slotCount * 4);
    this.capacity = Math.max(1, Math.min(this.slotCount - 1, Math.floor(this.slotCount * MAX_LOAD)));
  }

  get size(): number {
    return this.n;
  }

  /** The slot index holding the hash in this.h, or the empty slot where it would go. */
  private probe(): number {
    const s = this.slots;
    const h = this.h;
    let i = h[3] % this.slotCount;
    for (;;) {
      const at = i * 4;
      if (s[at + 3] === 0 || (s[at] === h[0] && s[at + 1] === h[1] && s[at + 2] === h[2])) return i;
      i = i + 1 === this.slotCount ? 0 : i + 1;
    }
  }

  /**
   * Records `offset` as the latest of the key b[start, end); false (nothing changed) if the map
   * is full and the key is new, or the offset is too far from the pass's base.
   */
  put(b: Uint8Array, start: number, end: number, offset: number): boolean {
    const rel = offset - this.base;
    if (rel < 0 || rel >= MAX_SPAN) return false;
    keyHash128(b, start, end, this.h);
    const at = this.probe() * 4;
    const s = this.slots;
    if (s[at + 3] === 0) {
      if (this.n >= this.capacity) return false;
      s[at] = this.h[0];
      s[at + 1] = this.h[1];
      s[at + 2] = this.h[2];
      this.n++;
    }
    s[at + 3] = rel + 1;
    return true;
  }

  /** The latest offset recorded for the key b[start, end), or -1. */
  get(b: Uint8Array, start: number, end: number): number {
    keyHash128(b, start, end, this.h);
    const v = this.slots[this.probe() * 4 + 3];
    return v === 0 ? -1 : this.base + v - 1;
  }
}
