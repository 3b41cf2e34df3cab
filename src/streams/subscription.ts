// SPDX-License-Identifier: Apache-2.0
/**
 * A group member in this process: `for await (const msg of sub)`. Fetches from its assigned
 * partitions in turn, one bounded fetch at a time (pull-driven: nothing is read ahead beyond
 * one fetch of `maxBytes`), and long-polls when all are caught up.
 */
import { drainTimeoutOption, InFlightGate } from "./drain.js";
import { BrokerClosedError, CorruptRecordError, NotAssignedError, OffsetOutOfRangeError, ValidationError } from "../errors.js";
import type { Logger } from "../observability/telemetry.js";
import type { StorageEngine } from "../store/engine.js";
import type { Message, MessageBatch, SubscribeOptions, Subscription } from "../types.js";
import { newMemberId } from "./group-coordinator.js";
import type { GroupCoordination, GroupMember } from "../store/group-coordination.js";
import { decodeValue, encodeBatch, stampBatch, type StoredRecord } from "../log/record-batch.js";
import { validateName } from "../store/names.js";
import type { MemberListener } from "../broker/host.js";
import { COMMIT_LINGER_MS, CommitCoalescer, maxPendingCommitsOption, type CommitMark } from "./commit-coalescer.js";

interface Assigned {
  position: number | null;
  /** The partition's replay mark when this period read its committed offset (0: none):
   * records below it are `msg.replay` (META-4). */
  replayUntil: number;
  ac: AbortController;
  /** Group generation in which this member got the partition (its ownership period). */
  generation: number;
}

/**
 * Stored batches of one partition for a consumer in another process (`nextRaw`): the server
 * forwards `data` as is and the client decodes it, so no record is decoded here.
 */
export interface RawChunk {
  partition: number;
  /** Generation in which this member got the partition; fences commits of older periods. */
  generation: number;
  /** First offset wanted: `data` may start with records below it (whole batches), to skip. */
  from: number;
  /** Whole verified batches, contiguous (a view of one read buffer). */
  data: Buffer;
  /** Offset after the last batch in `data`. */
  nextOffset: number;
  /** Records in `data` at or after `from`. */
  records: number;
  /** Records below this offset are replays after a reset (`msg.replay`, META-4); 0: none. */
  replayUntil: number;
  /** Aborts when the partition is revoked from this member or the subscription closes. */
  signal: AbortSignal;
}

/** Reason for ending a long-poll wait (one object: waits happen thousands of times a second). */
const WAIT_OVER = new Error("wait over");

/** Shared by messages without headers (frozen: a handler cannot add to another's headers). */
const NO_HEADERS: Record<string, Uint8Array> = Object.freeze({}) as Record<string, Uint8Array>;

/**
 * A delivered message: one object per record (no closure); `commit()` marks it through the
 * subscription that delivered it, within the ownership period it was delivered in.
 */
class LocalMessage<T> implements Message<T> {
  readonly #sub: GroupSubscription<unknown>;
  readonly #period: Assigned;
  constructor(
    readonly topic: string,
    readonly partition: number,
    readonly offset: number,
    readonly timestamp: number,
    readonly key: Uint8Array | null,
    readonly value: T,
    readonly headers: Record<string, Uint8Array>,
    readonly signal: AbortSignal,
    readonly replay: boolean,
    sub: GroupSubscription<unknown>,
    period: Assigned,
  ) {
    this.#sub = sub;
    this.#period = period;
  }
  commit(): Promise<void> {
    this.#sub.gate.committed(this);
    return this.#sub.markCommit(this.partition, this.offset, this.#period);
  }
}

export interface SubscriptionDeps {
  engine: StorageEngine;
  coordinator: GroupCoordination;
  logger: Logger;
  /** Counts a failed offsets write (`sluice_group_commit_failures_total`); none without metrics. */
  onCommitFailure?(group: string, topic: string): void;
  onClose(sub: GroupSubscription<unknown>): void;
}

export class GroupSubscription<T> implements Subscription<T>, GroupMember {
  readonly memberId = newMemberId();
  readonly group: string;
  readonly topic: string;
  private assigned = new Map<number, Assigned>();
  /** Fetched messages not yet handed out: `buffer[head..]` (a head index: Array.shift is O(n)). */
  private buffer: Message<T>[] = [];
  private head = 0;
  private rr = 0;
  private joined: Promise<void> | null = null;
  private closed = false;
  private wake: (() => void) | null = null;
  /** Signal of the engine waits of long polls (see waitForData); replaced once aborted. */
  private waitAc: AbortController | null = null;
  private readonly closeAc = new AbortController();
  private generationSeen = 0;
  private closing: Promise<void> | null = null;
  /** What the loop holds while the signal's abort drains the subscription (drain.ts). */
  readonly gate = new InFlightGate();
  private draining = false;
  private readonly drainTimeoutMs: number;
  /** `msg.commit()` / `batch.commit()` marks, written one shared write at a time (COMMIT-1). */
  private readonly commits: CommitCoalescer;

  constructor(
    private deps: SubscriptionDeps,
    topic: string,
    private opts: SubscribeOptions & { onCorrupt?: "error" | "skip" },
    /** Hears of rebalances (the server's remote members follow them). */
    private readonly listener?: MemberListener,
  ) {
    this.topic = topic;
    this.group = validateName("group", opts.group);
    validateName("topic", topic); // a missing topic is reported by the first read (join)
    if (opts.start !== undefined && opts.start !== "earliest" && opts.start !== "latest") throw new ValidationError(`start must be "earliest" or "latest"`);
    if (opts.maxBytes !== undefined && (!Number.isInteger(opts.maxBytes) || opts.maxBytes < 1 || opts.maxBytes > 64 * 1024 * 1024))
      throw new ValidationError("maxBytes must be an integer in [1, 67108864]");
    if (opts.offsetReset !== undefined && !["earliest", "latest", "error"].includes(opts.offsetReset)) throw new ValidationError(`offsetReset must be earliest, latest or error`);
    if (opts.assignment !== undefined && !["range", "roundrobin"].includes(opts.assignment)) throw new ValidationError(`assignment must be range or roundrobin`);
    this.commits = new CommitCoalescer((marks) => this.writeCommits(marks), maxPendingCommitsOption(opts.maxPendingCommits), COMMIT_LINGER_MS);
    this.drainTimeoutMs = drainTimeoutOption(opts.drainTimeoutMs);
    if (opts.signal) {
      if (opts.signal.aborted) this.closed = true;
      else opts.signal.addEventListener("abort", () => void this.drainThenClose(), { once: true });
    }
  }

  /**
   * The signal aborted: hand out nothing more, let the loop finish (and commit) the message it
   * holds, then leave (drain.ts); `close()` meanwhile closes at once.
   */
  private async drainThenClose(): Promise<void> {
    if (this.closing) return this.closing;
    this.draining = true;
    this.wake?.();
    await this.gate.settle(this.drainTimeoutMs);
    return this.close();
  }

  assignment(): number[] {
    return [...this.sortedParts()];
  }

  /** The assigned partitions in order, kept between reads (a read per record at the live end). */
  private parts: number[] | null = null;
  private sortedParts(): number[] {
    return (this.parts ??= [...this.assigned.keys()].sort((a, b) => a - b));
  }

  // GroupMember
  revoke(partitions: number[], generation: number): void | Promise<void> {
    // Marks made in the ownership period that ends now are written before the partitions are
    // let go (COMMIT-1): the coordinator hands them over only once this returns, so the new
    // owner starts from them. Taken (and their write staged, synchronously) before the period's
    // signal aborts. The coordinator gives the partitions to no one before this resolves
    // (GRP-1), so writing them without checkOwner cannot overwrite a new owner's commits.
    const taken = this.commits.take(partitions);
    const next = new Map<number, number>();
    const generations = new Map<number, number>();
    for (const [p, t] of taken) {
      if (t.mark.signal === this.assigned.get(p)?.ac.signal) {
        next.set(p, t.mark.offset + 1);
        generations.set(p, t.mark.generation);
      } else t.settle(new NotAssignedError(`partition ${this.topic}/${p} was revoked from this member before its commit was written`));
    }
    // After the write in flight (it may hold older marks of these partitions): commits reach
    // the engine in the order they were made, whatever the engine.
    const written = next.size === 0 ? null : this.commits.idle().then(() => this.writeOffsets(next, generations));
    for (const p of partitions) {
      this.assigned.get(p)?.ac.abort(new Error(`partition ${p} revoked`));
      this.assigned.delete(p);
      this.parts = null;
    }
    // Drop buffered messages of revoked partitions: the new owner will deliver them.
    this.buffer = this.buffer.slice(this.head).filter((m) => this.assigned.has(m.partition));
    this.head = 0;
    this.wake?.();
    this.rebalanced(generation, partitions);
    const told = this.listener?.revoked(partitions, generation);
    if (written === null) return told;
    const settled = written.then(
      () => {
        for (const p of next.keys()) taken.get(p)!.settle(null);
      },
      (e: Error) => {
        for (const p of next.keys()) taken.get(p)!.settle(e);
        this.deps.logger.warn({ err: e, group: this.group, topic: this.topic, partitions: [...next.keys()] }, "commit of revoked partitions failed; their messages since the last commit are redelivered");
      },
    );
    return Promise.all([settled, told]).then(() => {});
  }

  assign(partitions: number[], generation: number): void {
    this.generationSeen = generation;
    for (const p of partitions) this.assigned.set(p, { position: null, replayUntil: 0, ac: new AbortController(), generation });
    this.parts = null;
    this.rebalanced(generation, []);
    this.wake?.();
    this.listener?.assigned(partitions, generation);
  }

  private rebalanced(generation: number, revoked: number[]): void {
    if (!this.opts.onRebalance) return;
    try {
      this.opts.onRebalance({ type: "group:rebalance", generation, assigned: [...this.sortedParts()], revoked: [...revoked].sort((a, b) => a - b) });
    } catch (e) {
      this.deps.logger.warn({ err: e, group: this.group, topic: this.topic }, "onRebalance threw; ignored");
    }
  }

  private ensureJoined(): Promise<void> {
    // Once closed, never again: a loop that comes back after its member left (the signal's
    // drain ended, or close() while a message was handled) would otherwise join as a new
    // member that no loop reads and that is never closed, holding its partitions for good.
    if (this.closed) return Promise.resolve();
    if (!this.joined) {
      this.joined = this.deps.engine
        .getTopic(this.topic)
        .then((t) => this.deps.coordinator.join(this.group, this.topic, t.config.partitions, this.opts.assignment ?? "range", this));
    }
    return this.joined;
  }

  /**
   * Where to read partition `p` next: the position already reached, else the committed offset,
   * else the start policy; clamped into [log start, high watermark] (offsetReset below the
   * start). Also returns the high watermark read for it.
   */
  private async resolvePosition(p: number, a: Assigned): Promise<{ pos: number; highWatermark: number }> {
    const { logStartOffset, highWatermark } = await this.deps.engine.offsets(this.topic, p);
    let pos = a.position;
    let replayUntil = a.replayUntil;
    if (pos === null) {
      const c = (await this.deps.engine.getCommitted(this.group, this.topic)).get(p);
      pos = c ? c.offset : (this.opts.start ?? "latest") === "earliest" ? logStartOffset : highWatermark;
      // The mark read with the offset holds for this whole period: no reset while the group
      // has members, and once a commit reaches it every later record lies above it anyway.
      replayUntil = c?.replayUntil ?? 0;
    }
    if (pos < logStartOffset) {
      const policy = this.opts.offsetReset ?? "earliest";
      if (policy === "error") throw new OffsetOutOfRangeError(this.topic, p, pos, logStartOffset, highWatermark);
      this.deps.logger.warn({ group: this.group, topic: this.topic, partition: p, from: pos, policy }, "offset below log start; resetting");
      pos = policy === "earliest" ? logStartOffset : highWatermark;
    } else if (pos > highWatermark) pos = highWatermark;
    // Still the same ownership period (not revoked while we awaited): keep the position.
    if (this.assigned.get(p) === a) {
      a.position = pos;
      a.replayUntil = replayUntil;
    }
    return { pos, highWatermark };
  }

  /**
   * One read from the next assigned partition with data (round robin), through `read`; the
   * position moves to its `nextOffset` unless the partition was revoked meanwhile. Returns the
   * first result that holds records (with its partition, ownership period and start), or null
   * when every partition is caught up. Corrupt records are skipped when `onCorrupt: "skip"`.
   */
  private async readNext<R extends { nextOffset: number }>(
    read: (p: number, pos: number) => Promise<R>,
    hasRecords: (r: R) => boolean,
  ): Promise<{ p: number; a: Assigned; pos: number; res: R } | null> {
    const parts = this.sortedParts();
    for (let i = 0; i < parts.length; i++) {
      const p = parts[(this.rr + i) % parts.length];
      const a = this.assigned.get(p);
      if (!a) continue;
      const { pos, highWatermark } = await this.resolvePosition(p, a);
      if (pos >= highWatermark || this.assigned.get(p) !== a) continue;
      let res: R;
      try {
        res = await read(p, pos);
      } catch (e) {
        if (e instanceof CorruptRecordError && this.opts.onCorrupt === "skip" && e.nextOffset !== undefined) {
          this.deps.logger.error({ err: e }, "skipping corrupt records");
          if (this.assigned.get(p) === a) a.position = e.nextOffset;
          continue;
        }
        throw e;
      }
      // Revoked while reading (or revoked and assigned again: a new ownership period).
      if (this.assigned.get(p) !== a || a.position !== pos) continue;
      a.position = res.nextOffset;
      this.rr = (this.rr + i + 1) % Math.max(1, parts.length);
      if (hasRecords(res)) return { p, a, pos, res };
    }
    return null;
  }

  /** One fetch from the next partition with data into the buffer; false when all are caught up. */
  private async fill(): Promise<boolean> {
    const maxBytes = this.opts.maxBytes ?? 1024 * 1024;
    const got = await this.readNext(
      (p, pos) => this.deps.engine.read(this.topic, p, pos, maxBytes),
      (r) => r.records.length > 0,
    );
    if (got === null) return false;
    for (const r of got.res.records) this.buffer.push(this.makeMessage(got.p, got.a, r));
    return true;
  }

  /**
   * The next stored batches from an assigned partition with data (round robin), waiting for
   * data when all are caught up; null once closed. For the server's remote members, which
   * forward the bytes: positions advance as with messages (one read per call: at most
   * `maxBytes`, no batch past the one reaching `maxRecords`, at least one batch), but nothing
   * is decoded or buffered here. Do not mix with the message iterators of one subscription.
   */
  async nextRaw(maxBytes: number, maxRecords = Infinity): Promise<RawChunk | null> {
    await this.ensureJoined();
    while (!this.closed) {
      const c = await this.fillRaw(maxBytes, maxRecords);
      if (c !== null) return c;
      if (!this.closed) await this.waitForData();
    }
    return null;
  }

  private async fillRaw(maxBytes: number, maxRecords: number): Promise<RawChunk | null> {
    const got = await this.readNext(
      (p, pos) => this.readRaw(p, pos, maxBytes, maxRecords),
      (r) => r.records > 0,
    );
    if (got === null) return null;
    const { p, a, pos, res } = got;
    return { partition: p, generation: a.generation, from: pos, data: res.data, nextOffset: res.nextOffset, records: res.records, replayUntil: a.replayUntil, signal: a.ac.signal };
  }

  /**
   * Stored batches as bytes: the engine's encoded capability, or (an engine without it) the
   * records read and encoded into one batch at their offsets, so the server's push path is the
   * same for every engine.
   */
  private async readRaw(p: number, pos: number, maxBytes: number, maxRecords: number): Promise<{ data: Buffer; nextOffset: number; records: number }> {
    const enc = this.deps.engine.encoded;
    if (enc) return enc.readRaw(this.topic, p, pos, maxBytes, maxRecords);
    const r = await this.deps.engine.read(this.topic, p, pos, maxBytes);
    const recs = Number.isFinite(maxRecords) ? r.records.slice(0, maxRecords) : r.records;
    if (recs.length === 0) return { data: Buffer.alloc(0), nextOffset: r.nextOffset, records: 0 };
    const batch = encodeBatch(recs);
    stampBatch(batch, recs[0].offset);
    return { data: batch, nextOffset: recs[recs.length - 1].offset + 1, records: recs.length };
  }

  private makeMessage(p: number, a: Assigned, r: StoredRecord): Message<T> {
    let headers: Record<string, Uint8Array> = NO_HEADERS;
    if (r.headers && r.headers.length > 0) {
      headers = {};
      for (const [k, v] of r.headers) headers[k] = v;
    }
    return new LocalMessage<T>(this.topic, p, r.offset, r.timestamp, r.key, decodeValue(r.value, r.valueKind) as T, headers, a.ac.signal, r.offset < a.replayUntil, this as GroupSubscription<unknown>, a);
  }

  /** `msg.commit()` of a message of ownership period `a` (COMMIT-1). */
  markCommit(p: number, offset: number, a: Assigned): Promise<void> {
    return this.commits.mark(p, { offset, generation: a.generation, signal: a.ac.signal });
  }

  /**
   * One shared write of the marks made since the last one (COMMIT-1). The ownership checks and
   * the engine call happen in one synchronous step, so a write is staged in the engine before
   * any revocation that follows it (commits reach the engine in the order they were decided).
   */
  private async writeCommits(marks: Map<number, CommitMark>): Promise<Map<number, Error>> {
    const refused = new Map<number, Error>();
    const next = new Map<number, number>();
    const generations = new Map<number, number>();
    for (const [p, m] of marks) {
      try {
        this.checkPeriod(m.signal, p);
        this.deps.coordinator.checkOwner(this.group, this.topic, p, this.memberId);
        next.set(p, m.offset + 1);
        generations.set(p, m.generation);
      } catch (e) {
        refused.set(p, e as Error);
      }
    }
    if (next.size > 0) await this.writeOffsets(next, generations);
    return refused;
  }

  /**
   * A message can be committed only within the ownership period it was delivered in: once its
   * partition was revoked (even if it has come back since) or the member closed, its commit
   * could move the group's position back. The same rule as a remote member's (NotAssignedError).
   */
  private checkPeriod(signal: AbortSignal, partition: number): void {
    if (signal.aborted) {
      throw new NotAssignedError(
        `partition ${this.topic}/${partition} was revoked from this member of group ${this.group} (or the subscription closed) after the message was delivered; the new owner resumes from the last commit`,
      );
    }
  }

  /**
   * Stores "processed through" for several partitions in one durable write: `next` maps a
   * partition to the next offset to read (last processed + 1). Used by `batch.commit()` and by
   * the server, which commits for remote members without keeping their messages.
   */
  async commitOffsets(next: Map<number, number>): Promise<void> {
    const generations = new Map<number, number>();
    for (const p of next.keys()) {
      this.deps.coordinator.checkOwner(this.group, this.topic, p, this.memberId);
      generations.set(p, this.assigned.get(p)?.generation ?? -1);
    }
    await this.writeOffsets(next, generations);
  }

  /**
   * The one place offsets are written, fenced by this member and the ownership periods of the
   * commit (an engine with shared coordination checks them inside the write: PG-1); a failed
   * write is counted, then rethrown unchanged.
   */
  private writeOffsets(next: Map<number, number>, generations: Map<number, number>): Promise<void> {
    const w = this.deps.engine.commitOffsets(this.group, this.topic, next, { memberId: this.memberId, generations });
    const onFailure = this.deps.onCommitFailure;
    if (onFailure === undefined) return w;
    return w.catch((e: unknown) => {
      onFailure(this.group, this.topic);
      throw e;
    });
  }

  /**
   * Long poll until an assigned partition has data past its position, `wake()` (assignment
   * changed, close) or `maxWaitMs`. A caught-up member polls once per record it is handed, so
   * a poll allocates little: the engine waits share one AbortController (`waitAc`) across
   * polls, aborted (and replaced) only when a poll ends with engine waits still registered
   * (another partition woke it, or `wake()`), which drops them. Not AbortSignal.any with
   * closeAc: a dependent signal per wait on a long-lived source keeps garbage alive between
   * waits (at thousands of waits per second the server's young generation filled with it and
   * scavenges took 5 ms).
   */
  private async waitForData(maxWaitMs = 30_000): Promise<void> {
    if (this.closeAc.signal.aborted) return;
    const targets: number[] = []; // partition, position pairs
    for (const [p, a] of [...this.assigned]) targets.push(p, a.position ?? (await this.resolvePosition(p, a)).pos);
    const ac = (this.waitAc ??= new AbortController());
    let open = 0;
    await new Promise<void>((resolve) => {
      const ended = (): void => {
        open--;
        resolve();
      };
      for (let i = 0; i < targets.length; i += 2) {
        open++;
        this.deps.engine.waitFor(this.topic, targets[i], targets[i + 1], maxWaitMs, ac.signal).then(ended, ended);
      }
      this.wake = resolve;
      if (targets.length === 0) setTimeout(resolve, maxWaitMs).unref();
    });
    this.wake = null;
    if (open > 0) {
      this.waitAc = null;
      ac.abort(WAIT_OVER); // a given reason: abort() without one builds a DOMException (a stack trace)
    }
  }

  private shift(): Message<T> | undefined {
    if (this.head >= this.buffer.length) return undefined;
    const m = this.buffer[this.head++];
    if (this.head === this.buffer.length) {
      this.buffer = [];
      this.head = 0;
    }
    return m;
  }

  private async next(): Promise<Message<T> | null> {
    await this.ensureJoined();
    while (!this.closed && !this.draining) {
      const m = this.shift();
      if (m) {
        if (!this.assigned.has(m.partition)) continue;
        // COMMIT-1: no message while maxPendingCommits marks are not yet durable.
        const room = this.commits.room();
        if (room !== null) await room;
        if (!this.assigned.has(m.partition) || this.closed || this.draining) continue;
        return m;
      }
      if (!(await this.fill()) && !this.closed && !this.draining) await this.waitForData();
    }
    return null;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Message<T>> {
    try {
      for (;;) {
        const m = await this.next();
        if (m === null) return;
        this.gate.handOut(m);
        yield m;
        this.gate.back();
      }
    } finally {
      this.gate.back();
      await this.close();
    }
  }

  async *batches(opts: { maxMessages?: number; maxWaitMs?: number } = {}): AsyncIterable<MessageBatch<T>> {
    const max = opts.maxMessages ?? 500;
    const maxWaitMs = opts.maxWaitMs ?? 0;
    if (!Number.isInteger(max) || max < 1) throw new ValidationError("maxMessages must be a positive integer");
    try {
      for (;;) {
        const first = await this.next();
        if (first === null) return;
        const messages = [first];
        // Fill up to `max`, waiting at most `maxWaitMs` (from the first message) for more.
        const deadline = Date.now() + maxWaitMs;
        while (messages.length < max && !this.closed && !this.draining) {
          if (this.head >= this.buffer.length && !(await this.fill())) {
            const left = deadline - Date.now();
            if (left <= 0) break;
            await this.waitForData(left);
            continue;
          }
          const m = this.shift();
          if (!m) break;
          if (this.assigned.has(m.partition)) messages.push(m);
        }
        const batch: MessageBatch<T> = {
          messages,
          commit: () => {
            this.gate.committed(batch);
            return this.commitBatch(messages);
          },
        };
        this.gate.handOut(batch);
        yield batch;
        this.gate.back();
      }
    } finally {
      this.gate.back();
      await this.close();
    }
  }

  /** `batch.commit()`: the highest offset per partition, marked together (COMMIT-1). */
  private commitBatch(messages: readonly Message<T>[]): Promise<void> {
    const last = new Map<number, { offset: number; signal: AbortSignal; count: number }>();
    for (const m of messages) {
      // All or nothing: a batch with a message of an ended ownership period commits nothing.
      try {
        this.checkPeriod(m.signal, m.partition);
      } catch (e) {
        return Promise.reject(e);
      }
      const l = last.get(m.partition);
      if (l === undefined) last.set(m.partition, { offset: m.offset, signal: m.signal, count: 1 });
      else {
        l.count++;
        if (m.offset > l.offset) l.offset = m.offset;
      }
    }
    const marks: Promise<void>[] = [];
    for (const [p, l] of last) marks.push(this.commits.mark(p, { offset: l.offset, generation: this.generationSeen, signal: l.signal }, l.count));
    return Promise.all(marks).then(() => {});
  }

  get generation(): number {
    return this.generationSeen;
  }

  close(): Promise<void> {
    return (this.closing ??= this.doClose());
  }

  private async doClose(): Promise<void> {
    if (this.closed && !this.joined) return;
    const wasOpen = !this.closed;
    this.closed = true;
    this.closeAc.abort();
    this.wake?.();
    // COMMIT-1: marks made before the close are written while this member still owns their
    // partitions (one attempt; a failure is logged and those messages are redelivered).
    if (wasOpen && this.commits.pendingMarks > 0) {
      await this.commits.flush().catch((e: unknown) => this.deps.logger.warn({ err: e, group: this.group, topic: this.topic }, "commits at close failed"));
    }
    this.commits.abandon(new BrokerClosedError("subscription closed before the commit was written"));
    const joined = this.joined;
    this.joined = null;
    for (const a of this.assigned.values()) a.ac.abort(new BrokerClosedError("subscription closed"));
    this.assigned.clear();
    this.parts = null;
    this.buffer = [];
    this.head = 0;
    if (joined) {
      await joined.catch(() => {});
      await this.deps.coordinator.leave(this.group, this.topic, this.memberId);
    }
    this.deps.onClose(this as GroupSubscription<unknown>);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

