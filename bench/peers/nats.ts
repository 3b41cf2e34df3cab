/**
 * NATS JetStream (file storage) as a peer for sluice's topic figures.
 *
 * Durability: by default JetStream acknowledges a publish once the message is written to the
 * stream's file (the page cache) and fsyncs only every `sync_interval` (2 minutes by default), so
 * a power loss or kernel crash can drop up to two minutes of acknowledged messages. The label
 * says so. nats-server >= 2.10 accepts `jetstream { sync_interval: always }` (fsync before ack);
 * when the installed server allows it, a second server on 4223 with that config is spawned in a
 * temp dir and measured too, which is the like-for-like peer for sluice's `durability: "always"`.
 */
import { AckPolicy, connect, StorageType, type JsMsg, type NatsConnection } from "nats";
import { execFile } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { METRIC, summarizeLatencies, unavailableRow, type BenchRow } from "../report.js";
import {
  compareVersions,
  DEFAULT_LATENCY_RATE,
  DEFAULT_RECORD_BYTES,
  durationOf,
  warmupOf,
  runAtFixedRate,
  runId,
  sentAtOf,
  spawnServer,
  stampedPayload,
  pumpWindow,
  waitUntil,
  type PeerOptions,
} from "./common.js";

export const NATS_URL = "127.0.0.1:4222";
export const NATS_SYNC_PORT = 4223;
export const NATS_SYSTEM = "nats-jetstream";
export const NATS_SYNC_SYSTEM = "nats-jetstream-sync";
export const NATS_DEFAULT_DURABILITY = "file storage, fsync every 2 min (default sync_interval): ack before fsync";
export const NATS_SYNC_DURABILITY = "file storage, sync_interval always: fsync before ack";

/** Outstanding acknowledged publishes from the single producer. */
const PUBLISH_WINDOW = 512;
/** Messages per pull in the consume figure; acks are cumulative (AckPolicy.All) every ACK_EVERY. */
const PULL_BATCH = 1000;
const ACK_EVERY = 100;
const MAX_BACKLOG = 500_000;

export type NatsTarget = { servers: string; system: string; durability: string };

async function open(target: NatsTarget): Promise<NatsConnection> {
  return connect({ servers: target.servers, timeout: 2000, reconnect: false, maxReconnectAttempts: 0 });
}

async function withStream<T>(nc: NatsConnection, fn: (stream: string, subject: string) => Promise<T>): Promise<T> {
  const jsm = await nc.jetstreamManager();
  const stream = `sluice_bench_${runId().replace(/[^a-zA-Z0-9_]/g, "_")}`;
  const subject = `${stream}.data`;
  await jsm.streams.add({ name: stream, subjects: [subject], storage: StorageType.File });
  try {
    return await fn(stream, subject);
  } finally {
    await jsm.streams.delete(stream).catch(() => {});
  }
}

/** One producer, `js.publish` with up to 512 outstanding, each PubAck awaited. */
export async function natsPublishThroughput(target: NatsTarget, opts: PeerOptions = {}): Promise<BenchRow> {
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let nc: NatsConnection | undefined;
  try {
    nc = await open(target);
    const js = nc.jetstream();
    return await withStream(nc, async (_stream, subject) => {
      const payload = stampedPayload(bytes, 0);
      const durationMs = durationOf(opts);
      const warm = performance.now();
      await pumpWindow(PUBLISH_WINDOW, () => (performance.now() - warm < warmupOf(opts) ? js.publish(subject, payload) : null));
      const start = performance.now();
      const sent = await pumpWindow(PUBLISH_WINDOW, () =>
        performance.now() - start < durationMs ? js.publish(subject, payload) : null,
      );
      const secs = (performance.now() - start) / 1000;
      return {
        name: METRIC.publish,
        system: target.system,
        durability: target.durability,
        value: sent / secs,
        unit: "msg/s",
        note: `js.publish, ${PUBLISH_WINDOW} outstanding`,
      };
    });
  } catch (err) {
    return unavailableRow(METRIC.publish, target.system, target.durability, "msg/s", err);
  } finally {
    await nc?.close().catch(() => {});
  }
}

/**
 * Consume-and-commit from a backlog with a durable pull consumer. AckPolicy.All makes an ack
 * cumulative ("processed through this message"), the same meaning as sluice's `msg.commit()`;
 * the consumer acks every 100 messages and confirms the last ack with ackAck().
 */
export async function natsConsumeThroughput(target: NatsTarget, opts: PeerOptions = {}): Promise<BenchRow> {
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let nc: NatsConnection | undefined;
  try {
    nc = await open(target);
    const js = nc.jetstream();
    const jsm = await nc.jetstreamManager();
    return await withStream(nc, async (stream, subject) => {
      const durationMs = durationOf(opts);
      // Fill the backlog (time-bounded).
      const payload = stampedPayload(bytes, 0);
      const wanted = opts.quick ? 100_000 : MAX_BACKLOG;
      let issued = 0;
      const fillStart = performance.now();
      const backlog = await pumpWindow(PUBLISH_WINDOW, () =>
        issued < wanted && performance.now() - fillStart < durationMs * 2 ? (issued++, js.publish(subject, payload)) : null,
      );
      await jsm.consumers.add(stream, { durable_name: "c", ack_policy: AckPolicy.All, max_ack_pending: 20_000 });
      const consumer = await js.consumers.get(stream, "c");
      const iter = await consumer.consume({ max_messages: PULL_BATCH });
      let consumed = 0;
      let last: JsMsg | undefined;
      const start = performance.now();
      const stopTimer = setTimeout(() => void iter.stop(), durationMs + 2000);
      for await (const m of iter) {
        consumed++;
        last = m;
        if (consumed % ACK_EVERY === 0) m.ack();
        if (consumed >= backlog || performance.now() - start >= durationMs) break;
      }
      clearTimeout(stopTimer);
      if (last) await last.ackAck();
      const secs = (performance.now() - start) / 1000;
      await iter.stop();
      return {
        name: METRIC.consume,
        system: target.system,
        durability: target.durability,
        value: consumed / secs,
        unit: "msg/s",
        note: `pull consume ${PULL_BATCH}, AckPolicy.All ack every ${ACK_EVERY}, backlog ${backlog}`,
      };
    });
  } catch (err) {
    return unavailableRow(METRIC.consume, target.system, target.durability, "msg/s", err);
  } finally {
    await nc?.close().catch(() => {});
  }
}

/** Fixed-rate js.publish (acked) with a pull consumer acking each message; latency = delivery - send. */
export async function natsLatency(target: NatsTarget, opts: PeerOptions = {}): Promise<BenchRow[]> {
  const rate = opts.latencyRatePerSec ?? DEFAULT_LATENCY_RATE;
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let nc: NatsConnection | undefined;
  try {
    nc = await open(target);
    const js = nc.jetstream();
    const jsm = await nc.jetstreamManager();
    return await withStream(nc, async (stream, subject) => {
      await jsm.consumers.add(stream, { durable_name: "lat", ack_policy: AckPolicy.Explicit });
      const consumer = await js.consumers.get(stream, "lat");
      const iter = await consumer.consume({ max_messages: 500 });
      const samples: number[] = [];
      const reader = (async () => {
        for await (const m of iter) {
          samples.push(performance.now() - sentAtOf(m.data));
          m.ack();
        }
      })();
      const template = stampedPayload(bytes, 0);
      let pubErr: unknown;
      const pacer = await runAtFixedRate(rate, durationOf(opts), () => {
        js.publish(subject, stampedPayload(bytes, performance.now(), template)).catch((e) => (pubErr ??= e));
      });
      await waitUntil(() => samples.length >= pacer.sent || pubErr !== undefined, 5000, "jetstream latency deliveries", 5);
      await iter.stop();
      await reader;
      if (pubErr) throw pubErr;
      const s = summarizeLatencies(samples);
      const note = `${rate}/s target, ${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}`;
      return [
        { name: METRIC.latencyP50, system: target.system, durability: target.durability, value: s.p50Ms, unit: "ms", note },
        { name: METRIC.latencyP99, system: target.system, durability: target.durability, value: s.p99Ms, unit: "ms", note },
      ];
    });
  } catch (err) {
    return [
      unavailableRow(METRIC.latencyP50, target.system, target.durability, "ms", err),
      unavailableRow(METRIC.latencyP99, target.system, target.durability, "ms", err),
    ];
  } finally {
    await nc?.close().catch(() => {});
  }
}

export async function natsTargetRows(target: NatsTarget, opts: PeerOptions = {}): Promise<BenchRow[]> {
  return [
    await natsPublishThroughput(target, opts),
    await natsConsumeThroughput(target, opts),
    ...(await natsLatency(target, opts)),
  ];
}

/** `nats-server --version` as "2.9.10", or null when the binary is missing. */
export async function natsServerVersion(): Promise<string | null> {
  try {
    const { stdout } = await promisify(execFile)("nats-server", ["--version"]);
    return /v?(\d+\.\d+\.\d+)/.exec(stdout)?.[1] ?? null;
  } catch {
    return null;
  }
}

/** First version whose JetStream config accepts `sync_interval: always`. */
export const NATS_SYNC_ALWAYS_MIN_VERSION = "2.10.0";

export type NatsSyncServer = { servers: string; stop(): Promise<void> };

/**
 * Spawns nats-server on `port` with JetStream in a temp store dir and `sync_interval: always`.
 * Throws with the reason when the installed server is too old or fails to start.
 */
export async function startNatsSyncAlways(port = NATS_SYNC_PORT): Promise<NatsSyncServer> {
  const version = await natsServerVersion();
  if (version === null) throw new Error("nats-server not found");
  if (compareVersions(version, NATS_SYNC_ALWAYS_MIN_VERSION) < 0) {
    throw new Error(`nats-server v${version} has no jetstream sync_interval (needs >= ${NATS_SYNC_ALWAYS_MIN_VERSION})`);
  }
  const servers = `127.0.0.1:${port}`;
  const server = await spawnServer({
    command: "nats-server",
    dirPrefix: "sluice-bench-nats-",
    argsFor: async (dir) => {
      const conf = join(dir, "nats.conf");
      await writeFile(
        conf,
        `listen: "127.0.0.1:${port}"\njetstream {\n  store_dir: "${join(dir, "store")}"\n  sync_interval: always\n}\n`,
      );
      return ["-c", conf];
    },
    ready: async () => {
      const nc = await connect({ servers, timeout: 1000, reconnect: false }).catch(() => null);
      if (!nc) return false;
      try {
        await (await nc.jetstreamManager()).getAccountInfo();
        return true;
      } finally {
        await nc.close().catch(() => {});
      }
    },
  });
  return { servers, stop: () => server.stop() };
}

/** JetStream with default sync (machine's server on 4222) and, if possible, sync always (4223). */
export async function runNatsPeer(opts: PeerOptions & { includeSyncAlways?: boolean } = {}): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  opts.log?.(`nats ${NATS_URL} (${NATS_DEFAULT_DURABILITY})`);
  rows.push(...(await natsTargetRows({ servers: NATS_URL, system: NATS_SYSTEM, durability: NATS_DEFAULT_DURABILITY }, opts)));
  if (opts.includeSyncAlways !== false) {
    const target: NatsTarget = { servers: `127.0.0.1:${NATS_SYNC_PORT}`, system: NATS_SYNC_SYSTEM, durability: NATS_SYNC_DURABILITY };
    let server: NatsSyncServer | undefined;
    try {
      server = await startNatsSyncAlways(NATS_SYNC_PORT);
      opts.log?.(`nats ${server.servers} (${NATS_SYNC_DURABILITY})`);
      rows.push(...(await natsTargetRows(target, opts)));
    } catch (err) {
      for (const [n, u] of [[METRIC.publish, "msg/s"], [METRIC.consume, "msg/s"], [METRIC.latencyP50, "ms"], [METRIC.latencyP99, "ms"]] as const) {
        rows.push(unavailableRow(n, target.system, target.durability, u, err));
      }
    } finally {
      await server?.stop().catch(() => {});
    }
  }
  return rows;
}
