// SPDX-License-Identifier: Apache-2.0
/**
 * Walks the frames of an audit log file front to back with a bounded window (never the whole
 * file in memory): opening, listing and verifying all use it.
 *
 * It classifies what it finds; what to do about it is the caller's (AUD-3):
 *  - `frame`: a complete frame whose CRC matches;
 *  - `damaged`: a complete frame whose CRC fails with more bytes after it (not a crash: a crash
 *    only tears the tail), reported and skipped by its length;
 *  - `torn`: the tail is an incomplete frame, a CRC-failing last frame, or zeros: what a crash
 *    during an append leaves; the walk ends there.
 *  - `lost`: a length field that can not be right in the middle of the file: the rest can not
 *    be framed; the walk ends there.
 */
import { Buffer } from "node:buffer";
import type { FileHandle } from "../../log/io.js";
import { crc32c } from "../../log/crc32c.js";
import { FRAME_HEADER_BYTES, HASH_BYTES, MAX_AUDIT_PAYLOAD_BYTES } from "./record.js";

export type FrameItem =
  | { kind: "frame"; pos: number; end: number; payload: Buffer }
  | { kind: "damaged"; pos: number; end: number; why: string }
  | { kind: "torn"; pos: number; why: string }
  | { kind: "lost"; pos: number; why: string };

const WINDOW = 64 * 1024;

/** A read-ahead window over a file of known size. */
class Window {
  private buf = Buffer.alloc(0);
  private at = 0; // file position of buf[0]
  constructor(
    private readonly fh: FileHandle,
    readonly size: number,
  ) {}

  /** Exactly `n` bytes at `pos` (fewer only past the end of the file). */
  async bytes(pos: number, n: number): Promise<Buffer> {
    if (pos >= this.at && pos + n <= this.at + this.buf.length) return this.buf.subarray(pos - this.at, pos - this.at + n);
    const want = Math.min(Math.max(n, WINDOW), this.size - pos);
    const b = Buffer.allocUnsafe(Math.max(0, want));
    let got = 0;
    while (got < want) {
      const r = await this.fh.read(b, got, want - got, pos + got);
      if (r === 0) break;
      got += r;
    }
    this.buf = b.subarray(0, got);
    this.at = pos;
    return this.buf.subarray(0, Math.min(n, got));
  }

  /** Whether every byte from `pos` to the end is zero (a preallocated or unwritten tail). */
  async zerosFrom(pos: number): Promise<boolean> {
    for (let p = pos; p < this.size; p += WINDOW) {
      const b = await this.bytes(p, Math.min(WINDOW, this.size - p));
      for (let i = 0; i < b.length; i++) if (b[i] !== 0) return false;
    }
    return true;
  }
}

/** The frames of `fh` (of `size` bytes) from `from`, in file order. */
export async function* readFrames(fh: FileHandle, size: number, from = 0): AsyncGenerator<FrameItem> {
  const w = new Window(fh, size);
  let pos = from;
  while (pos < size) {
    if (size - pos < FRAME_HEADER_BYTES) {
      yield { kind: "torn", pos, why: "incomplete frame header" };
      return;
    }
    const head = await w.bytes(pos, FRAME_HEADER_BYTES);
    const len = head.readUInt32BE(0);
    const crc = head.readUInt32BE(4);
    const end = pos + FRAME_HEADER_BYTES + len;
    if (len <= HASH_BYTES || len > MAX_AUDIT_PAYLOAD_BYTES) {
      if (await w.zerosFrom(pos)) yield { kind: "torn", pos, why: "zero-filled tail" };
      else if (end > size) yield { kind: "torn", pos, why: "incomplete frame" };
      else yield { kind: "lost", pos, why: `impossible frame length ${len}` };
      return;
    }
    if (end > size) {
      yield { kind: "torn", pos, why: "incomplete frame" };
      return;
    }
    // Copied: the window is reused by the next read.
    const payload = Buffer.from(await w.bytes(pos + FRAME_HEADER_BYTES, len));
    if (crc32c(payload) !== crc) {
      if (end === size) {
        yield { kind: "torn", pos, why: "last frame fails its checksum" };
        return;
      }
      yield { kind: "damaged", pos, end, why: "checksum mismatch" };
    } else {
      yield { kind: "frame", pos, end, payload };
    }
    pos = end;
  }
}
