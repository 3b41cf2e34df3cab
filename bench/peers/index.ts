/**
 * Entry point for the peer benchmarks: every peer system measured with the same payloads, pacer
 * and time bounds, each row labelled with the peer's actual durability setting. Every function
 * here is fail-soft: a peer that is down yields rows with value NaN and an "unavailable:" note.
 */
import type { BenchRow } from "../report.js";
import { runBullmqPeer, type QueuePeerOptions } from "./bullmq.js";
import type { PeerOptions } from "./common.js";
import { runNatsPeer } from "./nats.js";
import { runPgBossPeer } from "./pgboss.js";
import { runRabbitPeer } from "./rabbitmq.js";
import { runRedisPeer } from "./redis.js";

export * from "./common.js";
export * from "./redis.js";
export * from "./nats.js";
export * from "./rabbitmq.js";
export * from "./bullmq.js";
export * from "./pgboss.js";

export type PeerSelection = {
  redis?: boolean;
  nats?: boolean;
  rabbitmq?: boolean;
  bullmq?: boolean;
  pgboss?: boolean;
};

/** Topic peers (Redis Streams, JetStream, RabbitMQ): publish, consume+commit, latency p50/p99. */
export async function runStreamPeers(opts: PeerOptions & { only?: PeerSelection } = {}): Promise<BenchRow[]> {
  const on = (k: keyof PeerSelection) => opts.only === undefined || opts.only[k] === true;
  const rows: BenchRow[] = [];
  if (on("redis")) rows.push(...(await runRedisPeer(opts)));
  if (on("nats")) rows.push(...(await runNatsPeer(opts)));
  if (on("rabbitmq")) rows.push(...(await runRabbitPeer(opts)));
  return rows;
}

/** Job-queue peers (BullMQ, pg-boss): jobs/s end to end. */
export async function runQueuePeers(opts: QueuePeerOptions & { only?: PeerSelection; bullmqFsync?: boolean } = {}): Promise<BenchRow[]> {
  const on = (k: keyof PeerSelection) => opts.only === undefined || opts.only[k] === true;
  const rows: BenchRow[] = [];
  if (on("bullmq")) rows.push(...(await runBullmqPeer({ ...opts, includeFsync: opts.bullmqFsync ?? true })));
  if (on("pgboss")) rows.push(...(await runPgBossPeer({ ...opts, concurrency: undefined })));
  return rows;
}

export async function runAllPeers(opts: QueuePeerOptions & { only?: PeerSelection; bullmqFsync?: boolean } = {}): Promise<BenchRow[]> {
  return [...(await runStreamPeers(opts)), ...(await runQueuePeers(opts))];
}
