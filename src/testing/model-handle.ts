// SPDX-License-Identifier: Apache-2.0
/**
 * A file handle of FaultyFileSystem with the crash model: each call is counted and checked
 * against the injected faults by the file system, runs at once on the real descriptor with the
 * model recording what is not durable yet, and settles on a later turn of the event loop
 * (FaultyFileSystem.later), so calls complete in a reproducible order.
 */
import * as nfs from "node:fs";
import type { FileHandle } from "../log/io.js";
import type { CrashModel } from "./crash-model.js";
import type { FaultyFileSystem } from "./faulty-fs.js";
import { errno } from "./fs-util.js";
import type { Node } from "./inodes.js";

export class ModelHandle implements FileHandle {
  private readonly fd: number;
  private readonly node: Node;
  private closed = false;
  constructor(private fs: FaultyFileSystem, private m: CrashModel, readonly path: string, o: { fd: number; node: Node }) {
    this.fd = o.fd;
    this.node = o.node;
  }
  private later<T>(fn: () => T): Promise<T> {
    return this.fs.later(fn);
  }
  private checkOpen(what: string): void {
    this.fs.checkFrozen(what, this.path);
    if (this.closed) throw errno("EBADF", what, this.path, `EBADF: bad file descriptor, ${what} '${this.path}'`);
  }
  private doWrite(buffers: readonly Uint8Array[], position: number, durable: boolean): void {
    const data = Buffer.concat(buffers as Uint8Array[]);
    const r = this.fs.take("write", this.path);
    if (r) {
      if (r.tornBytes) this.m.write(this.node, this.fd, Buffer.from(data.subarray(0, Math.min(data.length, r.tornBytes))), position, false);
      throw errno(r.code, "write", this.path);
    }
    if (durable) {
      const s = this.fs.take("datasync", this.path);
      if (s) {
        // The bytes reached the page cache, but are not durable.
        this.m.write(this.node, this.fd, data, position, false);
        throw errno(s.code, "write (O_DSYNC)", this.path);
      }
    }
    this.m.write(this.node, this.fd, data, position, durable);
  }
  write(buffers: readonly Uint8Array[], position: number): Promise<void> {
    return this.later(() => {
      let len = 0;
      for (const b of buffers) len += b.length;
      this.checkOpen("write");
      this.fs.count("write", this.path, { bytes: len, position });
      this.doWrite(buffers, position, false);
    });
  }
  writeDurable(buffers: readonly Uint8Array[], position: number): Promise<void> {
    return this.later(() => {
      let len = 0;
      for (const b of buffers) len += b.length;
      this.checkOpen("write");
      this.fs.count("writeDurable", this.path, { bytes: len, position });
      this.doWrite(buffers, position, true);
    });
  }
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<number> {
    return this.later(() => {
      this.checkOpen("read");
      return nfs.readSync(this.fd, buf, offset, length, position);
    });
  }
  readSync(buf: Uint8Array, offset: number, length: number, position: number): number {
    this.checkOpen("read");
    let got = 0;
    while (got < length) {
      const n = nfs.readSync(this.fd, buf, offset + got, length - got, position + got);
      if (n === 0) break;
      got += n;
    }
    return got;
  }
  datasync(): Promise<void> {
    return this.later(() => {
      this.checkOpen("fdatasync");
      this.fs.count("datasync", this.path);
      const r = this.fs.take("datasync", this.path);
      if (r) throw errno(r.code, "fdatasync", this.path);
      this.m.datasync(this.node, this.fd);
    });
  }
  truncate(length: number): Promise<void> {
    return this.later(() => {
      this.checkOpen("ftruncate");
      this.fs.count("truncate", this.path, { bytes: length });
      const r = this.fs.take("truncate", this.path);
      if (r) throw errno(r.code, "ftruncate", this.path);
      this.m.truncate(this.node, this.fd, length);
    });
  }
  size(): Promise<number> {
    return this.later(() => {
      this.checkOpen("fstat");
      return nfs.fstatSync(this.fd).size;
    });
  }
  close(): Promise<void> {
    return this.later(() => {
      if (this.closed) return;
      this.closed = true;
      // After a crash the descriptor was already closed (closeAll): closing is a no-op then.
      this.m.closeFd(this.fd);
    });
  }
}
