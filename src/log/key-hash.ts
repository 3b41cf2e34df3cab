// SPDX-License-Identifier: Apache-2.0
/**
 * The 128-bit hash the cleaner matches keys by (offset-map.ts): MurmurHash3 x86_128 over a
 * byte range, in 32-bit arithmetic, with no allocation per call (the result goes into the
 * caller's Uint32Array). It replaced MD5 through node:crypto, whose ~2 µs per call (a native
 * boundary and a Hash object per key) was most of a compaction pass's time.
 *
 * Why a non-cryptographic hash is enough here: the hash is never stored, and a collision
 * between two keys can only make the cleaner drop one key's records in favour of the other's
 * later ones. By chance that needs two of the keys of one pass (at most a few million) to
 * share 96 bits, about 10^-17. On purpose it needs someone who can already write to the topic,
 * who can drop any key's value with a tombstone anyway, so collisions grant nothing.
 */

const C1 = 0x239b961b;
const C2 = 0xab0e9789;
const C3 = 0x38b34ae5;
const C4 = 0xa1e38b93;

function rotl(x: number, r: number): number {
  return (x << r) | (x >>> (32 - r));
}

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

function word(b: Uint8Array, i: number): number {
  return b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24);
}

/** MurmurHash3_x86_128 of b[start, end) with seed 0, as four u32 words into `out`. */
export function keyHash128(b: Uint8Array, start: number, end: number, out: Uint32Array): void {
  const len = end - start;
  let h1 = 0;
  let h2 = 0;
  let h3 = 0;
  let h4 = 0;
  let i = start;
  for (; i + 16 <= end; i += 16) {
    let k1 = word(b, i);
    let k2 = word(b, i + 4);
    let k3 = word(b, i + 8);
    let k4 = word(b, i + 12);
    k1 = Math.imul(rotl(Math.imul(k1, C1), 15), C2);
    h1 ^= k1;
    h1 = (Math.imul(rotl(h1, 19) + h2, 5) + 0x561ccd1b) | 0;
    k2 = Math.imul(rotl(Math.imul(k2, C2), 16), C3);
    h2 ^= k2;
    h2 = (Math.imul(rotl(h2, 17) + h3, 5) + 0x0bcaa747) | 0;
    k3 = Math.imul(rotl(Math.imul(k3, C3), 17), C4);
    h3 ^= k3;
    h3 = (Math.imul(rotl(h3, 15) + h4, 5) + 0x96cd1c35) | 0;
    k4 = Math.imul(rotl(Math.imul(k4, C4), 18), C1);
    h4 ^= k4;
    h4 = (Math.imul(rotl(h4, 13) + h1, 5) + 0x32ac3b17) | 0;
  }
  // The tail: up to 15 bytes, little-endian into k1..k4.
  let k1 = 0;
  let k2 = 0;
  let k3 = 0;
  let k4 = 0;
  const rest = end - i;
  for (let j = rest - 1; j >= 0; j--) {
    const v = b[i + j];
    if (j >= 12) k4 |= v << ((j - 12) * 8);
    else if (j >= 8) k3 |= v << ((j - 8) * 8);
    else if (j >= 4) k2 |= v << ((j - 4) * 8);
    else k1 |= v << (j * 8);
  }
  if (rest > 12) h4 ^= Math.imul(rotl(Math.imul(k4, C4), 18), C1);
  if (rest > 8) h3 ^= Math.imul(rotl(Math.imul(k3, C3), 17), C4);
  if (rest > 4) h2 ^= Math.imul(rotl(Math.imul(k2, C2), 16), C3);
  if (rest > 0) h1 ^= Math.imul(rotl(Math.imul(k1, C1), 15), C2);
  h1 ^= len;
  h2 ^= len;
  h3 ^= len;
  h4 ^= len;
  h1 = (h1 + h2 + h3 + h4) | 0;
  h2 = (h2 + h1) | 0;
  h3 = (h3 + h1) | 0;
  h4 = (h4 + h1) | 0;
  h1 = fmix(h1);
  h2 = fmix(h2);
  h3 = fmix(h3);
  h4 = fmix(h4);
  h1 = (h1 + h2 + h3 + h4) | 0;
  h2 = (h2 + h1) | 0;
  h3 = (h3 + h1) | 0;
  h4 = (h4 + h1) | 0;
  out[0] = h1;
  out[1] = h2;
  out[2] = h3;
  out[3] = h4;
}
