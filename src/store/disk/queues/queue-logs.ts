// SPDX-License-Identifier: Apache-2.0
/**
 * Opens a queue's two logs: `msgs/` (the jobs' records, records.ts) and `journal/` (state
 * events, events.ts), each a one-partition PartitionLog with the queue's durability. Either
 * both open or neither stays open.
 */
import { join } from "node:path";
import type { FileSystem } from "../../../log/io.js";
import { PartitionLog, type LogConfig } from "../../../log/partition-log.js";
import { BatchCipher } from "../../../log/batch-crypto.js";
import type { Keyring } from "../../../log/keyring.js";
import type { Telemetry } from "../../../observability/telemetry.js";
import type { QueueSettings } from "../../queue-store.js";
import { MAX_JOURNAL_RECORD_BYTES } from "./journal.js";
import { RESERVED_HEADER_ROOM } from "./records.js";

/** A queue's logs roll their segments at most weekly (settled segments are deleted whole). */
const SEGMENT_MS = 7 * 86_400_000;
/** Journal segments: a quarter of the message log's, within [16 KiB, 16 MiB]. */
const MIN_JOURNAL_SEGMENT = 16 * 1024;
const MAX_JOURNAL_SEGMENT = 16 * 1024 * 1024;

export interface QueueLogsOptions {
  name: string;
  /** Bound into each encrypted batch's authentication with the log's name (ENC-2). */
  incarnation: string;
  /** Used when `settings.encrypted` (ENC-1). */
  keyring: Keyring | null;
  dir: string;
  fs: FileSystem;
  telemetry: Telemetry;
  settings: QueueSettings;
  /** A write failed in either log (the queue stops and is reopened, Q-7). */
  onFault(e: unknown): void;
}

export async function openQueueLogs(o: QueueLogsOptions): Promise<{ msgs: PartitionLog; journal: PartitionLog }> {
  const s = o.settings;
  const config = (maxMessageBytes: number, segmentBytes: number): LogConfig => ({
    segmentBytes,
    segmentMs: SEGMENT_MS,
    maxMessageBytes,
    durability: s.durability,
    flushIntervalMs: 1000,
    retentionMs: -1,
    retentionBytes: -1,
  });
  // ENC-1: an encrypted queue encrypts both logs: payloads and headers in `msgs/`, results,
  // progress and failure records in `journal/`.
  const cipher = (sub: string): BatchCipher | undefined =>
    s.encrypted === true ? new BatchCipher(o.keyring, `queue:${o.incarnation}/${sub}`, `queue ${JSON.stringify(o.name)} (${sub})`) : undefined;
  const open = (sub: string, topic: string, c: LogConfig): Promise<PartitionLog> =>
    PartitionLog.open({ fs: o.fs, dir: join(o.dir, sub), topic, partition: 0, config: c, telemetry: o.telemetry, onFault: (e) => o.onFault(e), cipher: cipher(sub) });
  await o.fs.mkdir(o.dir);
  const msgs = await open("msgs", `queue:${o.name}`, config(s.maxMessageBytes + RESERVED_HEADER_ROOM, s.segmentBytes));
  const journalSegment = Math.max(MIN_JOURNAL_SEGMENT, Math.min(MAX_JOURNAL_SEGMENT, s.segmentBytes / 4));
  try {
    const journal = await open("journal", `queue-journal:${o.name}`, config(MAX_JOURNAL_RECORD_BYTES + 128 * 1024, journalSegment));
    return { msgs, journal };
  } catch (e) {
    await msgs.close().catch(() => {});
    throw e;
  }
}
