// SPDX-License-Identifier: Apache-2.0
/**
 * Compact binary bodies of the batched work-queue frames (docs/protocol.md §7):
 * QUEUE_SETTLE_BATCH (op 68, client -> server) and PUSH_JOB_BATCH (op 69, server -> client).
 * Shared by src/server and src/client; keep docs/protocol.md in sync.
 *
 * They replace per-job JSON (QUEUE_SETTLE items, PUSH_JOBS metas) on the hot path. Each pushed
 * job carries a *delivery tag* (a u32 the server numbers per worker, like AMQP's), and a
 * settlement names the tag instead of the receipt string: 5 bytes per ack, and an integer
 * lookup on the server.
 *
 * The decoders follow the rules of src/wire/codec.ts for hostile input: every length is checked
 * against the bytes present before use, counts against the minimum element size, and every
 * failure is a ProtocolError.
 */
import { ProtocolError, ValidationError } from "../errors.js";
import { Reader, Writer } from "./codec.js";
import { FRAME_HEADER_BYTES, FRAME_LENGTH_BYTES } from "./frame.js";
import { MIN_PUBLISH_RECORD_BYTES, ValueKind } from "./records.js";

/** Settlement actions on the wire. */
export const enum SettleAction {
  Ack = 0,
  Nack = 1,
  Extend = 2,
  /** Give a job back that was never handed to application code: no attempt is counted. */
  Release = 3,
  /** An ack with the job's result (JSON text); sent only to a server that keeps results. */
  AckResult = 4,
  /** Give the job back after `ms` (f64) without counting the delivery (`job.retryAfter`). */
  RetryAfter = 5,
}

export interface SettleItem {
  tag: number;
  action: "ack" | "nack" | "extend" | "release" | "retryAfter";
  /** nack: {delayMs?, requeue?, reason?, errorClass?, errorMessage?}; extend: {ms}; ack:
   * {result?} (the result as JSON text); retryAfter: {ms}. */
  arg: Record<string, unknown>;
}

/** action(1) + tag(4). */
const MIN_SETTLE_ITEM_BYTES = 5;

/**
 * Settle items: u32 count, then per item action u8 | tag u32 | argument:
 * ack (0) none; nack (1) i32 length + UTF-8 JSON object (failures only: rare); extend (2)
 * ms f64; release (3) none; ack with a result (4) i32 length + the result as UTF-8 JSON;
 * retryAfter (5) ms f64.
 */
export function encodeSettleItems(items: readonly SettleItem[]): Buffer {
  const w = new Writer(8 + items.length * 5);
  w.u32(items.length);
  for (const it of items) {
    switch (it.action) {
      case "ack":
        if (typeof it.arg.result === "string") {
          w.u8(SettleAction.AckResult);
          w.u32(it.tag);
          w.utf8(it.arg.result);
          break;
        }
        w.u8(SettleAction.Ack);
        w.u32(it.tag);
        break;
      case "extend":
        w.u8(SettleAction.Extend);
        w.u32(it.tag);
        w.f64(Number(it.arg.ms));
        break;
      case "nack":
        w.u8(SettleAction.Nack);
        w.u32(it.tag);
        w.nullableUtf8(JSON.stringify(it.arg ?? {}));
        break;
      case "release":
        w.u8(SettleAction.Release);
        w.u32(it.tag);
        break;
      case "retryAfter":
        w.u8(SettleAction.RetryAfter);
        w.u32(it.tag);
        w.f64(Number(it.arg.ms));
        break;
      default:
        throw new ValidationError(`unknown settle action ${JSON.stringify(it.action)}`);
    }
  }
  return w.finish();
}

const ACK_ARG: Record<string, unknown> = Object.freeze({}) as Record<string, unknown>;

export function decodeSettleItems(buf: Buffer, maxItems: number): SettleItem[] {
  const r = new Reader(buf);
  const n = r.u32("settle count");
  if (n > maxItems) throw new ProtocolError(`${n} settle items exceed the limit of ${maxItems}`);
  if (n * MIN_SETTLE_ITEM_BYTES > r.remaining) throw new ProtocolError(`settle count ${n} exceeds the bytes left`);
  const out: SettleItem[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const action = r.u8("settle action");
    const tag = r.u32("delivery tag");
    switch (action) {
      case SettleAction.Ack:
        out[i] = { tag, action: "ack", arg: ACK_ARG };
        break;
      case SettleAction.Extend:
        out[i] = { tag, action: "extend", arg: { ms: r.f64("extend ms") } };
        break;
      case SettleAction.Release:
        out[i] = { tag, action: "release", arg: ACK_ARG };
        break;
      case SettleAction.RetryAfter:
        out[i] = { tag, action: "retryAfter", arg: { ms: r.f64("retryAfter ms") } };
        break;
      case SettleAction.AckResult:
        // Checked (JSON, size) where it is applied, as an embedded ack checks it.
        out[i] = { tag, action: "ack", arg: { result: r.utf8("ack result") } };
        break;
      case SettleAction.Nack: {
        const json = r.utf8("nack options");
        let arg: unknown;
        try {
          arg = JSON.parse(json);
        } catch {
          throw new ProtocolError("nack options are not valid JSON");
        }
        if (arg === null || typeof arg !== "object" || Array.isArray(arg)) throw new ProtocolError("nack options must be a JSON object");
        out[i] = { tag, action: "nack", arg: arg as Record<string, unknown> };
        break;
      }
      default:
        throw new ProtocolError(`unknown settle action ${action}`);
    }
  }
  r.end("settle items");
  return out;
}

/** One delivered job as it travels: the stored value bytes and kind, not a decoded value. */
export interface WireJob {
  id: string;
  receipt: string;
  attempt: number;
  enqueuedAt: number;
  leaseExpiresAt: number;
  redriveCount: number;
  key: string | null;
  /** DeadLetterInfo as JSON text, or null. */
  deadLetterJson: string | null;
  /** 0 bytes, 1 UTF-8 string, 2 JSON text; `value` null = the null value. */
  valueKind: number;
  value: Uint8Array | null;
  /** User headers only (never the broker's own `sluice-*`). */
  headers: readonly (readonly [string, Uint8Array])[] | null;
}

/** A pushed job as the client decodes it: the value decoded, with its delivery tag. */
export interface DecodedJob extends Omit<WireJob, "valueKind" | "value" | "headers"> {
  tag: number;
  data: unknown;
  /** With `lazyJson`: a JSON value's text, not parsed yet (`data` is then undefined). */
  jsonText?: string;
  headers: Record<string, Uint8Array>;
}

/** id(2) receipt(2) attempt(4) enqueuedAt(8) leaseExpiresAt(8) redriveCount(4) key(4) deadLetter(4) kind(1) headers(2). */
const MIN_JOB_BYTES = 2 + 2 + 4 + 8 + 8 + 4 + 4 + 4 + 1 + 2;
/** Fixed bytes per job plus room for short id and receipt strings (a size estimate). */
const JOB_OVERHEAD_BYTES = MIN_JOB_BYTES + 48;

/** The job's size on the wire, estimated (exact for the fixed part): sizes the frame buffer. */
export function wireJobSize(j: WireJob): number {
  let n = JOB_OVERHEAD_BYTES + (j.value === null ? 0 : j.value.length + 4);
  if (j.key !== null) n += j.key.length * 3;
  if (j.deadLetterJson !== null) n += j.deadLetterJson.length * 3;
  if (j.headers !== null) for (const [k, v] of j.headers) n += 6 + k.length * 3 + v.length;
  return n;
}

/**
 * Writes a whole PUSH_JOB_BATCH frame (length prefix, header, meta, body) into one buffer,
 * so the socket gets it without a further copy. Body:
 *   count u32 | firstTag u32 (job i has delivery tag firstTag + i), then per job
 *   id u16+UTF-8 | receipt u16+UTF-8 | attempt u32 | enqueuedAt f64 | leaseExpiresAt f64 |
 *   redriveCount u32 | key i32 (-1 null)+UTF-8 | deadLetter i32 (-1 null)+JSON |
 *   value kind u8 (0 bytes, 1 UTF-8, 2 JSON, 3 null) + i32 length + bytes (absent for null) |
 *   headers u16 count, per header name u16+UTF-8, value i32 length + bytes.
 */
export function encodeJobBatchFrame(op: number, flags: number, meta: unknown, firstTag: number, jobs: readonly WireJob[], sizeHint = 0): Buffer {
  const metaBuf = Buffer.from(JSON.stringify(meta), "utf8");
  let size = sizeHint;
  if (size <= 0) for (const j of jobs) size += wireJobSize(j);
  const w = new Writer(FRAME_LENGTH_BYTES + FRAME_HEADER_BYTES + metaBuf.length + 8 + size);
  w.u32(0); // frame length, patched below
  w.u8(op);
  w.u8(flags);
  w.u32(0); // correlation id: 0 for pushes
  w.u32(metaBuf.length);
  w.bytes(metaBuf);
  w.u32(jobs.length);
  w.u32(firstTag);
  for (const j of jobs) {
    w.shortString(j.id);
    w.shortString(j.receipt);
    w.u32(j.attempt);
    w.f64(j.enqueuedAt);
    w.f64(j.leaseExpiresAt);
    w.u32(j.redriveCount);
    w.nullableUtf8(j.key);
    w.nullableUtf8(j.deadLetterJson);
    if (j.value === null) w.u8(ValueKind.Null);
    else {
      w.u8(j.valueKind);
      w.i32(j.value.length);
      w.bytes(j.value);
    }
    const h = j.headers;
    const hn = h === null ? 0 : h.length;
    if (hn > 0xffff) throw new ValidationError(`too many headers (${hn})`);
    w.u16(hn);
    for (let k = 0; k < hn; k++) {
      w.shortString(h![k][0]);
      w.i32(h![k][1].length);
      w.bytes(h![k][1]);
    }
  }
  const out = w.finish();
  out.writeUInt32BE(out.length - FRAME_LENGTH_BYTES, 0);
  return out;
}

/**
 * Decodes a PUSH_JOB_BATCH body. Byte values are copied (a kept job must not pin the frame).
 * `lazyJson`: a JSON value is left as its text (`jsonText`) for the caller to parse when the
 * value is read (the network client's job.data): a handler that never reads it costs no parse.
 */
export function decodeJobBatch(buf: Buffer, maxJobs: number, lazyJson = false): DecodedJob[] {
  const r = new Reader(buf);
  const n = r.u32("job count");
  const firstTag = r.u32("first delivery tag");
  if (n > maxJobs) throw new ProtocolError(`${n} jobs exceed the limit of ${maxJobs}`);
  if (n * MIN_JOB_BYTES > r.remaining) throw new ProtocolError(`job count ${n} exceeds the bytes left`);
  const out: DecodedJob[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const id = r.shortString("job id");
    const receipt = r.shortString("receipt");
    const attempt = r.u32("attempt");
    const enqueuedAt = r.f64("enqueuedAt");
    const leaseExpiresAt = r.f64("leaseExpiresAt");
    const redriveCount = r.u32("redriveCount");
    const key = r.nullableUtf8("key");
    const deadLetterJson = r.nullableUtf8("deadLetter");
    const kind = r.u8("value kind");
    let data: unknown;
    let jsonText: string | undefined;
    switch (kind) {
      case ValueKind.Null:
        data = null;
        break;
      case ValueKind.Bytes:
        data = Buffer.from(r.bytes(r.length("value"), "value"));
        break;
      case ValueKind.Utf8:
        data = r.utf8("value");
        break;
      case ValueKind.Json: {
        const s = r.utf8("value");
        if (lazyJson) jsonText = s;
        else data = parseJobJson(s);
        break;
      }
      default:
        throw new ProtocolError(`unknown value kind ${kind}`);
    }
    const hn = r.u16("header count");
    if (hn * 6 > r.remaining) throw new ProtocolError(`header count ${hn} exceeds the bytes left`);
    const headers: Record<string, Uint8Array> = {};
    for (let k = 0; k < hn; k++) {
      const name = r.shortString("header name");
      const value = Buffer.from(r.bytes(r.length("header value"), "header value"));
      // A header named "__proto__" is data, not a prototype change.
      if (name === "__proto__") Object.defineProperty(headers, name, { value, enumerable: true, writable: true, configurable: true });
      else headers[name] = value;
    }
    out[i] = { tag: (firstTag + i) >>> 0, id, receipt, attempt, enqueuedAt, leaseExpiresAt, redriveCount, key, deadLetterJson, data, jsonText, headers };
  }
  r.end("jobs");
  return out;
}

/** A pushed job's JSON value (ProtocolError when it is not JSON). */
export function parseJobJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    throw new ProtocolError("job value of kind json is not valid JSON");
  }
}

/** A QUEUE_ENQUEUE record as the queue stores it: value bytes (copied) and their kind. */
export interface EnqueueRecord {
  value: Buffer | null;
  /** 0 bytes, 1 UTF-8 string, 2 JSON text (the storage kinds; a null value is `value: null`). */
  valueKind: 0 | 1 | 2;
  headers: Record<string, Buffer> | undefined;
}

/**
 * Decodes a QUEUE_ENQUEUE body (publish records, docs/protocol.md §4) straight into what the
 * queue stores, without decoding values into JS values first: bytes are copied (a queued job
 * must not pin the frame), UTF-8 stays UTF-8, JSON text is checked to be JSON and kept as
 * text. Partition, timestamp and key fields are ignored (a job's key travels in `opts`).
 */
export function decodeEnqueueRecords(buf: Buffer, maxRecords: number): EnqueueRecord[] {
  const r = new Reader(buf);
  const n = r.u32("record count");
  if (n > maxRecords) throw new ProtocolError(`batch of ${n} records exceeds the limit of ${maxRecords}`);
  if (n * MIN_PUBLISH_RECORD_BYTES > r.remaining) throw new ProtocolError(`record count ${n} exceeds the bytes left`);
  const out: EnqueueRecord[] = new Array(n);
  for (let i = 0; i < n; i++) {
    r.i32("partition");
    r.f64("timestamp");
    r.nullableBytes("key");
    const kind = r.u8("value kind");
    let value: Buffer | null = null;
    let valueKind: 0 | 1 | 2 = 0;
    switch (kind) {
      case ValueKind.Null:
        break;
      case ValueKind.Bytes: {
        const b = r.nullableBytes("value");
        value = b === null ? null : Buffer.from(b);
        break;
      }
      case ValueKind.Utf8:
        value = Buffer.from(r.bytes(r.length("value"), "value"));
        valueKind = 1;
        break;
      case ValueKind.Json: {
        const b = r.bytes(r.length("value"), "value");
        try {
          JSON.parse(b.toString("utf8"));
        } catch {
          throw new ProtocolError("record value of kind json is not valid JSON");
        }
        value = Buffer.from(b);
        valueKind = 2;
        break;
      }
      default:
        throw new ProtocolError(`unknown value kind ${kind}`);
    }
    const hn = r.u16("header count");
    let headers: Record<string, Buffer> | undefined;
    if (hn > 0) {
      if (hn * 7 > r.remaining) throw new ProtocolError(`header count ${hn} exceeds the bytes left`);
      headers = {};
      for (let k = 0; k < hn; k++) {
        const name = r.shortString("header name");
        const hk = r.u8("header kind");
        if (hk !== 0 && hk !== 1) throw new ProtocolError(`unknown header kind ${hk}`);
        const b = r.nullableBytes("header value");
        if (b === null && hk === 1) throw new ProtocolError("negative header value length");
        const v = b === null ? Buffer.alloc(0) : Buffer.from(b);
        if (name === "__proto__") Object.defineProperty(headers, name, { value: v, enumerable: true, writable: true, configurable: true });
        else headers[name] = v;
      }
    }
    out[i] = { value, valueKind, headers };
  }
  r.end("records");
  return out;
}
