// SPDX-License-Identifier: Apache-2.0
export { openBroker, EmbeddedBroker, type BrokerOptions } from "./broker/broker.js";
export { connect, type ConnectOptions } from "./client/index.js";
export * from "./errors.js";
export type * from "./types.js";
export type { Logger, MetricsSink, Clock, Telemetry } from "./observability/telemetry.js";
export type { FileSystem, FileHandle } from "./log/io.js";
export { partitionForKey, murmur2 } from "./streams/murmur2.js";
export type * from "./queues/types.js";
