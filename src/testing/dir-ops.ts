// SPDX-License-Identifier: Apache-2.0
/**
 * The crash model's log of directory entry operations (create, mkdir, unlink, rm, rename) not
 * yet made durable by an fsync of their directory, and what a power loss does to them: per
 * directory a seeded suffix of its un-synced operations is undone (a created file vanishes, a
 * removed one comes back from the scratch directory, a rename is reverted).
 */
import { join } from "node:path";
import type { PowerLossMode, PowerLossReport } from "./crash-model.js";
import { idOf, statOrNull } from "./fs-util.js";
import type { Inodes } from "./inodes.js";

export interface DirOp {
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

type Mode = Exclude<PowerLossMode, "mixed">;

export class DirOpLog {
  /** Oldest first; pinned (durable) ones are pruned. */
  private ops: DirOp[] = [];
  private seq = 0;

  add(op: Omit<DirOp, "seq" | "pinned">): DirOp {
    const d: DirOp = { ...op, seq: this.seq++, pinned: false };
    this.ops.push(d);
    return d;
  }
  /**
   * Makes `op` durable, and with it every earlier operation in the directories it touches (a
   * directory's entries reach the disk in order).
   */
  pin(op: DirOp): void {
    if (op.pinned) return;
    op.pinned = true;
    for (const d of op.dirs) for (const o of this.ops) if (!o.pinned && o.seq < op.seq && o.dirs.includes(d)) this.pin(o);
  }
  /** Forgets the durable operations. */
  prune(): void {
    this.ops = this.ops.filter((o) => !o.pinned);
  }
  /** An fsync of directory `dir` (inode id): every operation in it is durable now. */
  fsync(dir: string): void {
    for (const o of [...this.ops]) if (!o.pinned && o.dirs.includes(dir)) this.pin(o);
    this.prune();
  }
  /** Un-synced operations (oldest first), for tests and reports. */
  pending(): { kind: string; path: string; to?: string }[] {
    return this.ops.filter((o) => !o.pinned).map((o) => o.desc);
  }

  /**
   * Power loss: undoes a seeded suffix of each directory's un-synced operations (newest first),
   * records what was kept and undone in `report`, and empties the log. `modeFor` picks the
   * mode of each directory.
   */
  powerLoss(modeFor: () => Mode, rnd: () => number, inodes: Inodes, report: PowerLossReport): void {
    const ops = this.ops.filter((o) => !o.pinned);
    const cut = closeCuts(ops, chooseCuts(ops, modeFor, rnd));
    const undone = ops.filter((o) => o.dirs.every((d) => o.seq >= cut.get(d)!));
    for (const o of ops) if (!undone.includes(o)) report.kept.push(o.desc);
    for (const o of undone.sort((a, b) => b.seq - a.seq)) {
      const dirPath = inodes.pathOf(o.dir);
      if (dirPath === null) continue;
      undo(o, join(dirPath, o.name), inodes);
      report.undone.push(o.desc);
    }
    this.ops = [];
  }
}

/** Per directory (inode id): operations with seq >= its cut may be undone. */
function chooseCuts(ops: DirOp[], modeFor: () => Mode, rnd: () => number): Map<string, number> {
  const dirs = new Map<string, DirOp[]>();
  for (const o of ops) for (const d of o.dirs) dirs.get(d)?.push(o) ?? dirs.set(d, [o]);
  const cut = new Map<string, number>();
  for (const [d, list] of dirs) {
    const m = modeFor();
    let at: number;
    if (m === "drop") at = 0;
    else if (m === "keep") at = list.length;
    else at = Math.floor(rnd() * (list.length + 1));
    cut.set(d, at < list.length ? list[at].seq : Infinity);
  }
  return cut;
}

/**
 * An operation on two directories (rename) is undone only if both undo it; one that is kept
 * moves the cut of each of its directories past it, so each directory keeps its prefix
 * property (everything after an undone operation of a directory is undone). Until stable.
 */
function closeCuts(ops: DirOp[], cut: Map<string, number>): Map<string, number> {
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
  return cut;
}

/** Reverts `o`, whose entry is `here`, if the entries it made are still as it left them. */
function undo(o: DirOp, here: string, inodes: Inodes): void {
  switch (o.kind) {
    case "create":
    case "mkdir": {
      const st = statOrNull(here);
      if (st !== null && idOf(st) === o.node) inodes.toGrave(here);
      break;
    }
    case "unlink":
    case "rm": {
      if (o.grave !== undefined && statOrNull(here) === null && statOrNull(o.grave) !== null) inodes.move(o.grave, here);
      break;
    }
    case "rename":
      undoRename(o, here, inodes);
      break;
  }
}

/** Moves the renamed entry back to `here` and puts back the entry it replaced. */
function undoRename(o: DirOp, here: string, inodes: Inodes): void {
  const toDir = inodes.pathOf(o.toDir!);
  if (toDir === null) return;
  const there = join(toDir, o.toName!);
  const st = statOrNull(there);
  if (st !== null && idOf(st) === o.node && statOrNull(here) === null) {
    inodes.move(there, here);
    if (o.replaced && statOrNull(o.replaced.grave) !== null) inodes.move(o.replaced.grave, there);
  }
}
