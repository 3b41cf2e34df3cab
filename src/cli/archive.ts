// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice archive list|verify --dir DIR`, `sluice archive restore --data DIR ...`: the segment archive of topics with an `archive`
 * (tiered storage, src/log/archive/). Works on the archive directory itself, read-only, so it
 * runs beside a live broker (manifests and objects are replaced atomically, ARC-1).
 *   list    one line per archived segment (from its manifest)
 *   verify  recomputes length, CRC-32C and SHA-256 of every archived object against its
 *           manifest (ARC-3) and checks each partition's archived range is contiguous
 *   restore copies archived segments back into a partition directory (offline, holding the
 *           data dir's lock, FS-3) and moves its log start back (restore.ts, ARC-5)
 */
import { BrokerError, ValidationError } from "../errors.js";
import { NodeFileSystem } from "../log/io.js";
import { FsArchiveStore } from "../log/archive/fs-archive-store.js";
import { manifestBase, objectKey, parseManifest, type SegmentManifest } from "../log/archive/manifest.js";
import { verifyObject } from "../log/archive/segment-archiver.js";
import { isAbsolute, join, resolve } from "node:path";
import { readJsonFile } from "../log/io.js";
import { partitionPrefix } from "../log/archive/manifest.js";
import { restoreRange } from "../log/archive/restore.js";
import { validateName } from "../store/names.js";
import { PartitionNotFoundError, TopicNotFoundError } from "../errors.js";
import { UsageError, helpIfAsked, parse } from "./args.js";
import { Progress, printJson, printTable, say } from "./output.js";

export const ARCHIVE_HELP = `Usage: sluice archive list|verify --dir DIR [--topic NAME] [--partition N] [--json]
       sluice archive restore --data DIR --topic NAME --partition N --from OFFSET [--json]

The segment archive of topics created with an archive ({ "archive": { "dir": DIR } }): the
sealed segments retention copied there (verified) before deleting them locally. Reads the
archive directory only; safe beside a running broker.

  list     one line per archived segment: topic, partition, offsets, records, bytes, time range
  verify   recomputes each archived segment's length, CRC-32C and SHA-256 (and its indexes')
           against its manifest, and checks each partition's archived offsets are contiguous.
           Exit status 1 when anything is damaged or missing (error [ARCHIVE_CORRUPT]).
  restore  copies the archived segments from the one holding OFFSET up to the online log start
           back into the partition's directory (each checked against its manifest) and moves
           the log start back, for fast replay from local disk. Offline: needs --data, and no
           server may hold the data directory. Retention deletes them again at its next run if
           they exceed the topic's retention (they are not archived twice).

Options:
  --dir DIR          the archive directory (the topic config's archive.dir)
  --data DIR         (restore) the data directory; the archive is the topic's archive.dir
  --from OFFSET      (restore) the first offset to bring back online
  --topic NAME       only this topic
  --partition N      only this partition (with --topic)
  --json             machine-readable output

Replay from an archived offset works without restore: the broker reads the archive.`;

const OPTIONS = { dir: { type: "string" }, data: { type: "string" }, from: { type: "string" }, topic: { type: "string" }, partition: { type: "string" }, json: { type: "boolean" } } as const;

interface Entry {
  /** Key prefix of the partition in the archive. */
  prefix: string;
  m: SegmentManifest;
}

async function manifests(store: FsArchiveStore, topic: string | undefined, partition: number | undefined): Promise<{ entries: Entry[]; unreadable: string[] }> {
  const entries: Entry[] = [];
  const unreadable: string[] = [];
  for (const key of await store.list("")) {
    if (manifestBase(key) === null) continue;
    const bytes = await store.get(key);
    const m = bytes === null ? null : parseManifest(bytes);
    if (m === null) {
      unreadable.push(key);
      continue;
    }
    if (topic !== undefined && m.topic !== topic) continue;
    if (partition !== undefined && m.partition !== partition) continue;
    entries.push({ prefix: key.slice(0, key.lastIndexOf("/") + 1), m });
  }
  entries.sort((a, b) => (a.prefix === b.prefix ? a.m.baseOffset - b.m.baseOffset : a.prefix < b.prefix ? -1 : 1));
  return { entries, unreadable };
}

const iso = (ms: number): string => (ms < 0 ? "-" : new Date(ms).toISOString());

export async function archiveCommand(argv: string[]): Promise<void> {
  helpIfAsked(argv, ARCHIVE_HELP);
  const { values, positionals } = parse(argv, { usage: ARCHIVE_HELP, options: OPTIONS, maxPositionals: 1 });
  const sub = positionals[0];
  if (sub !== "list" && sub !== "verify" && sub !== "restore") throw new UsageError(`unknown archive command ${JSON.stringify(sub ?? "")}; usage: sluice archive list|verify --dir DIR, or restore --data DIR ...`);
  let partition: number | undefined;
  if (values.partition !== undefined) {
    partition = Number(values.partition);
    if (!Number.isSafeInteger(partition) || partition < 0) throw new UsageError(`--partition must be a partition number, got ${JSON.stringify(values.partition)}`);
    if (values.topic === undefined) throw new UsageError("--partition needs --topic");
  }
  if (sub === "restore") return restore(values.data, values.topic, partition, values.from, values.json === true);
  if (values.dir === undefined) throw new UsageError("archive needs --dir DIR (the topic config's archive.dir)");
  const dir = isAbsolute(values.dir) ? values.dir : resolve(values.dir);
  const fs = new NodeFileSystem();
  if ((await fs.stat(dir))?.isDirectory !== true) throw new ValidationError(`archive directory ${dir} does not exist`);
  const store = new FsArchiveStore(fs, dir);
  const { entries, unreadable } = await manifests(store, values.topic, partition);
  if (sub === "list") return list(entries, unreadable, values.json === true);
  return verify(store, entries, unreadable, values.json === true);
}

function list(entries: Entry[], unreadable: string[], json: boolean): void {
  if (json) return printJson({ segments: entries.map((e) => e.m), unreadable });
  printTable(
    ["TOPIC", "PARTITION", "BASE", "END", "RECORDS", "BYTES", "FIRST RECORD", "LAST RECORD", "ARCHIVED"],
    entries.map(({ m }) => [m.topic, m.partition, m.baseOffset, m.endOffset, m.recordCount, m.bytes, iso(m.minTimestamp), iso(m.maxTimestamp), iso(m.archivedAt)]),
  );
  for (const k of unreadable) say(`unreadable manifest: ${k}`);
}

async function verify(store: FsArchiveStore, entries: Entry[], unreadable: string[], json: boolean): Promise<void> {
  const progress = new Progress(json);
  const problems: { key: string; problem: string }[] = unreadable.map((key) => ({ key, problem: "unreadable manifest" }));
  let prev: Entry | null = null;
  for (const [i, e] of entries.entries()) {
    const { m, prefix } = e;
    progress.update(`${i + 1} of ${entries.length} segments`);
    if (prev !== null && prev.prefix === prefix && prev.m.endOffset !== m.baseOffset)
      problems.push({ key: objectKey(prefix, m.baseOffset, "manifest.json"), problem: `gap: offsets [${prev.m.endOffset}, ${m.baseOffset}) are not archived` });
    prev = e;
    const objects = [
      [objectKey(prefix, m.baseOffset, "log"), { bytes: m.bytes, sha256: m.sha256, crc32c: m.crc32c }],
      [objectKey(prefix, m.baseOffset, "index"), { bytes: m.indexBytes, sha256: m.indexSha256 }],
      [objectKey(prefix, m.baseOffset, "timeindex"), { bytes: m.timeIndexBytes, sha256: m.timeIndexSha256 }],
    ] as const;
    let ok = true;
    for (const [key, want] of objects) {
      try {
        await verifyObject(store, key, want);
      } catch (err) {
        if (!(err instanceof BrokerError)) throw err;
        ok = false;
        problems.push({ key, problem: err.message });
      }
    }
    progress.done();
    if (!json) say(`${ok ? "ok" : "DAMAGED"} ${m.topic}/${m.partition} [${m.baseOffset}, ${m.endOffset}) ${m.recordCount} records, ${m.bytes} bytes`);
  }
  progress.done();
  if (json) printJson({ ok: problems.length === 0, segments: entries.length, problems });
  else for (const p of problems) say(`  ${p.key}: ${p.problem}`);
  if (problems.length > 0) throw new BrokerError("ARCHIVE_CORRUPT", `${problems.length} problem(s) in the archive: ${problems[0].key}${problems.length > 1 ? ", ..." : ""}`);
}

async function restore(data: string | undefined, topic: string | undefined, partition: number | undefined, fromText: string | undefined, json: boolean): Promise<void> {
  if (data === undefined || topic === undefined || partition === undefined || fromText === undefined)
    throw new UsageError("archive restore needs --data DIR --topic NAME --partition N --from OFFSET");
  const from = Number(fromText);
  if (!Number.isSafeInteger(from) || from < 0) throw new UsageError(`--from must be an offset, got ${JSON.stringify(fromText)}`);
  validateName("topic", topic);
  const dataDir = resolve(data);
  const fs = new NodeFileSystem();
  // FS-3: no broker may have the partition open while its files and log start change.
  const lock = await fs.lock(dataDir);
  try {
    const topicDir = join(dataDir, "topics", topic);
    const meta = await readJsonFile<{ topicId: string; config: { partitions: number; archive?: { dir: string } | null } }>(fs, join(topicDir, "topic.json"));
    if (meta === null) throw new TopicNotFoundError(topic);
    if (partition >= meta.config.partitions) throw new PartitionNotFoundError(topic, partition);
    if (!meta.config.archive) throw new ValidationError(`topic ${topic} has no archive`);
    const store = new FsArchiveStore(fs, meta.config.archive.dir);
    const r = await restoreRange(fs, store, partitionPrefix(topic, meta.topicId, partition), join(topicDir, String(partition)), from);
    if (json) printJson({ topic, partition, ...r });
    else if (r.segments === 0) say(`${topic}/${partition}: offset ${from} is online already (log start ${r.logStart})`);
    else say(`${topic}/${partition}: restored ${r.segments} segment(s), ${r.bytes} bytes; log start ${r.previousLogStart} -> ${r.logStart}`);
  } finally {
    await lock.release();
  }
}
