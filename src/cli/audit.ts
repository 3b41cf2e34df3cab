// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice audit list|verify --data DIR`: the audit log of administrative operations
 * (src/security/audit/, docs/security.md "Audit log"). Reads the file only (no lock), so it
 * runs beside a live broker; a record being appended shows as a torn tail, which is no failure.
 *   list    the most recent records (or those since a time), as a table or JSON
 *   verify  walks the whole hash chain (AUD-2); exit status 1 at the first break
 */
import { resolve } from "node:path";
import { AuditLogCorruptError, ValidationError } from "../errors.js";
import { NodeFileSystem } from "../log/io.js";
import { listAuditRecords } from "../security/audit/reader.js";
import type { AuditRecord } from "../security/audit/record.js";
import { verifyAuditLog } from "../security/audit/verify.js";
import { TARGET_OPTIONS, UsageError, helpIfAsked, isoTime, optInt, parse } from "./args.js";
import { printJson, printTable, say } from "./output.js";
import { resolveTarget } from "./target.js";

export const AUDIT_HELP = `Usage: sluice audit list --data DIR [--since TIME] [--limit N] [--json]
       sluice audit verify --data DIR [--json]

The audit log of administrative operations: topic and queue creation, changes and deletion,
purges, redrives, job removals and group offset resets, each with who asked (principal and
source address), when, and the result (ok or the error code). Stored in DIR/audit/audit.log;
each record is chained to the one before it by a SHA-256 hash. Reads the file only; safe
beside a running server.

  list     the last N records (default 100), oldest first; with --since, the first N at or
           after TIME
  verify   walks the whole chain and prints OK with the record count and the last hash (note it
           down: records removed from the end can only be noticed against a hash kept elsewhere),
           or the first sequence number where the chain breaks and why (modified, missing,
           reordered, chain). Exit status 1 on a break (error [AUDIT_CORRUPT]).

Options:
  --data DIR         the data directory (or env SLUICE_DATA)
  --since TIME       (list) ISO-8601 time, e.g. 2026-12-01T10:00:00Z
  --limit N          (list) at most N records (default 100)
  --json             machine-readable output`;

const OPTIONS = { ...TARGET_OPTIONS, since: { type: "string" }, limit: { type: "string" }, json: { type: "boolean" } } as const;

export async function auditCommand(argv: string[]): Promise<void> {
  helpIfAsked(argv, AUDIT_HELP);
  const { values, positionals } = parse(argv, { usage: AUDIT_HELP, options: OPTIONS, maxPositionals: 1 });
  const sub = positionals[0];
  if (sub !== "list" && sub !== "verify") throw new UsageError(`unknown audit command ${JSON.stringify(sub ?? "")}; usage: sluice audit list|verify --data DIR`);
  const target = resolveTarget(values);
  if (target.kind !== "data") throw new UsageError(`audit ${sub} reads the data directory: use --data DIR (on the server's host)`);
  const dataDir = resolve(target.dir);
  const fs = new NodeFileSystem();
  if ((await fs.stat(dataDir))?.isDirectory !== true) throw new ValidationError(`data directory ${dataDir} does not exist`);
  const json = values.json === true;
  if (sub === "verify") {
    if (values.since !== undefined || values.limit !== undefined) throw new UsageError("--since and --limit are for audit list");
    return verify(fs, dataDir, json);
  }
  const since = values.since === undefined ? undefined : isoTime(values.since, "--since");
  const limit = optInt(values.limit, "--limit", { min: 1, max: 1_000_000 });
  const records = await listAuditRecords(fs, dataDir, { since, limit });
  if (json) return printJson({ records });
  printTable(
    ["SEQ", "TIME", "PRINCIPAL", "SOURCE", "OPERATION", "RESOURCE", "RESULT", "DETAILS"],
    records.map((r) => [r.seq, new Date(r.time).toISOString(), r.principal, r.source, r.op, `${r.resourceType} ${r.resource}`, r.result, detailsText(r)]),
  );
}

function detailsText(r: AuditRecord): string {
  return Object.entries(r.details)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
}

async function verify(fs: NodeFileSystem, dataDir: string, json: boolean): Promise<void> {
  const r = await verifyAuditLog(fs, dataDir);
  if (json) printJson(r);
  if (!r.ok) {
    if (!json) say(`FAILED at seq ${r.seq} (${r.reason}): ${r.detail}; ${r.count} record(s) before it verified`);
    throw new AuditLogCorruptError(r.seq, r.reason, r.detail);
  }
  if (json) return;
  const torn = r.tornTail ? " (an incomplete last record follows: a torn write, cut when the broker opens)" : "";
  say(r.count === 0 ? `OK: no audit records${torn}` : `OK: ${r.count} records, last seq ${r.lastSeq}, last hash ${r.lastHash}${torn}`);
}
