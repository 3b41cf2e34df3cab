// SPDX-License-Identifier: Apache-2.0
/**
 * Where sealed segments go before retention deletes them locally (tiered storage). The
 * interface is deliberately that of an object store (S3, GCS, Azure Blob): flat keys, whole
 * objects written at once, ranged reads, listing by prefix. Nothing relies on directories,
 * appends, renames across keys or listing order beyond what is sorted here.
 *
 * What the archive code relies on (ARC-1, docs/ARCHITECTURE.md):
 *  - `put` is atomic and durable when it resolves: a reader (after any crash) sees the whole
 *    new object or none of it (or the old one), never a prefix. S3 PUT gives this; the
 *    filesystem implementation gets it from temp file + fsync + rename + directory fsync.
 *  - `get` after a resolved `put` returns those bytes (read-after-write consistency).
 *  - `delete` of a missing key is not an error.
 */
import { ValidationError } from "../../errors.js";

/** A byte range [start, end) of an object. */
export interface ByteRange {
  start: number;
  end: number;
}

export interface ArchiveStore {
  /** Human-readable location, for logs and errors (e.g. a directory or bucket URL). */
  readonly location: string;
  /** Stores `data` under `key`, replacing any object there; atomic and durable once resolved. */
  put(key: string, data: Uint8Array | AsyncIterable<Uint8Array>): Promise<void>;
  /** The object's bytes (or the range of them, clipped to its size); null if there is no such object. */
  get(key: string, range?: ByteRange): Promise<Buffer | null>;
  /** Size in bytes, or null if there is no such object. */
  size(key: string): Promise<number | null>;
  /** Keys starting with `prefix` (a `/`-separated path prefix ending in `/`), sorted. */
  list(prefix: string): Promise<string[]>;
  /** Removes the object; a missing key is fine. */
  delete(key: string): Promise<void>;
}

const PART_RE = /^[A-Za-z0-9_-][A-Za-z0-9._-]*$/;

/**
 * Keys are `/`-separated parts of [A-Za-z0-9._-], none empty, none starting with a dot (no
 * `..`, and dot names are left to implementations for temporaries). Topic names (names.ts)
 * may start with a dot, so callers encode those parts with `keyPart`.
 */
export function checkKey(key: string, prefix = false): string[] {
  const parts = key.split("/");
  if (prefix && parts[parts.length - 1] === "") parts.pop();
  if (!prefix && parts.length === 0) throw new ValidationError(`invalid archive key ${JSON.stringify(key)}`);
  for (const p of parts) if (!PART_RE.test(p) || p.length > 250) throw new ValidationError(`invalid archive key ${JSON.stringify(key)}`);
  return parts;
}

/** A topic name (or any name of names.ts) as one key part: a leading dot becomes `_.`. */
export function keyPart(name: string): string {
  return name.startsWith(".") || name.startsWith("_") ? `_${name}` : name;
}
