// SPDX-License-Identifier: Apache-2.0
/**
 * The server's dispatch table: one handler per operation of the table in src/wire/ops.ts
 * (the compiler rejects a missing one). Topic, publish, fetch and group-admin operations are
 * here; group members in member-handlers.ts, work queues in queue-handlers.ts.
 *
 * A handler starts its broker call synchronously (before its first await), so pipelined
 * requests reach the broker in arrival order (docs/protocol.md §4).
 */
import { ValidationError } from "../errors.js";
import type { GroupListing, PublishBatchOptions, ResetTarget, TopicAlteration, TopicConfig } from "../types.js";
import { allOps, decodePublishRecords, encodeConsumedRecords, encodeReceipts, type Frame, type OpName } from "../wire/index.js";
import { MEMBER_HANDLERS, MEMBER_ONE_WAY_HANDLERS } from "./member-handlers.js";
import { QUEUE_HANDLERS } from "./queue-handlers.js";
import { SCHEDULE_HANDLERS } from "./schedule-handlers.js";
import { int, str, type OneWayHandler, type OneWayHandlers, type Reply, type RequestHandler, type RequestHandlers, type Session } from "./session.js";

const EMPTY: Reply = { meta: {} };

async function createTopic(s: Session, f: Frame): Promise<Reply> {
  const config = (f.meta.config ?? {}) as TopicConfig;
  if (typeof config !== "object" || Array.isArray(config)) throw new ValidationError("config must be an object");
  return { meta: { topic: await s.host.createTopic(str(f.meta, "name"), config, s.actor) } };
}

async function publish(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const topic = str(m, "topic");
  const records = decodePublishRecords(f.body, s.limits.maxRecordsPerBatch);
  const opts: PublishBatchOptions = { signal: s.signal };
  const pid = int(m, "producerId", true);
  if (pid !== undefined) {
    opts.producerId = pid;
    opts.producerEpoch = int(m, "producerEpoch", true);
    opts.baseSequence = int(m, "baseSequence", true);
  }
  return { meta: {}, body: encodeReceipts(await s.host.publishBatch(topic, records, opts)) };
}

async function publishEncoded(s: Session, f: Frame): Promise<Reply> {
  // The client's batch, in the storage format: stored as is after full validation.
  const topic = str(f.meta, "topic");
  const partition = int(f.meta, "partition");
  // The batch is kept until it is durable and counted at its own length (the pending bound).
  // A frame that arrived inside a larger socket chunk is a view into it: copy so the kept
  // bytes are what is counted, not the whole chunk.
  const batch = f.body.buffer.byteLength <= f.body.length + 4096 ? f.body : Buffer.from(f.body);
  const r = await s.host.publishEncoded(topic, partition, batch, s.signal);
  return { meta: { baseOffset: r.baseOffset, count: r.count, duplicate: r.duplicate, synced: r.synced } };
}

async function fetch(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const topic = str(m, "topic");
  const maxBytes = Math.min(int(m, "maxBytes", true) ?? 1024 * 1024, Math.floor(s.limits.maxFrameBytes / 2));
  const maxWaitMs = Math.min(int(m, "maxWaitMs", true) ?? 0, 300_000);
  const res = await s.host.fetch(topic, int(m, "partition"), int(m, "offset"), { maxBytes, maxWaitMs, signal: s.signal });
  return {
    meta: { nextOffset: res.nextOffset, highWatermark: res.highWatermark, logStartOffset: res.logStartOffset },
    body: encodeConsumedRecords(res.records),
  };
}

async function resetGroup(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  const result = await s.host.resetGroup(str(m, "group"), str(m, "topic"), m.to as ResetTarget, { dryRun: m.dryRun === true }, s.actor);
  return { meta: { result } };
}

/** A group is listed when the caller may see both it and its topic (ACL-4). */
function visibleGroups(s: Session, groups: GroupListing[]): GroupListing[] {
  const seen = s.gate.visible(s.principal, "group", groups, (g) => g.group);
  return s.gate.visible(s.principal, "topic", seen, (g) => g.topic);
}

export const REQUEST_HANDLERS: RequestHandlers = {
  Ping: () => EMPTY,
  CreateTopic: createTopic,
  DeleteTopic: async (s, f) => (await s.host.deleteTopic(str(f.meta, "name"), s.actor), EMPTY),
  // ACL-4: only what the caller may see is listed.
  ListTopics: async (s) => ({ meta: { topics: s.gate.visible(s.principal, "topic", await s.host.listTopics(), (t) => t) } }),
  DescribeTopic: async (s, f) => ({ meta: { topic: await s.host.describeTopic(str(f.meta, "name")) } }),
  // Setting retention to a value is idempotent: re-sent after a reconnect, it changes nothing more.
  AlterTopic: async (s, f) => ({ meta: { topic: await s.host.alterTopic(str(f.meta, "name"), (f.meta.changes ?? {}) as TopicAlteration, s.actor) } }),
  InitProducer: async (s, f) => ({ meta: await s.host.initProducer(int(f.meta, "producerId", true)) }),
  Publish: publish,
  PublishEncoded: publishEncoded,
  Fetch: fetch,
  OffsetForTimestamp: async (s, f) => ({
    meta: { offset: await s.host.offsetForTimestamp(str(f.meta, "topic"), int(f.meta, "partition"), int(f.meta, "timestamp")) },
  }),
  ResetGroup: resetGroup,
  GroupLag: async (s, f) => ({ meta: { lag: await s.host.groupLag(str(f.meta, "group"), str(f.meta, "topic")) } }),
  ListGroups: async (s, f) => ({ meta: { groups: visibleGroups(s, await s.host.listGroups(f.meta.topic === undefined ? {} : { topic: str(f.meta, "topic") })) } }),
  ...MEMBER_HANDLERS,
  ...QUEUE_HANDLERS,
  ...SCHEDULE_HANDLERS,
};

export const ONE_WAY_HANDLERS: OneWayHandlers = MEMBER_ONE_WAY_HANDLERS;

function byCode<H>(table: Partial<Record<OpName, H>>): ReadonlyMap<number, H> {
  const out = new Map<number, H>();
  for (const op of allOps()) {
    const h = table[op.name];
    if (h !== undefined) out.set(op.code, h);
  }
  return out;
}

/** Handlers by opcode: an opcode with neither is unknown to this server. */
export const requestHandler: ReadonlyMap<number, RequestHandler> = byCode(REQUEST_HANDLERS);
export const oneWayHandler: ReadonlyMap<number, OneWayHandler> = byCode(ONE_WAY_HANDLERS);
