// SPDX-License-Identifier: Apache-2.0
/**
 * A FileSystem for tests that injects the failures real disks produce: ENOSPC and EIO on
 * write or fsync, torn writes (only a prefix reaches the file), and power loss (every byte not
 * covered by an fdatasync is lost, optionally leaving a torn prefix of it). Lost bytes include
 * overwrites inside the synced length (e.g. appends into a preallocated, zero-filled region):
 * power loss puts back what was there at the last fdatasync.
 */
import { NodeFileSystem, type FileHandle, type FileSystem, type OpenMode } from "../log/io.js";

export type FaultOp = "write" | "datasync" | "open" | "rename" | "fsyncDir" | "truncate";

interface Rule {
  op: FaultOp;
  code: string;
  pathIncludes?: string;
  /** For writes: bytes that reach the file before the error (a torn write). */
  tornBytes?: number;
  remaining: number;
}

function errno(code: string, op: string, path: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: injected fault, ${op} '${path}'`), { code, syscall: op, path });
}

export class FaultyFileSystem implements FileSystem {
  private inner = new NodeFileSystem();
  private rules: Rule[] = [];
  /** Bytes known durable per path (size at the last datasync). */
  readonly synced = new Map<string, number>();
  /** Per path: content overwritten below the synced size since the last datasync, oldest first. */
  readonly undo = new Map<string, { pos: number; old: Buffer }[]>();
  /** Fail the next `times` operations `op` (optionally on paths containing `pathIncludes`). */
  failNext(op: FaultOp, code: string, opts: { pathIncludes?: string; times?: number; tornBytes?: number } = {}): void {
    this.rules.push({ op, code, pathIncludes: opts.pathIncludes, tornBytes: opts.tornBytes, remaining: opts.times ?? 1 });
  }
  /** Fail every `op` until cleared (e.g. a full disk). */
  failAlways(op: FaultOp, code: string, pathIncludes?: string): void {
    this.rules.push({ op, code, pathIncludes, remaining: Infinity });
  }
  clearFaults(): void {
    this.rules = [];
  }
  take(op: FaultOp, path: string): Rule | null {
    const i = this.rules.findIndex((r) => r.op === op && (!r.pathIncludes || path.includes(r.pathIncludes)) && r.remaining > 0);
    if (i < 0) return null;
    const r = this.rules[i];
    r.remaining--;
    if (r.remaining <= 0) this.rules.splice(i, 1);
    return r;
  }

  async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const r = this.take("open", path);
    if (r) throw errno(r.code, "open", path);
    const h = await this.inner.open(path, mode);
    if (!this.synced.has(path)) this.synced.set(path, await h.size());
    return new FaultyHandle(this, h);
  }
  readFile(path: string): Promise<Buffer> {
    return this.inner.readFile(path);
  }
  mkdir(path: string): Promise<void> {
    return this.inner.mkdir(path);
  }
  readdir(path: string): Promise<string[]> {
    return this.inner.readdir(path);
  }
  async rename(from: string, to: string): Promise<void> {
    const r = this.take("rename", from);
    if (r) throw errno(r.code, "rename", from);
    await this.inner.rename(from, to);
    if (this.synced.has(from)) {
      this.synced.set(to, this.synced.get(from)!);
      this.synced.delete(from);
    }
    if (this.undo.has(from)) {
      this.undo.set(to, this.undo.get(from)!);
      this.undo.delete(from);
    }
  }
  unlink(path: string): Promise<void> {
    this.synced.delete(path);
    this.undo.delete(path);
    return this.inner.unlink(path);
  }
  rm(path: string): Promise<void> {
    return this.inner.rm(path);
  }
  async fsyncDir(path: string): Promise<void> {
    const r = this.take("fsyncDir", path);
    if (r) throw errno(r.code, "fsync", path);
    return this.inner.fsyncDir(path);
  }
  stat(path: string) {
    return this.inner.stat(path);
  }

  /**
   * Simulates power loss for files opened through this FS: each is cut back to its last
   * fdatasync'ed size, plus `keepTornBytes` of the lost bytes (a torn write). Call after the
   * broker is abandoned (not closed), then reopen a broker on the same dir.
   */
  async powerLoss(keepTornBytes = 0): Promise<void> {
    for (const [path, size] of this.synced) {
      const st = await this.inner.stat(path);
      if (!st || st.isDirectory) continue;
      const undo = this.undo.get(path) ?? [];
      this.undo.delete(path);
      if (st.size <= size && undo.length === 0) continue;
      // The torn prefix is kept from the lowest lost byte, whether overwritten or appended.
      let lost = st.size > size ? size : Infinity;
      for (const u of undo) lost = Math.min(lost, u.pos);
      const keepEnd = lost + keepTornBytes;
      const h = await this.inner.open(path, "rw");
      for (let i = undo.length - 1; i >= 0; i--) {
        const { pos, old } = undo[i];
        const from = Math.max(pos, Math.min(keepEnd, pos + old.length));
        if (from < pos + old.length) await h.write([old.subarray(from - pos)], from);
      }
      if (st.size > size) await h.truncate(Math.min(st.size, Math.max(size, keepEnd)));
      await h.close();
    }
  }
}

class FaultyHandle implements FileHandle {
  constructor(private fs: FaultyFileSystem, private h: FileHandle) {}
  get path(): string {
    return this.h.path;
  }
  async write(buffers: readonly Uint8Array[], position: number): Promise<void> {
    // Remember what this write overwrites below the synced size, for powerLoss().
    const synced = this.fs.synced.get(this.path) ?? 0;
    let len = 0;
    for (const b of buffers) len += b.length;
    const overEnd = Math.min(position + len, synced);
    if (overEnd > position) {
      const old = Buffer.alloc(overEnd - position);
      let got = 0;
      while (got < old.length) {
        const n = await this.h.read(old, got, old.length - got, position + got);
        if (n === 0) break;
        got += n;
      }
      const list = this.fs.undo.get(this.path) ?? [];
      list.push({ pos: position, old: old.subarray(0, got) });
      this.fs.undo.set(this.path, list);
    }
    const r = this.fs.take("write", this.path);
    if (r) {
      if (r.tornBytes) {
        const all = Buffer.concat(buffers as Uint8Array[]);
        await this.h.write([all.subarray(0, Math.min(all.length, r.tornBytes))], position);
      }
      throw errno(r.code, "write", this.path);
    }
    return this.h.write(buffers, position);
  }
  /**
   * As write + datasync of those bytes: a "write" fault fails it (possibly torn), a "datasync"
   * fault fails it after the bytes reached the page cache (still lost on powerLoss()).
   */
  async writeDurable(buffers: readonly Uint8Array[], position: number): Promise<void> {
    await this.write(buffers, position);
    const r = this.fs.take("datasync", this.path);
    if (r) throw errno(r.code, "write (O_DSYNC)", this.path);
    let len = 0;
    for (const b of buffers) len += b.length;
    await this.h.datasync();
    // Durable now: the written range, and so the synced size if it was contiguous with it.
    const synced = this.fs.synced.get(this.path) ?? 0;
    if (position <= synced && position + len > synced) this.fs.synced.set(this.path, position + len);
    const undo = this.fs.undo.get(this.path);
    if (undo) this.fs.undo.set(this.path, undo.filter((u) => u.pos + u.old.length <= position || u.pos >= position + len));
  }
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<number> {
    return this.h.read(buf, offset, length, position);
  }
  readSync(buf: Uint8Array, offset: number, length: number, position: number): number {
    return this.h.readSync(buf, offset, length, position);
  }
  async datasync(): Promise<void> {
    const r = this.fs.take("datasync", this.path);
    if (r) throw errno(r.code, "fdatasync", this.path);
    // Overwrites made before this call are durable now (writes racing with it stay undoable:
    // they are pushed after the snapshot taken here).
    const undo = this.fs.undo.get(this.path);
    const n = undo?.length ?? 0;
    await this.h.datasync();
    this.fs.synced.set(this.path, await this.h.size());
    if (undo && n > 0) undo.splice(0, n);
  }
  async truncate(length: number): Promise<void> {
    const r = this.fs.take("truncate", this.path);
    if (r) throw errno(r.code, "ftruncate", this.path);
    await this.h.truncate(length);
    const s = this.fs.synced.get(this.path);
    if (s !== undefined && s > length) this.fs.synced.set(this.path, length);
    // Bytes past the new end are gone: nothing to put back there.
    const undo = this.fs.undo.get(this.path);
    if (undo) for (const u of undo) if (u.pos + u.old.length > length) u.old = u.old.subarray(0, Math.max(0, length - u.pos));
  }
  size(): Promise<number> {
    return this.h.size();
  }
  close(): Promise<void> {
    return this.h.close();
  }
}
