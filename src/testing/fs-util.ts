// SPDX-License-Identifier: Apache-2.0
/**
 * Small helpers shared by FaultyFileSystem, its handles and its crash model: errors shaped like
 * the ones Node's fs throws (so code under test handles injected faults as real ones), and
 * stat lookups by path and by inode.
 */
import * as nfs from "node:fs";

/** An error as Node's fs would throw it: `code`, `syscall` and `path` set. */
export function errno(code: string, op: string, path: string, message?: string): NodeJS.ErrnoException {
  return Object.assign(new Error(message ?? `${code}: injected fault, ${op} '${path}'`), { code, syscall: op, path });
}

/** stat of `path`, or null if it (or a directory on the way) does not exist. */
export function statOrNull(path: string): nfs.Stats | null {
  try {
    return nfs.statSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT" || (e as NodeJS.ErrnoException).code === "ENOTDIR") return null;
    throw e;
  }
}

/** The inode id (device and inode number): a file keeps it across renames. */
export function idOf(st: nfs.Stats): string {
  return `${st.dev}:${st.ino}`;
}
