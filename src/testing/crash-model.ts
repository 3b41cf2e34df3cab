// SPDX-License-Identifier: Apache-2.0
/**
 * The crash model of FaultyFileSystem (`new FaultyFileSystem({ crashModel: { scratchDir } })`),
 * used by the crash-point enumeration (crash-points.ts). Durability is simulated, nothing is
 * fdatasync'ed for real. The model remembers, per inode, its content at the last fdatasync and
 * every un-synced write and truncate since (inodes.ts), and per directory the creates,
 * renames, unlinks and mkdirs not yet made durable by an fsync of that directory (dir-ops.ts;
 * an fsync pins an operation and every earlier one in the directories it touches).
 * `powerLoss({ seed })` then builds a state a real page cache could have left: an arbitrary
 * subset of the un-synced written sectors (512 B) reaches the disk, possibly a torn prefix of
 * the last write, the file size is the one after some prefix of the size changes (a kept
 * sector past it is cut, a lost one inside it reads as zeros; file-replay.ts), and a seeded
 * suffix of each directory's un-synced entry operations is undone (a created file vanishes,
 * an unlinked one comes back, a rename is reverted). Removed files are kept in `scratchDir`
 * (which must be on the same file system, outside the data dir) until the power loss decides
 * whether their removal survives.
 */
import * as nfs from "node:fs";
import { basename, dirname } from "node:path";
import type { OpenMode } from "../log/io.js";
import { DirOpLog, type DirOp } from "./dir-ops.js";
import { replay } from "./file-replay.js";
import { errno, idOf, statOrNull } from "./fs-util.js";
import { prng } from "./helpers.js";
import { Inodes, type Node } from "./inodes.js";

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

/** @internal The bookkeeping of the crash model: inodes, their un-synced changes, un-synced directory entries. */
export class CrashModel {
  private readonly inodes: Inodes;
  private readonly dirOps = new DirOpLog();
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
    this.inodes = new Inodes(this.scratch);
    this.durableMkdir = o.durableMkdir ?? true;
    this.realSync = o.realSync ?? false;
    nfs.mkdirSync(this.scratch, { recursive: true });
  }

  /** Extra event-loop turns before the next call completes (jitter). */
  extraTurns(): number {
    return this.jitter === null ? 0 : Math.floor(this.jitter() * (this.maxTurns + 1));
  }

  // ─────────── descriptors and file content ───────────

  open(path: string, mode: OpenMode): { fd: number; node: Node } {
    let created = false;
    if (mode === "create" && statOrNull(path) === null) created = true;
    const flags = mode === "r" ? "r" : mode === "rw" ? "r+" : nfs.constants.O_RDWR | nfs.constants.O_CREAT;
    const fd = nfs.openSync(path, flags, 0o644);
    this.fds.add(fd);
    const node = this.inodes.node(path, nfs.fstatSync(fd));
    if (created) {
      node.durable = Buffer.alloc(0);
      node.pending = [];
      const dir = this.inodes.dirNode(dirname(path));
      this.dirOps.add({ kind: "create", dirs: [dir.id], dir: dir.id, name: basename(path), node: node.id, desc: { kind: "create", path } });
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

  // ─────────── directory entries ───────────

  mkdir(path: string): void {
    const missing: string[] = [];
    for (let p = path; statOrNull(p) === null; p = dirname(p)) {
      missing.unshift(p);
      if (dirname(p) === p) break;
    }
    for (const p of missing) {
      nfs.mkdirSync(p);
      const parent = this.inodes.dirNode(dirname(p));
      const node = this.inodes.dirNode(p);
      const op = this.dirOps.add({ kind: "mkdir", dirs: [parent.id], dir: parent.id, name: basename(p), node: node.id, desc: { kind: "mkdir", path: p } });
      if (this.durableMkdir) this.dirOps.pin(op);
    }
    if (this.durableMkdir) this.dirOps.prune();
    const st = statOrNull(path);
    if (st === null || !st.isDirectory()) throw errno("ENOTDIR", "mkdir", path, `ENOTDIR: not a directory, mkdir '${path}'`);
  }
  rename(from: string, to: string): void {
    const src = statOrNull(from);
    if (src === null) throw errno("ENOENT", "rename", from, `ENOENT: no such file or directory, rename '${from}' -> '${to}'`);
    const node = this.inodes.node(from, src);
    const fromDir = this.inodes.dirNode(dirname(from));
    const toDir = this.inodes.dirNode(dirname(to));
    const dst = statOrNull(to);
    let replaced: DirOp["replaced"];
    if (dst !== null) {
      if (idOf(dst) === node.id) return; // same file: nothing to do (POSIX)
      if (dst.isDirectory() !== src.isDirectory())
        throw errno(dst.isDirectory() ? "EISDIR" : "ENOTDIR", "rename", from, `rename '${from}' -> '${to}': type mismatch`);
      if (dst.isDirectory() && nfs.readdirSync(to).length > 0) throw errno("ENOTEMPTY", "rename", from, `ENOTEMPTY: directory not empty, rename '${from}' -> '${to}'`);
      const old = this.inodes.node(to, dst);
      replaced = { node: old.id, grave: this.inodes.toGrave(to) };
    }
    this.inodes.move(from, to);
    this.dirOps.add({
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
    this.remove("unlink", path, st);
  }
  rm(path: string): void {
    const st = statOrNull(path);
    if (st === null) return;
    this.remove("rm", path, st);
  }
  /** Removes the entry at `path` (kept in the scratch dir until a power loss decides). */
  private remove(kind: "unlink" | "rm", path: string, st: nfs.Stats): void {
    const node = this.inodes.node(path, st);
    const dir = this.inodes.dirNode(dirname(path));
    const grave = this.inodes.toGrave(path);
    this.dirOps.add({ kind, dirs: [dir.id], dir: dir.id, name: basename(path), node: node.id, grave, desc: { kind, path } });
  }
  fsyncDir(path: string): void {
    const dir = this.inodes.dirNode(path);
    if (this.realSync) {
      const fd = nfs.openSync(path, "r");
      try {
        nfs.fsyncSync(fd);
      } finally {
        nfs.closeSync(fd);
      }
    }
    this.dirOps.fsync(dir.id);
  }

  /** Un-synced directory operations (oldest first), for tests and reports. */
  pendingDirOps(): { kind: string; path: string; to?: string }[] {
    return this.dirOps.pending();
  }
  /** Un-synced changes of the file at `path` (writes / truncates since its last fdatasync). */
  pendingOf(path: string): number {
    return this.inodes.nodeAt(path)?.pending.length ?? 0;
  }

  // ─────────── power loss ───────────

  powerLoss(mode: PowerLossMode, seed: number): PowerLossReport {
    this.closeAll();
    const rnd = prng(seed ^ 0x5eed);
    const pick = (): Exclude<PowerLossMode, "mixed"> => (["drop", "keep", "prefix", "random"] as const)[Math.floor(rnd() * 4)];
    // One draw per file and per directory in "mixed" mode, interleaved with their own draws.
    const modeFor = (): Exclude<PowerLossMode, "mixed"> => (mode === "mixed" ? pick() : mode);
    const report: PowerLossReport = { mode, files: [], undone: [], kept: [] };
    this.loseFileContent(modeFor, rnd, report);
    this.dirOps.powerLoss(modeFor, rnd, this.inodes, report);
    return report;
  }

  /**
   * File contents, by inode, wherever the file is now (so an unlink that is undone brings back
   * what the power loss left); in creation order, not by path: paths may hold random names,
   * the order of the seeded choices must not depend on them.
   */
  private loseFileContent(modeFor: () => Exclude<PowerLossMode, "mixed">, rnd: () => number, report: PowerLossReport): void {
    for (const n of this.inodes.all()) {
      if (n.isDir || n.pending.length === 0) continue;
      const st = statOrNull(n.path);
      if (st === null || st.isDirectory() || idOf(st) !== n.id) continue;
      const m = modeFor();
      const r = replay(n.durable, n.pending, m, rnd);
      nfs.writeFileSync(n.path, r.image);
      report.files.push({ path: n.path, mode: m, pendingOps: n.pending.length, keptSectors: r.kept, sectors: r.sectors, durableSize: n.durable.length, size: r.image.length, before: st.size });
      n.durable = r.image;
      n.pending = [];
    }
  }

  dispose(): void {
    this.closeAll();
    nfs.rmSync(this.scratch, { recursive: true, force: true });
  }
}
