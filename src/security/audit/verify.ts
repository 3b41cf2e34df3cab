// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice audit verify`: walks the whole chain (AUD-2) and names the first sequence number at
 * which it breaks, and why:
 *
 *  - `modified`: the record's fields do not match its hash (or can not be decoded, or its CRC
 *    fails in the middle of the file);
 *  - `missing`: the next record carries a later sequence number and the expected one does not
 *    follow it (deleted records);
 *  - `reordered`: the expected sequence number comes right after a later one (swapped records),
 *    or a sequence number comes again;
 *  - `chain`: a record's `prev` is not the previous record's hash (a record before it was
 *    rewritten with a recomputed hash, or replaced).
 *
 * One record of lookahead tells `missing` from `reordered`; memory stays bounded. An
 * incomplete last frame is a torn write (truncated when the broker opens, AUD-3), not a
 * failure. Records removed from the end can not be told from records never written: compare
 * the last hash printed with one kept elsewhere.
 */
import type { FileSystem } from "../../log/io.js";
import { readAuditItems, type AuditItem } from "./reader.js";
import { GENESIS_HASH } from "./record.js";

export type VerifyFailure = "modified" | "missing" | "reordered" | "chain";

export type VerifyResult =
  | { ok: true; count: number; lastSeq: number; lastHash: string; tornTail: boolean }
  | { ok: false; count: number; seq: number; reason: VerifyFailure; detail: string };

export async function verifyAuditLog(fs: FileSystem, dataDir: string): Promise<VerifyResult> {
  const it = readAuditItems(fs, dataDir)[Symbol.asyncIterator]();
  let ahead: AuditItem | null = null;
  const next = async (): Promise<AuditItem | null> => {
    if (ahead !== null) {
      const a = ahead;
      ahead = null;
      return a;
    }
    const r = await it.next();
    return r.done ? null : r.value;
  };
  const peek = async (): Promise<AuditItem | null> => (ahead ??= await next());
  let expect = 1;
  let prev = GENESIS_HASH;
  let count = 0;
  const fail = async (seq: number, reason: VerifyFailure, detail: string): Promise<VerifyResult> => {
    await it.return?.(undefined); // closes the file
    return { ok: false, count, seq, reason, detail };
  };
  for (let item = await next(); item !== null; item = await next()) {
    if (item.kind === "torn") return { ok: true, count, lastSeq: expect - 1, lastHash: prev, tornTail: true };
    if (item.kind === "bad") return fail(expect, "modified", `record at byte ${item.pos}: ${item.why}`);
    const r = item.record;
    if (!item.hashMatches) return fail(r.seq === expect ? r.seq : expect, "modified", `record at byte ${item.pos} (seq ${r.seq}) does not match its hash`);
    if (r.seq !== expect) {
      if (r.seq < expect) return fail(expect, "reordered", `seq ${r.seq} found where seq ${expect} was expected`);
      const after = await peek();
      if (after?.kind === "record" && after.record.seq === expect) return fail(expect, "reordered", `seq ${expect} found after seq ${r.seq}`);
      const gap = r.seq - expect === 1 ? `seq ${expect} is missing` : `seqs ${expect}..${r.seq - 1} are missing`;
      return fail(expect, "missing", `${gap} (seq ${r.seq} follows seq ${expect - 1})`);
    }
    if (r.prev !== prev) return fail(r.seq, "chain", `seq ${r.seq}'s prev does not match the hash of seq ${r.seq - 1} (a record up to seq ${r.seq} was rewritten)`);
    prev = r.hash;
    expect++;
    count++;
  }
  return { ok: true, count, lastSeq: expect - 1, lastHash: prev, tornTail: false };
}
