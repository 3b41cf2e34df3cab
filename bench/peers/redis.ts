/**
 * Redis Streams as a peer for sluice's topic figures.
 *
 * Two Redis setups are measured because they sit on opposite sides of sluice's durability:
 * - the machine's Redis on 6379 (save "", appendonly no): an XADD reply means "in memory only";
 * - a throwaway redis-server on 6380 with appendonly yes + appendfsync always: Redis writes and
 *   fsyncs the AOF before it sends the replies of each event-loop iteration, so a reply means
 *   "on disk" (with group commit across the pipelined commands of one iteration). This is the
 *   like-for-like peer for sluice's `durability: "always"`.
 */
import { Redis } from "ioredis";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { METRIC, reasonText, summarizeLatencies, unavailableRow, type BenchRow } from "../report.js";
import {
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
  type SpawnedServer,
} from "./common.js";

export const REDIS_HOST = "127.0.0.1";
export const REDIS_MEMORY_PORT = 6379;
export const REDIS_FSYNC_PORT = 6380;

export type RedisTarget = { port: number; host?: string; system: string; durability: string };

/** Pipelined XADDs per round trip and round trips in flight for the publish figure. */
const PUBLISH_BATCH = 100;
const PUBLISH_WINDOW = 8;
/** Messages per XREADGROUP when draining a backlog. */
const CONSUME_COUNT = 1000;
/** Backlog is capped so memory on 6379 stays bounded whatever the run length. */
const MAX_BACKLOG = 500_000;

function client(port: number, host = REDIS_HOST): Redis {
  return new Redis({
    host,
    port,
    lazyConnect: true,
    connectTimeout: 2000,
    // Fail fast instead of retrying forever when the peer is down.
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
    enableOfflineQueue: false,
  });
}

async function connected(port: number, host?: string): Promise<Redis> {
  const r = client(port, host);
  r.on("error", () => {
    // Errors surface through the rejected command; the listener only stops an unhandled 'error'.
  });
  await r.connect();
  return r;
}

/** Reads the server's actual persistence config so the printed label cannot lie. */
export async function describeRedisDurability(port: number, host = REDIS_HOST): Promise<string> {
  const r = await connected(port, host);
  try {
    const [, aof] = (await r.config("GET", "appendonly")) as string[];
    const [, fsync] = (await r.config("GET", "appendfsync")) as string[];
    const [, save] = (await r.config("GET", "save")) as string[];
    if (aof === "yes") return `AOF appendfsync ${fsync}${fsync === "always" ? " (fsync before reply)" : ""}`;
    return `in memory only (appendonly no, save "${save}")`;
  } finally {
    r.disconnect();
  }
}

export type RedisFsyncServer = { port: number; stop(): Promise<void>; reused: boolean };

/**
 * Starts a second redis-server with `--appendonly yes --appendfsync always --save ""` in a temp
 * dir on `port` (default 6380). If a server already answers there with exactly that config (a
 * previous run's), it is reused and left running; any other server there is an error.
 */
export async function startRedisFsync(port = REDIS_FSYNC_PORT): Promise<RedisFsyncServer> {
  const existing = await describeRedisDurability(port).catch(() => null);
  if (existing !== null) {
    if (existing.startsWith("AOF appendfsync always")) return { port, reused: true, stop: async () => {} };
    throw new Error(`port ${port} already has a redis-server with different persistence (${existing})`);
  }
  const server: SpawnedServer = await spawnServer({
    command: "redis-server",
    dirPrefix: "sluice-bench-redis-",
    argsFor: (dir) => [
      "--port", String(port),
      "--bind", REDIS_HOST,
      "--dir", dir,
      "--appendonly", "yes",
      "--appendfsync", "always",
      "--save", "",
      "--daemonize", "no",
      "--protected-mode", "yes",
      "--logfile", "",
    ],
    ready: async () => {
      const r = await connected(port).catch(() => null);
      if (!r) return false;
      try {
        return (await r.ping()) === "PONG";
      } finally {
        r.disconnect();
      }
    },
  });
  return { port, reused: false, stop: () => server.stop() };
}

/** Time-bounded pipelined XADD from one producer; every XADD's reply is awaited (acknowledged). */
export async function redisPublishThroughput(target: RedisTarget, opts: PeerOptions = {}): Promise<BenchRow> {
  const name = METRIC.publish;
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  let r: Redis | undefined;
  const key = `sluice-bench:pub:${runId()}`;
  try {
    r = await connected(target.port, target.host);
    const payload = stampedPayload(bytes, 0);
    const rr = r;
    await fillStream(rr, key, Number.MAX_SAFE_INTEGER, bytes, warmupOf(opts));
    const durationMs = durationOf(opts);
    const start = performance.now();
    const rounds = await pumpWindow(PUBLISH_WINDOW, () => {
      if (performance.now() - start >= durationMs) return null;
      const p = rr.pipeline();
      for (let i = 0; i < PUBLISH_BATCH; i++) p.xadd(key, "*", "d", payload);
      return p.exec().then((res) => {
        const bad = res?.find(([e]) => e);
        if (bad) throw bad[0];
      });
    });
    const sent = rounds * PUBLISH_BATCH;
    const secs = (performance.now() - start) / 1000;
    return {
      name,
      system: target.system,
      durability: target.durability,
      value: sent / secs,
      unit: "msg/s",
      note: `pipelined XADD, ${PUBLISH_BATCH}/round trip, ${PUBLISH_WINDOW} in flight`,
    };
  } catch (err) {
    return unavailableRow(name, target.system, target.durability, "msg/s", err);
  } finally {
    await r?.del(key).catch(() => {});
    r?.disconnect();
  }
}

/** Fills `key` with up to `count` records (or until `maxMs`), pipelined; returns how many. */
async function fillStream(r: Redis, key: string, count: number, bytes: number, maxMs: number): Promise<number> {
  const payload = stampedPayload(bytes, 0);
  const start = performance.now();
  let sent = 0;
  await pumpWindow(PUBLISH_WINDOW, () => {
    if (sent >= count || performance.now() - start >= maxMs) return null;
    const n = Math.min(PUBLISH_BATCH * 5, count - sent);
    const p = r.pipeline();
    for (let i = 0; i < n; i++) p.xadd(key, "*", "d", payload);
    sent += n;
    return p.exec();
  });
  return sent;
}

/**
 * Consume-and-commit from a backlog: a consumer group reads with XREADGROUP (COUNT 1000) and
 * XACKs every id it read; the XACK is pipelined with the next read and its reply awaited, so
 * the figure counts only acknowledged commits.
 */
export async function redisConsumeThroughput(target: RedisTarget, opts: PeerOptions = {}): Promise<BenchRow> {
  const name = METRIC.consume;
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  const key = `sluice-bench:con:${runId()}`;
  let r: Redis | undefined;
  try {
    r = await connected(target.port, target.host);
    const durationMs = durationOf(opts);
    const backlog = await fillStream(r, key, opts.quick ? 100_000 : MAX_BACKLOG, bytes, durationMs * 2);
    await r.xgroup("CREATE", key, "g", "0");
    let consumed = 0;
    let pendingAck: Promise<unknown> | undefined;
    const start = performance.now();
    while (consumed < backlog && performance.now() - start < durationMs) {
      const res = (await r.xreadgroupBuffer("GROUP", "g", "c1", "COUNT", CONSUME_COUNT, "STREAMS", key, ">")) as
        | [Buffer, [Buffer, Buffer[]][]][]
        | null;
      if (pendingAck) await pendingAck;
      const entries = res?.[0]?.[1] ?? [];
      if (entries.length === 0) break;
      consumed += entries.length;
      pendingAck = r.xack(key, "g", ...entries.map((e) => e[0]));
    }
    if (pendingAck) await pendingAck;
    const secs = (performance.now() - start) / 1000;
    return {
      name,
      system: target.system,
      durability: target.durability,
      value: consumed / secs,
      unit: "msg/s",
      note: `XREADGROUP COUNT ${CONSUME_COUNT} + XACK, backlog ${backlog}`,
    };
  } catch (err) {
    return unavailableRow(name, target.system, target.durability, "msg/s", err);
  } finally {
    await r?.del(key).catch(() => {});
    r?.disconnect();
  }
}

/**
 * End-to-end latency at a fixed rate: one connection XADDs at `latencyRatePerSec` (default
 * 2,000/s), another blocks in XREADGROUP and XACKs; latency = delivery time - send time.
 */
export async function redisLatency(target: RedisTarget, opts: PeerOptions = {}): Promise<BenchRow[]> {
  const rate = opts.latencyRatePerSec ?? DEFAULT_LATENCY_RATE;
  const unit = "ms";
  const bytes = opts.recordBytes ?? DEFAULT_RECORD_BYTES;
  const key = `sluice-bench:lat:${runId()}`;
  let pub: Redis | undefined;
  let sub: Redis | undefined;
  try {
    pub = await connected(target.port, target.host);
    sub = await connected(target.port, target.host);
    await pub.xgroup("CREATE", key, "g", "$", "MKSTREAM");
    const samples: number[] = [];
    const template = stampedPayload(bytes, 0);
    let running = true;
    let expected = Number.POSITIVE_INFINITY;
    const consumer = (async () => {
      while (running || samples.length < expected) {
        const res = (await sub!.xreadgroupBuffer("GROUP", "g", "c1", "COUNT", 500, "BLOCK", 200, "STREAMS", key, ">")) as
          | [Buffer, [Buffer, Buffer[]][]][]
          | null;
        const now = performance.now();
        const entries = res?.[0]?.[1] ?? [];
        for (const [, fields] of entries) samples.push(now - sentAtOf(fields[1]));
        if (entries.length) void sub!.xack(key, "g", ...entries.map((e) => e[0])).catch(() => {});
        if (!running && entries.length === 0) break;
      }
    })();
    let pubErr: unknown;
    const pacer = await runAtFixedRate(rate, durationOf(opts), () => {
      pub!.xadd(key, "*", "d", stampedPayload(bytes, performance.now(), template)).catch((e) => (pubErr ??= e));
    });
    expected = pacer.sent;
    await waitUntil(() => samples.length >= expected || pubErr !== undefined, 5000, "redis latency deliveries", 5);
    running = false;
    await consumer;
    if (pubErr) throw pubErr;
    const s = summarizeLatencies(samples);
    const note = `${rate}/s target, ${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}`;
    return [
      { name: METRIC.latencyP50, system: target.system, durability: target.durability, value: s.p50Ms, unit, note },
      { name: METRIC.latencyP99, system: target.system, durability: target.durability, value: s.p99Ms, unit, note },
    ];
  } catch (err) {
    return [
      unavailableRow(METRIC.latencyP50, target.system, target.durability, unit, err),
      unavailableRow(METRIC.latencyP99, target.system, target.durability, unit, err),
    ];
  } finally {
    await pub?.del(key).catch(() => {});
    pub?.disconnect();
    sub?.disconnect();
  }
}

export async function redisTargetRows(target: RedisTarget, opts: PeerOptions = {}): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  rows.push(await redisPublishThroughput(target, opts));
  rows.push(await redisConsumeThroughput(target, opts));
  rows.push(...(await redisLatency(target, opts)));
  return rows;
}

export const REDIS_SYSTEM = "redis-streams";
export const REDIS_FSYNC_SYSTEM = "redis-streams-fsync";

/**
 * All Redis Streams figures: against 6379 (as configured on this machine) and against a spawned
 * 6380 with appendfsync always (stopped at the end). Never throws.
 */
export async function runRedisPeer(opts: PeerOptions & { includeMemory?: boolean; includeFsync?: boolean } = {}): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  if (opts.includeMemory !== false) {
    const durability = await describeRedisDurability(REDIS_MEMORY_PORT).catch(() => "unknown");
    const target: RedisTarget = { port: REDIS_MEMORY_PORT, system: REDIS_SYSTEM, durability };
    opts.log?.(`redis :${REDIS_MEMORY_PORT} (${durability})`);
    rows.push(...(await redisTargetRows(target, opts)));
  }
  if (opts.includeFsync !== false) {
    const durability = "AOF appendfsync always (fsync before reply)";
    const target: RedisTarget = { port: REDIS_FSYNC_PORT, system: REDIS_FSYNC_SYSTEM, durability };
    let server: RedisFsyncServer | undefined;
    try {
      server = await startRedisFsync(REDIS_FSYNC_PORT);
      target.durability = await describeRedisDurability(REDIS_FSYNC_PORT);
      opts.log?.(`redis :${REDIS_FSYNC_PORT} (${target.durability})`);
      rows.push(...(await redisTargetRows(target, opts)));
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

/** redis-server --version, for the report header. */
export async function redisVersion(): Promise<string> {
  try {
    const { stdout } = await promisify(execFile)("redis-server", ["--version"]);
    return /v=(\S+)/.exec(stdout)?.[1] ?? stdout.trim();
  } catch (err) {
    return `unknown (${reasonText(err)})`;
  }
}
