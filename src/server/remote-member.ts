// SPDX-License-Identifier: Apache-2.0
/**
 * A consumer-group member that lives in a client process and is represented in the server by
 * one member subscription of the broker (`host.subscribeMember`). The broker's group
 * coordinator therefore sees every remote member as an ordinary member: join = subscribe,
 * leave = close, rebalancing/generations/fencing are the coordinator's. This module adds what
 * only the network needs:
 *
 * - forwarding stored batches: for a client that announced PUSH_RECORD_BATCHES the server reads
 *   whole stored record batches (`nextRaw`: verified, never decoded) and pushes them as they
 *   are; the client decodes. Clients that did not announce it get messages (PUSH_MESSAGES);
 * - credit-based flow control: data is pulled from the member subscription only while the
 *   client has granted credit and the socket is not backpressured, so a slow consumer never
 *   makes the server buffer without bound;
 * - commits by (partition, offset): the client names the message it processed. We keep only
 *   the highest delivered offset per partition (no message is retained) and commit offset+1
 *   for all named partitions in one durable write (`commitOffsets`);
 * - revocation: the coordinator tells the member of every rebalance (`MemberListener`); a
 *   revocation is pushed to the client, and the partitions move on only once the client
 *   confirmed it stopped (REVOKE_ACK), or after `revokeTimeoutMs`.
 *
 * A commit this member can no longer make (its ownership period of the partition ended, or
 * the member itself did) fails with `NotAssignedError`, as the embedded broker's does.
 */
import { NotAssignedError, ValidationError } from "../errors.js";
import { decodeRecords, readHeader, type StoredRecord } from "../log/record-batch.js";
import type { RawChunk } from "../streams/subscription.js";
import { splitRawChunk } from "./raw-split.js";
import { toConsumed } from "../streams/records.js";
import type { ConsumedRecord, Message } from "../types.js";
import type { MemberSubscription, StreamHost } from "../broker/host.js";

export interface RemoteMemberOptions {
  id: number;
  host: StreamHost;
  topic: string;
  group: string;
  start?: "earliest" | "latest";
  offsetReset?: "earliest" | "latest" | "error";
  assignment?: "range" | "roundrobin";
  maxBytes?: number;
  /** Initial credit in messages granted by the client. */
  credit: number;
  /** Max messages per push frame (PUSH_MESSAGES). */
  maxBatchMessages: number;
  /** Max body bytes of one push frame (what the client's frame reader accepts, with room). */
  maxPushBytes: number;
  /** Longest wait for the client to acknowledge a revocation before the partitions move anyway. */
  revokeTimeoutMs: number;
  /**
   * Called with a batch of messages to push; returns false when the socket is backpressured.
   * `replay`: [partition, offset] pairs, the records of that partition below the offset are
   * replays (`msg.replay`); absent when none is.
   */
  push(messages: ConsumedRecord[], replay?: [number, number][]): boolean;
  /** Pushes stored batches as they are (PUSH_RECORD_BATCHES); same return value as `push`.
   * Only for clients that announced it; the others get messages. */
  pushRaw?(chunk: RawChunk): boolean;
  pushAssignment(generation: number, assigned: number[], revoked: number[], ack?: number): void;
  pushEnded(reason: string, error?: unknown): void;
  /** Resolves when the socket can take more output. */
  waitWritable(): Promise<void>;
}

type CommitPair = [number, number] | [number, number, number];

export class RemoteMember {
  readonly id: number;
  private readonly opts: RemoteMemberOptions;
  private readonly sub: MemberSubscription;
  private readonly ac = new AbortController();
  private credit: number;
  /** The client's last credit grant: the size of a read-ahead (raw mode). */
  private lastGrant: number;
  private creditWaiter: (() => void) | null = null;
  /** Highest delivered offset per partition in its current ownership period. */
  private readonly delivered = new Map<number, number>();
  /** Raw mode: generation of the ownership period in which `delivered` was pushed. */
  private readonly deliveredGen = new Map<number, number>();
  private lastAssignment: number[] = [];
  /** Set once the member is closed; the reason is reported to later commits. */
  endedReason: string | null = null;
  private nextAck = 1;
  private readonly pendingAcks = new Map<number, () => void>();

  constructor(opts: RemoteMemberOptions) {
    this.id = opts.id;
    this.opts = opts;
    this.credit = opts.credit;
    this.lastGrant = opts.credit;
    this.sub = opts.host.subscribeMember(
      opts.topic,
      {
        group: opts.group,
        start: opts.start,
        offsetReset: opts.offsetReset,
        assignment: opts.assignment,
        maxBytes: opts.maxBytes,
        signal: this.ac.signal,
      },
      {
        revoked: (partitions, generation) => this.revokeRemote(partitions, generation),
        assigned: (partitions, generation) => this.assigned(partitions, generation),
      },
    );
    void (opts.pushRaw ? this.pumpRaw(opts.pushRaw) : this.pump());
  }

  get topic(): string {
    return this.opts.topic;
  }
  get group(): string {
    return this.opts.group;
  }

  addCredit(n: number): void {
    if (!Number.isSafeInteger(n) || n < 0 || n > 1_000_000) throw new ValidationError(`invalid credit ${n}`);
    this.credit = Math.min(this.credit + n, 10_000_000);
    if (n > 0) this.lastGrant = n;
    this.wake();
  }

  private wake(): void {
    const w = this.creditWaiter;
    this.creditWaiter = null;
    w?.();
  }

  /**
   * Cooperative revocation across the network: the coordinator awaits this before it hands
   * the partitions to their new owner (GRP-1). The member subscription has stopped locally;
   * the client is told (PUSH_ASSIGNMENT with an ack id) and we wait for its REVOKE_ACK, sent
   * once it has aborted `msg.signal` and dropped buffered messages, or for `revokeTimeoutMs`,
   * or for this member to end. Thus a remote consumer stops before its partitions move.
   */
  private revokeRemote(partitions: number[], generation: number): Promise<void> {
    if (this.endedReason !== null || partitions.length === 0) return Promise.resolve();
    this.lastAssignment = this.lastAssignment.filter((p) => !partitions.includes(p));
    for (const p of partitions) this.dropPartition(p);
    const ack = this.nextAck++;
    return new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.pendingAcks.delete(ack);
        resolve();
      };
      const timer = setTimeout(done, this.opts.revokeTimeoutMs);
      timer.unref();
      this.pendingAcks.set(ack, done);
      this.opts.pushAssignment(generation, this.lastAssignment, partitions, ack);
    });
  }

  private assigned(partitions: number[], generation: number): void {
    if (this.endedReason !== null) return;
    this.lastAssignment = [...new Set([...this.lastAssignment, ...partitions])].sort((a, b) => a - b);
    this.opts.pushAssignment(generation, this.lastAssignment, []);
  }

  /** The client confirmed it stopped processing the revoked partitions. */
  revokeAck(ack: number): void {
    this.pendingAcks.get(ack)?.();
  }

  private releaseAcks(): void {
    for (const done of [...this.pendingAcks.values()]) done();
  }

  private dropPartition(p: number): void {
    this.delivered.delete(p);
    this.deliveredGen.delete(p);
  }

  private async waitForCredit(): Promise<void> {
    while (this.endedReason === null && this.credit <= 0) {
      await new Promise<void>((resolve) => (this.creditWaiter = resolve));
    }
  }

  /**
   * Message mode (clients without PUSH_RECORD_BATCHES). The member's batch iterator hands over
   * whatever is buffered (up to maxBatchMessages) per step: far fewer promise hops than
   * per-message iteration. A batch is requested only while credit is positive, so the client
   * may receive up to maxBatchMessages - 1 beyond its credit: its buffer is bounded by
   * window + one batch.
   */
  private async pump(): Promise<void> {
    try {
      const it = this.sub.batches({ maxMessages: this.opts.maxBatchMessages, maxWaitMs: 0 })[Symbol.asyncIterator]();
      while (this.endedReason === null) {
        await this.waitForCredit();
        if (this.endedReason !== null) break;
        const r = await it.next();
        if (r.done) break;
        this.deliver(r.value.messages);
      }
      this.finish(this.endedReason ?? "closed");
    } catch (err) {
      this.finish("error", err);
    }
  }

  private deliver(batch: Message[]): void {
    if (batch.length === 0 || this.endedReason !== null) return;
    // Replays of a partition are the records below its mark: one bound per partition says it.
    let replay: Map<number, number> | undefined;
    for (const m of batch) {
      this.delivered.set(m.partition, m.offset);
      if (m.replay) (replay ??= new Map()).set(m.partition, Math.max(replay.get(m.partition) ?? 0, m.offset + 1));
    }
    this.credit -= batch.length;
    if (!this.opts.push(batch, replay && [...replay])) this.pauseUntilWritable();
  }

  /**
   * Raw mode: one read of stored batches per step, pushed without decoding. A push starts only
   * with positive credit and carries no batch past the one that reaches the credit (but at
   * least one batch, at most the subscription's maxBytes), so a client holds at most its window
   * plus the records of one stored batch.
   *
   * Read-ahead: once the credit is spent, the next chunk (about one grant of records) is read
   * and verified while the client works through what it has, so the disk read and checksum
   * leave the round trip between a grant and the push that answers it. The chunk is pushed as
   * far as each grant reaches (`splitRawChunk`); the client's window is unchanged, and the
   * server holds at most one chunk (one read) per member.
   */
  private async pumpRaw(pushRaw: (chunk: RawChunk) => boolean): Promise<void> {
    const maxRead = Math.max(4096, Math.min(this.opts.maxBytes ?? 1024 * 1024, this.opts.maxPushBytes));
    let ahead: Promise<RawChunk | null> | null = null;
    try {
      while (this.endedReason === null) {
        await this.waitForCredit();
        if (this.endedReason !== null) break;
        let chunk: RawChunk | null = ahead !== null ? await ahead : await this.sub.nextRaw(maxRead, this.credit);
        ahead = null;
        if (chunk === null) break;
        while (chunk !== null && this.credit > 0 && this.endedReason === null) {
          const { head, rest } = splitRawChunk(chunk, this.credit);
          this.deliverRaw(head, pushRaw);
          chunk = rest;
        }
        if (this.endedReason !== null) break;
        if (chunk !== null) ahead = Promise.resolve(chunk);
        else if (this.credit <= 0) {
          ahead = this.sub.nextRaw(maxRead, Math.max(1, this.lastGrant));
          ahead.catch(() => {}); // awaited above: a failure ends the pump there
        }
      }
      this.finish(this.endedReason ?? "closed");
    } catch (err) {
      this.finish("error", err);
    }
  }

  private deliverRaw(chunk: RawChunk, pushRaw: (chunk: RawChunk) => boolean): void {
    // Revoked after the read: the partition's next owner delivers these records.
    if (this.endedReason !== null || chunk.signal.aborted) return;
    const p = chunk.partition;
    this.delivered.set(p, chunk.nextOffset - 1);
    this.deliveredGen.set(p, chunk.generation);
    this.credit -= chunk.records;
    const writable = chunk.data.length <= this.opts.maxPushBytes ? pushRaw(chunk) : this.pushDecoded(chunk);
    if (!writable) this.pauseUntilWritable();
  }

  /**
   * A single stored batch larger than a push frame (possible for batches appended in-process,
   * up to 64 MiB): decode it and push its records as PUSH_MESSAGES frames of bounded size.
   */
  private pushDecoded(chunk: RawChunk): boolean {
    const recs: StoredRecord[] = [];
    for (let pos = 0; pos < chunk.data.length; ) {
      const h = readHeader(chunk.data, pos);
      decodeRecords(chunk.data, pos, h, chunk.from, recs);
      pos += h.length;
    }
    let writable = true;
    let slice: ConsumedRecord[] = [];
    let bytes = 0;
    const replay: [number, number][] | undefined = chunk.replayUntil > chunk.from ? [[chunk.partition, chunk.replayUntil]] : undefined;
    for (const r of recs) {
      const size = 64 + (r.key?.length ?? 0) + (r.value?.length ?? 0);
      if (slice.length > 0 && (bytes + size > this.opts.maxPushBytes / 2 || slice.length >= this.opts.maxBatchMessages)) {
        writable = this.opts.push(slice, replay) && writable;
        slice = [];
        bytes = 0;
      }
      slice.push(toConsumed(this.opts.topic, chunk.partition, r));
      bytes += size;
    }
    if (slice.length > 0) writable = this.opts.push(slice, replay) && writable;
    return writable;
  }

  /** Socket backpressure: pretend we have no credit until it drains. */
  private pauseUntilWritable(): void {
    const saved = this.credit;
    this.credit = 0;
    void this.opts.waitWritable().then(() => {
      this.credit += saved;
      this.wake();
    });
  }

  /**
   * Commits "processed through offset" for each (partition, offset) pair in one durable write.
   * A pair may carry a third element, the generation the records were pushed with
   * (PUSH_RECORD_BATCHES): a commit from an earlier ownership period of the partition is
   * refused even if the partition came back to this member since.
   */
  async commit(offsets: CommitPair[]): Promise<void> {
    if (this.endedReason !== null) {
      throw new NotAssignedError(
        `member ${this.id} of group ${JSON.stringify(this.opts.group)} is no longer active (${this.endedReason}); ` +
          "its partitions may have moved to another member, which resumes from the last commit",
      );
    }
    const next = new Map<number, number>();
    for (const [partition, offset, generation] of offsets) {
      const hi = this.delivered.get(partition);
      const earlierPeriod = generation !== undefined && (hi === undefined || this.deliveredGen.get(partition) !== generation);
      if (earlierPeriod || (hi === undefined && !this.lastAssignment.includes(partition))) throw this.notAssigned(partition, earlierPeriod);
      if (hi === undefined) continue; // nothing delivered in this ownership period: nothing to commit
      if (offset < 0) throw new ValidationError(`invalid offset ${offset}`);
      // "Processed through `offset`" for an offset this member was given (never beyond).
      next.set(partition, Math.min(offset, hi) + 1);
    }
    if (next.size > 0) await this.sub.commitOffsets(next);
  }

  private notAssigned(partition: number, earlierPeriod: boolean): NotAssignedError {
    const what = `partition ${partition} of ${JSON.stringify(this.opts.topic)}`;
    const who = `member ${this.id} of group ${JSON.stringify(this.opts.group)}`;
    return new NotAssignedError(
      earlierPeriod
        ? `${what} was revoked from ${who} after these records were delivered; records of an earlier ownership period can no longer be committed`
        : `${what} is not assigned to ${who}`,
    );
  }

  assignment(): number[] {
    return this.lastAssignment;
  }

  private finish(reason: string, error?: unknown): void {
    const first = this.endedReason === null;
    if (first) this.endedReason = reason;
    this.releaseAcks();
    this.delivered.clear();
    this.deliveredGen.clear();
    this.wake();
    if (first) this.opts.pushEnded(reason, error);
  }

  /** Ends this member for `reason` (the client hears PUSH_SUBSCRIPTION_ENDED) and leaves the group. */
  end(reason: string, error?: unknown): void {
    this.finish(reason, error);
    void this.close(reason);
  }

  /** Leaves the group (partitions are reassigned by the coordinator). */
  async close(reason = "closed"): Promise<void> {
    if (this.endedReason === null) this.endedReason = reason;
    this.releaseAcks();
    this.ac.abort();
    this.wake();
    try {
      await this.sub.close();
    } catch {
      // closing is best effort; the coordinator drops the member either way
    }
  }
}
