// SPDX-License-Identifier: Apache-2.0
/**
 * Exclusive lock of a data directory (as Kafka's `.lock`): one process at a time, whether it is
 * an embedded broker, `sluice serve` or a CLI command. Two writers on one log would corrupt it.
 *
 * Invariant FS-3: the lock is a kernel object owned by the process, so a holder killed with
 * SIGKILL never blocks the next start, and there is no stale-lock takeover to race on. On Linux
 * it is a socket bound in the abstract namespace under a name derived from the directory's
 * device and inode (bind is atomic; the kernel releases it when the process dies; the same
 * process binding twice fails too). Elsewhere it falls back to an exclusive-create lock file
 * whose holder pid is checked for liveness.
 *
 * Beside it, `.lock` in the directory names the holder (pid, host, since) for the error a
 * second opener gets. It is informational only: the kernel object decides.
 */
import { createServer, type Server } from "node:net";
import * as nfs from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { DataDirLockedError } from "../errors.js";
import type { DirLock } from "./io.js";

/** Who holds a data directory (from its `.lock` file; fields may be unknown). */
export interface LockHolder {
  pid: number | null;
  host: string | null;
  /** ISO time the holder took the lock. */
  since: string | null;
}

export const LOCK_FILE = ".lock";

function locked(dir: string, h: LockHolder = readHolder(dir)): DataDirLockedError {
  return new DataDirLockedError(dir, h.pid, h.host, h.since);
}

function readHolder(dir: string): LockHolder {
  try {
    const j = JSON.parse(nfs.readFileSync(join(dir, LOCK_FILE), "utf8")) as Partial<LockHolder>;
    return { pid: typeof j.pid === "number" ? j.pid : null, host: typeof j.host === "string" ? j.host : null, since: typeof j.since === "string" ? j.since : null };
  } catch {
    return { pid: null, host: null, since: null };
  }
}

function holderText(): string {
  return JSON.stringify({ pid: process.pid, host: hostname(), since: new Date().toISOString() } satisfies LockHolder) + "\n";
}

/** Takes the exclusive lock of `dir` (which must exist) or throws DataDirLockedError. */
export async function lockDirectory(dir: string): Promise<DirLock> {
  return process.platform === "linux" ? lockAbstract(dir) : lockFile(dir);
}

async function lockAbstract(dir: string): Promise<DirLock> {
  const st = nfs.statSync(dir);
  // Device and inode identify the directory whatever path (symlink, bind mount) names it.
  const name = `\0sluice-data-dir:${st.dev}:${st.ino}`;
  const server: Server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e: NodeJS.ErrnoException) => reject(e.code === "EADDRINUSE" ? locked(dir) : e));
    server.listen({ path: name, exclusive: true }, () => resolve());
  });
  // Connections are never expected; the socket exists only to be bound.
  server.on("connection", (s) => s.destroy());
  server.unref();
  nfs.writeFileSync(join(dir, LOCK_FILE), holderText());
  return held(dir, async () => {
    if (readHolder(dir).pid === process.pid) nfs.rmSync(join(dir, LOCK_FILE), { force: true });
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
}

/** A lock this process holds; `release` runs `free` once. */
function held(dir: string, free: () => Promise<void>): DirLock {
  let released = false;
  return {
    dir,
    async release(): Promise<void> {
      if (released) return;
      released = true;
      await free();
    },
  };
}

/** Non-Linux fallback: exclusive create of `.lock`; a lock whose pid is gone is taken over. */
async function lockFile(dir: string): Promise<DirLock> {
  const path = join(dir, LOCK_FILE);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = nfs.openSync(path, "wx");
      nfs.writeSync(fd, holderText());
      nfs.closeSync(fd);
      return held(dir, async () => nfs.rmSync(path, { force: true }));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const h = readHolder(dir);
      if (h.pid !== null && h.host === hostname() && !alive(h.pid)) {
        nfs.rmSync(path, { force: true }); // the holder died without releasing
        continue;
      }
      throw locked(dir, h);
    }
  }
  throw locked(dir);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}
