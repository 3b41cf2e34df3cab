// SPDX-License-Identifier: Apache-2.0
/**
 * A group member over the network. The server pushes messages while we hold credit; we grant
 * more credit as the application consumes, so at most `windowMessages` messages are buffered
 * here (and none pile up in the server). Commits name (partition, offset); the server commits
 * the matching message for the group.
 *
 * Revocation: the server pushes every assignment change; messages of a revoked partition have
 * their `signal` aborted and are dropped from the local buffer. If the member's session ends
 * (connection lost, or no heartbeat for the session timeout, e.g. a frozen process) we join
 * again as a new member; commits of messages from the old member fail with
 * `StaleGenerationError`/`NotAssignedError` because their partitions may have moved.
 */
import { AbortedError, NotAssignedError, StaleGenerationError } from "../errors.js";
import type { Message, MessageBatch, SubscribeOptions, Subscription } from "../types.js";
import { Op, decodeConsumedRecords, wireToError, type Frame, type WireError } from "../server/protocol.js";
import type { Transport } from "./transport.js";

export interface RemoteSubscriptionOptions {
  windowMessages: number;
  sessionTimeoutMs: number;
}

let nextSubId = 1;

interface MemberState {
  id: number;
  ended: boolean;
  /** Per partition: aborts when the partition is revoked from this member (or the
   * subscription closes). One combined signal per partition, shared by its messages. */
  partitionSignals: Map<number, { ac: AbortController; signal: AbortSignal }>;
}

/** A message delivered to a remote member. Private fields keep it a plain-looking record. */
class RemoteMessage<T> implements Message<T> {
  readonly #member: MemberState;
  readonly #commit: (m: RemoteMessage<T>) => Promise<void>;
  constructor(
    readonly topic: string,
    readonly partition: number,
    readonly offset: number,
    readonly timestamp: number,
    readonly key: Uint8Array | null,
    readonly value: T,
    readonly headers: Record<string, Uint8Array>,
    readonly signal: AbortSignal,
    member: MemberState,
    commit: (m: RemoteMessage<T>) => Promise<void>,
  ) {
    this.#member = member;
    this.#commit = commit;
  }
  commit(): Promise<void> {
    return this.#commit(this);
  }
  static memberOf(m: Message<unknown>): MemberState {
    return (m as RemoteMessage<unknown>).#member;
  }
}

export class RemoteSubscription<T> implements Subscription<T> {
  readonly group: string;
  readonly topic: string;
  private member: MemberState | null = null;
  private buffer: Message<T>[] = [];
  private waiter: (() => void) | null = null;
  private consumedSinceCredit = 0;
  private closed = false;
  private joinError: unknown = null;
  private currentAssignment: number[] = [];
  private currentGeneration = 0;
  private readonly closeAc = new AbortController();
  private joining: Promise<void> | null = null;

  constructor(
    private readonly transport: Transport,
    private readonly registry: Map<number, RemoteSubscription<unknown>>,
    topic: string,
    private readonly opts: SubscribeOptions,
    private readonly ropts: RemoteSubscriptionOptions,
  ) {
    this.group = opts.group;
    this.topic = topic;
    if (opts.signal) {
      if (opts.signal.aborted) this.closed = true;
      else opts.signal.addEventListener("abort", () => void this.close(), { once: true });
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
      const member: MemberState = { id, ended: false, partitionSignals: new Map() };
      this.member = member;
      this.registry.set(id, this as RemoteSubscription<unknown>);
      try {
        await this.transport.request(
          Op.Subscribe,
          {
            sub: id,
            topic: this.topic,
            group: this.opts.group,
            start: this.opts.start,
            offsetReset: this.opts.offsetReset,
            assignment: this.opts.assignment,
            maxBytes: this.opts.maxBytes,
            credit: this.ropts.windowMessages,
            sessionTimeoutMs: this.ropts.sessionTimeoutMs,
          },
          null,
          { retry: false },
        );
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
    for (const { ac } of m.partitionSignals.values()) ac.abort(new StaleGenerationError("group member ended"));
    // Buffered messages of that member can no longer be committed: drop them (they are
    // redelivered to whoever owns the partition next).
    this.buffer = this.buffer.slice(this.head).filter((msg) => RemoteMessage.memberOf(msg) !== m);
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
      case Op.PushMessages: {
        const recs = decodeConsumedRecords(this.topic, f.body);
        const commit = (msg: RemoteMessage<T>): Promise<void> => {
          // A message of a revoked ownership period must not be committed, even if the
          // partition has since come back to this member (that could move the offset back).
          if (msg.signal.aborted && !m.ended) {
            return Promise.reject(
              new NotAssignedError(
                `partition ${msg.partition} of ${JSON.stringify(this.topic)} was revoked from this member (or the subscription closed) after this message was delivered`,
              ),
            );
          }
          return this.commitOffsets(m, [[msg.partition, msg.offset]]);
        };
        for (const r of recs) {
          let ps = m.partitionSignals.get(r.partition);
          if (!ps) {
            const ac = new AbortController();
            ps = { ac, signal: AbortSignal.any([ac.signal, this.closeAc.signal]) };
            m.partitionSignals.set(r.partition, ps);
          }
          this.buffer.push(
            new RemoteMessage<T>(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value as T, r.headers, ps.signal, m, commit),
          );
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
          m.partitionSignals.get(p)?.ac.abort(new StaleGenerationError(`partition ${p} was revoked`));
          m.partitionSignals.delete(p);
        }
        if (revoked.length) {
          const live = this.buffer.slice(this.head);
          this.buffer = live.filter((msg) => !revoked.includes(msg.partition));
          this.head = 0;
          this.consumedSinceCredit += live.length - this.buffer.length;
          this.maybeGrantCredit();
        }
        // Revocation handshake: signals are aborted and buffered messages dropped; the
        // partitions may move to their new owner now.
        if (typeof f.meta.ack === "number") this.transport.sendOneWay(Op.RevokeAck, { sub: m.id, ack: f.meta.ack });
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

  private async commitOffsets(m: MemberState, offsets: [number, number][]): Promise<void> {
    if (m.ended) {
      throw new StaleGenerationError(
        `cannot commit: this message was delivered to a group member that has since ended (session expired or reconnected); ` +
          "its partition may belong to another member now",
      );
    }
    await this.transport.request(Op.Commit, { sub: m.id, offsets }, null, { retry: false });
  }

  private maybeGrantCredit(): void {
    const m = this.member;
    if (!m || m.ended) return;
    if (this.consumedSinceCredit >= Math.max(1, Math.floor(this.ropts.windowMessages / 2))) {
      this.transport.sendOneWay(Op.Credit, { sub: m.id, credit: this.consumedSinceCredit });
      this.consumedSinceCredit = 0;
    }
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  private head = 0;
  /** O(1) dequeue: advance a head index, compact occasionally. */
  private shift(): Message<T> | undefined {
    if (this.head >= this.buffer.length) {
      if (this.head > 0) {
        this.buffer = [];
        this.head = 0;
      }
      return undefined;
    }
    const m = this.buffer[this.head++];
    if (this.head > 1024 && this.head * 2 > this.buffer.length) {
      this.buffer = this.buffer.slice(this.head);
      this.head = 0;
    }
    return m;
  }

  private take(): Message<T> | undefined {
    const msg = this.shift();
    if (msg) {
      this.consumedSinceCredit++;
      this.maybeGrantCredit();
    }
    return msg;
  }

  private async nextMessage(): Promise<Message<T> | null> {
    for (;;) {
      if (this.closed) return null;
      if (this.joinError) {
        const e = this.joinError;
        this.joinError = null;
        throw e;
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
      next: async () => {
        const msg = await this.nextMessage();
        return msg ? { value: msg, done: false } : { value: undefined, done: true };
      },
      return: async () => {
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  batches(opts: { maxMessages?: number; maxWaitMs?: number } = {}): AsyncIterable<MessageBatch<T>> {
    const maxMessages = Math.max(1, opts.maxMessages ?? 500);
    const maxWaitMs = Math.max(0, opts.maxWaitMs ?? 50);
    const self = this;
    return {
      [Symbol.asyncIterator](): AsyncIterator<MessageBatch<T>> {
        return {
          async next() {
            const first = await self.nextMessage();
            if (!first) return { value: undefined, done: true };
            const messages: Message<T>[] = [first];
            const deadline = Date.now() + maxWaitMs;
            while (messages.length < maxMessages) {
              const m = self.take();
              if (m) {
                messages.push(m);
                continue;
              }
              const left = deadline - Date.now();
              if (left <= 0 || self.closed) break;
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
              commit: async () => {
                // Highest offset per partition, grouped per member (a batch may straddle a rejoin).
                const byMember = new Map<MemberState, Map<number, number>>();
                for (const m of messages) {
                  if (m.signal.aborted && !RemoteMessage.memberOf(m).ended) {
                    throw new NotAssignedError(
                      `partition ${m.partition} of ${JSON.stringify(self.topic)} was revoked from this member (or the subscription closed) after this batch was delivered`,
                    );
                  }
                  const ms = RemoteMessage.memberOf(m);
                  let mp = byMember.get(ms);
                  if (!mp) byMember.set(ms, (mp = new Map()));
                  mp.set(m.partition, Math.max(mp.get(m.partition) ?? -1, m.offset));
                }
                for (const [ms, mp] of byMember) await self.commitOffsets(ms, [...mp.entries()]);
              },
            };
            return { value: batch, done: false };
          },
          async return() {
            await self.close();
            return { value: undefined, done: true };
          },
        };
      },
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.closeAc.abort(new AbortedError("subscription closed"));
    this.wake();
    await this.joining?.catch(() => {});
    const m = this.member;
    if (m && !m.ended) {
      this.endMember(m);
      try {
        await this.transport.request(Op.Unsubscribe, { sub: m.id }, null, { retry: false });
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

