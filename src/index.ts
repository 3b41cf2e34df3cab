// SPDX-License-Identifier: Apache-2.0
export { openBroker, EmbeddedBroker, type BrokerOptions } from "./broker/broker.js";
export { connect, type ConnectOptions } from "./client/index.js";
export * from "./errors.js";
export type * from "./types.js";
export type { Logger, MetricsSink, Clock, Telemetry } from "./observability/telemetry.js";
export type { FileSystem, FileHandle } from "./log/io.js";
export { partitionForKey, murmur2 } from "./streams/murmur2.js";
export type * from "./queues/types.js";
export { envelope, causedBy, readEnvelope, messageIdOf, ENVELOPE_HEADERS, type Envelope, type EnvelopeInit, type MessageKind } from "./contracts/envelope.js";
export { SchemaRegistry, SchemaTarget, type MessageSchema, type ParseSchema, type AddSchemaOptions, type SchemaTargetOptions } from "./contracts/schemas.js";
export { backwardProblems, type JsonSchema } from "./contracts/compat.js";
export { processOrdered, type OrderedOptions } from "./contracts/ordered.js";
export { Inbox, type InboxStore, type InboxMessage, type InboxOptions, type HandleOptions, type HandleResult } from "./contracts/inbox.js";
export { SqliteInboxStore, SQLITE_INBOX_SCHEMA, type SqliteDatabase } from "./contracts/stores/sqlite-inbox.js";
export { PgInboxStore, PG_INBOX_SCHEMA, type PgPool, type PgPoolClient, type PgQueryable } from "./contracts/stores/pg-inbox.js";
