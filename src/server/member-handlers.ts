// SPDX-License-Identifier: Apache-2.0
/**
 * Group members across processes (docs/protocol.md §6): SUBSCRIBE, COMMIT, UNSUBSCRIBE and the
 * one-way CREDIT, REVOKE_ACK and HEARTBEAT. Each member is a `RemoteMember`; its pushes go out
 * through the session.
 */
import { NotAssignedError, ValidationError } from "../errors.js";
import { DEFAULT_MAX_FRAME_BYTES, encodeConsumedRecords, encodeFrame, encodeFrameHead, errorToWire, FLAG_PUSH, Op, type Frame } from "../wire/index.js";
import { RemoteMember } from "./remote-member.js";
import { int, str, type OneWayHandlers, type Reply, type RequestHandler, type Session } from "./session.js";

const EMPTY: Reply = { meta: {} };
/** Messages per PUSH_MESSAGES frame. */
const MAX_PUSH_MESSAGES = 1000;

function pick<T extends string>(m: Record<string, unknown>, key: string, allowed: readonly T[]): T | undefined {
  const v = m[key];
  if (v === undefined || v === null) return undefined;
  const found = allowed.find((a) => a === v);
  if (found === undefined) throw new ValidationError(`${key} must be one of ${allowed.join(", ")}`);
  return found;
}

function subscribe(s: Session, f: Frame): Reply {
  const m = f.meta;
  const { limits } = s;
  if (s.members.size >= limits.maxSubscriptionsPerConnection) {
    throw new ValidationError(`at most ${limits.maxSubscriptionsPerConnection} subscriptions per connection`);
  }
  const sub = int(m, "sub");
  if (s.members.has(sub)) throw new ValidationError(`subscription id ${sub} is already in use`);
  const topic = str(m, "topic");
  const credit = Math.max(1, Math.min(int(m, "credit", true) ?? 1000, 100_000));
  const sessionTimeoutMs = Math.max(
    limits.minSessionTimeoutMs,
    Math.min(int(m, "sessionTimeoutMs", true) ?? limits.defaultSessionTimeoutMs, limits.maxSessionTimeoutMs),
  );
  const member: RemoteMember = new RemoteMember({
    id: sub,
    host: s.host,
    topic,
    group: str(m, "group"),
    start: pick(m, "start", ["earliest", "latest"] as const),
    offsetReset: pick(m, "offsetReset", ["earliest", "latest", "error"] as const),
    assignment: pick(m, "assignment", ["range", "roundrobin"] as const),
    maxBytes: int(m, "maxBytes", true),
    credit,
    maxBatchMessages: MAX_PUSH_MESSAGES,
    // The client's frame reader takes DEFAULT_MAX_FRAME_BYTES; keep room for the head.
    maxPushBytes: Math.min(limits.maxFrameBytes, DEFAULT_MAX_FRAME_BYTES) - 64 * 1024,
    revokeTimeoutMs: Math.min(sessionTimeoutMs, 10_000),
    // Only for clients that announced PUSH_RECORD_BATCHES (the others get PUSH_MESSAGES).
    pushRaw:
      m.recordBatches === true
        ? (c) =>
            // Stored batches go out as they are: the head is encoded, the bytes are not copied.
            s.sendParts(
              encodeFrameHead(
                Op.PushRecordBatches,
                FLAG_PUSH,
                0,
                // replayUntil only when some record of the push is a replay (older clients ignore it).
                { sub, partition: c.partition, generation: c.generation, from: c.from, records: c.records, replayUntil: c.replayUntil > c.from ? c.replayUntil : undefined },
                c.data.length,
              ),
              c.data,
            )
        : undefined,
    push: (msgs, replay) => s.send(encodeFrame(Op.PushMessages, FLAG_PUSH, 0, { sub, topic, replay }, encodeConsumedRecords(msgs))),
    pushAssignment: (generation, assigned, revoked, ack) => {
      s.send(encodeFrame(Op.PushAssignment, FLAG_PUSH, 0, { sub, generation, assigned, revoked, ack }));
    },
    pushEnded: (reason, error) => {
      if (s.members.get(sub) === member) {
        s.members.delete(sub);
        s.rememberEnded(sub, reason);
      }
      s.send(encodeFrame(Op.PushSubscriptionEnded, FLAG_PUSH, 0, { sub, reason, error: error === undefined ? undefined : errorToWire(error) }));
    },
    waitWritable: () => s.waitWritable(),
  });
  s.members.set(sub, member);
  s.armLiveness(sessionTimeoutMs);
  return { meta: { sub, sessionTimeoutMs } };
}

type CommitPair = [number, number] | [number, number, number];

async function commit(s: Session, f: Frame): Promise<Reply> {
  const sub = int(f.meta, "sub");
  const offsets = f.meta.offsets;
  if (!Array.isArray(offsets) || offsets.length > 100_000) throw new ValidationError("offsets must be an array");
  const pairs: CommitPair[] = [];
  for (const o of offsets) {
    if (!Array.isArray(o) || (o.length !== 2 && o.length !== 3) || !o.every((v) => Number.isSafeInteger(v))) {
      throw new ValidationError("each offset must be [partition, offset] or [partition, offset, generation]");
    }
    // Optional third element: the generation the records were pushed with (raw pushes).
    pairs.push(o.length === 3 ? [o[0], o[1], o[2]] : [o[0], o[1]]);
  }
  const member = s.members.get(sub);
  if (!member) {
    // The member ended (session expiry, unsubscribe) or never existed here: its partitions may
    // belong to another member now, which resumes from the last commit.
    const why = s.endedReason(sub);
    throw new NotAssignedError(
      why ? `group member ${sub} ended (${why}); its partitions may belong to another member now` : `unknown group member ${sub} on this connection`,
    );
  }
  await member.commit(pairs);
  // The wire carries the last processed offset; the line names the committed position (next to read), as groupLag does.
  for (const [partition, offset] of pairs) s.processing.commit(member.topic, member.group, partition, offset + 1);
  return EMPTY;
}

async function unsubscribe(s: Session, f: Frame): Promise<Reply> {
  const sub = int(f.meta, "sub");
  const member = s.members.get(sub);
  if (member) {
    s.members.delete(sub);
    s.rememberEnded(sub, "unsubscribed");
    await member.close("unsubscribed");
  }
  return EMPTY;
}

export const MEMBER_HANDLERS: { readonly Subscribe: RequestHandler; readonly Commit: RequestHandler; readonly Unsubscribe: RequestHandler } = {
  Subscribe: subscribe,
  Commit: commit,
  Unsubscribe: unsubscribe,
};

export const MEMBER_ONE_WAY_HANDLERS: OneWayHandlers = {
  // Every frame counts as a heartbeat (the connection notes when it last heard from the client).
  Heartbeat: () => {},
  RevokeAck: (s, f) => {
    const ack = int(f.meta, "ack");
    s.members.get(int(f.meta, "sub"))?.revokeAck(ack);
  },
  Credit: (s, f) => {
    const credit = int(f.meta, "credit");
    s.members.get(int(f.meta, "sub"))?.addCredit(credit);
  },
};
