// SPDX-License-Identifier: Apache-2.0
/**
 * Values, headers and records on the wire (docs/protocol.md §4 "Records"): publish records
 * (PUBLISH, QUEUE_ENQUEUE bodies, PUSH_JOBS), consumed records (FETCH responses,
 * PUSH_MESSAGES) and publish receipts. Counts are checked against the minimum encoded size of
 * one element times the bytes left before any array is allocated.
 */
import { ProtocolError, ValidationError } from "../errors.js";
import type { ValueKind as StoredValueKind } from "../log/record-batch.js";
import type { ConsumedRecord, Headers, PublishReceipt, PublishRecord, PublishValue } from "../types.js";
import { Reader, Writer } from "./codec.js";

/**
 * Value kinds, the one definition for every wire body. 0-2 are the storage format's kinds
 * (src/log/record-batch.ts), so stored values are forwarded with their kind unchanged; 3 is the
 * null value, which the storage format expresses as a null value of kind 0.
 */
export const enum ValueKind {
  Bytes = 0,
  Utf8 = 1,
  Json = 2,
  Null = 3,
}

/** Compile-time check that kinds 0-2 are the storage kinds. */
const STORED_KINDS: readonly StoredValueKind[] = [ValueKind.Bytes, ValueKind.Utf8, ValueKind.Json];
void STORED_KINDS;

const HEADER_BYTES = 0;
const HEADER_STRING = 1;

/** Minimum encoded size of a publish record / consumed record: used to bound counts. */
export const MIN_PUBLISH_RECORD_BYTES = 4 + 8 + 4 + 1 + 2;
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
  r.end("records");
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
  r.end("records");
  return out;
}

/** Receipts (PUBLISH response body): u32 count, then per record partition i32 | offset f64 |
 * flags u8 (bit0 duplicate, bit1 synced). */
export function encodeReceipts(receipts: readonly PublishReceipt[]): Buffer {
  const w = new Writer(8 + receipts.length * 13);
  w.u32(receipts.length);
  for (const r of receipts) {
    w.i32(r.partition);
    w.f64(r.offset);
    w.u8((r.duplicate ? 1 : 0) | (r.synced ? 2 : 0));
  }
  return w.finish();
}

/** Partition(4) offset(8) flags(1) per receipt. */
const RECEIPT_BYTES = 13;

export function decodeReceipts(topic: string, buf: Buffer): PublishReceipt[] {
  const r = new Reader(buf);
  const n = r.u32("receipt count");
  if (n * RECEIPT_BYTES > r.remaining) throw new ProtocolError(`receipt count ${n} exceeds the bytes left`);
  const out: PublishReceipt[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const partition = r.i32("partition");
    const offset = r.f64("offset");
    const flags = r.u8("receipt flags");
    out[i] = { topic, partition, offset, duplicate: (flags & 1) !== 0, synced: (flags & 2) !== 0 };
  }
  r.end("receipts");
  return out;
}
