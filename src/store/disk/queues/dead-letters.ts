// SPDX-License-Identifier: Apache-2.0
/**
 * Moves between queues: dead-lettering and redrive. Both copy a job into another
 * queue through that queue's `StoredQueue.enqueue` (obtained from the policy layer's `peer`),
 * with a system dedupe id that makes a repeated copy a no-op, and change the source only once
 * the copy is durable.
 *
 * DLQ_INTENT (durable) -> append to the dead-letter queue with `sys:dlq:<incarnation>:<id>`
 * (durable) -> DEAD. A crash anywhere leaves the job in the source (the intent is resumed on
 * open) or in the dead-letter queue; never in neither. A move that cannot land (dead-letter
 * queue full) is retried every second, and on every open, until it does.
 * redrive appends to the target with `sys:rd:<incarnation>:<id>` and acks the DLQ entry
 * only after that append is durable; a redrive in progress is recorded in `redrive.json` and
 * resumed on open.
 */
import { join } from "node:path";
import { ValidationError } from "../../../errors.js";
import type { Logger } from "../../../observability/telemetry.js";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../../../log/io.js";
import type { PreparedRecord } from "../../../log/record-batch.js";
import type { AttemptRecord, DeadLetterInfo, RedriveOptions, RedriveResult } from "../../../queues/types.js";
import { isSystemHeader, type NewJob, type QueueSettings, type StoredQueue } from "../../queue-store.js";
import { encodeEvent, Ev } from "./events.js";
import type { Journal } from "./journal.js";
import type { DlqIntent, JobState } from "./job-state.js";
import type { PayloadCache } from "./payload-cache.js";
import { deadLetterOf, firstEnqueuedAtOf, redriveCountOf } from "./records.js";
import { St } from "./table.js";

const REDRIVE_FILE = "redrive.json";
/** Pause before a dead-letter move that failed (e.g. the DLQ is full) is tried again. */
const MOVE_RETRY_MS = 1000;
/** Dead-letter entries examined per round of a redrive. */
const REDRIVE_ROUND = 256;

/** What moves need from their queue. */
export interface MoveHost {
  readonly name: string;
  readonly incarnation: string;
  readonly dir: string;
  readonly fs: FileSystem;
  readonly logger: Logger;
  settings(): QueueSettings;
  state(): JobState;
  journal(): Journal;
  cache(): PayloadCache;
  peer(name: string): Promise<StoredQueue>;
  check(): void;
  /** Whether moves may still run (open and healthy). */
  alive(): boolean;
  /** Runs `p` in the background (awaited by whenIdle and close). */
  track(p: Promise<unknown>): void;
  /** A terminal transition happened (room, availability, cache). */
  settled(off: number): void;
  /** Grantable jobs may exist. */
  available(): void;
  /** Every enqueue queued so far has been appended. */
  enqueueDrained(): Promise<void>;
  now(): number;
}

export class Mover {
  private redriveRunning: Promise<RedriveResult> | null = null;

  constructor(private readonly q: MoveHost) {}

  /** Q-4 step 1: the durable intent, then the move. */
  async deadLetter(off: number, last: AttemptRecord): Promise<void> {
    const st = this.q.state();
    const t = st.table;
    const i = t.idx(off);
    const intent: DlqIntent = {
      at: this.q.now(),
      attempts: t.attempts[i],
      errorClass: last.errorClass,
      error: last.error,
      ...(last.codeVersion !== undefined ? { codeVersion: last.codeVersion } : {}),
      history: st.history.get(off) ?? [last],
    };
    st.startMove(off, intent);
    this.q.available();
    await this.q.journal().event(encodeEvent(Ev.DLQ_INTENT, off, t.attempts[i], intent.at, intent));
    try {
      await this.finish(off, intent, false);
    } catch (e) {
      // E.g. the DLQ is full: the intent is durable, so keep retrying (and on every open) until it lands.
      this.retryLater(off, intent);
      throw e;
    }
  }

  /** Resumes the moves whose intent the journal holds (on open; never awaited inside it). */
  resume(): void {
    for (const [off, intent] of this.q.state().moving)
      this.q.track(
        this.finish(off, intent, true).catch((e) => {
          this.q.logger.warn({ err: e, queue: this.q.name }, "resuming dead-letter move failed; retrying");
          this.retryLater(off, intent);
        }),
      );
  }

  private retryLater(off: number, intent: DlqIntent): void {
    const timer = setTimeout(() => {
      if (!this.q.alive() || !this.q.state().moving.has(off)) return;
      this.q.track(
        this.finish(off, intent, true).catch((e) => {
          this.q.logger.warn({ err: e, queue: this.q.name, offset: off }, "dead-letter move failed; retrying");
          this.retryLater(off, intent);
        }),
      );
    }, MOVE_RETRY_MS);
    timer.unref();
  }

  /** Q-4 steps 2-3 (also run on open for intents found in the journal). */
  private async finish(off: number, intent: DlqIntent, resumed: boolean): Promise<void> {
    const target = this.q.settings().deadLetter;
    if (target !== null) {
      const [r] = [...(await this.q.cache().fetch([off])).values()];
      if (r instanceof Error) throw r;
      const dlq = await this.q.peer(target);
      this.checkEncrypted(dlq);
      await dlq.enqueue([this.deadLetterCopy(off, r, intent, resumed)]);
    }
    const st = this.q.state();
    if (st.finishMove(off, this.q.now())) {
      this.q.settled(off);
      this.q.available();
      await this.q.journal().fixed(Ev.DEAD, off, 0, this.q.now());
    }
  }

  /** ENC-1: an encrypted queue's jobs are copied only into encrypted queues (never to disk in clear). */
  private checkEncrypted(dest: StoredQueue): void {
    if (this.q.settings().encrypted === true && dest.settings.encrypted !== true)
      throw new ValidationError(`queue ${JSON.stringify(this.q.name)} is encrypted; its jobs cannot be copied into ${JSON.stringify(dest.name)}, which is not`);
  }

  /** The job as it lands in the dead-letter queue: payload, kept headers, the failure record. */
  private deadLetterCopy(off: number, r: PreparedRecord, intent: DlqIntent, resumed: boolean): NewJob {
    const s = this.q.settings();
    const redact = new Set(s.redactHeaders);
    const redacted: string[] = [];
    const kept: [string, Buffer][] = [];
    for (const [k, v] of r.headers ?? []) {
      if (isSystemHeader(k)) continue;
      if (redact.has(k.toLowerCase())) redacted.push(k);
      else kept.push([k, v]);
    }
    const redriveCount = redriveCountOf(r);
    const firstEnqueuedAt = firstEnqueuedAtOf(r);
    const info: DeadLetterInfo & { key: string | null } = {
      sourceQueue: this.q.name,
      sourceId: String(off),
      sourceIncarnation: this.q.incarnation,
      firstEnqueuedAt,
      deadLetteredAt: intent.at,
      attempts: intent.attempts,
      errorClass: intent.errorClass,
      error: intent.error,
      history: intent.history,
      ...(intent.codeVersion !== undefined ? { codeVersion: intent.codeVersion } : {}),
      redriveCount,
      repeat: redriveCount > 0 && redriveCount >= s.maxRedrives,
      // A resumed move may follow a DLQ append that landed before the crash; the system dedupe id
      // normally suppresses the second copy, but if it does not (window passed) the copy says so.
      duplicate: resumed,
      redacted,
      key: r.key === null ? null : r.key.toString("utf8"),
    };
    const now = this.q.now();
    return {
      record: { key: null, value: r.value, valueKind: r.valueKind, timestamp: now, headers: kept.length > 0 ? kept : null },
      key: null,
      deliverAt: now,
      dedupeId: `sys:dlq:${this.q.incarnation}:${off}`,
      size: 0, // measured on the encoded copy (storedJobSize)
      // The DLQ copy keeps the source's redrive count in its record, not in its own headers.
      origin: { redriveCount: 0, firstEnqueuedAt: now, deadLetter: info },
    };
  }

  /** Resumes a redrive recorded before a crash (on open, in the background). */
  async resumeRedrive(): Promise<void> {
    const rd = await readJsonFile<{ opts: RedriveOptions }>(this.q.fs, join(this.q.dir, REDRIVE_FILE)).catch(() => null);
    if (rd === null) return;
    const p = Promise.resolve().then(() => this.redrive(rd.opts, true));
    this.q.track(p.catch((e) => this.q.logger.error({ err: e, queue: this.q.name }, "resuming redrive failed")));
  }

  /** moves matching dead-letter entries of this queue back to their source (or `target`). */
  async redrive(opts: RedriveOptions, resuming = false): Promise<RedriveResult> {
    this.q.check();
    if (opts.limit !== undefined && !(Number.isInteger(opts.limit) && opts.limit >= 0)) throw new ValidationError("limit must be a non-negative integer");
    while (this.redriveRunning) await this.redriveRunning.catch(() => {});
    const run = this.runRedrive(opts, resuming);
    this.redriveRunning = run;
    try {
      return await run;
    } finally {
      this.redriveRunning = null;
    }
  }

  private async runRedrive(opts: RedriveOptions, resuming: boolean): Promise<RedriveResult> {
    const path = join(this.q.dir, REDRIVE_FILE);
    if (!resuming) await writeFileAtomic(this.q.fs, path, JSON.stringify({ opts }));
    await this.q.enqueueDrained();
    const t = this.q.state().table;
    const limit = opts.limit ?? Infinity;
    const result: RedriveResult = { moved: 0, skippedRepeats: 0 };
    let cursor = t.floor;
    const end = t.end;
    while (result.moved < limit && cursor < end) {
      this.q.check();
      const cand: number[] = [];
      for (let o = Math.max(cursor, t.floor); o < end && cand.length < REDRIVE_ROUND; o++) {
        if (isWaiting(t.status[t.idx(o)])) cand.push(o);
        cursor = o + 1;
      }
      if (cand.length === 0) continue;
      const byTarget = await this.selectRound(cand, opts, limit - result.moved, result);
      for (const [target, list] of byTarget) result.moved += await this.moveBack(target, list);
    }
    await this.q.fs.unlink(path).catch(() => {});
    await this.q.fs.fsyncDir(this.q.dir).catch(() => {});
    this.q.available();
    return result;
  }

  /** The round's entries that match, as copies grouped by target queue. */
  private async selectRound(cand: number[], opts: RedriveOptions, room: number, result: RedriveResult): Promise<Map<string, { off: number; job: NewJob }[]>> {
    const t = this.q.state().table;
    const ids = opts.filter?.ids ? new Set(opts.filter.ids.map(String)) : null;
    const f = opts.filter;
    const recs = await this.q.cache().fetch(cand);
    const byTarget = new Map<string, { off: number; job: NewJob }[]>();
    let chosen = 0;
    for (const o of cand) {
      if (chosen >= room) break;
      const r = recs.get(o);
      if (r === undefined || r instanceof Error || !t.has(o) || !isWaiting(t.status[t.idx(o)])) continue;
      const info = deadLetterOf(r);
      const target = opts.target ?? info?.sourceQueue;
      if (target === undefined) continue;
      if (ids !== null && !ids.has(String(o)) && !(info && ids.has(info.sourceId))) continue;
      if (f?.errorClass !== undefined && info?.errorClass !== f.errorClass) continue;
      const at = info?.deadLetteredAt ?? r.timestamp;
      if (f?.from !== undefined && at < f.from) continue;
      if (f?.to !== undefined && at >= f.to) continue;
      if (info?.repeat && !opts.includeRepeats) {
        result.skippedRepeats++;
        continue;
      }
      const headers: [string, Buffer][] = [];
      for (const [k, v] of r.headers ?? []) if (!isSystemHeader(k)) headers.push([k, v]);
      const now = this.q.now();
      const key = info?.key ?? null;
      const job: NewJob = {
        record: { key: key === null ? null : Buffer.from(key, "utf8"), value: r.value, valueKind: r.valueKind, timestamp: now, headers: headers.length > 0 ? headers : null },
        key,
        deliverAt: now,
        dedupeId: `sys:rd:${this.q.incarnation}:${o}`,
        size: 0, // measured on the encoded copy (storedJobSize)
        origin: { redriveCount: (info?.redriveCount ?? 0) + 1, firstEnqueuedAt: info?.firstEnqueuedAt ?? r.timestamp, deadLetter: null },
      };
      let list = byTarget.get(target);
      if (!list) byTarget.set(target, (list = []));
      list.push({ off: o, job });
      chosen++;
    }
    return byTarget;
  }

  /** Copies `list` into `target`, then acks the DLQ entries; returns how many moved. */
  private async moveBack(target: string, list: { off: number; job: NewJob }[]): Promise<number> {
    const st = this.q.state();
    const t = st.table;
    // Through the policy layer even for this queue itself: every write goes through `StoredQueue`.
    const dest = await this.q.peer(target);
    this.checkEncrypted(dest);
    // Not deliverable while in transit; the mark is in memory only (a crash leaves the entry,
    // and the dedupe id makes the retry idempotent).
    const prev = new Map<number, St>();
    for (const { off } of list) {
      const i = t.idx(off);
      prev.set(off, t.status[i] as St);
      st.setStatus(i, St.MOVING);
    }
    try {
      await dest.enqueue(list.map((x) => x.job));
    } catch (e) {
      for (const { off } of list) if (st.statusOf(off) === St.MOVING) st.setStatus(t.idx(off), prev.get(off)!);
      throw e;
    }
    let moved = 0;
    let p: Promise<void> = Promise.resolve();
    const now = this.q.now();
    for (const { off } of list) {
      if (st.statusOf(off) !== St.MOVING) continue;
      st.finish(off, St.DONE, now);
      this.q.settled(off);
      p = this.q.journal().fixed(Ev.ACK, off, 0, now);
      moved++;
    }
    await p;
    return moved;
  }
}

function isWaiting(s: number): boolean {
  return s === St.READY || s === St.DELAYED || s === St.BLOCKED;
}
