// SPDX-License-Identifier: Apache-2.0
/**
 * The client's frame reader: the socket reads straight into the memory frames are handed out
 * from (net.Socket's `onread`), so a frame is never copied in user space.
 *
 * Why: subscriptions receive pushes of stored batches, up to about 1 MiB per frame. Node hands
 * a socket's data over in 64 KiB chunks, and the generic FrameReader (src/wire/frame.ts)
 * joins the chunks of a large frame into a fresh buffer: a copy of every byte consumed, into
 * freshly mapped pages. That copy was the largest single cost of a consuming client (about a
 * third of its CPU draining a backlog). Here:
 *
 * - small frames are read into a 64 KiB slab and handed out as views of it (as chunks were);
 * - once a frame's header says it will not fit in the slab, a buffer of exactly its size is
 *   allocated, the bytes already read are copied in (at most one slab), and the socket reads
 *   the rest of the frame directly into it.
 *
 * Invariants (hostile input, as FrameReader): a frame length is checked against the minimum
 * and `maxFrameBytes` before anything is allocated from it; the reader never holds more than
 * one slab plus one frame.
 */
import { FrameTooLargeError, ProtocolError } from "../errors.js";
import { FRAME_HEADER_BYTES, FRAME_LENGTH_BYTES } from "../wire/frame.js";

/** Slab for small frames; a read into it is offered at least MIN_READ_BYTES of room. */
const SLAB_BYTES = 64 * 1024;
const MIN_READ_BYTES = 16 * 1024;

export class DirectFrameReader {
  maxFrameBytes: number;
  private slab: Buffer = Buffer.allocUnsafe(SLAB_BYTES);
  /** Unconsumed bytes of the slab are [start, end). */
  private start = 0;
  private end = 0;
  /** A frame body too large for the slab, being read in place, and how much of it is filled. */
  private big: Buffer | null = null;
  private bigFilled = 0;

  constructor(maxFrameBytes: number) {
    this.maxFrameBytes = maxFrameBytes;
  }

  /** Where the socket's next read goes (`onread.buffer`). */
  readBuffer(): Buffer {
    if (this.big !== null) return this.big.subarray(this.bigFilled);
    if (this.slab.length - this.end < MIN_READ_BYTES) {
      // Move the unconsumed tail (part of one frame that fits a slab) to a fresh slab. The old
      // slab is not reused: frames handed out are views of it.
      const fresh = Buffer.allocUnsafe(SLAB_BYTES);
      const n = this.slab.copy(fresh, 0, this.start, this.end);
      this.slab = fresh;
      this.start = 0;
      this.end = n;
    }
    return this.slab.subarray(this.end);
  }

  /** `n` bytes were read into the buffer last returned by readBuffer (`onread.callback`). */
  wrote(n: number): void {
    if (this.big !== null) {
      this.bigFilled += n;
      if (this.bigFilled > this.big.length) throw new Error("invariant: read past the frame buffer");
    } else {
      this.end += n;
      if (this.end > this.slab.length) throw new Error("invariant: read past the slab");
    }
  }

  /** The next complete frame body (without its length prefix), or null. Throws ProtocolError
   * on an invalid length; the caller must then drop the connection. */
  next(): Buffer | null {
    if (this.big !== null) {
      if (this.bigFilled < this.big.length) return null;
      const frame = this.big;
      this.big = null;
      this.bigFilled = 0;
      return frame;
    }
    const avail = this.end - this.start;
    if (avail < FRAME_LENGTH_BYTES) return null;
    const len = this.slab.readUInt32BE(this.start);
    if (len < FRAME_HEADER_BYTES) throw new ProtocolError(`frame length ${len} is below the minimum ${FRAME_HEADER_BYTES}`);
    if (len > this.maxFrameBytes) throw new FrameTooLargeError(`frame length ${len} exceeds the limit of ${this.maxFrameBytes} bytes`);
    const bodyStart = this.start + FRAME_LENGTH_BYTES;
    if (avail >= FRAME_LENGTH_BYTES + len) {
      this.start = bodyStart + len;
      return this.slab.subarray(bodyStart, bodyStart + len);
    }
    if (FRAME_LENGTH_BYTES + len > SLAB_BYTES - MIN_READ_BYTES) {
      // Too large to ever complete inside a slab: give it its own buffer and read into it.
      const big = Buffer.allocUnsafe(len);
      this.bigFilled = this.slab.copy(big, 0, bodyStart, this.end);
      this.big = big;
      this.start = this.end; // never rewind: frames handed out are views of the slab
    }
    return null;
  }
}
