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
 * **Crash model** (`new FaultyFileSystem({ crashModel: { scratchDir } })`, crash-model.ts),
 * used by the crash-point enumeration (crash-points.ts): every call runs synchronously in the
 * order it is made and completes on a later turn of the event loop (setImmediate: first in
 * first out, or with a seeded number of extra turns, `jitter`), so a workload issues the same
 * calls in the same order on every run. Durability is simulated: the model remembers what is
 * not durable yet, and `powerLoss({ seed })` builds a state a real page cache could have left.
 * Without it, handles work on real files and remember what a power loss takes back
 * (faulty-handle.ts).
 */
import * as nfs from "node:fs";
import { NodeFileSystem, type DirLock, type FileHandle, type FileSystem, type OpenMode } from "../log/io.js";
import { CrashModel, type CrashModelOptions, type PowerLossOptions, type PowerLossReport } from "./crash-model.js";
import { FaultyHandle, restoreSynced } from "./faulty-handle.js";
import { errno, statOrNull } from "./fs-util.js";
import { prng } from "./helpers.js";
import { ModelHandle } from "./model-handle.js";

export { CrashModel, type CrashModelOptions, type PowerLossMode, type PowerLossOptions, type PowerLossReport } from "./crash-model.js";
export { replay } from "./file-replay.js";
export { prng };

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

export interface FaultyFileSystemOptions {
  crashModel?: CrashModelOptions;
}

interface Rule {
  op: FaultOp;
  code: string;
  pathIncludes?: string;
  /** For writes: bytes that reach the file before the error (a torn write). */
  tornBytes?: number;
  remaining: number;
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

  /** Counts a state-changing call on `path`, then throws the fault injected for it, if any. */
  private countAndFault(kind: IoOpKind & FaultOp, path: string, syscall: string = kind, extra: Partial<IoOp> = {}): void {
    this.count(kind, path, extra);
    const r = this.take(kind, path);
    if (r) throw errno(r.code, syscall, path);
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
    if (m)
      return this.later(() => {
        // Crash model: counted only when it creates a directory.
        const st = statOrNull(path);
        if (st !== null && st.isDirectory()) return this.checkFrozen("mkdir", path);
        this.countAndFault("mkdir", path);
        m.mkdir(path);
      });
    try {
      this.countAndFault("mkdir", path);
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
    if (m) return this.later(() => (this.countAndFault("rename", from, "rename", { to }), m.rename(from, to)));
    try {
      this.countAndFault("rename", from, "rename", { to });
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
    if (m)
      return this.later(() => {
        if (statOrNull(path) === null) {
          this.checkFrozen("unlink", path);
          throw errno("ENOENT", "unlink", path, `ENOENT: no such file or directory, unlink '${path}'`);
        }
        this.countAndFault("unlink", path);
        m.unlink(path);
      });
    try {
      this.countAndFault("unlink", path);
    } catch (e) {
      return Promise.reject(e);
    }
    this.synced.delete(path);
    this.undo.delete(path);
    return this.inner.unlink(path);
  }
  rm(path: string): Promise<void> {
    const m = this.model;
    if (m)
      return this.later(() => {
        if (statOrNull(path) === null) return this.checkFrozen("rm", path);
        this.countAndFault("rm", path);
        m.rm(path);
      });
    try {
      this.countAndFault("rm", path);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.inner.rm(path);
  }
  async fsyncDir(path: string): Promise<void> {
    const m = this.model;
    if (m) return this.later(() => (this.countAndFault("fsyncDir", path, "fsync"), m.fsyncDir(path)));
    this.countAndFault("fsyncDir", path, "fsync");
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
    await this.releaseLocks();
    await restoreSynced(this.inner, this.synced, this.undo, typeof opts === "number" ? opts : 0);
    return null;
  }

  /** Removes the crash model's scratch directory (crash model only). */
  dispose(): void {
    this.model?.dispose();
  }
}
