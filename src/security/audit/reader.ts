// SPDX-License-Identifier: Apache-2.0
/**
 * Reading an audit log without opening the broker (`sluice audit list|verify --data`): the
 * records in file order, decoded, one frame in memory at a time. Reads only; safe beside a
 * running broker (a frame being written shows as a torn tail).
 */
import type { FileSystem } from "../../log/io.js";
import { auditLogPath } from "./audit-log.js";
import { readFrames } from "./frame-reader.js";
import { decodePayload, type AuditRecord } from "./record.js";

export type AuditItem =
  | { kind: "record"; pos: number; record: AuditRecord; hashMatches: boolean }
  /** A frame whose checksum fails, or whose fields can not be decoded, or the rest of the file can not be framed. */
  | { kind: "bad"; pos: number; why: string }
  /** An incomplete last frame (a crash, or an append in progress); nothing follows. */
  | { kind: "torn"; pos: number; why: string };

/** Every item of the audit log of `dataDir` in file order; nothing when there is no log. */
export async function* readAuditItems(fs: FileSystem, dataDir: string): AsyncGenerator<AuditItem> {
  const path = auditLogPath(dataDir);
  if ((await fs.stat(path)) === null) return;
  const fh = await fs.open(path, "r");
  try {
    const size = await fh.size();
    for await (const it of readFrames(fh, size)) {
      if (it.kind === "frame") {
        const d = decodePayload(it.payload);
        yield d.ok ? { kind: "record", pos: it.pos, record: d.record, hashMatches: d.hashMatches } : { kind: "bad", pos: it.pos, why: d.why };
      } else if (it.kind === "torn") {
        yield { kind: "torn", pos: it.pos, why: it.why };
      } else {
        yield { kind: "bad", pos: it.pos, why: it.why };
      }
    }
  } finally {
    await fh.close();
  }
}

export interface ListOptions {
  /** Only records at or after this time (ms since epoch). */
  since?: number;
  /** At most this many records: the most recent ones when `since` is not given, else the first after it. */
  limit?: number;
}

/**
 * Records for `sluice audit list`: readable records only (damage is verify's to report). With
 * a limit and no `since`, the last `limit` records, kept in a ring of that size.
 */
export async function listAuditRecords(fs: FileSystem, dataDir: string, opts: ListOptions = {}): Promise<AuditRecord[]> {
  const limit = opts.limit ?? 100;
  const out: AuditRecord[] = [];
  for await (const it of readAuditItems(fs, dataDir)) {
    if (it.kind !== "record") continue;
    if (opts.since !== undefined) {
      if (it.record.time < opts.since) continue;
      out.push(it.record);
      if (out.length >= limit) break;
    } else {
      out.push(it.record);
      if (out.length > limit) out.shift();
    }
  }
  return out;
}
