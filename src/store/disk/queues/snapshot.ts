// SPDX-License-Identifier: Apache-2.0
/**
 * The queue snapshot (`snapshot.bin`, replaced with writeFileAtomic): `SLQSNAP1`, u32 JSON
 * length, JSON metadata (floor, journal offset, leases, history, dead-letter moves, dedupe ids,
 * chains, counters, idempotent requests; since 0.x also priorities, expiries and singleton keys,
 * each optional and absent when unused, so snapshots of older versions load unchanged), then
 * the job table's columns (table.ts).
 *
 * JRN-3: a snapshot is taken only between two journal appends (journal.ts), so every journal
 * record below `journalOffset` is reflected in it; events after it replay idempotently
 * (JRN-1). Q-6: it never claims more than the logs hold: its rows end at the message log's
 * durable end (jobs are added to the table only once their append is durable), and after it is
 * durable the journal below `journalOffset` and the message log below `floor` are deleted.
 */
import { join } from "node:path";
import { StorageError } from "../../../errors.js";
import { writeFileAtomic, type FileSystem } from "../../../log/io.js";
import type { AttemptRecord } from "../../../queues/types.js";
import type { FlowRow } from "./flows.js";
import type { DlqIntent, JobState } from "./job-state.js";
import type { IdemSnapshot } from "./producers.js";
import type { RetainedRow } from "./retained.js";
import type { SingletonRow } from "./singletons.js";
import { JobTable } from "./table.js";
import type { BlobSealer } from "../../../log/batch-crypto.js";

const SNAP_MAGIC = Buffer.from("SLQSNAP1");
export const SNAPSHOT_FILE = "snapshot.bin";

export interface SnapshotMeta {
  version: 1;
  incarnation: string;
  floor: number;
  rows: number;
  journalOffset: number;
  chains: [number, string][];
  leases: [number, number, number, string][];
  history: [number, AttemptRecord[]][];
  moving: [number, DlqIntent][];
  dedupe: [string, number, number][];
  counters: { redeliveries: number; retries: number; completed: number; deadLettered: number };
  /** Idempotent enqueue requests of jobs below `rows` (absent in snapshots of older versions). */
  idem?: IdemSnapshot;
  /** Completed and dead-lettered jobs not yet expired (retained.ts; absent in older versions). */
  retained?: RetainedRow[];
  /** [offset, priority] of live jobs with a priority above 0 (JOB-1; absent: none). */
  priorities?: [number, number][];
  /** [offset, group] of live jobs enqueued with a group (GRP-Q1/GRP-Q2; absent: none). */
  groups?: [number, string][];
  /** [offset, expiresAt] of live jobs with an expiry not yet reached (JOB-3; absent: none). */
  expiries?: [number, number][];
  /** Singleton, debounce and throttle keys in force (singletons.ts; absent: none). */
  singletons?: SingletonRow[];
  /** Last progress (JSON text) of live jobs (job.progress; absent when none or in older versions). */
  progress?: [number, string][];
  /** Live flow parents, their children and the outcomes so far (FLOW-2; absent: none). */
  flows?: FlowRow[];
}

/** Everything a snapshot holds besides the state (dedupe ids and idempotent requests). */
export interface SnapshotExtras {
  incarnation: string;
  journalOffset: number;
  dedupe: [string, number, number][];
  idem: IdemSnapshot;
  singletons: SingletonRow[];
  /** Wall-clock ms: retained outcomes expired by then are left out. */
  now: number;
  /** Last progress of live jobs (JSON text). */
  progress?: [number, string][];
}

/** Serialises the state (its floor advanced first). */
export function encodeSnapshot(st: JobState, x: SnapshotExtras): { body: Buffer; meta: SnapshotMeta } {
  const t = st.table;
  t.advanceFloor();
  const chainsUsed = new Map<number, string>();
  t.forEachLive((_o, i) => {
    const c = t.chain[i];
    if (c >= 0 && !chainsUsed.has(c)) chainsUsed.set(c, st.chains.get(c)?.key ?? "");
  });
  const meta: SnapshotMeta = {
    version: 1,
    incarnation: x.incarnation,
    floor: t.floor,
    rows: t.rows,
    journalOffset: x.journalOffset,
    chains: [...chainsUsed],
    leases: [...st.leases.values()].map((l) => [l.off, l.attempt, l.deadlineWall, l.consumerId]),
    history: [...st.history],
    moving: [...st.moving],
    dedupe: x.dedupe,
    counters: { redeliveries: st.redeliveries, retries: st.retries, completed: st.completed, deadLettered: st.deadLettered },
    idem: x.idem,
    ...(st.retained.size > 0 ? { retained: st.retained.rows(x.now) } : {}),
    ...(st.prio !== null && st.prio.size > 0 ? { priorities: [...st.prio] } : {}),
    ...(st.expiry !== null && st.expiry.size > 0 ? { expiries: [...st.expiry] } : {}),
    ...(st.groups !== null && st.groups.jobs > 0 ? { groups: st.groups.entries() } : {}),
    ...(x.singletons.length > 0 ? { singletons: x.singletons } : {}),
    ...(x.progress !== undefined && x.progress.length > 0 ? { progress: x.progress } : {}),
    ...(st.flows !== null && st.flows.size > 0 ? { flows: st.flows.rows() } : {}),
  };
  const json = Buffer.from(JSON.stringify(meta), "utf8");
  const head = Buffer.alloc(12);
  SNAP_MAGIC.copy(head, 0);
  head.writeUInt32LE(json.length, 8);
  return { body: Buffer.concat([head, json, t.encode()]), meta };
}

/** Writes the snapshot; an encrypted queue's is sealed whole first (ENC-1: retained results, progress, dedupe ids). */
export async function writeSnapshot(fs: FileSystem, dir: string, body: Buffer, sealer: BlobSealer | null): Promise<void> {
  await writeFileAtomic(fs, join(dir, SNAPSHOT_FILE), sealer === null ? body : sealer.seal(body));
}

export async function readSnapshot(fs: FileSystem, dir: string, queue: string, sealer: BlobSealer | null): Promise<{ meta: SnapshotMeta; table: JobTable } | null> {
  const path = join(dir, SNAPSHOT_FILE);
  if ((await fs.stat(path)) === null) return null;
  let buf = await fs.readFile(path);
  if (sealer !== null) buf = sealer.open(buf, path);
  if (buf.length < 12 || !buf.subarray(0, 8).equals(SNAP_MAGIC)) throw new StorageError(`queue ${queue}: bad snapshot ${path}`);
  const jl = buf.readUInt32LE(8);
  if (jl > buf.length - 12) throw new StorageError(`queue ${queue}: truncated snapshot ${path}`);
  const meta = JSON.parse(buf.toString("utf8", 12, 12 + jl)) as SnapshotMeta;
  const table = JobTable.decode(meta.floor, meta.rows, buf.subarray(12 + jl));
  return { meta, table };
}
