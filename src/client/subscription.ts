// SPDX-License-Identifier: Apache-2.0
/**
 * A group member over the network. The server pushes messages while we hold credit; we grant
 * more credit as the application consumes, so at most `windowMessages` messages (plus one
 * push) are buffered here and none pile up in the server. Commits name (partition, offset,
 * generation); the server commits "processed through" for the group.
 *
 * Pushes normally carry stored record batches as the server read them (PUSH_RECORD_BATCHES):
 * they are checked and indexed on arrival (src/client/record-batches.ts) and each record
 * becomes a `Message` only when the application takes it, so buffered records cost no
 * objects. PUSH_MESSAGES (records one by one) comes from servers whose broker cannot read raw.
 *
 * Revocation: the server pushes every assignment change; messages of a revoked partition have
 * their `signal` aborted and are dropped from the local buffer. If the member's session ends
 * (connection lost, or no heartbeat for the session timeout, e.g. a frozen process) we join
 * again as a new member; commits of messages from the old member fail with
 * `NotAssignedError` (as embedded) because their partitions may have moved.
 */
import { drainTimeoutOption, InFlightGate } from "../streams/drain.js";
import { AbortedError, NotAssignedError, ProtocolError } from "../errors.js";
import type { Message, MessageBatch, SubscribeOptions, Subscription } from "../types.js";
import { Op, decodeConsumedRecords, wireToError, type Frame, type WireError } from "../wire/index.js";
import { readRecordInto, scanPushedBatches, type RecordFields, type RecordTable } from "./record-batches.js";
import type { Transport } from "./transport.js";
import { COMMIT_LINGER_MS, CommitCoalescer, maxPendingCommitsOption, type CommitMark } from "../streams/commit-coalescer.js";

export interface RemoteSubscriptionOptions {
  windowMessages: number;
  sessionTimeoutMs: number;
}

let nextSubId = 1;
/** Upper bound on a window raised by batches() (the server accepts up to 100 000 at once). */
const MAX_WINDOW = 100_000;
/** Where readRecordInto puts one record's fields before they go into a RemoteMessage. */
const scratch: RecordFields = { key: null, value: null, headers: {} };

interface MemberState {
  id: number;
  ended: boolean;
  /** Per partition: aborts when the partition is revoked from this member (or the
   * subscription closes). One combined signal per partition, shared by its messages. */
  partitionSignals: Map<number, { ac: AbortController; signal: AbortSignal }>;
  /** Per partition: the generation in which it was last revoked from this member. Pushes of
   * that generation or older are dropped (their records go to the next owner). */
  revokedIn: Map<number, number>;
  /** `msg.commit()` of this member's messages (one closure per member). */
  commit: (m: RemoteMessage<unknown>) => Promise<void>;
  /** Commit marks of this member, one COMMIT request in flight at a time (COMMIT-1). */
  commits: CommitCoalescer;
}

/** A message delivered to a remote member. Private fields keep it a plain-looking record. */
class RemoteMessage<T> implements Message<T> {
  readonly #member: MemberState;
  /** Generation of the push (PUSH_RECORD_BATCHES), sent with commits for fencing; -1: none. */
  readonly #generation: number;
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
    member: MemberState,
    generation: number,
  ) {
    this.#member = member;
    this.#generation = generation;
  }
  commit(): Promise<void> {
    return this.#member.commit(this as RemoteMessage<unknown>);
  }
  static memberOf(m: Message<unknown>): MemberState {
    return (m as RemoteMessage<unknown>).#member;
  }
  static generationOf(m: Message<unknown>): number {
    return (m as RemoteMessage<unknown>).#generation;
  }
}

/** The not yet taken records of one PUSH_RECORD_BATCHES frame. */
class RawSegment {
  next = 0;
  constructor(
    readonly table: RecordTable,
    readonly partition: number,
    readonly generation: number,
    readonly member: MemberState,
    readonly signal: AbortSignal,
    /** Records below this offset are replays after a reset (`msg.replay`); 0: none. */
    readonly replayUntil: number,
  ) {}
  get left(): number {
    return this.table.count - this.next;
  }
}

type Buffered<T> = RemoteMessage<T> | RawSegment;

function memberOfEntry(e: Buffered<unknown>): MemberState {
  return e instanceof RawSegment ? e.member : RemoteMessage.memberOf(e);
}

export class RemoteSubscription<T> implements Subscription<T> {
  readonly group: string;
  readonly topic: string;
  private member: MemberState | null = null;
  /** Taken from `head` on; RawSegments yield their records one by one. */
  private buffer: Buffered<T>[] = [];
  private waiter: (() => void) | null = null;
  private consumedSinceCredit = 0;
  /** The credit window: `windowMessages`, raised by batches() to hold two batches. */
  private window: number;
  private closed = false;
  /** What the loop holds while the signal's abort drains the subscription (drain.ts). */
  private readonly gate = new InFlightGate();
  private draining = false;
  private readonly drainTimeoutMs: number;
  private joinError: unknown = null;
  private currentAssignment: number[] = [];
  private currentGeneration = 0;
  private readonly closeAc = new AbortController();
  private joining: Promise<void> | null = null;
  private readonly maxPendingCommits: number;

  constructor(
    private readonly transport: Transport,
    private readonly registry: Map<number, RemoteSubscription<unknown>>,
    topic: string,
    private readonly opts: SubscribeOptions,
    private readonly ropts: RemoteSubscriptionOptions,
  ) {
    this.group = opts.group;
    this.topic = topic;
    this.window = ropts.windowMessages;
    this.maxPendingCommits = maxPendingCommitsOption(opts.maxPendingCommits);
    this.drainTimeoutMs = drainTimeoutOption(opts.drainTimeoutMs);
    if (opts.signal) {
      if (opts.signal.aborted) this.closed = true;
      else opts.signal.addEventListener("abort", () => void this.drainThenClose(), { once: true });
    }
    if (!this.closed) void this.join();
  }

  /** Join (or re-join) the group as a new member. */
  join(): Promise<void> {
    if (this.joining) return this.joining;
    this.joining = (async () => {
      const old = this.member;
      if (old) this.endMember(old);
      if (this.closed) return;
      const id = nextSubId++;
      const member: MemberState = { id, ended: false, partitionSignals: new Map(), revokedIn: new Map(), commit: null!, commits: null! };
      // The new member starts with a full window of credit; nothing of the old one is buffered.
      this.consumedSinceCredit = 0;
      member.commit = this.messageCommit(member);
      member.commits = new CommitCoalescer((marks) => this.writeCommits(member, marks), this.maxPendingCommits, COMMIT_LINGER_MS);
      this.member = member;
      this.registry.set(id, this as RemoteSubscription<unknown>);
      try {
        await this.transport.rpc.Subscribe({
            sub: id,
            topic: this.topic,
            group: this.opts.group,
            start: this.opts.start,
            offsetReset: this.opts.offsetReset,
            assignment: this.opts.assignment,
            maxBytes: this.opts.maxBytes,
            credit: this.window,
            sessionTimeoutMs: this.ropts.sessionTimeoutMs,
            // This client decodes stored batches (PUSH_RECORD_BATCHES); older ones do not ask.
            recordBatches: true,
        });
      } catch (err) {
        this.registry.delete(id);
        member.ended = true;
        const code = (err as { code?: string }).code;
        if (code === "CONNECTION_CLOSED" || code === "TIMEOUT") return; // onReconnect joins again
        this.joinError = err;
        this.wake();
      }
    })().finally(() => (this.joining = null));
    return this.joining;
  }

  private endMember(m: MemberState): void {
    m.ended = true;
    this.registry.delete(m.id);
    for (const { ac } of m.partitionSignals.values()) ac.abort(new NotAssignedError("group member ended"));
    m.commits.abandon(new NotAssignedError("group member ended before the commit was written; its partitions may belong to another member now"));
    // Buffered messages of that member can no longer be committed: drop them (they are
    // redelivered to whoever owns the partition next).
    this.buffer = this.buffer.slice(this.head).filter((e) => memberOfEntry(e) !== m);
    this.head = 0;
    this.currentAssignment = [];
  }

  /** Transport reconnected: our member on the old connection is gone. */
  onReconnect(): void {
    if (this.closed) return;
    void this.join();
  }

  onPush(f: Frame): void {
    const m = this.member;
    if (!m || m.ended || f.meta.sub !== m.id) return;
    switch (f.op) {
      case Op.PushRecordBatches: {
        // Stored batches as the server read them; records below `from` are skipped.
        const partition = f.meta.partition;
        const generation = f.meta.generation;
        const from = f.meta.from;
        const replayUntil = f.meta.replayUntil ?? 0; // absent: no replays (and older servers)
        if (!Number.isSafeInteger(partition) || !Number.isSafeInteger(generation) || !Number.isSafeInteger(from) || !Number.isSafeInteger(replayUntil)) {
          throw new ProtocolError("PUSH_RECORD_BATCHES needs integer partition, generation, from and replayUntil");
        }
        const p = partition as number;
        const gen = generation as number;
        const table = scanPushedBatches(f.body, from as number);
        const revokedIn = m.revokedIn.get(p);
        if (revokedIn !== undefined && gen <= revokedIn) {
          // Pushed before a revocation we already applied: the next owner gets these records.
          // Their credit comes back, or the window would shrink for good.
          this.consumedSinceCredit += table.count;
          this.maybeGrantCredit();
          break;
        }
        if (table.count > 0) this.buffer.push(new RawSegment(table, p, gen, m, this.partitionSignal(m, p), replayUntil as number));
        this.wake();
        break;
      }
      case Op.PushMessages: {
        const recs = decodeConsumedRecords(this.topic, f.body);
        const replay = new Map(Array.isArray(f.meta.replay) ? (f.meta.replay as [number, number][]) : []); // [partition, replayUntil]
        for (const r of recs) {
          const isReplay = r.offset < (replay.get(r.partition) ?? 0);
          this.buffer.push(new RemoteMessage<T>(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value as T, r.headers, this.partitionSignal(m, r.partition), isReplay, m, -1));
        }
        this.wake();
        break;
      }
      case Op.PushAssignment: {
        const assigned = (f.meta.assigned as number[]) ?? [];
        const revoked = (f.meta.revoked as number[]) ?? [];
        this.currentAssignment = [...assigned];
        this.currentGeneration = Number(f.meta.generation ?? 0);
        for (const p of revoked) {
          m.partitionSignals.get(p)?.ac.abort(new NotAssignedError(`partition ${p} was revoked`));
          m.partitionSignals.delete(p);
          m.revokedIn.set(p, this.currentGeneration);
        }
        if (revoked.length) {
          const live = this.buffer.slice(this.head);
          this.buffer = [];
          this.head = 0;
          for (const e of live) {
            if (!revoked.includes(e.partition)) this.buffer.push(e);
            else this.consumedSinceCredit += e instanceof RawSegment ? e.left : 1;
          }
          this.maybeGrantCredit();
        }
        // Revocation handshake: signals are aborted and buffered messages dropped; the
        // partitions may move to their new owner now.
        if (typeof f.meta.ack === "number") this.transport.sendOneWay(Op.RevokeAck, { sub: m.id, ack: f.meta.ack });
        try {
          this.opts.onRebalance?.({ type: "group:rebalance", generation: this.currentGeneration, assigned: [...assigned].sort((a, b) => a - b), revoked: [...revoked].sort((a, b) => a - b) });
        } catch {
          // The option's contract: exceptions are ignored (the subscription goes on).
        }
        break;
      }
      case Op.PushSubscriptionEnded: {
        this.endMember(m);
        if (!this.closed) {
          const err = f.meta.error as { code?: string } | undefined;
          if (err && err.code && err.code !== "BROKER_CLOSED" && err.code !== "CONNECTION_CLOSED" && f.meta.reason === "error") {
            // A non-recoverable error from the broker (e.g. topic deleted): surface it.
            this.joinError = wireToError(err as WireError);
            this.wake();
          } else {
            // Session expired or the broker ended the member: join again after a short pause.
            setTimeout(() => void this.join(), 50).unref();
          }
        }
        break;
      }
    }
  }

  /** One signal per (member, partition), shared by its messages; aborts on revocation. */
  private partitionSignal(m: MemberState, partition: number): AbortSignal {
    let ps = m.partitionSignals.get(partition);
    if (!ps) {
      const ac = new AbortController();
      ps = { ac, signal: AbortSignal.any([ac.signal, this.closeAc.signal]) };
      m.partitionSignals.set(partition, ps);
    }
    return ps.signal;
  }

  /**
   * `msg.commit()` for messages of member `m`: a mark, written with the others made meanwhile
   * (COMMIT-1). A message of a revoked ownership period is refused, even if the partition has
   * since come back to this member (that could move the offset back): the mark's signal is
   * the period's.
   */
  private messageCommit(m: MemberState): (msg: RemoteMessage<unknown>) => Promise<void> {
    return (msg) => (this.gate.committed(msg), m.commits.mark(msg.partition, { offset: msg.offset, generation: RemoteMessage.generationOf(msg), signal: msg.signal }));
  }

  /** One COMMIT request with the marks of member `m` made since its last one. */
  private async writeCommits(m: MemberState, marks: Map<number, CommitMark>): Promise<void> {
    const offsets: ([number, number] | [number, number, number])[] = [];
    for (const [p, k] of marks) offsets.push(k.generation >= 0 ? [p, k.offset, k.generation] : [p, k.offset]);
    await this.commitOffsets(m, offsets);
  }

  /**
   * `batch.commit()`: the highest offset per partition, grouped per member (a batch may
   * straddle a rejoin), with the generation it was pushed in. Computed synchronously, so the
   * commit in flight does not keep the batch's messages (and the frames they view) alive.
   */
  private commitBatch(messages: readonly Message<T>[]): Promise<void> {
    // Messages of one (member, partition, ownership period) share one signal: the per-message
    // work is a comparison; maps are touched once per signal.
    type Last = { member: MemberState; partition: number; offset: number; generation: number; count: number };
    const bySignal = new Map<AbortSignal, Last>();
    let lastSignal: AbortSignal | null = null;
    let cur: Last | undefined;
    for (const m of messages) {
      if (m.signal !== lastSignal) {
        lastSignal = m.signal;
        if (m.signal.aborted && !RemoteMessage.memberOf(m).ended) {
          return Promise.reject(
            new NotAssignedError(
              `partition ${m.partition} of ${JSON.stringify(this.topic)} was revoked from this member (or the subscription closed) after this batch was delivered`,
            ),
          );
        }
        cur = bySignal.get(m.signal);
        if (!cur) {
          bySignal.set(m.signal, { member: RemoteMessage.memberOf(m), partition: m.partition, offset: m.offset, generation: RemoteMessage.generationOf(m), count: 1 });
          cur = bySignal.get(m.signal);
          continue;
        }
      }
      if (m.offset > cur!.offset) {
        cur!.offset = m.offset;
        cur!.generation = RemoteMessage.generationOf(m);
      }
      cur!.count++;
    }
    // Highest offset per partition, grouped per member (a batch may straddle a rejoin).
    const byMember = new Map<MemberState, Map<number, { offset: number; generation: number }>>();
    for (const e of bySignal.values()) {
      let parts = byMember.get(e.member);
      if (!parts) byMember.set(e.member, (parts = new Map()));
      const prev = parts.get(e.partition);
      if (!prev || e.offset > prev.offset) parts.set(e.partition, e);
    }
    const marks: Promise<void>[] = [];
    for (const [signal, e] of bySignal) {
      const best = byMember.get(e.member)!.get(e.partition)!;
      if (best === e) marks.push(e.member.commits.mark(e.partition, { offset: e.offset, generation: e.generation, signal }, e.count));
    }
    return Promise.all(marks).then(() => {});
  }

  private async commitOffsets(m: MemberState, offsets: ([number, number] | [number, number, number])[]): Promise<void> {
    if (m.ended) {
      throw new NotAssignedError(
        `cannot commit: this message was delivered to a group member that has since ended (session expired or reconnected); ` +
          "its partition may belong to another member now",
      );
    }
    await this.transport.rpc.Commit({ sub: m.id, offsets });
  }

  private maybeGrantCredit(): void {
    const m = this.member;
    if (!m || m.ended) return;
    if (this.consumedSinceCredit >= Math.max(1, Math.floor(this.window / 2))) {
      this.transport.sendOneWay(Op.Credit, { sub: m.id, credit: this.consumedSinceCredit });
      this.consumedSinceCredit = 0;
    }
  }

  /**
   * Batches of N need a window of at least 2N: with less, the next batch cannot arrive while
   * the application works on (and commits) the current one, and every batch waits for a
   * round trip. Raises the window (bounded by MAX_WINDOW) and grants the difference at once.
   */
  private raiseWindow(n: number): void {
    const target = Math.min(n, MAX_WINDOW);
    if (target <= this.window) return;
    const extra = target - this.window;
    this.window = target;
    const m = this.member;
    if (!m || m.ended) return; // the next SUBSCRIBE grants the whole window
    const grant = (): void => {
      if (this.member === m && !m.ended) this.transport.sendOneWay(Op.Credit, { sub: m.id, credit: extra });
    };
    // A SUBSCRIBE in flight carried the old window: top it up once the member exists.
    if (this.joining) void this.joining.then(grant);
    else grant();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  private head = 0;

  /**
   * Moves buffered messages into `out` until it holds `max` or the buffer is empty, and
   * returns their credit (one check for the whole run). O(1) per message: a head index
   * advances, the array is compacted occasionally. A record of a RawSegment becomes its
   * Message here, when the application takes it.
   */
  private takeInto(out: Message<T>[], max: number): void {
    const before = out.length;
    try {
      while (out.length < max && this.head < this.buffer.length) {
        const e = this.buffer[this.head];
        if (e instanceof RawSegment) {
          const t = e.table;
          const end = Math.min(t.count, e.next + (max - out.length));
          while (e.next < end) {
            const i = e.next++;
            readRecordInto(scratch, t.buf, t.pos[i]);
            const offset = t.offset[i];
            out.push(new RemoteMessage<T>(this.topic, e.partition, offset, t.timestamp[i], scratch.key, scratch.value as T, scratch.headers, e.signal, offset < e.replayUntil, e.member, e.generation));
          }
          if (e.next >= t.count) this.head++;
        } else {
          this.head++;
          out.push(e);
        }
      }
    } finally {
      if (this.head >= this.buffer.length) {
        this.buffer = [];
        this.head = 0;
      } else if (this.head > 1024 && this.head * 2 > this.buffer.length) {
        this.buffer = this.buffer.slice(this.head);
        this.head = 0;
      }
      scratch.value = scratch.key = null;
      const n = out.length - before;
      if (n > 0) {
        this.consumedSinceCredit += n;
        this.maybeGrantCredit();
      }
    }
  }

  /** Reused by take(): one array per message was measurable garbage on the per-message path. */
  private readonly one: Message<T>[] = [];

  private take(): Message<T> | undefined {
    this.takeInto(this.one, 1);
    const m = this.one[0];
    this.one.length = 0;
    return m;
  }

  private async nextMessage(): Promise<Message<T> | null> {
    for (;;) {
      if (this.closed || this.draining) return null;
      if (this.joinError) {
        const e = this.joinError;
        this.joinError = null;
        throw e;
      }
      // COMMIT-1: no message while maxPendingCommits marks of this member are not yet durable.
      const room = this.member?.commits.room() ?? null;
      if (room !== null) {
        await room;
        continue;
      }
      const msg = this.take();
      if (msg) return msg;
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  assignment(): number[] {
    return [...this.currentAssignment];
  }

  /** Group generation of the last assignment this member received. */
  get generation(): number {
    return this.currentGeneration;
  }

  [Symbol.asyncIterator](): AsyncIterator<Message<T>> {
    return {
      next: () => {
        this.gate.back();
        // A buffered message with nothing to wait for (nextMessage's checks, in its order)
        // is handed out without async frames: most messages of a busy subscription.
        if (!this.closed && !this.draining && this.joinError === null && (this.member?.commits.room() ?? null) === null) {
          const msg = this.take();
          if (msg) {
            this.gate.handOut(msg);
            return Promise.resolve({ value: msg, done: false });
          }
        }
        return this.nextMessage().then((msg) => {
          if (msg) this.gate.handOut(msg);
          return msg ? { value: msg, done: false } : { value: undefined, done: true };
        });
      },
      return: async () => {
        this.gate.back();
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  batches(opts: { maxMessages?: number; maxWaitMs?: number } = {}): AsyncIterable<MessageBatch<T>> {
    const maxMessages = Math.max(1, opts.maxMessages ?? 500);
    const maxWaitMs = Math.max(0, opts.maxWaitMs ?? 50);
    this.raiseWindow(2 * maxMessages);
    const self = this;
    return {
      [Symbol.asyncIterator](): AsyncIterator<MessageBatch<T>> {
        return {
          async next() {
            self.gate.back();
            const first = await self.nextMessage();
            if (!first) return { value: undefined, done: true };
            const messages: Message<T>[] = [first];
            const deadline = Date.now() + maxWaitMs;
            while (messages.length < maxMessages) {
              const had = messages.length;
              self.takeInto(messages, maxMessages);
              if (messages.length > had) continue;
              const left = deadline - Date.now();
              if (left <= 0 || self.closed || self.draining) break;
              await new Promise<void>((r) => {
                const t = setTimeout(r, left);
                self.waiter = () => {
                  clearTimeout(t);
                  r();
                };
              });
            }
            const batch: MessageBatch<T> = {
              messages,
              commit: () => {
                self.gate.committed(batch);
                return self.commitBatch(messages);
              },
            };
            self.gate.handOut(batch);
            return { value: batch, done: false };
          },
          async return() {
            self.gate.back();
            await self.close();
            return { value: undefined, done: true };
          },
        };
      },
    };
  }

  private closing: Promise<void> | null = null;

  /**
   * The signal aborted: hand out nothing more, let the loop finish (and commit) the message it
   * holds, then leave (drain.ts); `close()` meanwhile closes at once.
   */
  private async drainThenClose(): Promise<void> {
    if (this.closing) return this.closing;
    this.draining = true;
    this.wake();
    await this.gate.settle(this.drainTimeoutMs);
    return this.close();
  }

  close(): Promise<void> {
    return (this.closing ??= this.doClose());
  }

  private async doClose(): Promise<void> {
    if (this.closed) return;
    // COMMIT-1: marks made before the close are written while the member still owns their
    // partitions (one attempt); then the member ends.
    const pending = this.member;
    if (pending && !pending.ended && pending.commits.pendingMarks > 0) await pending.commits.flush().catch(() => {});
    this.closed = true;
    this.closeAc.abort(new AbortedError("subscription closed"));
    this.wake();
    await this.joining?.catch(() => {});
    const m = this.member;
    if (m && !m.ended) {
      this.endMember(m);
      try {
        await this.transport.rpc.Unsubscribe({ sub: m.id });
      } catch {
        // Connection gone or client closing: the server drops the member with the connection.
      }
    }
    this.buffer = [];
    this.head = 0;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

