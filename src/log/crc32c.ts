// SPDX-License-Identifier: Apache-2.0
/**
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), slicing-by-8. This is the checksum
 * Kafka, ext4 and iSCSI use; it is stronger than CRC-32 for the short bursts disks produce.
 * Pure JS so the storage engine needs no native addon.
 */

const T = new Int32Array(8 * 256);
(() => {
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    T[n] = c;
  }
  for (let n = 0; n < 256; n++) {
    let c = T[n];
    for (let k = 1; k < 8; k++) {
      c = T[c & 0xff] ^ (c >>> 8);
      T[k * 256 + n] = c;
    }
  }
})();

/** Continues `crc` (0 to start) over buf[start, end). Returns an unsigned 32-bit value. */
export function crc32c(buf: Uint8Array, start = 0, end = buf.length, crc = 0): number {
  let c = ~crc;
  let i = start;
  const stop8 = end - ((end - i) & 7);
  while (i < stop8) {
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
  while (i < end) c = T[(c ^ buf[i++]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}
