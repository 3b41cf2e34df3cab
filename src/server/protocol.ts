// SPDX-License-Identifier: Apache-2.0
/**
 * The sluice wire protocol (version 1), shared by the server and the client. The byte layout
 * is documented in docs/protocol.md; keep the two in sync.
 *
 * Invariants the decoders keep, because every byte here may come from a hostile peer:
 * - nothing is allocated from a length field before that length has been checked against
 *   the bytes actually present (and the frame length against `maxFrameBytes`);
 * - every decode error is a `ProtocolError`, never a RangeError or a crash;
 * - counts are checked against the minimum encoded size of one element before any array of
 *   that size is built.
 */
import {
  AbortedError,
  BrokerClosedError,
  BrokerError,
  ConflictError,
  ConnectionClosedError,
  CorruptRecordError,
  GroupActiveError,
  InvalidBatchError,
  InvalidNameError,
  LeaseExpiredError,
  NotAssignedError,
  NotFoundError,
  OffsetOutOfRangeError,
  OutOfOrderSequenceError,
  PartitionNotFoundError,
  PermanentError,
  ProducerFencedError,
  ProtocolError,
  QueueFullError,
  RecordTooLargeError,
  StaleGenerationError,
  StorageError,
  StorageFullError,
  TimeoutError,
  TopicExistsError,
  TopicNotFoundError,
  UnsupportedVersionError,
  ValidationError,
} from "../errors.js";
import type { ConsumedRecord, Headers, PublishRecord, PublishValue } from "../types.js";

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

export const enum Op {
  Hello = 1,
  Ping = 2,
  CreateTopic = 10,
  DeleteTopic = 11,
  ListTopics = 12,
  DescribeTopic = 13,
  Publish = 20,
  InitProducer = 21,
  PublishEncoded = 22,
  Fetch = 30,
  OffsetForTimestamp = 31,
  Subscribe = 40,
  Credit = 41,
  Commit = 42,
  Unsubscribe = 43,
  Heartbeat = 44,
  PushMessages = 45,
  PushAssignment = 46,
  PushSubscriptionEnded = 47,
  RevokeAck = 48,
  PushRecordBatches = 49,
  ResetGroup = 50,
  GroupLag = 51,
  QueueEnqueue = 60,
  QueueWork = 61,
  QueueSettle = 62,
  QueueStop = 63,
  QueueAdmin = 64,
  PushJobs = 65,
  PushLeaseLost = 66,
  PushWorkerEnded = 67,
  QueueSettleBatch = 68,
  PushJobBatch = 69,
}

export const KNOWN_OPS: ReadonlySet<number> = new Set([
  1, 2, 10, 11, 12, 13, 20, 21, 22, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69,
]);

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
  const metaBuf = meta === undefined || meta === null ? EMPTY : Buffer.from(JSON.stringify(meta), "utf8");
  const bodyLen = body === null ? 0 : body.length;
  const frameLen = FRAME_HEADER_BYTES + metaBuf.length + bodyLen;
  const inline = body !== null && bodyLen < copyBelow;
  const out = Buffer.allocUnsafe(FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length + (inline ? bodyLen : 0));
  out.writeUInt32BE(frameLen, 0);
  out.writeUInt8(op, 4);
  out.writeUInt8(flags, 5);
  out.writeUInt32BE(correlationId >>> 0, 6);
  out.writeUInt32BE(metaBuf.length, 10);
  metaBuf.copy(out, 14);
  if (inline) body.copy(out, 14 + metaBuf.length);
  return [out, inline || body === null || bodyLen === 0 ? null : body];
}

/**
 * Encodes the length prefix, header and meta of a frame whose `bodyLength`-byte body the
 * caller writes next (a push of stored batches is sent without copying them into the frame).
 */
export function encodeFrameHead(op: number, flags: number, correlationId: number, meta: unknown, bodyLength: number): Buffer {
  const metaBuf = meta === undefined || meta === null ? EMPTY : Buffer.from(JSON.stringify(meta), "utf8");
  const out = Buffer.allocUnsafe(FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length);
  out.writeUInt32BE(FRAME_HEADER_BYTES + metaBuf.length + bodyLength, 0);
  out.writeUInt8(op, 4);
  out.writeUInt8(flags, 5);
  out.writeUInt32BE(correlationId >>> 0, 6);
  out.writeUInt32BE(metaBuf.length, 10);
  metaBuf.copy(out, 14);
  return out;
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
      throw new ProtocolError(`frame length ${len} exceeds the limit of ${this.maxFrameBytes} bytes`, "FRAME_TOO_LARGE");
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

// ---------------------------------------------------------------------------------------------
// Binary writer / reader

export class Writer {
  private buf: Buffer;
  private pos = 0;
  constructor(initial = 1024) {
    this.buf = Buffer.allocUnsafe(initial);
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
  shortString(s: string): void {
    const b = Buffer.from(s, "utf8");
    if (b.length > 0xffff) throw new ValidationError(`string of ${b.length} bytes is too long (max 65535)`);
    this.u16(b.length);
    this.bytes(b);
  }
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
  nullableBytes(what = "bytes"): Buffer | null {
    const n = this.i32(what + " length");
    if (n === -1) return null;
    if (n < -1) throw new ProtocolError(`negative ${what} length ${n}`);
    return this.bytes(n, what);
  }
  utf8(what = "string"): string {
    const n = this.i32(what + " length");
    if (n < 0) throw new ProtocolError(`negative ${what} length ${n}`);
    this.need(n, what);
    const s = this.buf.toString("utf8", this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  shortString(what = "string"): string {
    const n = this.u16(what + " length");
    this.need(n, what);
    const s = this.buf.toString("utf8", this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
}

// ---------------------------------------------------------------------------------------------
// Values, headers, records

export const enum ValueKind {
  Bytes = 0,
  Utf8 = 1,
  Json = 2,
  Null = 3,
}

const HEADER_BYTES = 0;
const HEADER_STRING = 1;

/** Minimum encoded size of a publish record / consumed record: used to bound counts. */
const MIN_PUBLISH_RECORD_BYTES = 4 + 8 + 4 + 1 + 2;
const MIN_CONSUMED_RECORD_BYTES = 4 + 8 + 8 + 4 + 1 + 2;

function encodeValue(w: Writer, value: PublishValue | undefined): void {
  if (value === null || value === undefined) {
    w.u8(ValueKind.Null);
  } else if (value instanceof Uint8Array) {
    w.u8(ValueKind.Bytes);
    w.nullableBytes(value);
  } else if (typeof value === "string") {
    w.u8(ValueKind.Utf8);
    w.utf8(value);
  } else {
    const json = JSON.stringify(value);
    if (json === undefined) throw new ValidationError(`value of type ${typeof value} cannot be encoded as JSON`);
    w.u8(ValueKind.Json);
    w.utf8(json);
  }
}

function decodeValue(r: Reader, copy = true): unknown {
  const kind = r.u8("value kind");
  switch (kind) {
    case ValueKind.Null:
      return null;
    case ValueKind.Bytes: {
      const b = r.nullableBytes("value");
      // Consumers get a copy: the frame buffer may be large, and an application keeping one
      // value must not pin the whole frame. The server appends and forgets, so it uses a view.
      return b === null ? null : copy ? Buffer.from(b) : b;
    }
    case ValueKind.Utf8:
      return r.utf8("value");
    case ValueKind.Json: {
      const s = r.utf8("value");
      try {
        return JSON.parse(s);
      } catch {
        throw new ProtocolError("record value of kind json is not valid JSON");
      }
    }
    default:
      throw new ProtocolError(`unknown value kind ${kind}`);
  }
}

function encodeHeaders(w: Writer, headers: Headers | Record<string, Uint8Array> | undefined | null): void {
  if (!headers) {
    w.u16(0);
    return;
  }
  const names = Object.keys(headers);
  if (names.length > 0xffff) throw new ValidationError(`too many headers (${names.length})`);
  w.u16(names.length);
  for (const name of names) {
    w.shortString(name);
    const v = headers[name];
    if (typeof v === "string") {
      w.u8(HEADER_STRING);
      w.utf8(v);
    } else if (v instanceof Uint8Array) {
      w.u8(HEADER_BYTES);
      w.nullableBytes(v);
    } else {
      throw new ValidationError(`header ${JSON.stringify(name)} must be a string or Uint8Array`);
    }
  }
}

function decodeHeaders(r: Reader, asBytes: boolean): Record<string, string | Uint8Array> {
  const n = r.u16("header count");
  // 2 (name len) + 1 (kind) + 4 (value len) per header at least.
  if (n * 7 > r.remaining) throw new ProtocolError(`header count ${n} exceeds the bytes left`);
  const out: Record<string, string | Uint8Array> = Object.create(null);
  for (let i = 0; i < n; i++) {
    const name = r.shortString("header name");
    const kind = r.u8("header kind");
    if (kind === HEADER_STRING) {
      const s = r.utf8("header value");
      out[name] = asBytes ? Buffer.from(s, "utf8") : s;
    } else if (kind === HEADER_BYTES) {
      const b = r.nullableBytes("header value");
      out[name] = b === null ? Buffer.alloc(0) : Buffer.from(b);
    } else {
      throw new ProtocolError(`unknown header kind ${kind}`);
    }
  }
  return out;
}

function keyBytes(key: string | Uint8Array | null | undefined): Uint8Array | null {
  if (key === null || key === undefined) return null;
  if (typeof key === "string") return Buffer.from(key, "utf8");
  return key;
}

/** Publish records: u32 count, then per record partition(i32, -1 none) timestamp(f64, -1 none)
 * key(nullable bytes) value(kind + payload) headers. */
export function encodePublishRecords(records: readonly PublishRecord[], partitionOverride?: number, sizeHint = 0): Buffer {
  const w = new Writer(Math.max(64 + records.length * 64, sizeHint + records.length * 32 + 64));
  w.u32(records.length);
  for (const rec of records) {
    w.i32(partitionOverride !== undefined ? partitionOverride : rec.partition === undefined ? -1 : rec.partition);
    w.f64(rec.timestamp === undefined ? -1 : rec.timestamp);
    w.nullableBytes(keyBytes(rec.key));
    encodeValue(w, rec.value);
    encodeHeaders(w, rec.headers);
  }
  return w.finish();
}

/** `copyValues`: false on the server's publish path (the frame outlives the append only); true
 * wherever a decoded value may be retained (queue payloads, client-side jobs). */
export function decodePublishRecords(buf: Buffer, maxRecords: number, copyValues = false): PublishRecord[] {
  const r = new Reader(buf);
  const n = r.u32("record count");
  if (n > maxRecords) throw new ProtocolError(`batch of ${n} records exceeds the limit of ${maxRecords}`);
  if (n * MIN_PUBLISH_RECORD_BYTES > r.remaining) throw new ProtocolError(`record count ${n} exceeds the bytes left`);
  const out: PublishRecord[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const partition = r.i32("partition");
    const timestamp = r.f64("timestamp");
    const key = r.nullableBytes("key");
    const value = decodeValue(r, copyValues) as PublishValue;
    const headers = decodeHeaders(r, false) as Headers;
    const rec: PublishRecord = { value };
    if (partition >= 0) rec.partition = partition;
    else if (partition !== -1) throw new ProtocolError(`invalid partition ${partition}`);
    if (timestamp !== -1) rec.timestamp = timestamp;
    if (key !== null) rec.key = Buffer.from(key);
    if (Object.keys(headers).length > 0) rec.headers = headers;
    out[i] = rec;
  }
  if (r.remaining !== 0) throw new ProtocolError(`${r.remaining} trailing bytes after records`);
  return out;
}

/** Consumed records (fetch responses and pushes): u32 count, then per record partition(i32)
 * offset(f64) timestamp(f64) key value headers. The topic travels in the frame meta. */
export function encodeConsumedRecords(records: readonly ConsumedRecord[]): Buffer {
  const w = new Writer(64 + records.length * 64);
  w.u32(records.length);
  for (const rec of records) writeConsumedRecord(w, rec);
  return w.finish();
}

export function writeConsumedRecord(w: Writer, rec: ConsumedRecord): void {
  w.i32(rec.partition);
  w.f64(rec.offset);
  w.f64(rec.timestamp);
  w.nullableBytes(rec.key);
  encodeValue(w, rec.value as PublishValue);
  encodeHeaders(w, rec.headers);
}

export function decodeConsumedRecords(topic: string, buf: Buffer): ConsumedRecord[] {
  const r = new Reader(buf);
  const n = r.u32("record count");
  if (n * MIN_CONSUMED_RECORD_BYTES > r.remaining) throw new ProtocolError(`record count ${n} exceeds the bytes left`);
  const out: ConsumedRecord[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const partition = r.i32("partition");
    const offset = r.f64("offset");
    const timestamp = r.f64("timestamp");
    const key = r.nullableBytes("key");
    const value = decodeValue(r);
    const headers = decodeHeaders(r, true) as Record<string, Uint8Array>;
    out[i] = { topic, partition, offset, timestamp, key: key === null ? null : Buffer.from(key), value, headers };
  }
  if (r.remaining !== 0) throw new ProtocolError(`${r.remaining} trailing bytes after records`);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Errors on the wire

export interface WireError {
  code: string;
  message: string;
  retriable: boolean;
  details?: Record<string, unknown>;
}

export function errorToWire(err: unknown): WireError {
  if (err instanceof BrokerError) {
    const details: Record<string, unknown> = {};
    if (err instanceof OffsetOutOfRangeError) {
      Object.assign(details, {
        topic: err.topic,
        partition: err.partition,
        offset: err.offset,
        logStartOffset: err.logStartOffset,
        logEndOffset: err.logEndOffset,
      });
    } else if (err instanceof RecordTooLargeError) {
      Object.assign(details, { sizeBytes: err.sizeBytes, maxBytes: err.maxBytes });
    } else if (err instanceof CorruptRecordError) {
      Object.assign(details, {
        topic: err.topic,
        partition: err.partition,
        offset: err.offset,
        file: err.file,
        position: err.position,
        nextOffset: err.nextOffset,
      });
    } else if (err instanceof TopicNotFoundError) {
      details.topic = err.topic;
    } else if (err instanceof QueueFullError) {
      Object.assign(details, { depth: err.depth, bytes: err.bytes });
    }
    return { code: err.code, message: err.message, retriable: err.retriable, details };
  }
  const message = err instanceof Error ? err.message : String(err);
  return { code: "INTERNAL", message: `internal server error: ${message}`, retriable: false };
}

/** Rebuilds the error class a server raised, so `instanceof errors.X` works on the client. */
export function wireToError(w: WireError): BrokerError {
  const d = (w.details ?? {}) as Record<string, any>;
  const msg = String(w.message ?? "");
  let e: BrokerError;
  switch (w.code) {
    case "VALIDATION":
      e = new ValidationError(msg);
      break;
    case "INVALID_NAME":
      e = new InvalidNameError("", "", "");
      break;
    case "TOPIC_NOT_FOUND":
      e = new TopicNotFoundError(String(d.topic ?? ""));
      break;
    case "PARTITION_NOT_FOUND":
      e = new PartitionNotFoundError("", 0);
      break;
    case "NOT_FOUND":
      e = new NotFoundError(msg);
      break;
    case "TOPIC_EXISTS":
      e = new TopicExistsError("");
      break;
    case "GROUP_ACTIVE":
      e = new GroupActiveError("");
      break;
    case "CONFLICT":
      e = new ConflictError(msg);
      break;
    case "RECORD_TOO_LARGE":
      e = new RecordTooLargeError(Number(d.sizeBytes ?? 0), Number(d.maxBytes ?? 0));
      break;
    case "OFFSET_OUT_OF_RANGE":
      e = new OffsetOutOfRangeError(
        String(d.topic ?? ""),
        Number(d.partition ?? 0),
        Number(d.offset ?? 0),
        Number(d.logStartOffset ?? 0),
        Number(d.logEndOffset ?? 0),
      );
      break;
    case "CORRUPT_RECORD":
      e = new CorruptRecordError(
        String(d.topic ?? ""),
        Number(d.partition ?? 0),
        Number(d.offset ?? 0),
        String(d.file ?? ""),
        Number(d.position ?? 0),
        msg,
        d.nextOffset === undefined || d.nextOffset === null ? undefined : Number(d.nextOffset),
      );
      break;
    case "INVALID_BATCH":
      e = new InvalidBatchError(msg);
      break;
    case "STORAGE_FULL":
      e = new StorageFullError(msg);
      break;
    case "STORAGE_ERROR":
      e = new StorageError(msg);
      break;
    case "OUT_OF_ORDER_SEQUENCE":
      e = new OutOfOrderSequenceError(msg);
      break;
    case "PRODUCER_FENCED":
      e = new ProducerFencedError(msg);
      break;
    case "BROKER_CLOSED":
      e = new BrokerClosedError(msg);
      break;
    case "TIMEOUT":
      e = new TimeoutError(msg);
      break;
    case "ABORTED":
      e = new AbortedError(msg);
      break;
    case "CONNECTION_CLOSED":
      e = new ConnectionClosedError(msg);
      break;
    case "NOT_ASSIGNED":
      e = new NotAssignedError(msg);
      break;
    case "STALE_GENERATION":
      e = new StaleGenerationError(msg);
      break;
    case "LEASE_EXPIRED":
      e = new LeaseExpiredError(msg);
      break;
    case "QUEUE_FULL":
      e = new QueueFullError("", Number(d.depth ?? 0), Number(d.bytes ?? 0));
      break;
    case "PERMANENT":
      e = new PermanentError(msg);
      break;
    case "UNSUPPORTED_VERSION":
      e = new UnsupportedVersionError(msg);
      break;
    default:
      if (w.code === "PROTOCOL" || w.code === "FRAME_TOO_LARGE" || w.code.startsWith("PROTOCOL")) {
        e = new ProtocolError(msg, w.code);
      } else {
        e = new BrokerError(String(w.code), msg, { retriable: Boolean(w.retriable) });
      }
  }
  // Keep the server's exact message (several constructors build their own text).
  (e as { message: string }).message = msg;
  return e;
}
