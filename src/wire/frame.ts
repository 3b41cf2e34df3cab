// SPDX-License-Identifier: Apache-2.0
/**
 * Frames of the sluice wire protocol (version 1), shared by the client and the server: the
 * preamble, the frame head (length, opcode, flags, correlation id, JSON meta) and the
 * incremental frame splitter. The byte layout is documented in docs/protocol.md §1-2; keep the
 * two in sync.
 *
 * Invariants the decoders keep, because every byte here may come from a hostile peer:
 * - nothing is allocated from a length field before that length has been checked against
 *   the bytes actually present (and the frame length against `maxFrameBytes`);
 * - every decode error is a `ProtocolError`, never a RangeError or a crash.
 */
import { FrameTooLargeError, ProtocolError } from "../errors.js";

/** ASCII "SLCE": first four bytes a client sends. */
export const MAGIC = Buffer.from("SLCE", "latin1");
export const PROTOCOL_VERSION = 1;
export const MIN_PROTOCOL_VERSION = 1;
/** magic(4) + minVersion(u16) + maxVersion(u16). */
export const PREAMBLE_BYTES = 8;
/** frameLength(u32) is followed by opcode(u8) flags(u8) correlationId(u32) metaLength(u32). */
export const FRAME_LENGTH_BYTES = 4;
export const FRAME_HEADER_BYTES = 10; // opcode + flags + correlationId + metaLength
/** Default cap on one frame (after the length prefix). Records above the broker's
 * maxMessageBytes are refused by the broker anyway; this bounds a batch. */
export const DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024;
/** Before HELLO completes a peer is unauthenticated and unknown: keep its cap tiny. */
export const PRE_HANDSHAKE_MAX_FRAME_BYTES = 4096;

export const FLAG_RESPONSE = 1;
export const FLAG_ERROR = 2;
export const FLAG_PUSH = 4;

export interface Frame {
  op: number;
  flags: number;
  correlationId: number;
  /** Parsed JSON metadata (an object; `{}` when the meta section is empty). */
  meta: Record<string, unknown>;
  /** Binary tail (records); a view into the frame buffer. */
  body: Buffer;
}

// ---------------------------------------------------------------------------------------------
// Frame encoding

const EMPTY = Buffer.alloc(0);

/** Encodes one frame: length prefix, header, JSON meta, binary body. */
export function encodeFrame(
  op: number,
  flags: number,
  correlationId: number,
  meta: unknown,
  body: Buffer | null = null,
): Buffer {
  const [head, tail] = encodeFrameParts(op, flags, correlationId, meta, body, 64 * 1024);
  return tail === null ? head : Buffer.concat([head, tail]);
}

/**
 * Encodes one frame as [head, body]: the body is not copied when it is at least
 * `copyBelow` bytes (large record batches go to the socket as they are, in one writev with
 * the head); smaller bodies are copied into the head and `null` is returned for the tail.
 */
export function encodeFrameParts(
  op: number,
  flags: number,
  correlationId: number,
  meta: unknown,
  body: Buffer | null,
  copyBelow = 16 * 1024,
): [Buffer, Buffer | null] {
  const metaBuf = metaBytes(meta);
  const bodyLen = body === null ? 0 : body.length;
  const inline = body !== null && bodyLen < copyBelow;
  const out = Buffer.allocUnsafe(FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length + (inline ? bodyLen : 0));
  const at = writeHead(out, op, flags, correlationId, metaBuf, bodyLen);
  if (inline) body.copy(out, at);
  return [out, inline || body === null || bodyLen === 0 ? null : body];
}

/**
 * Encodes the length prefix, header and meta of a frame whose `bodyLength`-byte body the
 * caller writes next (a push of stored batches is sent without copying them into the frame).
 */
export function encodeFrameHead(op: number, flags: number, correlationId: number, meta: unknown, bodyLength: number): Buffer {
  const metaBuf = metaBytes(meta);
  const out = Buffer.allocUnsafe(FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length);
  writeHead(out, op, flags, correlationId, metaBuf, bodyLength);
  return out;
}

/** JSON meta as bytes; none (an empty section) for null/undefined. */
export function metaBytes(meta: unknown): Buffer {
  return meta === undefined || meta === null ? EMPTY : Buffer.from(JSON.stringify(meta), "utf8");
}

/** Writes length prefix, header and meta at the start of `out`; returns where the body goes. */
export function writeHead(out: Buffer, op: number, flags: number, correlationId: number, metaBuf: Buffer, bodyLength: number): number {
  out.writeUInt32BE(FRAME_HEADER_BYTES + metaBuf.length + bodyLength, 0);
  out.writeUInt8(op, 4);
  out.writeUInt8(flags, 5);
  out.writeUInt32BE(correlationId >>> 0, 6);
  out.writeUInt32BE(metaBuf.length, 10);
  metaBuf.copy(out, 14);
  return FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length;
}

export function encodePreamble(minVersion = MIN_PROTOCOL_VERSION, maxVersion = PROTOCOL_VERSION): Buffer {
  const b = Buffer.allocUnsafe(PREAMBLE_BYTES);
  MAGIC.copy(b, 0);
  b.writeUInt16BE(minVersion, 4);
  b.writeUInt16BE(maxVersion, 6);
  return b;
}

/** Parses a complete frame (without its length prefix). Throws ProtocolError. */
export function decodeFrame(buf: Buffer): Frame {
  if (buf.length < FRAME_HEADER_BYTES) throw new ProtocolError(`frame of ${buf.length} bytes is shorter than its header`);
  const op = buf.readUInt8(0);
  const flags = buf.readUInt8(1);
  const correlationId = buf.readUInt32BE(2);
  const metaLen = buf.readUInt32BE(6);
  if (metaLen > buf.length - FRAME_HEADER_BYTES) {
    throw new ProtocolError(`meta length ${metaLen} exceeds frame (${buf.length - FRAME_HEADER_BYTES} bytes left)`);
  }
  let meta: Record<string, unknown> = {};
  if (metaLen > 0) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(buf.toString("utf8", FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + metaLen));
    } catch {
      throw new ProtocolError("frame meta is not valid JSON");
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new ProtocolError("frame meta must be a JSON object");
    }
    meta = parsed as Record<string, unknown>;
  }
  return { op, flags, correlationId, meta, body: buf.subarray(FRAME_HEADER_BYTES + metaLen) };
}

/**
 * Incremental frame splitter. Holds received chunks without concatenating them until one
 * whole frame is present, so memory per connection stays below `maxFrameBytes` plus one
 * socket chunk, whatever the peer sends. The length prefix is checked against the current
 * cap *before* any frame buffer is allocated.
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Can be lowered/raised between frames (e.g. after the handshake). */
  maxFrameBytes: number;

  constructor(maxFrameBytes: number) {
    this.maxFrameBytes = maxFrameBytes;
  }

  get bufferedBytes(): number {
    return this.buffered;
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.buffered += chunk.length;
  }

  /** Copies up to n buffered bytes without consuming them. */
  peekRaw(n: number): Buffer {
    const out = Buffer.allocUnsafe(Math.min(n, this.buffered));
    let got = 0;
    for (const c of this.chunks) {
      if (got === out.length) break;
      got += c.copy(out, got, 0, Math.min(c.length, out.length - got));
    }
    return out;
  }

  /** Takes exactly n raw bytes (used for the preamble), or null if not yet available. */
  takeRaw(n: number): Buffer | null {
    if (this.buffered < n) return null;
    return this.take(n);
  }

  /** Returns the next complete frame body (without length prefix) or null. Throws ProtocolError
   * when the announced length is invalid; the caller must then drop the connection. */
  next(): Buffer | null {
    if (this.buffered < FRAME_LENGTH_BYTES) return null;
    const len = this.peekUInt32();
    if (len < FRAME_HEADER_BYTES) throw new ProtocolError(`frame length ${len} is below the minimum ${FRAME_HEADER_BYTES}`);
    if (len > this.maxFrameBytes) {
      throw new FrameTooLargeError(`frame length ${len} exceeds the limit of ${this.maxFrameBytes} bytes`);
    }
    if (this.buffered < FRAME_LENGTH_BYTES + len) return null;
    this.take(FRAME_LENGTH_BYTES);
    return this.take(len);
  }

  private peekUInt32(): number {
    const first = this.chunks[0];
    if (first.length >= 4) return first.readUInt32BE(0);
    const tmp = Buffer.allocUnsafe(4);
    let got = 0;
    for (const c of this.chunks) {
      const n = Math.min(4 - got, c.length);
      c.copy(tmp, got, 0, n);
      got += n;
      if (got === 4) break;
    }
    return tmp.readUInt32BE(0);
  }

  private take(n: number): Buffer {
    const first = this.chunks[0];
    if (first.length === n) {
      this.chunks.shift();
      this.buffered -= n;
      return first;
    }
    if (first.length > n) {
      this.chunks[0] = first.subarray(n);
      this.buffered -= n;
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let got = 0;
    while (got < n) {
      const c = this.chunks[0];
      const k = Math.min(n - got, c.length);
      c.copy(out, got, 0, k);
      got += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.buffered -= n;
    return out;
  }
}
