// SPDX-License-Identifier: Apache-2.0
/**
 * The operation table of protocol version 1: the one place each operation is declared. The
 * opcode constants (`Op`), the known-ops check (`opName`), the server's dispatch table
 * (src/server/handlers.ts must have a handler for every request and one-way op, checked by the
 * compiler) and the client's stubs (src/client/rpc.ts) all derive from it, and
 * test/wire-ops.test.ts checks the table in docs/protocol.md §4 against it.
 *
 * Per op:
 * - `kind`: `request` (answered with the same opcode and correlation id), `oneway` (a client
 *   frame that gets no answer) or `push` (server to client, correlation id 0);
 * - `retry`: whether the client may send a request again on a new connection after the old
 *   one dropped with the request unanswered: `true` when doing it twice is harmless (reads,
 *   allocations), `false` when it could apply twice, `"caller"` when that depends on the
 *   request (its producer fields, a dry run, the admin action) and each call says;
 * - `request` / `response`: the meta and body, as docs/protocol.md §4 states them;
 * - `compat`: set on ops kept only for clients of protocol version 1 that predate their
 *   replacement, with the reason (docs/protocol.md §4 says which).
 */

export type OpKind = "request" | "oneway" | "push";
export type RetryRule = boolean | "caller";

export interface OpSpec {
  readonly code: number;
  /** The name in docs/protocol.md (upper snake case). */
  readonly wireName: string;
  readonly kind: OpKind;
  readonly retry: RetryRule;
  readonly request: string;
  readonly response: string;
  readonly compat?: string;
}

const NONE = "—";

export const OPS = {
  Hello: { code: 1, wireName: "HELLO", kind: "request", retry: false, request: "see §1", response: "see §1" },
  Ping: { code: 2, wireName: "PING", kind: "request", retry: true, request: "{}", response: "{}" },
  CreateTopic: { code: 10, wireName: "CREATE_TOPIC", kind: "request", retry: false, request: "{name, config}", response: "{topic: TopicDescription}" },
  DeleteTopic: { code: 11, wireName: "DELETE_TOPIC", kind: "request", retry: false, request: "{name}", response: "{}" },
  ListTopics: { code: 12, wireName: "LIST_TOPICS", kind: "request", retry: true, request: "{}", response: "{topics}" },
  DescribeTopic: { code: 13, wireName: "DESCRIBE_TOPIC", kind: "request", retry: true, request: "{name}", response: "{topic}" },
  AlterTopic: { code: 14, wireName: "ALTER_TOPIC", kind: "request", retry: true, request: "{name, changes: {retentionMs?, retentionBytes?}}", response: "{topic}" },
  Publish: {
    code: 20,
    wireName: "PUBLISH",
    kind: "request",
    retry: "caller",
    request: "{topic, producerId?, producerEpoch?, baseSequence?} + publish records",
    response: "receipts",
  },
  InitProducer: {
    code: 21,
    wireName: "INIT_PRODUCER",
    kind: "request",
    retry: "caller",
    request: "{producerId?}",
    response: "{producerId, producerEpoch}",
  },
  PublishEncoded: {
    code: 22,
    wireName: "PUBLISH_ENCODED",
    kind: "request",
    retry: "caller",
    request: "{topic, partition} + one record batch in the storage format",
    response: "{baseOffset, count, duplicate, synced}",
  },
  Fetch: {
    code: 30,
    wireName: "FETCH",
    kind: "request",
    retry: true,
    request: "{topic, partition, offset, maxBytes?, maxWaitMs?}",
    response: "{nextOffset, highWatermark, logStartOffset} + consumed records",
  },
  OffsetForTimestamp: {
    code: 31,
    wireName: "OFFSET_FOR_TIMESTAMP",
    kind: "request",
    retry: true,
    request: "{topic, partition, timestamp}",
    response: "{offset}",
  },
  Subscribe: {
    code: 40,
    wireName: "SUBSCRIBE",
    kind: "request",
    retry: false,
    request: "{sub, topic, group, start?, offsetReset?, assignment?, maxBytes?, credit, sessionTimeoutMs, recordBatches?}",
    response: "{sub, sessionTimeoutMs}",
  },
  Credit: { code: 41, wireName: "CREDIT", kind: "oneway", retry: false, request: "{sub, credit}", response: NONE },
  Commit: {
    code: 42,
    wireName: "COMMIT",
    kind: "request",
    retry: false,
    request: "{sub, offsets: [[partition, offset, generation?], ...]}",
    response: "{}",
  },
  Unsubscribe: { code: 43, wireName: "UNSUBSCRIBE", kind: "request", retry: false, request: "{sub}", response: "{}" },
  Heartbeat: { code: 44, wireName: "HEARTBEAT", kind: "oneway", retry: false, request: "{}", response: NONE },
  PushMessages: {
    code: 45,
    wireName: "PUSH_MESSAGES",
    kind: "push",
    retry: false,
    request: "{sub, topic, replay?} + consumed records",
    response: NONE,
    compat: "clients that do not announce recordBatches in SUBSCRIBE; also carries a stored batch larger than a frame",
  },
  PushAssignment: {
    code: 46,
    wireName: "PUSH_ASSIGNMENT",
    kind: "push",
    retry: false,
    request: "{sub, generation, assigned, revoked, ack?}",
    response: NONE,
  },
  PushSubscriptionEnded: { code: 47, wireName: "PUSH_SUBSCRIPTION_ENDED", kind: "push", retry: false, request: "{sub, reason, error?}", response: NONE },
  RevokeAck: { code: 48, wireName: "REVOKE_ACK", kind: "oneway", retry: false, request: "{sub, ack}", response: NONE },
  PushRecordBatches: {
    code: 49,
    wireName: "PUSH_RECORD_BATCHES",
    kind: "push",
    retry: false,
    request: "{sub, partition, generation, from, records, replayUntil?} + stored record batches",
    response: NONE,
  },
  ResetGroup: { code: 50, wireName: "RESET_GROUP", kind: "request", retry: "caller", request: "{group, topic, to, dryRun}", response: "{result}" },
  GroupLag: { code: 51, wireName: "GROUP_LAG", kind: "request", retry: true, request: "{group, topic}", response: "{lag}" },
  ListGroups: { code: 52, wireName: "LIST_GROUPS", kind: "request", retry: true, request: "{topic?}", response: "{groups}" },
  QueueEnqueue: {
    code: 60,
    wireName: "QUEUE_ENQUEUE",
    kind: "request",
    retry: "caller",
    request: "{queue, config?, opts?: [{key?, delayMs?, deliverAt?, dedupeId?, priority?, group?, expireInMs?, expiresAt?, singletonKey?, singletonMode?, singletonWindowMs?}], compact?, producerId?, sequence?, calls?} + publish records (value = job data, headers)",
    response: "{results: [{id, duplicate, replaced?}]} or {first, n} (§7), errors?",
  },
  QueueWork: {
    code: 61,
    wireName: "QUEUE_WORK",
    kind: "request",
    retry: false,
    request: "{queue, config?, worker, prefetch, visibilityTimeoutMs?, consumerId?, codeVersion?, onUnsettled?, batch?}",
    response: "{worker, batch?}",
  },
  QueueSettle: {
    code: 62,
    wireName: "QUEUE_SETTLE",
    kind: "request",
    retry: false,
    request: "{worker, items: [{receipt, action: ack|nack|extend, arg}]}",
    response: "{results: [null | WireError]}",
    compat: "workers registered without batch: true (clients before QUEUE_SETTLE_BATCH)",
  },
  QueueStop: { code: 63, wireName: "QUEUE_STOP", kind: "request", retry: false, request: "{worker, drain?}", response: "{}" },
  QueueAdmin: {
    code: 64,
    wireName: "QUEUE_ADMIN",
    kind: "request",
    retry: "caller",
    request: "{queue, config?, action: declare|stats|settings|purge|redrive|remove|delete, opts?} or {action: list}",
    response: "{stats} | {settings} | {purged} | {result} | {removed} | {} | {queues}",
  },
  PushJobs: {
    code: 65,
    wireName: "PUSH_JOBS",
    kind: "push",
    retry: false,
    request: "{worker, jobs: [{id, key, attempt, enqueuedAt, receipt, leaseExpiresAt, redriveCount, deadLetter}]} + publish records (data, headers)",
    response: NONE,
    compat: "workers registered without batch: true (clients before PUSH_JOB_BATCH)",
  },
  PushLeaseLost: { code: 66, wireName: "PUSH_LEASE_LOST", kind: "push", retry: false, request: "{worker, receipt, tag?}", response: NONE },
  PushWorkerEnded: { code: 67, wireName: "PUSH_WORKER_ENDED", kind: "push", retry: false, request: "{worker, reason, error?}", response: NONE },
  QueueSettleBatch: {
    code: 68,
    wireName: "QUEUE_SETTLE_BATCH",
    kind: "request",
    retry: false,
    request: "{worker, lookahead?} + settle items (§7)",
    response: "{} or {errors: [[index, WireError], ...]}",
  },
  PushJobBatch: { code: 69, wireName: "PUSH_JOB_BATCH", kind: "push", retry: false, request: "{worker, results?} + job batch (§7)", response: NONE },
  QueueGetJob: {
    code: 70,
    wireName: "QUEUE_GET_JOB",
    kind: "request",
    retry: true,
    request: "{queue, id}",
    response: "{job: {id, state, attempts, valueKind?, result?, lastError?, completedAt?} | null} + the job's value bytes",
  },
  QueueBrowse: {
    code: 71,
    wireName: "QUEUE_BROWSE",
    kind: "request",
    retry: true,
    request: "{queue, limit?, after?, state?}",
    response: "{jobs: [{id, state, attempts, key, enqueuedAt, redriveCount, deadLetter}], next} + publish records (data, headers)",
  },
  QueueProgress: {
    code: 76,
    wireName: "QUEUE_PROGRESS",
    kind: "request",
    retry: false,
    request: "{worker, tag?, receipt?, progress}",
    response: "{}",
  },
  QueueEvents: {
    code: 77,
    wireName: "QUEUE_EVENTS",
    kind: "request",
    retry: true,
    request: "{queue, from, max?, maxWaitMs?}",
    response: "{events: [QueueEvent], position}",
  },
  QueueSchedule: {
    code: 90,
    wireName: "QUEUE_SCHEDULE",
    kind: "request",
    retry: true,
    request: "{queue, action: upsert|list|pause|resume|remove, name?, opts?} (+ one publish record: data, headers, for upsert)",
    response: "{schedules: [ScheduleInfo without data, headers]} + publish records (data, headers) | {removed} | {}",
  },
} as const satisfies Record<string, OpSpec>;

export type OpName = keyof typeof OPS;
/** Names of the ops of one kind. */
export type OpNameOf<K extends OpKind> = { [N in OpName]: (typeof OPS)[N]["kind"] extends K ? N : never }[OpName];
export type RequestOpName = OpNameOf<"request">;
export type OneWayOpName = OpNameOf<"oneway">;
/** Requests whose retry safety each call decides. */
export type CallerRetryOpName = { [N in RequestOpName]: (typeof OPS)[N]["retry"] extends "caller" ? N : never }[RequestOpName];

type OpCodes = { readonly [N in OpName]: (typeof OPS)[N]["code"] };

const NAMES = Object.keys(OPS) as OpName[];

function opCodes(): OpCodes {
  const out: Record<string, number> = {};
  for (const name of NAMES) out[name] = OPS[name].code;
  return Object.freeze(out) as OpCodes;
}

/** Opcodes by name: `Op.PublishEncoded === 22`. */
export const Op: OpCodes = opCodes();
/** An opcode of protocol version 1. */
export type Op = OpCodes[OpName];

const BY_CODE: ReadonlyMap<number, OpName> = new Map(NAMES.map((n) => [OPS[n].code, n]));

/** The known-ops check: the name of an opcode, or undefined for one this version does not know. */
export function opName(code: number): OpName | undefined {
  return BY_CODE.get(code);
}

/** Every op in opcode order (docs, tests). */
export function allOps(): readonly (OpSpec & { name: OpName })[] {
  return NAMES.map((name) => ({ name, ...OPS[name] })).sort((a, b) => a.code - b.code);
}

/** Whether a request may be re-sent after a reconnect when the call does not say (`caller`
 * ops default to no: safe unless the caller knows better). */
export function retryByDefault(code: number): boolean {
  const name = BY_CODE.get(code);
  return name !== undefined && OPS[name].retry === true;
}
