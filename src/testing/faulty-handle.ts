// SPDX-License-Identifier: Apache-2.0
/**
 * FaultyFileSystem without the crash model: its file handle, which runs every call on a real
 * file and remembers what a power loss would take back (the size at the last fdatasync, and
 * the bytes each un-synced write overwrote below it, as FaultyFileSystem.synced / .undo), and
 * that power loss.
 */
import type { FileHandle, FileSystem } from "../log/io.js";
import type { FaultyFileSystem } from "./faulty-fs.js";
import { errno } from "./fs-util.js";

export class FaultyHandle implements FileHandle {
  constructor(private fs: FaultyFileSystem, private h: FileHandle) {}
  get path(): string {
    return this.h.path;
  }
  async write(buffers: readonly Uint8Array[], position: number, counted = false): Promise<void> {
    let len = 0;
    for (const b of buffers) len += b.length;
    if (!counted) this.fs.count("write", this.path, { bytes: len, position });
    // Remember what this write overwrites below the synced size, for powerLoss().
    const synced = this.fs.synced.get(this.path) ?? 0;
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
    this.fs.checkFrozen("write", this.path);
    return this.h.write(buffers, position);
  }
  /**
   * As write + datasync of those bytes: a "write" fault fails it (possibly torn), a "datasync"
   * fault fails it after the bytes reached the page cache (still lost on powerLoss()).
   */
  async writeDurable(buffers: readonly Uint8Array[], position: number): Promise<void> {
    let len = 0;
    for (const b of buffers) len += b.length;
    this.fs.count("writeDurable", this.path, { bytes: len, position });
    await this.write(buffers, position, true);
    const r = this.fs.take("datasync", this.path);
    if (r) throw errno(r.code, "write (O_DSYNC)", this.path);
    this.fs.checkFrozen("datasync", this.path);
    await this.h.datasync();
    // Durable now: the written range, and so the synced size if it was contiguous with it.
    const synced = this.fs.synced.get(this.path) ?? 0;
    if (position <= synced && position + len > synced) this.fs.synced.set(this.path, position + len);
    const undo = this.fs.undo.get(this.path);
    if (undo) this.fs.undo.set(this.path, undo.filter((u) => u.pos + u.old.length <= position || u.pos >= position + len));
  }
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<number> {
    this.fs.checkFrozen("read", this.path);
    return this.h.read(buf, offset, length, position);
  }
  readSync(buf: Uint8Array, offset: number, length: number, position: number): number {
    this.fs.checkFrozen("read", this.path);
    return this.h.readSync(buf, offset, length, position);
  }
  async datasync(): Promise<void> {
    this.fs.count("datasync", this.path);
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
    this.fs.count("truncate", this.path, { bytes: length });
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
    this.fs.checkFrozen("fstat", this.path);
    return this.h.size();
  }
  close(): Promise<void> {
    return this.h.close();
  }
}

/**
 * Power loss without the crash model: each file in `synced` is cut back to its last
 * fdatasync'ed size and its overwritten bytes are put back, keeping `keepTornBytes` of what
 * was lost from the lowest lost byte (a torn write).
 */
export async function restoreSynced(inner: FileSystem, synced: Map<string, number>, undoLog: Map<string, { pos: number; old: Buffer }[]>, keepTornBytes: number): Promise<void> {
  for (const [path, size] of synced) {
    const st = await inner.stat(path);
    if (!st || st.isDirectory) continue;
    const undo = undoLog.get(path) ?? [];
    undoLog.delete(path);
    if (st.size <= size && undo.length === 0) continue;
    // The torn prefix is kept from the lowest lost byte, whether overwritten or appended.
    let lost = st.size > size ? size : Infinity;
    for (const u of undo) lost = Math.min(lost, u.pos);
    const keepEnd = lost + keepTornBytes;
    const h = await inner.open(path, "rw");
    for (let i = undo.length - 1; i >= 0; i--) {
      const { pos, old } = undo[i];
      const from = Math.max(pos, Math.min(keepEnd, pos + old.length));
      if (from < pos + old.length) await h.write([old.subarray(from - pos)], from);
    }
    if (st.size > size) await h.truncate(Math.min(st.size, Math.max(size, keepEnd)));
    await h.close();
  }
}
