// SPDX-License-Identifier: Apache-2.0
/**
 * Redis Streams as a peer for sluice's topic rows, in the shapes of bench/shapes.ts.
 *
 * Two Redis setups sit on opposite sides of sluice's durability:
 * - the machine's Redis on 6379 (save "", appendonly no): an XADD reply means "in memory only";
 * - a throwaway redis-server on 6380 with appendonly yes + appendfsync always: Redis writes and
 *   fsyncs the AOF before it sends the replies of each event-loop iteration, so a reply means
 *   "on disk" (group commit across the commands of one iteration). This is the like-for-like
 *   peer for sluice's `durability: "always"`, and every ratio is against it.
 */
import { Redis } from "ioredis";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { backlogFor, cpuPerMessage, findPid, Meter, nextEstimate, type BenchCase, type Limits } from "../harness.js";
import { reasonText, summarizeLatencies } from "../report.js";
import { CONSUME_BATCH, CONSUME_WINDOW, fmt, ORDER_JSON, ORDER_TEXT, PUBLISH_WINDOW, RECORD_BYTES, SHAPE, stampedOrderJson } from "../shapes.js";
import { pumpWindow, runAtFixedRate, runId, spawnServer, stampedPayload, waitUntil, type SpawnedServer } from "./common.js";

export const REDIS_HOST = "127.0.0.1";
export const REDIS_MEMORY_PORT = 6379;
export const REDIS_FSYNC_PORT = 6380;
export const REDIS_SYSTEM = "redis-streams";
export const REDIS_FSYNC_SYSTEM = "redis-streams-fsync";

export type RedisTarget = { port: number; system: string; durability: string; pid?: number };

function client(port: number): Redis {
  return new Redis({
    host: REDIS_HOST,
    port,
    lazyConnect: true,
    connectTimeout: 2000,
    // Fail fast instead of retrying forever when the peer is down.
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
    enableOfflineQueue: false,
  });
}

export async function connected(port: number): Promise<Redis> {
  const r = client(port);
  r.on("error", () => {
    // Errors surface through the rejected command; the listener only stops an unhandled 'error'.
  });
  await r.connect();
  return r;
}

async function withRedis<T>(port: number, fn: (r: Redis) => Promise<T>): Promise<T> {
  const r = await connected(port);
  try {
    return await fn(r);
  } finally {
    r.disconnect();
  }
}

/** Reads the server's actual persistence config so the printed label cannot lie. */
export async function describeRedisDurability(port: number): Promise<string> {
  return withRedis(port, async (r) => {
    const [, aof] = (await r.config("GET", "appendonly")) as string[];
    const [, fsync] = (await r.config("GET", "appendfsync")) as string[];
    const [, save] = (await r.config("GET", "save")) as string[];
    if (aof === "yes") return `AOF appendfsync ${fsync}${fsync === "always" ? " (fsync before reply)" : ""}`;
    return `in memory only (appendonly no, save "${save}")`;
  });
}

/** The redis-server process serving `port` (its title is "redis-server host:port"). */
export function redisPid(port: number): number | undefined {
  return findPid("redis-server", (cmd) => cmd.includes(`:${port}`));
}

export type RedisFsyncServer = { port: number; pid?: number; stop(): Promise<void>; reused: boolean };

/**
 * Starts a second redis-server with `--appendonly yes --appendfsync always --save ""` in a temp
 * dir on `port` (default 6380). If a server already answers there with exactly that config (a
 * previous run's), it is reused and left running; any other server there is an error.
 */
export async function startRedisFsync(port = REDIS_FSYNC_PORT): Promise<RedisFsyncServer> {
  const existing = await describeRedisDurability(port).catch(() => null);
  if (existing !== null) {
    if (existing.startsWith("AOF appendfsync always")) return { port, pid: redisPid(port), reused: true, stop: async () => {} };
    throw new Error(`port ${port} already has a redis-server with different persistence (${existing})`);
  }
  const server: SpawnedServer = await spawnServer({
    command: "redis-server",
    dirPrefix: "sluice-bench-redis-",
    argsFor: (dir) => ["--port", String(port), "--bind", REDIS_HOST, "--dir", dir, "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--logfile", ""],
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
  return { port, pid: server.child.pid, reused: false, stop: () => server.stop() };
}

/** Single XADD per message, PUBLISH_WINDOW awaiting their reply at once (no explicit pipeline). */
export function redisPublishPerMessage(t: RedisTarget): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `XADD per message, ${SHAPE.publishPerMessage}`,
    run: (limits) =>
      withRedis(t.port, async (r) => {
        const key = `sluice-bench:pubm:${runId()}`;
        try {
          const m = new Meter(limits);
          await pumpWindow(PUBLISH_WINDOW, () => (m.done ? null : r.xadd(key, "*", "d", ORDER_JSON).then(() => void m.add(1))));
          return { values: { rate: m.rate() }, note: m.describe() };
        } finally {
          await r.del(key).catch(() => {});
        }
      }),
  };
}

/** Pipelines of `batch` XADDs, `window` pipelines in flight. */
export function redisPublishBatches(t: RedisTarget, batch: number, window: number): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `pipeline of ${fmt(batch)} XADD, ${window} pipelines in flight (${fmt(batch * window)} records), ${RECORD_BYTES} B`,
    run: (limits) =>
      withRedis(t.port, async (r) => {
        const key = `sluice-bench:pubb:${runId()}`;
        const payload = stampedPayload(RECORD_BYTES, 0);
        try {
          const m = new Meter(limits);
          await pumpWindow(window, () => {
            if (m.done) return null;
            const p = r.pipeline();
            for (let i = 0; i < batch; i++) p.xadd(key, "*", "d", payload);
            return p.exec().then((res) => {
              const bad = res?.find(([e]) => e);
              if (bad) throw bad[0];
              m.add(batch);
            });
          });
          return { values: { rate: m.rate() }, note: m.describe() };
        } finally {
          await r.del(key).catch(() => {});
        }
      }),
  };
}

/** A stream kept across repetitions, read by a new consumer group each time. */
class RedisBacklog {
  key = `sluice-bench:backlog:${runId()}`;
  filled = 0;
  constructor(
    readonly payload: Buffer,
    public est: number,
  ) {}
  async ensure(r: Redis, limits: Limits): Promise<void> {
    const need = backlogFor(limits, this.est);
    if (this.filled >= need) return;
    let issued = this.filled;
    await pumpWindow(8, () => {
      if (issued >= need) return null;
      const n = Math.min(500, need - issued);
      issued += n;
      const p = r.pipeline();
      for (let i = 0; i < n; i++) p.xadd(this.key, "*", "d", this.payload);
      return p.exec();
    });
    this.filled = need;
  }
}

type Entries = [string, string[]][];

/**
 * Consume from a backlog with XREADGROUP COUNT 1000, the next read sent as soon as one returns
 * (two in flight = the window of 2000), and XACK either per message (`perMessage`, not awaited,
 * the last one awaited) or of each batch's ids (one XACK in flight).
 */
export function redisConsume(t: RedisTarget, perMessage: boolean): BenchCase {
  const backlog = new RedisBacklog(perMessage ? ORDER_JSON : stampedPayload(RECORD_BYTES, 0), perMessage ? 100_000 : 250_000);
  const half = CONSUME_WINDOW / 2;
  return {
    system: t.system,
    durability: t.durability,
    shape: perMessage
      ? `XREADGROUP COUNT ${fmt(half)}, 2 in flight; XACK per message; ${SHAPE.perMessageConsume}`
      : `XREADGROUP COUNT ${fmt(CONSUME_BATCH)}, 2 in flight; one XACK of the batch's ids per batch; ${SHAPE.batchConsume}`,
    run: (limits, rep) =>
      withRedis(t.port, async (r) => {
        await backlog.ensure(r, limits);
        const group = `g${rep}`;
        await r.xgroup("CREATE", backlog.key, group, "0");
        try {
          const m = new Meter(limits);
          const read = () => r.xreadgroup("GROUP", group, "c", "COUNT", perMessage ? half : CONSUME_BATCH, "STREAMS", backlog.key, ">") as Promise<[string, Entries][] | null>;
          let next = read();
          let seen = 0;
          let sum = 0;
          let failure: unknown;
          let pendingAck: Promise<unknown> | null = null;
          let exhausted = false;
          for (;;) {
            const entries = (await next)?.[0]?.[1] ?? [];
            if (entries.length === 0) {
              exhausted = true;
              m.finish();
              break;
            }
            next = read();
            seen += entries.length;
            let stop = false;
            if (perMessage) {
              for (const [id, fields] of entries) {
                sum += (JSON.parse(fields[1]) as { total: number }).total;
                if (m.add(1) || seen >= backlog.filled) {
                  await r.xack(backlog.key, group, id);
                  stop = true;
                  break;
                }
                r.xack(backlog.key, group, id).catch((e) => (failure ??= e));
              }
            } else {
              sum += entries.length;
              stop = m.add(entries.length) || seen >= backlog.filled;
              if (pendingAck) await pendingAck;
              pendingAck = r.xack(backlog.key, group, ...entries.map((e) => e[0]));
              if (stop) await pendingAck;
            }
            if (stop) {
              exhausted = seen >= backlog.filled;
              m.finish();
              break;
            }
          }
          await next.catch(() => {});
          if (failure) throw failure;
          if (sum === 0) throw new Error("no values read");
          backlog.est = nextEstimate(backlog.est, m, exhausted);
          return { values: { rate: m.rate() }, note: `${m.describe()}${exhausted ? `; backlog of ${fmt(backlog.filled)} exhausted` : ""}` };
        } finally {
          await r.xgroup("DESTROY", backlog.key, group).catch(() => {});
        }
      }),
    close: () => withRedis(t.port, async (r) => void (await r.del(backlog.key))),
  };
}

/**
 * End-to-end latency at a fixed rate: XADD per message; another connection blocks in
 * XREADGROUP and XACKs every message (not awaited); the redis-server's CPU per message.
 */
export function redisLatency(t: RedisTarget, rate: number): BenchCase {
  return {
    system: t.system,
    durability: t.durability,
    shape: `XADD per message at ${fmt(rate)}/s; consumer: XREADGROUP BLOCK, XACK per message (not awaited); ${ORDER_TEXT} + send time`,
    run: async (limits) => {
      const pub = await connected(t.port);
      const sub = await connected(t.port);
      const key = `sluice-bench:lat:${runId()}`;
      try {
        await pub.xgroup("CREATE", key, "g", "$", "MKSTREAM");
        const samples: number[] = [];
        let measureFrom = Number.POSITIVE_INFINITY;
        let running = true;
        const consumer = (async () => {
          while (running) {
            const res = (await sub.xreadgroup("GROUP", "g", "c", "COUNT", 500, "BLOCK", 100, "STREAMS", key, ">")) as [string, Entries][] | null;
            const now = performance.now();
            for (const [id, fields] of res?.[0]?.[1] ?? []) {
              const v = JSON.parse(fields[1]) as { t: number };
              if (v.t >= measureFrom) samples.push(now - v.t);
              void sub.xack(key, "g", id).catch(() => {});
            }
          }
        })();
        let pubErr: unknown;
        const send = () => {
          pub.xadd(key, "*", "d", stampedOrderJson(performance.now())).catch((e) => (pubErr ??= e));
        };
        await runAtFixedRate(rate, limits.warmupMs, send);
        measureFrom = performance.now();
        const { usPerMsg, result: pacer } = await cpuPerMessage(t.pid, async () => {
          const p = await runAtFixedRate(rate, limits.maxMs, send);
          await waitUntil(() => samples.length >= p.sent || pubErr !== undefined, 5000, "redis latency deliveries", 5);
          return { messages: p.sent, result: p };
        });
        running = false;
        await consumer;
        if (pubErr) throw pubErr;
        const s = summarizeLatencies(samples);
        return { values: { p50: s.p50Ms, p99: s.p99Ms, cpu: usPerMsg }, note: `${pacer.achievedRatePerSec.toFixed(0)}/s achieved, n=${s.count}` };
      } finally {
        await pub.del(key).catch(() => {});
        pub.disconnect();
        sub.disconnect();
      }
    },
  };
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
