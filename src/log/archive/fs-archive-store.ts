// SPDX-License-Identifier: Apache-2.0
/**
 * An ArchiveStore on a directory (a second disk, an NFS or object-store mount): key `a/b/c`
 * is the file `<root>/a/b/c`. All I/O goes through the FileSystem abstraction (src/log/io.ts)
 * so FaultyFileSystem can crash it at every operation.
 *
 * `put` is atomic and durable (ARC-1 relies on it): write a temp file `.<random>.tmp` in the
 * target directory, fdatasync, rename over the key, fsync the directory. A crash leaves the
 * old object or the new one, plus perhaps a temp file that `list` never shows and the next
 * `put` into that directory removes.
 */
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import type { FileSystem } from "../io.js";
import { checkKey, type ArchiveStore, type ByteRange } from "./archive-store.js";

const TMP_RE = /^\..*\.tmp$/;

export class FsArchiveStore implements ArchiveStore {
  readonly location: string;

  constructor(
    private readonly fs: FileSystem,
    private readonly root: string,
  ) {
    this.location = root;
  }

  private path(key: string, prefix = false): string {
    return join(this.root, ...checkKey(key, prefix));
  }

  async put(key: string, data: Uint8Array | AsyncIterable<Uint8Array>): Promise<void> {
    const path = this.path(key);
    const dir = dirname(path);
    await this.fs.mkdir(dir);
    await this.removeTemps(dir);
    const tmp = join(dir, `.${randomBytes(8).toString("hex")}.tmp`);
    const fh = await this.fs.open(tmp, "create");
    try {
      await fh.truncate(0);
      if (data instanceof Uint8Array) await fh.write([data], 0);
      else {
        let pos = 0;
        for await (const chunk of data) {
          await fh.write([chunk], pos);
          pos += chunk.length;
        }
      }
      await fh.datasync();
    } finally {
      await fh.close();
    }
    await this.fs.rename(tmp, path);
    await this.fs.fsyncDir(dir);
  }

  /** Temp files of puts a crash interrupted (only one put writes into a directory at a time). */
  private async removeTemps(dir: string): Promise<void> {
    for (const n of await this.fs.readdir(dir)) if (TMP_RE.test(n)) await this.fs.unlink(join(dir, n)).catch(() => {});
  }

  async get(key: string, range?: ByteRange): Promise<Buffer | null> {
    const path = this.path(key);
    const st = await this.fs.stat(path);
    if (st === null || st.isDirectory) return null;
    const start = Math.min(range?.start ?? 0, st.size);
    const end = Math.min(range?.end ?? st.size, st.size);
    const buf = Buffer.allocUnsafe(Math.max(0, end - start));
    const fh = await this.fs.open(path, "r");
    try {
      let got = 0;
      while (got < buf.length) {
        const n = await fh.read(buf, got, buf.length - got, start + got);
        if (n === 0) break;
        got += n;
      }
      return got === buf.length ? buf : buf.subarray(0, got);
    } finally {
      await fh.close();
    }
  }

  async size(key: string): Promise<number | null> {
    const st = await this.fs.stat(this.path(key));
    return st === null || st.isDirectory ? null : st.size;
  }

  async list(prefix: string): Promise<string[]> {
    const parts = prefix === "" ? [] : checkKey(prefix, true);
    const out: string[] = [];
    const walk = async (dir: string, keyPrefix: string): Promise<void> => {
      const st = await this.fs.stat(dir);
      if (st === null || !st.isDirectory) return;
      for (const n of (await this.fs.readdir(dir)).sort()) {
        if (n.startsWith(".")) continue;
        const p = join(dir, n);
        if ((await this.fs.stat(p))?.isDirectory) await walk(p, `${keyPrefix}${n}/`);
        else out.push(`${keyPrefix}${n}`);
      }
    };
    await walk(join(this.root, ...parts), parts.length === 0 ? "" : `${parts.join("/")}/`);
    return out.sort();
  }

  async delete(key: string): Promise<void> {
    const path = this.path(key);
    await this.fs.unlink(path).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw e;
    });
    await this.fs.fsyncDir(dirname(path)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw e;
    });
  }
}
