// SPDX-License-Identifier: Apache-2.0
/**
 * A consumer-group member that lives in a client process and is represented in the server by
 * one embedded subscription (`broker.subscribe`). The broker's in-process group coordinator
 * therefore sees every remote member as an ordinary member: join = subscribe, leave = close,
 * rebalancing/generations/fencing are the coordinator's. This module adds what only the
 * network needs:
 *
 * - forwarding stored batches: when the embedded subscription can read raw (`nextRaw`, the
 *   broker's own GroupSubscription), the server reads whole stored record batches (verified,
 *   never decoded) and pushes them as they are (PUSH_RECORD_BATCHES); the client decodes.
 *   Otherwise (test doubles, other engines) messages are pulled and re-encoded
 *   (PUSH_MESSAGES);
 * - credit-based flow control: data is pulled from the embedded subscription only while
 *   the client has granted credit and the socket is not backpressured, so a slow consumer
 *   never makes the server buffer without bound;
 * - session liveness: a member whose connection sends nothing (no heartbeat) for
 *   `sessionTimeoutMs` is closed, which makes the coordinator move its partitions; later
 *   commits for it fail with `StaleGenerationError`;
 * - commits by (partition, offset): the client names the message it processed. When the
 *   embedded subscription offers `commitOffsets(Map<partition, nextOffset>)` we keep only the
 *   highest delivered offset per partition (no message is retained, so memory does not grow
 *   with unprocessed values) and commit offset+1 for all partitions in one durable write.
 *   Otherwise we keep the delivered-but-uncommitted `Message` objects (delivery pauses at
 *   `maxUncommitted`) and call the matching one's commit();
 * - revocation signals: when an embedded message's `signal` aborts (partition revoked) or the
 *   assignment changes, we push the new assignment so the client aborts `msg.signal` before
 *   the partition moves.
 */
import { NotAssignedError, StaleGenerationError, ValidationError } from "../errors.js";
import { decodeRecords, readHeader, type StoredRecord } from "../log/record-batch.js";
import type { RawChunk } from "../streams/subscription.js";
import { toConsumed } from "../streams/records.js";
import type { Broker, ConsumedRecord, Message, Subscription } from "../types.js";

export interface RemoteMemberOptions {
  id: number;
  broker: Broker;
  topic: string;
  group: string;
  start?: "earliest" | "latest";
  offsetReset?: "earliest" | "latest" | "error";
  assignment?: "range" | "roundrobin";
  maxBytes?: number;
  /** Initial credit in messages granted by the client. */
  credit: number;
  /** Upper bound on delivered-but-uncommitted messages kept for commits; delivery pauses at it. */
  maxUncommitted: number;
  /** Max messages per push frame (PUSH_MESSAGES). */
  maxBatchMessages: number;
  /** Max body bytes of one push frame (what the client's frame reader accepts, with room). */
  maxPushBytes: number;
  /** Longest wait for the client to acknowledge a revocation before the partitions move anyway. */
  revokeTimeoutMs: number;
  /** Called with a batch of messages to push; returns false when the socket is backpressured. */
  push(messages: ConsumedRecord[]): boolean;
  /** Pushes stored batches as they are (PUSH_RECORD_BATCHES); same return value as `push`.
   * Without it every member uses `push`. */
  pushRaw?(chunk: RawChunk): boolean;
  pushAssignment(generation: number, assigned: number[], revoked: number[], ack?: number): void;
  pushEnded(reason: string, error?: unknown): void;
  /** Resolves when the socket can take more output. */
  waitWritable(): Promise<void>;
}


export class RemoteMember {
  readonly id: number;
  private readonly opts: RemoteMemberOptions;
  private readonly sub: Subscription;
  private readonly ac = new AbortController();
  private credit: number;
  private creditWaiter: (() => void) | null = null;
  /** Delivered but not yet committed messages, per partition, in offset order. */
  private readonly uncommitted = new Map<number, Message[]>();
  private uncommittedCount = 0;
  /** Hook mode: highest delivered offset per partition. */
  private readonly delivered = new Map<number, number>();
  /** Raw mode: generation of the ownership period in which `delivered` was pushed. */
  private readonly deliveredGen = new Map<number, number>();
  private readonly commitHook: ((next: Map<number, number>) => Promise<void>) | null;
  private readonly hookedSignals = new WeakSet<AbortSignal>();
  private lastAssignment: number[] = [];
  private generation = 0;
  private assignmentTimer: NodeJS.Timeout;
  /** Set once the member is closed; the reason is reported to later commits. */
  endedReason: string | null = null;
  private nextAck = 1;
  /** True when revoke/assign are intercepted (then message signals need no separate watch). */
  private intercepting = false;
  private readonly pendingAcks = new Map<number, () => void>();

  constructor(opts: RemoteMemberOptions) {
    this.id = opts.id;
    this.opts = opts;
    this.credit = opts.credit;
    this.sub = opts.broker.subscribe(opts.topic, {
      group: opts.group,
      start: opts.start,
      offsetReset: opts.offsetReset,
      assignment: opts.assignment,
      maxBytes: opts.maxBytes,
      signal: this.ac.signal,
    });
    this.interceptRebalance();
    const hook = (this.sub as unknown as { commitOffsets?: unknown }).commitOffsets;
    this.commitHook = typeof hook === "function" ? (hook.bind(this.sub) as (next: Map<number, number>) => Promise<void>) : null;
    // Also poll the cheap `assignment()`: engines without the revoke/assign interception (and
    // members that receive no data) still report changes. Unref'd: never keeps a process alive.
    this.assignmentTimer = setInterval(() => this.checkAssignment(), 100);
    this.assignmentTimer.unref();
    void this.pump();
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
    this.wake();
  }

  private wake(): void {
    const w = this.creditWaiter;
    this.creditWaiter = null;
    w?.();
  }

  /**
   * Cooperative revocation across the network. The coordinator awaits a member's `revoke()`
   * before it hands the partitions to their new owner (GRP-1), so we extend the embedded
   * member's revoke: after it stops locally, the client is told (PUSH_ASSIGNMENT with an ack
   * id) and we wait for its REVOKE_ACK -- sent once it has aborted `msg.signal` and dropped
   * buffered messages -- or for `revokeTimeoutMs`, or for this member to end. Thus a remote
   * consumer stops before its partitions move. Assignments are pushed at once, too.
   * Duck-typed: an engine whose subscription has no revoke/assign keeps the polling path.
   */
  private interceptRebalance(): void {
    const m = this.sub as unknown as {
      revoke?: (parts: number[], generation: number) => unknown;
      assign?: (parts: number[], generation: number) => unknown;
    };
    if (typeof m.revoke !== "function" || typeof m.assign !== "function") return;
    this.intercepting = true;
    const revoke = m.revoke.bind(this.sub);
    const assign = m.assign.bind(this.sub);
    m.revoke = (parts: number[], generation: number) =>
      Promise.resolve(revoke(parts, generation)).then(() => this.revokeRemote(parts, generation));
    m.assign = (parts: number[], generation: number) => {
      const r = assign(parts, generation);
      this.checkAssignment();
      return r;
    };
  }

  private revokeRemote(parts: number[], generation: number): Promise<void> {
    if (this.endedReason !== null || parts.length === 0) return Promise.resolve();
    this.lastAssignment = this.lastAssignment.filter((p) => !parts.includes(p));
    for (const p of parts) this.dropPartition(p);
    this.generation = generation;
    const ack = this.nextAck++;
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, this.opts.revokeTimeoutMs);
      timer.unref();
      const self = this;
      function done(): void {
        clearTimeout(timer);
        self.pendingAcks.delete(ack);
        resolve();
      }
      this.pendingAcks.set(ack, done);
      this.opts.pushAssignment(generation, this.lastAssignment, parts, ack);
    });
  }

  /** The client confirmed it stopped processing the revoked partitions. */
  revokeAck(ack: number): void {
    this.pendingAcks.get(ack)?.();
  }

  private releaseAcks(): void {
    for (const done of [...this.pendingAcks.values()]) done();
  }

  private checkAssignment(): void {
    if (this.endedReason !== null) return;
    let now: number[];
    try {
      now = [...this.sub.assignment()].sort((a, b) => a - b);
    } catch {
      return;
    }
    const prev = this.lastAssignment;
    if (now.length === prev.length && now.every((p, i) => p === prev[i])) return;
    const revoked = prev.filter((p) => !now.includes(p));
    const assigned = now.filter((p) => !prev.includes(p));
    this.lastAssignment = now;
    // Prefer the coordinator's generation when the embedded subscription exposes it.
    const g = (this.sub as unknown as { generation?: unknown }).generation;
    this.generation = typeof g === "number" ? g : this.generation + 1;
    for (const p of revoked) this.dropPartition(p);
    this.opts.pushAssignment(this.generation, now, revoked);
    void assigned;
  }

  private dropPartition(p: number): void {
    this.delivered.delete(p);
    this.deliveredGen.delete(p);
    const list = this.uncommitted.get(p);
    if (list) {
      this.uncommittedCount -= list.length;
      this.uncommitted.delete(p);
      this.wake();
    }
  }

  private hook(msg: Message): void {
    if (this.intercepting) return;
    const sig = msg.signal;
    if (!sig || this.hookedSignals.has(sig)) return;
    this.hookedSignals.add(sig);
    const onAbort = (): void => {
      // The embedded coordinator revoked this partition (or the subscription closed). Tell
      // the client now so it stops processing before the partition moves.
      if (this.endedReason !== null) return;
      this.checkAssignment();
      if (this.lastAssignment.includes(msg.partition)) {
        // assignment() not yet updated: report the revocation explicitly.
        this.lastAssignment = this.lastAssignment.filter((p) => p !== msg.partition);
        const g = (this.sub as unknown as { generation?: unknown }).generation;
        this.generation = typeof g === "number" ? g : this.generation + 1;
        this.dropPartition(msg.partition);
        this.opts.pushAssignment(this.generation, this.lastAssignment, [msg.partition]);
      }
    };
    if (sig.aborted) onAbort();
    else sig.addEventListener("abort", onAbort, { once: true });
  }

  private async pump(): Promise<void> {
    const nextRaw = (this.sub as unknown as { nextRaw?: unknown }).nextRaw;
    if (typeof nextRaw === "function" && this.opts.pushRaw && this.commitHook) {
      return this.pumpRaw(nextRaw.bind(this.sub) as (maxBytes: number, maxRecords: number) => Promise<RawChunk | null>);
    }
    try {
      // The embedded subscription's batch iterator hands over whatever is buffered (up to
      // maxBatchMessages) per step: far fewer promise hops than per-message iteration. A batch
      // is requested only while credit is positive, so the client may receive up to
      // maxBatchMessages - 1 beyond its credit: its buffer is bounded by window + one batch.
      const it = this.sub.batches({ maxMessages: this.opts.maxBatchMessages, maxWaitMs: 0 })[Symbol.asyncIterator]();
      while (this.endedReason === null) {
        // Flow control: wait for credit, room for uncommitted messages and a writable socket.
        while (this.endedReason === null && (this.credit <= 0 || this.uncommittedCount >= this.opts.maxUncommitted)) {
          await new Promise<void>((resolve) => (this.creditWaiter = resolve));
        }
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

  /**
   * Raw mode: one read of stored batches per step, pushed without decoding. A step starts only
   * with positive credit and reads no batch past the one that reaches the credit (but at least
   * one batch, at most the subscription's maxBytes), so a client holds at most its window plus
   * the records of one stored batch.
   */
  private async pumpRaw(nextRaw: (maxBytes: number, maxRecords: number) => Promise<RawChunk | null>): Promise<void> {
    const maxRead = Math.max(4096, Math.min(this.opts.maxBytes ?? 1024 * 1024, this.opts.maxPushBytes));
    try {
      while (this.endedReason === null) {
        while (this.endedReason === null && this.credit <= 0) {
          await new Promise<void>((resolve) => (this.creditWaiter = resolve));
        }
        if (this.endedReason !== null) break;
        const chunk = await nextRaw(maxRead, this.credit);
        if (chunk === null) break;
        this.deliverRaw(chunk);
      }
      this.finish(this.endedReason ?? "closed");
    } catch (err) {
      this.finish("error", err);
    }
  }

  private deliverRaw(chunk: RawChunk): void {
    // Revoked after the read: the partition's next owner delivers these records.
    if (this.endedReason !== null || chunk.signal.aborted) return;
    const p = chunk.partition;
    this.delivered.set(p, chunk.nextOffset - 1);
    this.deliveredGen.set(p, chunk.generation);
    this.credit -= chunk.records;
    if (!this.lastAssignment.length) this.checkAssignment();
    const writable = chunk.data.length <= this.opts.maxPushBytes ? this.opts.pushRaw!(chunk) : this.pushDecoded(chunk);
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
    for (const r of recs) {
      const size = 64 + (r.key?.length ?? 0) + (r.value?.length ?? 0);
      if (slice.length > 0 && (bytes + size > this.opts.maxPushBytes / 2 || slice.length >= this.opts.maxBatchMessages)) {
        writable = this.opts.push(slice) && writable;
        slice = [];
        bytes = 0;
      }
      slice.push(toConsumed(this.opts.topic, chunk.partition, r));
      bytes += size;
    }
    if (slice.length > 0) writable = this.opts.push(slice) && writable;
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

  private deliver(batch: Message[]): void {
    if (batch.length === 0 || this.endedReason !== null) return;
    for (const m of batch) {
      if (this.commitHook) {
        this.delivered.set(m.partition, m.offset);
      } else {
        let list = this.uncommitted.get(m.partition);
        if (!list) {
          list = [];
          this.uncommitted.set(m.partition, list);
        }
        list.push(m);
        this.uncommittedCount++;
      }
      this.hook(m);
    }
    this.credit -= batch.length;
    if (!this.lastAssignment.length) this.checkAssignment();
    const writable = this.opts.push(batch);
    if (!writable) this.pauseUntilWritable();
  }

  /** Commits "processed through offset" for each (partition, offset) pair, in one durable
   * write when the embedded subscription offers `commitOffsets` (one fsync for all partitions,
   * exactly what its own batch commit does), else via the delivered messages' commit().
   * A pair may carry a third element, the generation the records were pushed with
   * (PUSH_RECORD_BATCHES): a commit from an earlier ownership period of the partition is
   * refused with StaleGenerationError even if the partition came back to this member. */
  async commit(offsets: ([number, number] | [number, number, number])[]): Promise<void> {
    if (this.endedReason !== null) {
      throw new StaleGenerationError(
        `member ${this.id} of group ${JSON.stringify(this.opts.group)} is no longer active (${this.endedReason}); ` +
          "its partitions may have moved to another member",
      );
    }
    if (this.commitHook) {
      const next = new Map<number, number>();
      for (const [partition, offset, generation] of offsets) {
        const hi = this.delivered.get(partition);
        if (generation !== undefined && (hi === undefined || this.deliveredGen.get(partition) !== generation)) {
          if (hi === undefined && !this.lastAssignment.includes(partition)) {
            throw new NotAssignedError(
              `partition ${partition} of ${JSON.stringify(this.opts.topic)} is not assigned to member ${this.id} of group ${JSON.stringify(this.opts.group)}`,
            );
          }
          throw new StaleGenerationError(
            `partition ${partition} of ${JSON.stringify(this.opts.topic)} was revoked from member ${this.id} after generation ${generation} and assigned again; ` +
              "records of the earlier ownership period can no longer be committed",
          );
        }
        if (hi === undefined) {
          if (!this.lastAssignment.includes(partition)) {
            throw new NotAssignedError(
              `partition ${partition} of ${JSON.stringify(this.opts.topic)} is not assigned to member ${this.id} of group ${JSON.stringify(this.opts.group)}`,
            );
          }
          continue; // nothing delivered in this ownership period: nothing to commit
        }
        if (offset < 0) throw new ValidationError(`invalid offset ${offset}`);
        // "Processed through `offset`" for an offset this member was given (never beyond).
        next.set(partition, Math.min(offset, hi) + 1);
      }
      if (next.size > 0) await this.commitHook(next);
      return;
    }
    const targets: Message[] = [];
    for (const [partition, offset] of offsets) {
      const list = this.uncommitted.get(partition);
      let idx = -1;
      if (list) {
        // Highest delivered message with offset <= requested (usually exactly equal).
        for (let i = list.length - 1; i >= 0; i--) {
          if (list[i].offset <= offset) {
            idx = i;
            break;
          }
        }
      }
      if (idx < 0) {
        if (!this.lastAssignment.includes(partition)) {
          throw new NotAssignedError(
            `partition ${partition} of ${JSON.stringify(this.opts.topic)} is not assigned to member ${this.id} of group ${JSON.stringify(this.opts.group)}`,
          );
        }
        // Already committed (or never delivered, which a correct client cannot ask for): nothing to do.
        continue;
      }
      targets.push(list![idx]);
    }
    if (targets.length === 0) return;
    await Promise.all(targets.map((m) => m.commit()));
    for (const msg of targets) {
      // Drop everything at or below the committed message; the array may have changed during
      // the await (more deliveries appended, or the partition dropped).
      const cur = this.uncommitted.get(msg.partition);
      if (!cur) continue;
      let n = 0;
      while (n < cur.length && cur[n].offset <= msg.offset) n++;
      cur.splice(0, n);
      this.uncommittedCount -= n;
    }
    this.wake();
  }

  assignment(): number[] {
    return this.lastAssignment;
  }

  private finish(reason: string, error?: unknown): void {
    const first = this.endedReason === null;
    if (first) this.endedReason = reason;
    this.releaseAcks();
    clearInterval(this.assignmentTimer);
    this.uncommitted.clear();
    this.uncommittedCount = 0;
    this.delivered.clear();
    this.deliveredGen.clear();
    this.wake();
    if (first) this.opts.pushEnded(reason, error);
  }

  /** Leaves the group (partitions are reassigned by the coordinator). */
  async close(reason = "closed"): Promise<void> {
    if (this.endedReason === null) this.endedReason = reason;
    this.releaseAcks();
    clearInterval(this.assignmentTimer);
    this.ac.abort();
    this.wake();
    try {
      await this.sub.close();
    } catch {
      // closing is best effort; the coordinator drops the member either way
    }
    this.uncommitted.clear();
    this.uncommittedCount = 0;
  }
}
