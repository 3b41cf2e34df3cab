// SPDX-License-Identifier: Apache-2.0
/**
 * Encryption at rest of record batches (docs/storage-format.md, "Encrypted batches";
 * docs/security.md, "Encryption at rest"). A log of an `encrypted` topic or queue has a
 * BatchCipher; every other log has none and pays nothing.
 *
 * An encrypted batch keeps its 56-byte header in clear (recovery, indexes, retention and
 * producer state work without keys) and replaces the records section by
 *
 *   u8 keyIdLength | keyId (ASCII) | nonce (12 bytes) | AES-256-GCM(records) | tag (16 bytes)
 *
 * with `BATCH_ATTR_ENCRYPTED` set in the header. The GCM additional data is the stored header
 * without its CRC (length, attributes, count, base offset, timestamps, producer fields), the
 * key id, and the log's context (the topic's id and partition, or the queue's incarnation and
 * log), so a batch moved to another offset, partition, topic or queue, or a header changed to
 * match, fails authentication (ENC-2). The batch CRC is computed last, over the bytes on disk.
 *
 * Encryption happens in the append pipeline once the base offset is assigned (`LogWriter.enqueue`),
 * so every producer path is covered: `append`, client-encoded batches (`appendEncoded`), queue
 * message logs and journals (ENC-1). Decryption happens in `LogReader.read` and, for the
 * server's push of stored batches, `PartitionLog.readRaw` (plain batches with a fresh CRC), so
 * no client ever receives ciphertext.
 */
import { createCipheriv, createDecipheriv, randomFillSync } from "node:crypto";
import { EncryptionKeyMissingError, InvalidBatchError, StorageError, ValidationError } from "../errors.js";
import type { Keyring } from "./keyring.js";
import { BATCH_ATTR_ENCRYPTED, HEADER_SIZE, MAX_BATCH_BYTES, stampBatch, writeI64, type BatchHeader } from "./record-batch.js";

const NONCE_BYTES = 12;
const TAG_BYTES = 16;
const O_ATTR = 9;
const O_BASE = 16;

/** Encrypts and decrypts the batches of one log (one topic partition, or one queue log). */
export class BatchCipher {
  private readonly context: Buffer;

  /**
   * @param keyring null when the broker has no keys: writes and reads of encrypted batches
   *   fail with EncryptionKeyMissingError (recovery and retention still work).
   * @param context what the log is, bound into every batch's authentication (ENC-2).
   * @param where names the log in errors (`topic/partition`, `queue q (messages)`).
   */
  constructor(
    readonly keyring: Keyring | null,
    context: string,
    readonly where: string,
  ) {
    this.context = Buffer.from(`sluice-batch-v1\0${context}`, "utf8");
  }

  /** Before a batch of `plainBytes` is queued: a key to write with, and room for the envelope. */
  checkWritable(plainBytes: number): void {
    if (this.keyring === null) throw new EncryptionKeyMissingError("", this.where);
    const total = plainBytes + 1 + this.keyring.activeId.length + NONCE_BYTES + TAG_BYTES;
    if (total > MAX_BATCH_BYTES) throw new ValidationError(`batch of ${total} bytes encrypted exceeds ${MAX_BATCH_BYTES}`);
  }

  /**
   * A batch in clear (as encodeBatch or a client built it) at `baseOffset`, encrypted with the
   * active key into a new stamped buffer (base offset and CRC set). Synchronous: it runs in the
   * offset assignment step (LOG-1), so AAD can bind the offset.
   */
  seal(plain: Buffer, baseOffset: number): Buffer {
    const keyring = this.keyring;
    if (keyring === null) throw new EncryptionKeyMissingError("", this.where);
    const id = keyring.activeId;
    const recLen = plain.length - HEADER_SIZE;
    const envEnd = HEADER_SIZE + 1 + id.length + NONCE_BYTES;
    const total = envEnd + recLen + TAG_BYTES;
    const out = Buffer.allocUnsafe(total);
    plain.copy(out, 0, 0, HEADER_SIZE);
    out.writeUInt32BE(total, 0);
    out[O_ATTR] |= BATCH_ATTR_ENCRYPTED;
    writeI64(out, O_BASE, baseOffset);
    let p = HEADER_SIZE;
    out[p++] = id.length;
    p += out.write(id, p, "latin1");
    randomFillSync(out, p, NONCE_BYTES); // a fresh 96-bit nonce per batch
    const c = createCipheriv("aes-256-gcm", keyring.activeKey(), out.subarray(p, p + NONCE_BYTES), { authTagLength: TAG_BYTES });
    c.setAAD(this.aad(out, 0, envEnd));
    const a = c.update(plain.subarray(HEADER_SIZE));
    const b = c.final();
    a.copy(out, envEnd);
    b.copy(out, envEnd + a.length);
    c.getAuthTag().copy(out, total - TAG_BYTES);
    stampBatch(out, baseOffset); // the CRC covers what is on disk
    return out;
  }

  /**
   * The batch at buf[pos..] (verified: CRC and length, with BATCH_ATTR_ENCRYPTED) in clear: a
   * new buffer holding its header (length and attribute adjusted, CRC stale) and records.
   * A key id the keyring lacks: EncryptionKeyMissingError. Failed authentication (tampered
   * bytes, a batch moved elsewhere): InvalidBatchError, which readers report as damage
   * (CorruptRecordError); nothing of it is returned.
   */
  open(buf: Buffer, pos: number, h: BatchHeader): { buf: Buffer; h: BatchHeader } {
    const end = pos + h.length;
    const idLen = buf[pos + HEADER_SIZE];
    const envEnd = pos + HEADER_SIZE + 1 + idLen + NONCE_BYTES;
    if (idLen < 1 || idLen > 32 || envEnd + TAG_BYTES > end) throw new InvalidBatchError("encrypted batch envelope is malformed");
    const id = buf.toString("latin1", pos + HEADER_SIZE + 1, pos + HEADER_SIZE + 1 + idLen);
    if (this.keyring === null) throw new EncryptionKeyMissingError(id, this.where);
    const key = this.keyring.key(id);
    if (key === undefined) throw new EncryptionKeyMissingError(id, this.where);
    const d = createDecipheriv("aes-256-gcm", key, buf.subarray(envEnd - NONCE_BYTES, envEnd), { authTagLength: TAG_BYTES });
    d.setAAD(this.aad(buf, pos, envEnd));
    d.setAuthTag(buf.subarray(end - TAG_BYTES, end));
    const ct = buf.subarray(envEnd, end - TAG_BYTES);
    const out = Buffer.allocUnsafe(HEADER_SIZE + ct.length);
    const a = d.update(ct);
    try {
      d.final();
    } catch {
      throw new InvalidBatchError(`encrypted batch failed authentication with key ${JSON.stringify(id)} (altered on disk, or not written at this offset of ${this.where})`);
    }
    buf.copy(out, 0, pos, pos + HEADER_SIZE);
    a.copy(out, HEADER_SIZE);
    out.writeUInt32BE(out.length, 0);
    out[O_ATTR] &= ~BATCH_ATTR_ENCRYPTED;
    return { buf: out, h: { ...h, length: out.length, attributes: h.attributes & ~BATCH_ATTR_ENCRYPTED } };
  }

  /**
   * One verified stored batch of a raw read in clear with its CRC recomputed (a batch in clear
   * is returned as it is): what the server pushes to clients, which never get ciphertext.
   */
  openStamped(data: Buffer, pos: number, h: BatchHeader): Buffer {
    if ((h.attributes & BATCH_ATTR_ENCRYPTED) === 0) return data.subarray(pos, pos + h.length);
    const o = this.open(data, pos, h);
    stampBatch(o.buf, h.baseOffset);
    return o.buf;
  }

  /** AAD: the header without its CRC, the key id (its length byte included) and the context. */
  private aad(buf: Buffer, pos: number, envEnd: number): Buffer {
    return Buffer.concat([buf.subarray(pos, pos + 4), buf.subarray(pos + 8, envEnd - NONCE_BYTES), this.context]);
  }
}

const BLOB_MAGIC = Buffer.from("SLENC001");

/**
 * Seals whole files of an encrypted queue (its snapshot): `SLENC001`, u8 keyIdLength, keyId,
 * nonce (12), AES-256-GCM(file), tag (16); the GCM additional data is everything before the
 * nonce plus the context (the queue's incarnation), so a snapshot of another queue is refused.
 */
export class BlobSealer {
  private readonly context: Buffer;

  constructor(
    private readonly keyring: Keyring | null,
    context: string,
    private readonly where: string,
  ) {
    this.context = Buffer.from(`sluice-blob-v1\0${context}`, "utf8");
  }

  seal(plain: Buffer): Buffer {
    if (this.keyring === null) throw new EncryptionKeyMissingError("", this.where);
    const id = Buffer.from(this.keyring.activeId, "latin1");
    const head = Buffer.concat([BLOB_MAGIC, Buffer.from([id.length]), id]);
    const nonce = randomFillSync(Buffer.allocUnsafe(NONCE_BYTES));
    const c = createCipheriv("aes-256-gcm", this.keyring.activeKey(), nonce, { authTagLength: TAG_BYTES });
    c.setAAD(Buffer.concat([head, this.context]));
    return Buffer.concat([head, nonce, c.update(plain), c.final(), c.getAuthTag()]);
  }

  /** The file in clear; a damaged or foreign one is a StorageError, a missing key EncryptionKeyMissingError. */
  open(buf: Buffer, path: string): Buffer {
    const m = BLOB_MAGIC.length;
    if (buf.length < m + 1 || !buf.subarray(0, m).equals(BLOB_MAGIC)) throw new StorageError(`${this.where}: ${path} is not an encrypted file`);
    const idLen = buf[m];
    const envEnd = m + 1 + idLen + NONCE_BYTES;
    if (idLen < 1 || idLen > 32 || envEnd + TAG_BYTES > buf.length) throw new StorageError(`${this.where}: ${path} is truncated`);
    const id = buf.toString("latin1", m + 1, m + 1 + idLen);
    const key = this.keyring?.key(id);
    if (key === undefined) throw new EncryptionKeyMissingError(this.keyring === null ? "" : id, this.where);
    const d = createDecipheriv("aes-256-gcm", key, buf.subarray(envEnd - NONCE_BYTES, envEnd), { authTagLength: TAG_BYTES });
    d.setAAD(Buffer.concat([buf.subarray(0, m + 1 + idLen), this.context]));
    d.setAuthTag(buf.subarray(buf.length - TAG_BYTES));
    const a = d.update(buf.subarray(envEnd, buf.length - TAG_BYTES));
    try {
      return Buffer.concat([a, d.final()]);
    } catch {
      throw new StorageError(`${this.where}: ${path} failed authentication (altered, or not this queue's)`);
    }
  }
}
