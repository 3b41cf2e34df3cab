// SPDX-License-Identifier: Apache-2.0
/**
 * All file I/O of the storage engine goes through `FileSystem`, so tests can inject torn writes,
 * EIO, ENOSPC and the loss of un-synced data (see src/testing/faulty-fs.ts). Nothing in
 * src/log, src/store or src/queues may import node:fs directly for data or metadata files.
 */
import * as nfs from "node:fs";
import { createHash } from "node:crypto";
import { StorageError } from "../errors.js";
import { lockDirectory } from "./dir-lock.js";
import { basename, dirname, join, resolve } from "node:path";

export interface FileHandle {
  readonly path: string;
  /** Writes every byte of `buffers` at `position` (loops over short writes) or throws. */
  write(buffers: readonly Uint8Array[], position: number): Promise<void>;
  /** Reads up to `length` bytes at `position` into buf[offset..]; returns bytes read (0 at EOF). */
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<number>;
  /**
   * Synchronous pread, for small reads of bytes just written (in the page cache: a memory
   * copy). Blocks the event loop: never use it for reads that may go to the disk.
   */
  readSync(buf: Uint8Array, offset: number, length: number, position: number): number;
  /**
   * Writes `buffers` at `position` and resolves once those bytes (and the size needed to read
   * them back) are durable: write + fdatasync as one I/O operation (an O_DSYNC descriptor), so
   * one thread-pool hand-off instead of two. Covers only the bytes of this call.
   */
  writeDurable(buffers: readonly Uint8Array[], position: number): Promise<void>;
  /** fdatasync: data and the metadata needed to read it back (the size) are durable. */
  datasync(): Promise<void>;
  truncate(length: number): Promise<void>;
  size(): Promise<number>;
  close(): Promise<void>;
}

export type OpenMode = "r" | "rw" | "create";

/** An exclusive lock of a directory held by this process (see dir-lock.ts, FS-3). */
export interface DirLock {
  readonly dir: string;
  /** Releases the lock (idempotent). */
  release(): Promise<void>;
}

export interface FileSystem {
  /**
   * Takes the exclusive lock of directory `dir` (which must exist) for this process, or throws
   * DataDirLockedError naming the holder; changes nothing else (FS-3).
   */
  lock(dir: string): Promise<DirLock>;
  /** "r": read-only; "rw": read-write, must exist; "create": read-write, created if missing (never truncated). */
  open(path: string, mode: OpenMode): Promise<FileHandle>;
  readFile(path: string): Promise<Buffer>;
  /**
   * Creates `path` and any missing parents, and makes each created directory durable in its
   * parent (fsync of the parent) before returning (FS-2), so nothing written inside it can be
   * acknowledged while its directory entry could still vanish in a crash. Existing: no-op.
   */
  mkdir(path: string): Promise<void>;
  readdir(path: string): Promise<string[]>;
  rename(from: string, to: string): Promise<void>;
  unlink(path: string): Promise<void>;
  /** Recursive remove; missing paths are fine. */
  rm(path: string): Promise<void>;
  /** fsync of a directory, making creates/renames/unlinks in it durable. */
  fsyncDir(path: string): Promise<void>;
  /** Size in bytes, or null if missing. */
  stat(path: string): Promise<{ size: number; isDirectory: boolean } | null>;
}

function p<T>(fn: (cb: (err: NodeJS.ErrnoException | null, v: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => fn((err, v) => (err ? reject(err) : resolve(v))));
}

/** pwritev until every byte is written (writev may write fewer bytes than asked: signals, quotas). */
async function writeAll(fd: number, buffers: readonly Uint8Array[], position: number): Promise<void> {
  const bufs = buffers.filter((b) => b.length > 0) as Uint8Array[];
  let pos = position;
  while (bufs.length > 0) {
    const n = await p<number>((cb) => nfs.writev(fd, bufs as NodeJS.ArrayBufferView[], pos, cb));
    pos += n;
    let rest = n;
    while (bufs.length > 0 && rest >= bufs[0].length) {
      rest -= bufs[0].length;
      bufs.shift();
    }
    if (rest > 0) bufs[0] = bufs[0].subarray(rest);
    if (n === 0 && bufs.length > 0) throw Object.assign(new Error("write returned 0 bytes"), { code: "EIO" });
  }
}

class NodeFileHandle implements FileHandle {
  /** A second descriptor of the file opened O_DSYNC, for writeDurable (opened on first use). */
  private dsyncFd: number | null = null;
  constructor(readonly path: string, private fd: number) {}
  write(buffers: readonly Uint8Array[], position: number): Promise<void> {
    return writeAll(this.fd, buffers, position);
  }
  async writeDurable(buffers: readonly Uint8Array[], position: number): Promise<void> {
    if (this.dsyncFd === null) {
      const fd = await p<number>((cb) => nfs.open(this.path, nfs.constants.O_RDWR | nfs.constants.O_DSYNC, cb));
      if (this.dsyncFd === null) this.dsyncFd = fd;
      else await p<void>((cb) => nfs.close(fd, (e) => cb(e, undefined)));
    }
    return writeAll(this.dsyncFd, buffers, position);
  }
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<number> {
    return p<number>((cb) => nfs.read(this.fd, buf, offset, length, position, cb));
  }
  readSync(buf: Uint8Array, offset: number, length: number, position: number): number {
    let got = 0;
    while (got < length) {
      const n = nfs.readSync(this.fd, buf, offset + got, length - got, position + got);
      if (n === 0) break;
      got += n;
    }
    return got;
  }
  datasync(): Promise<void> {
    return p<void>((cb) => nfs.fdatasync(this.fd, (e) => cb(e, undefined)));
  }
  truncate(length: number): Promise<void> {
    return p<void>((cb) => nfs.ftruncate(this.fd, length, (e) => cb(e, undefined)));
  }
  async size(): Promise<number> {
    return (await p<nfs.Stats>((cb) => nfs.fstat(this.fd, cb))).size;
  }
  async close(): Promise<void> {
    if (this.dsyncFd !== null) {
      const fd = this.dsyncFd;
      this.dsyncFd = null;
      await p<void>((cb) => nfs.close(fd, (e) => cb(e, undefined))).catch(() => {});
    }
    return p<void>((cb) => nfs.close(this.fd, (e) => cb(e, undefined)));
  }
}

export class NodeFileSystem implements FileSystem {
  lock(dir: string): Promise<DirLock> {
    return lockDirectory(dir);
  }
  async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const flags = mode === "r" ? "r" : mode === "rw" ? "r+" : nfs.constants.O_RDWR | nfs.constants.O_CREAT;
    const fd = await p<number>((cb) => nfs.open(path, flags, 0o644, cb));
    return new NodeFileHandle(path, fd);
  }
  readFile(path: string): Promise<Buffer> {
    return nfs.promises.readFile(path);
  }
  async mkdir(path: string): Promise<void> {
    // Invariant FS-2: every created directory is fsynced into its parent.
    const created: string[] = [];
    let p = resolve(path);
    while ((await this.stat(p)) === null) {
      created.push(p);
      const up = dirname(p);
      if (up === p) break;
      p = up;
    }
    if (created.length === 0) return;
    await nfs.promises.mkdir(path, { recursive: true });
    for (const d of created) await this.fsyncDir(dirname(d));
  }
  readdir(path: string): Promise<string[]> {
    return nfs.promises.readdir(path);
  }
  rename(from: string, to: string): Promise<void> {
    return nfs.promises.rename(from, to);
  }
  unlink(path: string): Promise<void> {
    return nfs.promises.unlink(path);
  }
  rm(path: string): Promise<void> {
    return nfs.promises.rm(path, { recursive: true, force: true });
  }
  async fsyncDir(path: string): Promise<void> {
    const fd = await p<number>((cb) => nfs.open(path, "r", cb));
    try {
      await p<void>((cb) => nfs.fsync(fd, (e) => cb(e, undefined)));
    } finally {
      await p<void>((cb) => nfs.close(fd, (e) => cb(e, undefined)));
    }
  }
  async stat(path: string): Promise<{ size: number; isDirectory: boolean } | null> {
    try {
      const s = await nfs.promises.stat(path);
      return { size: s.size, isDirectory: s.isDirectory() };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw e;
    }
  }
}

/**
 * Replaces `path` atomically and durably: write `path.tmp`, fdatasync, rename over `path`,
 * fsync the directory. After a crash a reader sees either the old or the new content, never
 * a mix (invariant META-1 in docs/ARCHITECTURE.md).
 */
export async function writeFileAtomic(fs: FileSystem, path: string, data: Uint8Array | string): Promise<void> {
  // A short temp name in the same directory: `${path}.tmp` could pass the 255-byte name limit
  // for long (valid) topic or group names. Recovery removes stray *.tmp files.
  const tmp = join(dirname(path), `.${createHash("sha1").update(basename(path)).digest("hex").slice(0, 16)}.tmp`);
  const buf = typeof data === "string" ? Buffer.from(data, "utf8") : data;
  const fh = await fs.open(tmp, "create");
  try {
    await fh.truncate(0);
    await fh.write([buf], 0);
    await fh.datasync();
  } finally {
    await fh.close();
  }
  await fs.rename(tmp, path);
  await fs.fsyncDir(dirname(path));
}

/** Removes `path` if it is there: a file already gone is what the caller wanted. */
export async function unlinkIfExists(fs: FileSystem, path: string): Promise<void> {
  await fs.unlink(path).catch((e: NodeJS.ErrnoException) => {
    if (e.code !== "ENOENT") throw e;
  });
}

/** Reads a JSON metadata file written by writeFileAtomic; null if missing. */
export async function readJsonFile<T>(fs: FileSystem, path: string): Promise<T | null> {
  if ((await fs.stat(path)) === null) return null;
  const text = (await fs.readFile(path)).toString("utf8");
  try {
    return JSON.parse(text) as T;
  } catch (e) {
    // Written only by writeFileAtomic (META-1), so damage here is media corruption or tampering.
    throw new StorageError(`metadata file ${path} is damaged (${(e as Error).message}); restore it or remove it to start that object fresh`, e);
  }
}

export { join };
