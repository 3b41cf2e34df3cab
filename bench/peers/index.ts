// SPDX-License-Identifier: Apache-2.0
/**
 * The peer systems' cases (bench/harness.ts `BenchCase`), each in the shapes of bench/shapes.ts
 * and labelled with the durability it actually runs with. Every case is fail-soft: a peer that
 * is down makes its repetitions fail, and the row says `unavailable: <reason>`.
 */
export * from "./common.js";
export * from "./redis.js";
export * from "./nats.js";
export * from "./rabbitmq.js";
export * from "./bullmq.js";
export * from "./pgboss.js";
