// SPDX-License-Identifier: Apache-2.0
/**
 * A group member in this process: `for await (const msg of sub)`. Fetches from its assigned
 * partitions in turn, one bounded fetch at a time (pull-driven: nothing is read ahead beyond
 * one fetch of `maxBytes`), and long-polls when all are caught up.
 */
import { BrokerClosedError, CorruptRecordError, NotAssignedError, OffsetOutOfRangeError, ValidationError } from "../errors.js";
import type { Logger } from "../observability/telemetry.js";
import type { StorageEngine } from "../store/engine.js";
import type { Message, MessageBatch, SubscribeOptions, Subscription } from "../types.js";
import { newMemberId, type GroupCoordinator, type GroupMember } from "./group-coordinator.js";
import { toConsumed } from "./records.js";
import { encodeBatch, stampBatch } from "../log/record-batch.js";
import { validateName } from "../store/names.js";
import type { MemberListener } from "../broker/host.js";

interface Assigned {
  position: number | null;
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
  /** Aborts when the partition is revoked from this member or the subscription closes. */
  signal: AbortSignal;
}

export interface SubscriptionDeps {
  engine: StorageEngine;
  coordinator: GroupCoordinator;
  logger: Logger;
  onClose(sub: GroupSubscription<unknown>): void;
}

export class GroupSubscription<T> implements Subscription<T>, GroupMember {
  readonly memberId = newMemberId();
  readonly group: string;
  readonly topic: string;
  private assigned = new Map<number, Assigned>();
  private buffer: Message<T>[] = [];
  private rr = 0;
  private joined: Promise<void> | null = null;
  private closed = false;
  private wake: (() => void) | null = null;
  private readonly closeAc = new AbortController();
  private generationSeen = 0;

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
    if (opts.signal) {
      if (opts.signal.aborted) this.closed = true;
      else opts.signal.addEventListener("abort", () => void this.close(), { once: true });
    }
  }

  assignment(): number[] {
    return [...this.assigned.keys()].sort((a, b) => a - b);
  }

  // GroupMember
  revoke(partitions: number[], generation: number): void | Promise<void> {
    for (const p of partitions) {
      this.assigned.get(p)?.ac.abort(new Error(`partition ${p} revoked`));
      this.assigned.delete(p);
    }
    // Drop buffered messages of revoked partitions: the new owner will deliver them.
    this.buffer = this.buffer.filter((m) => this.assigned.has(m.partition));
    this.wake?.();
    return this.listener?.revoked(partitions, generation);
  }

  assign(partitions: number[], generation: number): void {
    this.generationSeen = generation;
    for (const p of partitions) this.assigned.set(p, { position: null, ac: new AbortController(), generation });
    this.wake?.();
    this.listener?.assigned(partitions, generation);
  }

  private ensureJoined(): Promise<void> {
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
    if (pos === null) {
      const c = (await this.deps.engine.getCommitted(this.group, this.topic)).get(p);
      pos = c ? c.offset : (this.opts.start ?? "latest") === "earliest" ? logStartOffset : highWatermark;
    }
    if (pos < logStartOffset) {
      const policy = this.opts.offsetReset ?? "earliest";
      if (policy === "error") throw new OffsetOutOfRangeError(this.topic, p, pos, logStartOffset, highWatermark);
      this.deps.logger.warn({ group: this.group, topic: this.topic, partition: p, from: pos, policy }, "offset below log start; resetting");
      pos = policy === "earliest" ? logStartOffset : highWatermark;
    } else if (pos > highWatermark) pos = highWatermark;
    // Still the same ownership period (not revoked while we awaited): keep the position.
    if (this.assigned.get(p) === a) a.position = pos;
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
    const parts = this.assignment();
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
    return { partition: p, generation: a.generation, from: pos, data: res.data, nextOffset: res.nextOffset, records: res.records, signal: a.ac.signal };
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

  private makeMessage(p: number, a: Assigned, r: Parameters<typeof toConsumed>[2]): Message<T> {
    const base = toConsumed<T>(this.topic, p, r);
    const offset = r.offset;
    return Object.assign(base, {
      signal: a.ac.signal,
      commit: async () => {
        this.checkPeriod(a.ac.signal, p);
        await this.commitOffsets(new Map([[p, offset + 1]]));
      },
    });
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
    for (const p of next.keys()) this.deps.coordinator.checkOwner(this.group, this.topic, p, this.memberId);
    await this.deps.engine.commitOffsets(this.group, this.topic, next);
  }

  private async waitForData(maxWaitMs = 30_000): Promise<void> {
    const waits: Promise<unknown>[] = [];
    // One controller per wait, aborted in `finally` so the engine drops its waiters. Not
    // AbortSignal.any with closeAc: a dependent signal per wait on a long-lived source keeps
    // garbage alive between waits (at thousands of waits per second the server's young
    // generation filled with it and scavenges took 5 ms); close() calls wake() instead.
    const ac = new AbortController();
    const signal = ac.signal;
    if (this.closeAc.signal.aborted) return;
    for (const [p, a] of [...this.assigned]) {
      const pos = a.position ?? (await this.resolvePosition(p, a)).pos;
      waits.push(this.deps.engine.waitFor(this.topic, p, pos, maxWaitMs, signal));
    }
    waits.push(new Promise<void>((r) => (this.wake = r)));
    if (this.assigned.size === 0) waits.push(new Promise((r) => setTimeout(r, maxWaitMs).unref()));
    try {
      await Promise.race(waits);
    } finally {
      this.wake = null;
      ac.abort();
    }
  }

  private async next(): Promise<Message<T> | null> {
    await this.ensureJoined();
    while (!this.closed) {
      const m = this.buffer.shift();
      if (m) {
        if (!this.assigned.has(m.partition)) continue;
        return m;
      }
      if (!(await this.fill()) && !this.closed) await this.waitForData();
    }
    return null;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Message<T>> {
    try {
      for (;;) {
        const m = await this.next();
        if (m === null) return;
        yield m;
      }
    } finally {
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
        while (messages.length < max && !this.closed) {
          if (this.buffer.length === 0 && !(await this.fill())) {
            const left = deadline - Date.now();
            if (left <= 0) break;
            await this.waitForData(left);
            continue;
          }
          const m = this.buffer.shift();
          if (!m) break;
          if (this.assigned.has(m.partition)) messages.push(m);
        }
        const sub = this;
        yield {
          messages,
          async commit() {
            const next = new Map<number, number>();
            for (const m of messages) {
              sub.checkPeriod(m.signal, m.partition);
              next.set(m.partition, Math.max(next.get(m.partition) ?? 0, m.offset + 1));
            }
            await sub.commitOffsets(next);
          },
        };
      }
    } finally {
      await this.close();
    }
  }

  get generation(): number {
    return this.generationSeen;
  }

  async close(): Promise<void> {
    if (this.closed && !this.joined) return;
    this.closed = true;
    this.closeAc.abort();
    this.wake?.();
    const joined = this.joined;
    this.joined = null;
    for (const a of this.assigned.values()) a.ac.abort(new BrokerClosedError("subscription closed"));
    this.assigned.clear();
    this.buffer = [];
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
