// SPDX-License-Identifier: Apache-2.0
/**
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), slicing-by-8. This is the checksum
 * Kafka, ext4 and iSCSI use; it is stronger than CRC-32 for the short bursts disks produce.
 * Pure JS so the storage engine needs no native addon: slicing-by-16 over aligned 32-bit
 * words for long inputs, slicing-by-8 over bytes otherwise.
 */

const T = new Int32Array(16 * 256);
(() => {
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    T[n] = c;
  }
  for (let n = 0; n < 256; n++) {
    let c = T[n];
    for (let k = 1; k < 16; k++) {
      c = T[c & 0xff] ^ (c >>> 8);
      T[k * 256 + n] = c;
    }
  }
})();

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** Continues `crc` (0 to start) over buf[start, end). Returns an unsigned 32-bit value. */
export function crc32c(buf: Uint8Array, start = 0, end = buf.length, crc = 0): number {
  let c = ~crc | 0;
  let i = start;
  if (LITTLE_ENDIAN && end - i >= 64) {
    // Fast path: read aligned 32-bit words through an Int32Array view (about twice the speed
    // of assembling words from bytes). Little-endian words equal the byte-wise composition.
    const base = buf.byteOffset;
    const pre = (4 - ((base + i) & 3)) & 3;
    c = crcBytes(c, buf, i, i + pre);
    i += pre;
    const words = ((end - i) >>> 4) << 2;
    c = crcWords16(c, new Int32Array(buf.buffer, base + i, words), words);
    i += words * 4;
  }
  const stop8 = end - ((end - i) & 7);
  c = crcSlice8(c, buf, i, stop8);
  c = crcBytes(c, buf, stop8, end);
  return ~c >>> 0;
}

// The loops are separate small functions, each warmed up below, on purpose: as one function,
// V8 optimized it on-stack inside the long word loop before the byte loops after it had ever
// run, then deoptimized it there ("insufficient type feedback") -- 749 times in one server run,
// and CRC fell from ~2 GB/s to ~150 MB/s.

function crcBytes(c: number, buf: Uint8Array, i: number, end: number): number {
  while (i < end) c = T[(c ^ buf[i++]) & 0xff] ^ (c >>> 8);
  return c;
}

/** Slicing-by-16: four little-endian words (16 bytes) per step; `words` is a multiple of 4. */
function crcWords16(c: number, w: Int32Array, words: number): number {
  for (let k = 0; k < words; k += 4) {
    const a = w[k] ^ c;
    const b = w[k + 1];
    const d = w[k + 2];
    const e = w[k + 3];
    c =
      T[3840 + (a & 0xff)] ^
      T[3584 + ((a >>> 8) & 0xff)] ^
      T[3328 + ((a >>> 16) & 0xff)] ^
      T[3072 + (a >>> 24)] ^
      T[2816 + (b & 0xff)] ^
      T[2560 + ((b >>> 8) & 0xff)] ^
      T[2304 + ((b >>> 16) & 0xff)] ^
      T[2048 + (b >>> 24)] ^
      T[1792 + (d & 0xff)] ^
      T[1536 + ((d >>> 8) & 0xff)] ^
      T[1280 + ((d >>> 16) & 0xff)] ^
      T[1024 + (d >>> 24)] ^
      T[768 + (e & 0xff)] ^
      T[512 + ((e >>> 8) & 0xff)] ^
      T[256 + ((e >>> 16) & 0xff)] ^
      T[e >>> 24];
  }
  return c;
}

/** Slicing-by-8 over bytes; (end - i) is a multiple of 8. */
function crcSlice8(c: number, buf: Uint8Array, i: number, end: number): number {
  while (i < end) {
    const a = (buf[i] | (buf[i + 1] << 8) | (buf[i + 2] << 16) | (buf[i + 3] << 24)) ^ c;
    c =
      T[1792 + (a & 0xff)] ^
      T[1536 + ((a >>> 8) & 0xff)] ^
      T[1280 + ((a >>> 16) & 0xff)] ^
      T[1024 + (a >>> 24)] ^
      T[768 + buf[i + 4]] ^
      T[512 + buf[i + 5]] ^
      T[256 + buf[i + 6]] ^
      T[buf[i + 7]];
    i += 8;
  }
  return c;
}

// Warm-up: every path and operation has type feedback before the first hot call.
{
  const warm = new Uint8Array(512);
  for (let n = 0; n < warm.length; n++) warm[n] = n * 31;
  for (let k = 0; k < 4; k++) for (let len = 0; len < 200; len += 7) crc32c(warm, k, k + len, len);
}

// ---------------------------------------------------------------------------------------------
// Patching a checksum without re-reading the data.
//
// CRC without its pre/post inversion ("raw") is linear over GF(2): if a message changes by the
// bytes D at some position followed by k unchanged bytes, its CRC changes by
// rawCrc(D) * x^(8k) mod P. The broker uses this to set a batch's base offset (which the CRC
// covers, invariant LOG-2) on a batch whose checksum it has just verified, instead of a second
// pass over the records (zlib's crc32_combine uses the same algebra).

const POLY = 0x82f63b78;

/** a * b modulo P in the reflected representation (bit 31 holds x^0). */
function multModP(a: number, b: number): number {
  let p = 0;
  for (let m = 0x80000000; a !== 0 && m !== 0; m >>>= 1) {
    if (a & m) {
      p ^= b;
      a &= ~m;
    }
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

/** X2N[k] = x^(2^k) mod P. */
const X2N = new Uint32Array(32);
X2N[0] = 0x40000000; // x^1
for (let k = 1; k < 32; k++) X2N[k] = multModP(X2N[k - 1], X2N[k - 1]);

/** x^(8n) mod P: the factor that moves a raw CRC past n zero bytes. */
function xPow8n(n: number): number {
  let p = 0x80000000; // x^0
  let k = 3;
  while (n > 0) {
    if (n & 1) p = multModP(X2N[k & 31], p);
    n >>>= 1;
    k++;
  }
  return p;
}

/**
 * The CRC of a message after the bytes at [pos, pos + oldBytes.length) change from `oldBytes`
 * to `newBytes`, given its CRC `crc` before the change and that `after` bytes of the message
 * follow the changed range. Equivalent to recomputing crc32c over the whole new message.
 */
export function crc32cPatch(crc: number, oldBytes: Uint8Array, newBytes: Uint8Array, after: number): number {
  if (oldBytes.length !== newBytes.length) throw new Error("crc32cPatch: ranges differ in length");
  if (!Number.isInteger(after) || after < 0 || after > 0xffffffff) throw new Error(`crc32cPatch: bad length ${after}`);
  let c = 0;
  for (let i = 0; i < oldBytes.length; i++) c = T[(c ^ oldBytes[i] ^ newBytes[i]) & 0xff] ^ (c >>> 8);
  return (crc ^ multModP(xPow8n(after), c >>> 0)) >>> 0;
}
