// SPDX-License-Identifier: Apache-2.0
/**
 * The crash model's table of the files and directories it has seen, by inode: a file keeps its
 * durable content and un-synced changes across renames, and one whose removal is not durable
 * yet is kept in a scratch directory (its "grave") until a power loss decides whether the
 * removal survives, so every node always has a current path.
 */
import * as nfs from "node:fs";
import { basename, join } from "node:path";
import type { Pending } from "./file-replay.js";
import { errno, idOf, statOrNull } from "./fs-util.js";

export interface Node {
  id: string;
  /** Current path (in the data dir or in the scratch dir). */
  path: string;
  isDir: boolean;
  /** File content at the last fdatasync. */
  durable: Buffer;
  /** Un-synced writes and truncates since, oldest first. */
  pending: Pending[];
}

export class Inodes {
  /** In creation order: the power loss walks them so, never by (possibly random) path names. */
  private nodes = new Map<string, Node>();
  private graveSeq = 0;

  constructor(private readonly scratch: string) {}

  /** Every node seen, in the order first seen. */
  all(): IterableIterator<Node> {
    return this.nodes.values();
  }
  /** The node of `st` (found at `path`), remembered from now on with its content as durable. */
  node(path: string, st: nfs.Stats): Node {
    const id = idOf(st);
    let n = this.nodes.get(id);
    if (n === undefined) {
      n = { id, path, isDir: st.isDirectory(), durable: st.isDirectory() ? Buffer.alloc(0) : nfs.readFileSync(path), pending: [] };
      this.nodes.set(id, n);
    } else n.path = path;
    return n;
  }
  nodeAt(path: string): Node | null {
    const st = statOrNull(path);
    return st === null ? null : this.node(path, st);
  }
  /** The node of an existing directory (ENOENT if it is missing). */
  dirNode(path: string): Node {
    const n = this.nodeAt(path);
    if (n === null) throw errno("ENOENT", "open", path, `ENOENT: no such file or directory, '${path}'`);
    return n;
  }
  pathOf(id: string): string | null {
    return this.nodes.get(id)?.path ?? null;
  }
  /** Renames `from` to `to` on disk; every node at or below `from` moves with it. */
  move(from: string, to: string): void {
    nfs.renameSync(from, to);
    this.movePaths(from, to);
  }
  /** Moves the entry at `path` into the scratch directory; returns where it is kept. */
  toGrave(path: string): string {
    const g = join(this.scratch, `${++this.graveSeq}-${basename(path)}`);
    this.move(path, g);
    return g;
  }
  /** Every node at or below `from` is now at or below `to`. */
  private movePaths(from: string, to: string): void {
    for (const n of this.nodes.values()) {
      if (n.path === from) n.path = to;
      else if (n.path.startsWith(from + "/")) n.path = to + n.path.slice(from.length);
    }
  }
}
