// SPDX-License-Identifier: Apache-2.0
/**
 * A FileSystem for tests that injects the failures real disks produce: ENOSPC and EIO on
 * write or fsync, torn writes (only a prefix reaches the file), and power loss (every byte not
 * covered by an fdatasync is lost, optionally leaving a torn prefix of it). Lost bytes include
 * overwrites inside the synced length (e.g. appends into a preallocated, zero-filled region):
 * power loss puts back what was there at the last fdatasync.
 *
 * Every call that changes or syncs state (write, writeDurable, datasync, truncate, open
 * "create", rename, unlink, rm, mkdir, fsyncDir) is counted (`opCount`, `onOp`), and the file
 * system can be frozen at the k-th such call (`crashAtOp(k)`): that call and every later one
 * throws, so nothing more reaches the disk. (With the crash model a call that changes nothing
 * is not counted: open "create" of an existing file, mkdir of an existing directory, unlink or
 * rm of a missing path.)
 *
 * **Crash model** (`new FaultyFileSystem({ crashModel: { scratchDir } })`), used by the
 * crash-point enumeration (crash-points.ts): every call runs synchronously in the order it is
 * made and completes on a later turn of the event loop (setImmediate: first in first out, or
 * with a seeded number of extra turns, `jitter`), so a workload issues the same calls in the
 * same order on every run. Durability is simulated,
 * nothing is fdatasync'ed for real. The model remembers, per inode, its content at the last
 * fdatasync and every un-synced write and truncate since, and per directory the creates,
 * renames, unlinks and mkdirs not yet made durable by an fsync of that directory (an fsync
 * pins an operation and every earlier one in the directories it touches). `powerLoss({ seed })`
 * then builds a state a real page cache could have left: an arbitrary subset of the un-synced
 * written sectors (512 B) reaches the disk, possibly a torn prefix of the last write, the file
 * size is the one after some prefix of the size changes (a kept sector past it is cut, a lost
 * one inside it reads as zeros), and a seeded suffix of each directory's un-synced entry
 * operations is undone (a created file vanishes, an unlinked one comes back, a rename is
 * reverted). Removed files are kept in `scratchDir` (which must be on the same file system,
 * outside the data dir) until the power loss decides whether their removal survives.
 */
import * as nfs from "node:fs";
import { basename, dirname, join } from "node:path";
import { NodeFileSystem, type DirLock, type FileHandle, type FileSystem, type OpenMode } from "../log/io.js";
import { prng } from "./helpers.js";

export type FaultOp = "write" | "datasync" | "open" | "rename" | "fsyncDir" | "truncate" | "unlink" | "mkdir" | "rm";

/** A call that changes or syncs state, as counted by FaultyFileSystem. */
export type IoOpKind = "write" | "writeDurable" | "datasync" | "truncate" | "create" | "rename" | "unlink" | "rm" | "mkdir" | "fsyncDir";

export interface IoOp {
  /** 0-based index among the counted calls of this file system. */
  index: number;
  kind: IoOpKind;
  path: string;
  /** Rename target. */
  to?: string;
  /** Bytes written / new length (truncate). */
  bytes?: number;
  position?: number;
}

/** Where the file system froze: the counted call at the crash point, or an explicit crash() ("explicit"). */
export type CrashPoint = Omit<IoOp, "kind"> & { kind: IoOpKind | "explicit" };

export interface CrashModelOptions {
  /**
   * Where removed files and directories are kept until a power loss decides whether their
   * removal survives: same file system as the data, outside the data dir. Created if missing.
   */
  scratchDir: string;
  /**
   * mkdir makes the directories it creates durable in their parents, as FileSystem.mkdir
   * promises (FS-2: NodeFileSystem fsyncs each parent). Default true; false models a mkdir
   * whose new entries need an explicit fsyncDir of the parent, as before FS-2.
   */
  durableMkdir?: boolean;
  /** Also issue real fdatasync/fsync calls (slow; only for checking the model against a real disk). Default false. */
  realSync?: boolean;
  /**
   * Completion order: every call completes 1 turn of the event loop after it was made, plus a
   * seeded 0..maxTurns more, so concurrent chains of calls interleave in another (still
   * reproducible) order for every seed. Default: no extra turns (first in, first out).
   */
  jitter?: { seed: number; maxTurns: number };
}

export interface FaultyFileSystemOptions {
  crashModel?: CrashModelOptions;
}

/**
 * How un-synced state survives a power loss (crash model):
 *  - "drop": nothing un-synced survives (only fdatasync'ed bytes, fsync'ed directory entries);
 *  - "keep": everything survives (a process crash: the page cache is written back);
 *  - "prefix": the un-synced changes of each file reach the disk in order up to a point, the
 *    last one torn (at a sector or at any byte); directory operations likewise;
 *  - "random": an arbitrary subset of the un-synced sectors of each file, the size from an
 *    arbitrary prefix of its size changes; an arbitrary suffix of each directory's operations
 *    is undone;
 *  - "mixed": each file and directory picks one of the above.
 */
export type PowerLossMode = "drop" | "keep" | "prefix" | "random" | "mixed";

export interface PowerLossOptions {
  /** Seeds every choice; the same seed on the same history gives the same result. */
  seed?: number;
  /** Default "mixed". */
  mode?: PowerLossMode;
}

/** What a power loss did (crash model), for failure reports. */
export interface PowerLossReport {
  mode: PowerLossMode;
  files: { path: string; mode: PowerLossMode; pendingOps: number; keptSectors: number; sectors: number; durableSize: number; size: number; before: number }[];
  undone: { kind: string; path: string; to?: string }[];
  kept: { kind: string; path: string; to?: string }[];
}

interface Rule {
  op: FaultOp;
  code: string;
  pathIncludes?: string;
  /** For writes: bytes that reach the file before the error (a torn write). */
  tornBytes?: number;
  remaining: number;
}

function errno(code: string, op: string, path: string, message?: string): NodeJS.ErrnoException {
  return Object.assign(new Error(message ?? `${code}: injected fault, ${op} '${path}'`), { code, syscall: op, path });
}


export class FaultyFileSystem implements FileSystem {
  private inner = new NodeFileSystem();
  private rules: Rule[] = [];
  /** Bytes known durable per path (size at the last datasync). Not maintained by the crash model. */
  readonly synced = new Map<string, number>();
  /** Per path: content overwritten below the synced size since the last datasync, oldest first. Not maintained by the crash model. */
  readonly undo = new Map<string, { pos: number; old: Buffer }[]>();
  /** Counted calls so far (the index the next one gets). */
  opCount = 0;
  /** Called for every counted call, before it runs (also for the one that crashes). */
  onOp: ((op: IoOp) => void) | null = null;
  private crashAt = Infinity;
  private frozen: CrashPoint | null = null;
  private frozenReason = "";
  private crashWaiters: ((op: CrashPoint | null) => void)[] = [];
  /** Releases of directory locks after a crash (see crash()). */
  private releasing: Promise<unknown> = Promise.resolve();
  /** The crash model, if enabled. */
  readonly model: CrashModel | null;

  constructor(opts: FaultyFileSystemOptions = {}) {
    this.model = opts.crashModel ? new CrashModel(opts.crashModel) : null;
  }

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

  // ───────────────────────────── crash points ─────────────────────────────

  /** Freezes the file system when the counted call with index `k` is made (it and all later calls throw). */
  crashAtOp(k: number): void {
    this.crashAt = k;
    if (this.opCount > k && this.frozen === null) this.crash();
  }
  /**
   * Freezes the file system now, as if its process died: every later call throws, open
   * descriptors are closed (crash model) and directory locks taken through it are released
   * (resolves once they are, so a new broker can open the directory in this process).
   */
  crash(reason = "crashed"): Promise<unknown> {
    if (this.frozen !== null) return this.releasing;
    this.frozen = { index: this.opCount, kind: "explicit", path: "" };
    this.frozenReason = reason;
    this.afterFreeze();
    return this.releasing;
  }
  /** The call at which the file system froze (for crashAtOp, the k-th call), or null. */
  get crashedAt(): CrashPoint | null {
    return this.frozen;
  }
  get isCrashed(): boolean {
    return this.frozen !== null;
  }
  /** Resolves with the call at which the file system froze. */
  whenCrashed(): Promise<CrashPoint | null> {
    if (this.frozen !== null) return Promise.resolve(this.frozen);
    return new Promise((r) => this.crashWaiters.push(r));
  }
  private afterFreeze(): void {
    this.model?.closeAll();
    void this.releaseLocks();
    for (const w of this.crashWaiters.splice(0)) w(this.frozen);
  }
  /** @internal Throws if frozen. */
  checkFrozen(what: string, path: string): void {
    if (this.frozen !== null) throw errno("EIO", what, path, `EIO: ${this.frozenReason} at I/O operation ${this.frozen.index} (${this.frozen.kind} ${this.frozen.path}); ${what} '${path}' did not happen`);
  }
  /** @internal Counts a state-changing call; freezes (and throws) at the crash point. */
  count(kind: IoOpKind, path: string, extra: Partial<IoOp> = {}): void {
    this.checkFrozen(kind, path);
    const op: IoOp = { index: this.opCount++, kind, path, ...extra };
    this.onOp?.(op);
    if (op.index >= this.crashAt) {
      this.frozen = op;
      this.frozenReason = `power lost (crash point ${op.index})`;
      this.afterFreeze();
      this.checkFrozen(kind, path);
    }
  }

  /** @internal Runs `fn` now (crash model) and settles on a later turn of the event loop (see CrashModelOptions.jitter). */
  later<T>(fn: () => T): Promise<T> {
    let ok = true;
    let v: T | unknown;
    try {
      v = fn();
    } catch (e) {
      ok = false;
      v = e;
    }
    let turns = 1 + (this.model?.extraTurns() ?? 0);
    return new Promise<T>((resolve, reject) => {
      const tick = (): void => {
        if (--turns > 0) setImmediate(tick);
        else if (ok) resolve(v as T);
        else reject(v);
      };
      setImmediate(tick);
    });
  }

  // ───────────────────────────── FileSystem ─────────────────────────────

  /** Directory locks taken through this file system: released when it crashes (the process "dies"). */
  private readonly locks = new Set<DirLock>();

  async lock(dir: string): Promise<DirLock> {
    this.checkFrozen("lock", dir);
    const inner = await this.inner.lock(dir);
    const held: DirLock = {
      dir,
      release: async () => {
        this.locks.delete(held);
        await inner.release();
      },
    };
    this.locks.add(held);
    return held;
  }


  /** A crash or power loss ends the "process" that held the locks: the kernel drops them. */
  private releaseLocks(): Promise<unknown> {
    this.releasing = Promise.all([this.releasing, ...[...this.locks].map((l) => l.release())]);
    return this.releasing;
  }

  async open(path: string, mode: OpenMode): Promise<FileHandle> {
    const m = this.model;
    if (m) {
      return this.later(() => {
        // Counted only when it creates the file (opening an existing one changes nothing).
        if (mode === "create" && statOrNull(path) === null) this.count("create", path);
        else this.checkFrozen("open", path);
        const r = this.take("open", path);
        if (r) throw errno(r.code, "open", path);
        return new ModelHandle(this, m, path, m.open(path, mode));
      });
    }
    if (mode === "create") this.count("create", path);
    else this.checkFrozen("open", path);
    const r = this.take("open", path);
    if (r) throw errno(r.code, "open", path);
    const h = await this.inner.open(path, mode);
    if (!this.synced.has(path)) this.synced.set(path, await h.size());
    return new FaultyHandle(this, h);
  }
  readFile(path: string): Promise<Buffer> {
    if (this.model) return this.later(() => (this.checkFrozen("read", path), nfs.readFileSync(path)));
    this.checkFrozen("read", path);
    return this.inner.readFile(path);
  }
  mkdir(path: string): Promise<void> {
    const m = this.model;
    const run = (): void => {
      this.count("mkdir", path);
      const r = this.take("mkdir", path);
      if (r) throw errno(r.code, "mkdir", path);
    };
    if (m)
      return this.later(() => {
        // Crash model: counted only when it creates a directory.
        const st = statOrNull(path);
        if (st !== null && st.isDirectory()) return this.checkFrozen("mkdir", path);
        run();
        m.mkdir(path);
      });
    try {
      run();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.inner.mkdir(path);
  }
  readdir(path: string): Promise<string[]> {
    if (this.model) return this.later(() => (this.checkFrozen("readdir", path), nfs.readdirSync(path)));
    this.checkFrozen("readdir", path);
    return this.inner.readdir(path);
  }
  async rename(from: string, to: string): Promise<void> {
    const m = this.model;
    const run = (): void => {
      this.count("rename", from, { to });
      const r = this.take("rename", from);
      if (r) throw errno(r.code, "rename", from);
    };
    if (m) return this.later(() => (run(), m.rename(from, to)));
    try {
      run();
    } catch (e) {
      return Promise.reject(e);
    }
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
    const m = this.model;
    const run = (): void => {
      this.count("unlink", path);
      const r = this.take("unlink", path);
      if (r) throw errno(r.code, "unlink", path);
    };
    if (m)
      return this.later(() => {
        if (statOrNull(path) === null) {
          this.checkFrozen("unlink", path);
          throw errno("ENOENT", "unlink", path, `ENOENT: no such file or directory, unlink '${path}'`);
        }
        run();
        m.unlink(path);
      });
    try {
      run();
    } catch (e) {
      return Promise.reject(e);
    }
    this.synced.delete(path);
    this.undo.delete(path);
    return this.inner.unlink(path);
  }
  rm(path: string): Promise<void> {
    const m = this.model;
    const run = (): void => {
      this.count("rm", path);
      const r = this.take("rm", path);
      if (r) throw errno(r.code, "rm", path);
    };
    if (m)
      return this.later(() => {
        if (statOrNull(path) === null) return this.checkFrozen("rm", path);
        run();
        m.rm(path);
      });
    try {
      run();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.inner.rm(path);
  }
  async fsyncDir(path: string): Promise<void> {
    const m = this.model;
    const run = (): void => {
      this.count("fsyncDir", path);
      const r = this.take("fsyncDir", path);
      if (r) throw errno(r.code, "fsync", path);
    };
    if (m) return this.later(() => (run(), m.fsyncDir(path)));
    run();
    return this.inner.fsyncDir(path);
  }
  stat(path: string): Promise<{ size: number; isDirectory: boolean } | null> {
    if (this.model)
      return this.later(() => {
        this.checkFrozen("stat", path);
        const st = statOrNull(path);
        return st === null ? null : { size: st.size, isDirectory: st.isDirectory() };
      });
    this.checkFrozen("stat", path);
    return this.inner.stat(path);
  }

  /**
   * Simulates power loss. Call after the broker is abandoned (not closed), then reopen a
   * broker on the same dir (with a new FileSystem).
   *
   * Without the crash model (`keepTornBytes` a number): each file opened through this FS is cut
   * back to its last fdatasync'ed size, plus `keepTornBytes` of the lost bytes (a torn write).
   *
   * With the crash model: see PowerLossOptions / PowerLossMode; freezes the file system first.
   */
  async powerLoss(opts: number | PowerLossOptions = 0): Promise<PowerLossReport | null> {
    if (this.model) {
      if (this.frozen === null) this.crash("power lost");
      await this.releaseLocks();
      const o = typeof opts === "number" ? { mode: "drop" as const, seed: 0 } : opts;
      return this.model.powerLoss(o.mode ?? "mixed", o.seed ?? 0);
    }
    const keepTornBytes = typeof opts === "number" ? opts : 0;
    await this.releaseLocks();
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
    return null;
  }

  /** Removes the crash model's scratch directory (crash model only). */
  dispose(): void {
    this.model?.dispose();
  }
}

class FaultyHandle implements FileHandle {
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

// ───────────────────────────── crash model ─────────────────────────────

const SECTOR = 512;

type Pending = { kind: "write"; pos: number; data: Buffer; durable: boolean } | { kind: "truncate"; len: number };

interface Node {
  id: string;
  /** Current path (in the data dir or in the scratch dir). */
  path: string;
  isDir: boolean;
  /** File content at the last fdatasync. */
  durable: Buffer;
  /** Un-synced writes and truncates since, oldest first. */
  pending: Pending[];
}

interface DirOp {
  seq: number;
  kind: "create" | "mkdir" | "unlink" | "rm" | "rename";
  /** Inode ids of the directories whose entries this operation changed. */
  dirs: string[];
  /** Directory and name of the entry (rename: the source). */
  dir: string;
  name: string;
  node: string;
  /** unlink / rm: where the removed entry is kept. */
  grave?: string;
  /** rename: target directory and name, and the entry it replaced (kept in the scratch dir). */
  toDir?: string;
  toName?: string;
  replaced?: { node: string; grave: string };
  pinned: boolean;
  /** For reports. */
  desc: { kind: string; path: string; to?: string };
}

function statOrNull(path: string): nfs.Stats | null {
  try {
    return nfs.statSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT" || (e as NodeJS.ErrnoException).code === "ENOTDIR") return null;
    throw e;
  }
}

function idOf(st: nfs.Stats): string {
  return `${st.dev}:${st.ino}`;
}

/** @internal The bookkeeping of the crash model: inodes, their un-synced changes, un-synced directory entries. */
export class CrashModel {
  private nodes = new Map<string, Node>();
  private dirOps: DirOp[] = [];
  private seq = 0;
  private graveSeq = 0;
  private readonly scratch: string;
  private readonly durableMkdir: boolean;
  readonly realSync: boolean;
  /** Open descriptors, closed when the file system freezes. */
  private fds = new Set<number>();
  private readonly jitter: (() => number) | null;
  private readonly maxTurns: number;

  constructor(o: CrashModelOptions) {
    this.jitter = o.jitter && o.jitter.maxTurns > 0 ? prng(o.jitter.seed ^ 0x71e7) : null;
    this.maxTurns = o.jitter?.maxTurns ?? 0;
    this.scratch = o.scratchDir;
    this.durableMkdir = o.durableMkdir ?? true;
    this.realSync = o.realSync ?? false;
    nfs.mkdirSync(this.scratch, { recursive: true });
  }

  /** Extra event-loop turns before the next call completes (jitter). */
  extraTurns(): number {
    return this.jitter === null ? 0 : Math.floor(this.jitter() * (this.maxTurns + 1));
  }

  private node(path: string, st: nfs.Stats): Node {
    const id = idOf(st);
    let n = this.nodes.get(id);
    if (n === undefined) {
      n = { id, path, isDir: st.isDirectory(), durable: st.isDirectory() ? Buffer.alloc(0) : nfs.readFileSync(path), pending: [] };
      this.nodes.set(id, n);
    } else n.path = path;
    return n;
  }
  private nodeAt(path: string): Node | null {
    const st = statOrNull(path);
    return st === null ? null : this.node(path, st);
  }
  private dirNode(path: string): Node {
    const n = this.nodeAt(path);
    if (n === null) throw errno("ENOENT", "open", path, `ENOENT: no such file or directory, '${path}'`);
    return n;
  }
  /** Every node at or below `from` is now at or below `to`. */
  private movePaths(from: string, to: string): void {
    for (const n of this.nodes.values()) {
      if (n.path === from) n.path = to;
      else if (n.path.startsWith(from + "/")) n.path = to + n.path.slice(from.length);
    }
  }
  private toGrave(path: string): string {
    const g = join(this.scratch, `${++this.graveSeq}-${basename(path)}`);
    nfs.renameSync(path, g);
    this.movePaths(path, g);
    return g;
  }
  private pathOf(id: string): string | null {
    return this.nodes.get(id)?.path ?? null;
  }
  private addDirOp(op: Omit<DirOp, "seq" | "pinned">): DirOp {
    const d: DirOp = { ...op, seq: this.seq++, pinned: false };
    this.dirOps.push(d);
    return d;
  }
  private pin(op: DirOp): void {
    if (op.pinned) return;
    op.pinned = true;
    for (const d of op.dirs) for (const o of this.dirOps) if (!o.pinned && o.seq < op.seq && o.dirs.includes(d)) this.pin(o);
  }
  private prune(): void {
    this.dirOps = this.dirOps.filter((o) => !o.pinned);
  }

  open(path: string, mode: OpenMode): { fd: number; node: Node } {
    let created = false;
    if (mode === "create" && statOrNull(path) === null) created = true;
    const flags = mode === "r" ? "r" : mode === "rw" ? "r+" : nfs.constants.O_RDWR | nfs.constants.O_CREAT;
    const fd = nfs.openSync(path, flags, 0o644);
    this.fds.add(fd);
    const node = this.node(path, nfs.fstatSync(fd));
    if (created) {
      node.durable = Buffer.alloc(0);
      node.pending = [];
      const dir = this.dirNode(dirname(path));
      this.addDirOp({ kind: "create", dirs: [dir.id], dir: dir.id, name: basename(path), node: node.id, desc: { kind: "create", path } });
    }
    return { fd, node };
  }
  closeFd(fd: number): void {
    if (!this.fds.delete(fd)) return;
    nfs.closeSync(fd);
  }
  closeAll(): void {
    for (const fd of this.fds) {
      try {
        nfs.closeSync(fd);
      } catch {
        // already closed
      }
    }
    this.fds.clear();
  }

  write(node: Node, fd: number, data: Buffer, position: number, durable: boolean): void {
    let done = 0;
    while (done < data.length) done += nfs.writeSync(fd, data, done, data.length - done, position + done);
    node.pending.push({ kind: "write", pos: position, data, durable });
    if (durable && this.realSync) nfs.fdatasyncSync(fd);
  }
  truncate(node: Node, fd: number, len: number): void {
    nfs.ftruncateSync(fd, len);
    node.pending.push({ kind: "truncate", len });
  }
  datasync(node: Node, fd: number): void {
    if (this.realSync) nfs.fdatasyncSync(fd);
    const size = nfs.fstatSync(fd).size;
    const buf = Buffer.alloc(size);
    let got = 0;
    while (got < size) {
      const n = nfs.readSync(fd, buf, got, size - got, got);
      if (n === 0) break;
      got += n;
    }
    node.durable = buf.subarray(0, got);
    node.pending = [];
  }

  mkdir(path: string): void {
    const missing: string[] = [];
    for (let p = path; statOrNull(p) === null; p = dirname(p)) {
      missing.unshift(p);
      if (dirname(p) === p) break;
    }
    for (const p of missing) {
      nfs.mkdirSync(p);
      const parent = this.dirNode(dirname(p));
      const node = this.dirNode(p);
      const op = this.addDirOp({ kind: "mkdir", dirs: [parent.id], dir: parent.id, name: basename(p), node: node.id, desc: { kind: "mkdir", path: p } });
      if (this.durableMkdir) this.pin(op);
    }
    if (this.durableMkdir) this.prune();
    const st = statOrNull(path);
    if (st === null || !st.isDirectory()) throw errno("ENOTDIR", "mkdir", path, `ENOTDIR: not a directory, mkdir '${path}'`);
  }
  rename(from: string, to: string): void {
    const src = statOrNull(from);
    if (src === null) throw errno("ENOENT", "rename", from, `ENOENT: no such file or directory, rename '${from}' -> '${to}'`);
    const node = this.node(from, src);
    const fromDir = this.dirNode(dirname(from));
    const toDir = this.dirNode(dirname(to));
    const dst = statOrNull(to);
    let replaced: DirOp["replaced"];
    if (dst !== null) {
      if (idOf(dst) === node.id) return; // same file: nothing to do (POSIX)
      if (dst.isDirectory() !== src.isDirectory())
        throw errno(dst.isDirectory() ? "EISDIR" : "ENOTDIR", "rename", from, `rename '${from}' -> '${to}': type mismatch`);
      if (dst.isDirectory() && nfs.readdirSync(to).length > 0) throw errno("ENOTEMPTY", "rename", from, `ENOTEMPTY: directory not empty, rename '${from}' -> '${to}'`);
      const old = this.node(to, dst);
      replaced = { node: old.id, grave: this.toGrave(to) };
    }
    nfs.renameSync(from, to);
    this.movePaths(from, to);
    this.addDirOp({
      kind: "rename",
      dirs: fromDir.id === toDir.id ? [fromDir.id] : [fromDir.id, toDir.id],
      dir: fromDir.id,
      name: basename(from),
      toDir: toDir.id,
      toName: basename(to),
      node: node.id,
      replaced,
      desc: { kind: "rename", path: from, to },
    });
  }
  unlink(path: string): void {
    const st = statOrNull(path);
    if (st === null) throw errno("ENOENT", "unlink", path, `ENOENT: no such file or directory, unlink '${path}'`);
    if (st.isDirectory()) throw errno("EISDIR", "unlink", path, `EISDIR: illegal operation on a directory, unlink '${path}'`);
    const node = this.node(path, st);
    const dir = this.dirNode(dirname(path));
    const grave = this.toGrave(path);
    this.addDirOp({ kind: "unlink", dirs: [dir.id], dir: dir.id, name: basename(path), node: node.id, grave, desc: { kind: "unlink", path } });
  }
  rm(path: string): void {
    const st = statOrNull(path);
    if (st === null) return;
    const node = this.node(path, st);
    const dir = this.dirNode(dirname(path));
    const grave = this.toGrave(path);
    this.addDirOp({ kind: "rm", dirs: [dir.id], dir: dir.id, name: basename(path), node: node.id, grave, desc: { kind: "rm", path } });
  }
  fsyncDir(path: string): void {
    const dir = this.dirNode(path);
    if (this.realSync) {
      const fd = nfs.openSync(path, "r");
      try {
        nfs.fsyncSync(fd);
      } finally {
        nfs.closeSync(fd);
      }
    }
    for (const o of [...this.dirOps]) if (!o.pinned && o.dirs.includes(dir.id)) this.pin(o);
    this.prune();
  }

  /** Un-synced directory operations (oldest first), for tests and reports. */
  pendingDirOps(): { kind: string; path: string; to?: string }[] {
    return this.dirOps.filter((o) => !o.pinned).map((o) => o.desc);
  }
  /** Un-synced changes of the file at `path` (writes / truncates since its last fdatasync). */
  pendingOf(path: string): number {
    return this.nodeAt(path)?.pending.length ?? 0;
  }

  powerLoss(mode: PowerLossMode, seed: number): PowerLossReport {
    this.closeAll();
    const rnd = prng(seed ^ 0x5eed);
    const pick = (): Exclude<PowerLossMode, "mixed"> => (["drop", "keep", "prefix", "random"] as const)[Math.floor(rnd() * 4)];
    const report: PowerLossReport = { mode, files: [], undone: [], kept: [] };
    // 1. File contents (by inode, wherever the file is now, so an unlink that is undone brings back what the power loss left).
    // (In creation order, not by path: paths may hold random names, the order must not depend on them.)
    for (const n of this.nodes.values()) {
      if (n.isDir || n.pending.length === 0) continue;
      const st = statOrNull(n.path);
      if (st === null || st.isDirectory() || idOf(st) !== n.id) continue;
      const m = mode === "mixed" ? pick() : mode;
      const r = replay(n.durable, n.pending, m, rnd);
      nfs.writeFileSync(n.path, r.image);
      report.files.push({ path: n.path, mode: m, pendingOps: n.pending.length, keptSectors: r.kept, sectors: r.sectors, durableSize: n.durable.length, size: r.image.length, before: st.size });
      n.durable = r.image;
      n.pending = [];
    }
    // 2. Directory entries: per directory a seeded suffix of its un-synced operations is undone;
    // an operation on two directories (rename) is undone only if both undo it, and then each
    // keeps its prefix property (everything after an undone operation of a directory is undone).
    const ops = this.dirOps.filter((o) => !o.pinned);
    const dirs = new Map<string, DirOp[]>();
    for (const o of ops) for (const d of o.dirs) dirs.get(d)?.push(o) ?? dirs.set(d, [o]);
    const cut = new Map<string, number>(); // per directory: ops with seq >= cut may be undone
    for (const [d, list] of dirs) {
      const m = mode === "mixed" ? pick() : mode;
      let at: number;
      if (m === "drop") at = 0;
      else if (m === "keep") at = list.length;
      else at = Math.floor(rnd() * (list.length + 1));
      cut.set(d, at < list.length ? list[at].seq : Infinity);
    }
    for (let changed = true; changed; ) {
      changed = false;
      for (const o of ops) {
        const kept = o.dirs.some((d) => o.seq < cut.get(d)!);
        if (!kept) continue;
        for (const d of o.dirs)
          if (o.seq >= cut.get(d)!) {
            cut.set(d, o.seq + 1);
            changed = true;
          }
      }
    }
    const undone = ops.filter((o) => o.dirs.every((d) => o.seq >= cut.get(d)!));
    for (const o of ops) if (!undone.includes(o)) report.kept.push(o.desc);
    for (const o of undone.sort((a, b) => b.seq - a.seq)) {
      const dirPath = this.pathOf(o.dir);
      if (dirPath === null) continue;
      const here = join(dirPath, o.name);
      switch (o.kind) {
        case "create":
        case "mkdir": {
          const st = statOrNull(here);
          if (st !== null && idOf(st) === o.node) this.toGrave(here);
          break;
        }
        case "unlink":
        case "rm": {
          if (o.grave !== undefined && statOrNull(here) === null && statOrNull(o.grave) !== null) {
            nfs.renameSync(o.grave, here);
            this.movePaths(o.grave, here);
          }
          break;
        }
        case "rename": {
          const toDir = this.pathOf(o.toDir!);
          if (toDir === null) break;
          const there = join(toDir, o.toName!);
          const st = statOrNull(there);
          if (st !== null && idOf(st) === o.node && statOrNull(here) === null) {
            nfs.renameSync(there, here);
            this.movePaths(there, here);
            if (o.replaced && statOrNull(o.replaced.grave) !== null) {
              nfs.renameSync(o.replaced.grave, there);
              this.movePaths(o.replaced.grave, there);
            }
          }
          break;
        }
      }
      report.undone.push(o.desc);
    }
    this.dirOps = [];
    return report;
  }

  dispose(): void {
    this.closeAll();
    nfs.rmSync(this.scratch, { recursive: true, force: true });
  }
}

/**
 * Rebuilds a file after a power loss from its content at the last fdatasync and the un-synced
 * changes since (see PowerLossMode). Returns the image and how many un-synced sector pieces survived.
 */
export function replay(durable: Buffer, pending: readonly Pending[], mode: Exclude<PowerLossMode, "mixed">, rnd: () => number): { image: Buffer; kept: number; sectors: number } {
  // Sector pieces of the un-synced writes, in order.
  const pieces: { op: number; a: number; b: number }[] = [];
  let forced = 0; // size changes up to the last durable write are durable (journal order)
  for (let i = 0; i < pending.length; i++) {
    const p = pending[i];
    if (p.kind !== "write") continue;
    if (p.durable) {
      forced = i + 1;
      continue;
    }
    const end = p.pos + p.data.length;
    for (let a = p.pos; a < end; ) {
      const b = Math.min(end, (Math.floor(a / SECTOR) + 1) * SECTOR);
      pieces.push({ op: i, a, b });
      a = b;
    }
  }
  // keep[i] = bytes kept from the start of piece i.
  const keep = new Array<number>(pieces.length).fill(0);
  let meta = forced; // size changes of pending[0 .. meta) are durable
  if (mode === "keep") {
    for (let i = 0; i < pieces.length; i++) keep[i] = pieces[i].b - pieces[i].a;
    meta = pending.length;
  } else if (mode === "prefix") {
    // In order up to a point: pieces before `at` whole, the one at `at` torn (whole sectors or any byte).
    const at = Math.floor(rnd() * (pieces.length + 1));
    for (let i = 0; i < at; i++) keep[i] = pieces[i].b - pieces[i].a;
    if (at < pieces.length && rnd() < 0.5) keep[at] = Math.floor(rnd() * (pieces[at].b - pieces[at].a));
    const lastOp = at < pieces.length ? pieces[at].op + (keep[at] > 0 ? 1 : 0) : pending.length;
    meta = Math.max(forced, Math.min(pending.length, lastOp));
  } else if (mode === "random") {
    for (let i = 0; i < pieces.length; i++) if (rnd() < 0.5) keep[i] = pieces[i].b - pieces[i].a;
    meta = forced + Math.floor(rnd() * (pending.length - forced + 1));
  }
  let img = Buffer.alloc(Math.max(durable.length, 4096));
  durable.copy(img);
  let len = durable.length;
  const resize = (n: number): void => {
    if (n < len) img.fill(0, n, len);
    else if (n > img.length) {
      const b = Buffer.alloc(Math.max(n, img.length * 2));
      img.copy(b, 0, 0, len);
      img = b;
    }
    len = n;
  };
  let pi = 0;
  let kept = 0;
  for (let i = 0; i < pending.length; i++) {
    const p = pending[i];
    if (p.kind === "truncate") {
      if (i < meta) resize(p.len);
      continue;
    }
    const end = p.pos + p.data.length;
    if (p.durable || i < meta) if (end > len) resize(end);
    if (p.durable) {
      p.data.copy(img, p.pos);
      continue;
    }
    for (; pi < pieces.length && pieces[pi].op === i; pi++) {
      const { a } = pieces[pi];
      const n = Math.min(keep[pi], Math.max(0, len - a)); // past the (durable) size a page is invisible
      if (keep[pi] > 0) kept++;
      if (n > 0) p.data.copy(img, a, a - p.pos, a - p.pos + n);
    }
  }
  return { image: Buffer.from(img.subarray(0, len)), kept, sectors: pieces.length };
}

class ModelHandle implements FileHandle {
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

export { prng };
