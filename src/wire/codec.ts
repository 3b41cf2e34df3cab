// SPDX-License-Identifier: Apache-2.0
/**
 * The one binary writer and reader of the wire protocol: frame bodies (records, receipts,
 * queue jobs and settlements) are all written and read with these. Big-endian throughout.
 *
 * The reader treats every byte as hostile: each read checks the bytes present first and fails
 * with a `ProtocolError` (never a RangeError); a length is checked before anything is sliced or
 * decoded from it.
 */
import { ProtocolError, ValidationError } from "../errors.js";

/** A growable buffer. */
export class Writer {
  private buf: Buffer;
  private pos = 0;
  constructor(initial = 1024) {
    this.buf = Buffer.allocUnsafe(Math.max(64, initial));
  }
  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = Buffer.allocUnsafe(size);
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }
  get length(): number {
    return this.pos;
  }
  u8(v: number): void {
    this.ensure(1);
    this.buf[this.pos++] = v;
  }
  u16(v: number): void {
    this.ensure(2);
    this.buf.writeUInt16BE(v, this.pos);
    this.pos += 2;
  }
  u32(v: number): void {
    this.ensure(4);
    this.buf.writeUInt32BE(v >>> 0, this.pos);
    this.pos += 4;
  }
  i32(v: number): void {
    this.ensure(4);
    this.buf.writeInt32BE(v, this.pos);
    this.pos += 4;
  }
  f64(v: number): void {
    this.ensure(8);
    this.buf.writeDoubleBE(v, this.pos);
    this.pos += 8;
  }
  bytes(b: Uint8Array): void {
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }
  /** i32 length (-1 = null) + bytes. */
  nullableBytes(b: Uint8Array | null): void {
    if (b === null) {
      this.i32(-1);
      return;
    }
    this.i32(b.length);
    this.bytes(b);
  }
  /** i32 length + UTF-8 bytes, written without an intermediate Buffer. */
  utf8(s: string): void {
    const max = Buffer.byteLength(s, "utf8");
    this.ensure(4 + max);
    const n = this.buf.write(s, this.pos + 4, "utf8");
    this.buf.writeInt32BE(n, this.pos);
    this.pos += 4 + n;
  }
  /** i32 length (-1 = null) + UTF-8. */
  nullableUtf8(s: string | null): void {
    if (s === null) this.i32(-1);
    else this.utf8(s);
  }
  /**
   * u16 length + UTF-8. Short ASCII strings (ids, receipts, header names) are copied byte by
   * byte: cheaper than a native call per string on the job-push path.
   */
  shortString(s: string): void {
    const n = s.length;
    if (n <= 64) {
      this.ensure(2 + n);
      const buf = this.buf;
      const at = this.pos + 2;
      let ascii = true;
      for (let i = 0; i < n; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) {
          ascii = false;
          break;
        }
        buf[at + i] = c;
      }
      if (ascii) {
        buf.writeUInt16BE(n, this.pos);
        this.pos = at + n;
        return;
      }
    }
    const len = Buffer.byteLength(s, "utf8");
    if (len > 0xffff) throw new ValidationError(`string of ${len} bytes is too long (max 65535)`);
    this.ensure(2 + len);
    this.buf.writeUInt16BE(len, this.pos);
    this.buf.write(s, this.pos + 2, "utf8");
    this.pos += 2 + len;
  }
  /** The bytes written so far (a view: do not write after taking it). */
  finish(): Buffer {
    return this.buf.subarray(0, this.pos);
  }
}

export class Reader {
  pos = 0;
  constructor(private readonly buf: Buffer) {}
  get remaining(): number {
    return this.buf.length - this.pos;
  }
  private need(n: number, what: string): void {
    if (n < 0 || this.pos + n > this.buf.length) {
      throw new ProtocolError(`truncated ${what}: need ${n} bytes, ${this.buf.length - this.pos} left`);
    }
  }
  u8(what = "u8"): number {
    this.need(1, what);
    return this.buf[this.pos++];
  }
  u16(what = "u16"): number {
    this.need(2, what);
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  u32(what = "u32"): number {
    this.need(4, what);
    const v = this.buf.readUInt32BE(this.pos);
    this.pos += 4;
    return v;
  }
  i32(what = "i32"): number {
    this.need(4, what);
    const v = this.buf.readInt32BE(this.pos);
    this.pos += 4;
    return v;
  }
  f64(what = "f64"): number {
    this.need(8, what);
    const v = this.buf.readDoubleBE(this.pos);
    this.pos += 8;
    return v;
  }
  /** A view (no copy) of n bytes. */
  bytes(n: number, what = "bytes"): Buffer {
    this.need(n, what);
    const v = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
  /** A non-negative i32 length. */
  length(what: string): number {
    const n = this.i32(what + " length");
    if (n < 0) throw new ProtocolError(`negative ${what} length ${n}`);
    return n;
  }
  /** i32 length (-1 = null) + a view of the bytes. */
  nullableBytes(what = "bytes"): Buffer | null {
    const n = this.i32(what + " length");
    if (n === -1) return null;
    if (n < -1) throw new ProtocolError(`negative ${what} length ${n}`);
    return this.bytes(n, what);
  }
  utf8(what = "string"): string {
    const n = this.length(what);
    this.need(n, what);
    const s = this.buf.toString("utf8", this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  /** i32 length (-1 = null) + UTF-8. */
  nullableUtf8(what = "string"): string | null {
    const b = this.nullableBytes(what);
    return b === null ? null : b.toString("utf8");
  }
  shortString(what = "string"): string {
    const n = this.u16(what + " length");
    this.need(n, what);
    const s = this.buf.toString("utf8", this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  /** Fails unless every byte was consumed. */
  end(what: string): void {
    if (this.remaining !== 0) throw new ProtocolError(`${this.remaining} trailing bytes after ${what}`);
  }
}
