// SPDX-License-Identifier: Apache-2.0
/**
 * QueueManager: the registry of work queues under `${dataDir}/queues/`.
 *
 * `queues.json` (writeFileAtomic) maps each queue name to its current incarnation directory
 * and stored config. Deleting a queue removes its manifest entry durably *before* deleting its
 * directory, and re-creating the name makes a new incarnation directory, so a deleted-then-
 * recreated queue never delivers old jobs (directories not in the manifest are removed on open).
 */
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { AbortedError, BrokerClosedError, NotFoundError, PermanentError, ValidationError } from "../errors.js";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../log/io.js";
import { silentLogger, type Logger } from "../log/logger.js";
import type { PublishValue } from "../types.js";
import type { ValueKind } from "../log/record-batch.js";
import { QueueCore, resolveQueueConfig, validateQueueName, WorkerImpl, MAX_PREFETCH, type PreparedJob, type QueueHost } from "./queue.js";
import type { EnqueueIdentity } from "./idempotence.js";
import type {
  EnqueueItem,
  EnqueueOptions,
  EnqueueResult,
  Job,
  ProcessOptions,
  Queue,
  QueueConfig,
  QueueStats,
  RedriveOptions,
  RedriveResult,
  WorkOptions,
  Worker,
} from "./types.js";

interface ManifestEntry {
  incarnation: string;
  config: QueueConfig;
  createdAt: number;
}

interface Manifest {
  version: 1;
  queues: Record<string, ManifestEntry>;
}

export interface QueueManagerOptions {
  dataDir: string;
  fs: FileSystem;
  logger?: Logger;
  /** Randomness for backoff jitter (tests). */
  random?: () => number;
}

export class QueueManager implements QueueHost {
  private readonly root: string;
  private readonly fs: FileSystem;
  private readonly logger: Logger;
  private readonly random: (() => number) | undefined;
  private manifest: Manifest;
  private cores = new Map<string, Promise<QueueCore>>();
  private lock: Promise<unknown> = Promise.resolve();
  private closed = false;

  private constructor(opts: QueueManagerOptions, manifest: Manifest) {
    this.root = join(opts.dataDir, "queues");
    this.fs = opts.fs;
    this.logger = opts.logger ?? silentLogger;
    this.random = opts.random;
    this.manifest = manifest;
  }

  static async open(opts: QueueManagerOptions): Promise<QueueManager> {
    const root = join(opts.dataDir, "queues");
    await opts.fs.mkdir(root);
    const manifest = (await readJsonFile<Manifest>(opts.fs, join(root, "queues.json"))) ?? { version: 1, queues: {} };
    // Leftovers of an interrupted delete (manifest entry already gone): remove them.
    const live = new Set(Object.values(manifest.queues).map((e) => e.incarnation));
    for (const n of await opts.fs.readdir(root)) {
      if (n === "queues.json" || n.endsWith(".tmp")) continue;
      if (!live.has(n)) await opts.fs.rm(join(root, n));
    }
    return new QueueManager(opts, manifest);
  }

  /** Serialises manifest changes and queue opens/deletes. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.lock.then(fn, fn);
    this.lock = run.catch(() => {});
    return run;
  }

  private async saveManifest(): Promise<void> {
    await writeFileAtomic(this.fs, join(this.root, "queues.json"), JSON.stringify(this.manifest));
  }

  /**
   * Returns a handle; nothing is opened or created until its first operation. `config`, when
   * given, is validated now (ValidationError) and stored as the queue's config on first use.
   */
  queue<T = unknown>(name: string, config?: QueueConfig): Queue<T> {
    validateQueueName(name);
    if (config !== undefined) resolveQueueConfig(name, config);
    if (this.closed) throw new BrokerClosedError();
    return new QueueHandle<T>(this, name, config);
  }

  /** @internal Opens (creating if needed) the current incarnation of `name`. */
  core(name: string, config?: QueueConfig, implicit = false): Promise<QueueCore> {
    if (this.closed) return Promise.reject(new BrokerClosedError());
    const cached = this.cores.get(name);
    if (cached !== undefined && config === undefined) return cached;
    const p = this.exclusive(async () => {
      if (this.closed) throw new BrokerClosedError();
      const existing = cached;
      let entry = this.manifest.queues[name];
      if (entry === undefined) {
        // DLQs created implicitly do not dead-letter further.
        const cfg: QueueConfig = config ?? (implicit ? { deadLetter: null } : {});
        entry = { incarnation: `${name}.${Date.now().toString(36)}${randomBytes(4).toString("hex")}`, config: cfg, createdAt: Date.now() };
        this.manifest.queues[name] = entry;
        await this.saveManifest();
      } else if (config !== undefined && JSON.stringify(config) !== JSON.stringify(entry.config)) {
        entry.config = config;
        await this.saveManifest();
      }
      const resolved = resolveQueueConfig(name, entry.config);
      if (existing !== undefined) {
        const core = await existing;
        core.config = resolved;
        return core;
      }
      return QueueCore.open({
        name,
        incarnation: entry.incarnation,
        dir: join(this.root, entry.incarnation),
        fs: this.fs,
        config: resolved,
        host: { core: (n: string) => this.core(n, undefined, true) },
        logger: this.logger,
        random: this.random,
      });
    });
    this.cores.set(name, p);
    p.catch(() => {
      if (this.cores.get(name) === p) this.cores.delete(name);
    });
    return p;
  }

  async listQueues(): Promise<string[]> {
    await this.lock;
    return Object.keys(this.manifest.queues).sort();
  }

  /** Durably deletes the queue and all its jobs. Open handles re-create it (empty) on next use. */
  async deleteQueue(name: string): Promise<void> {
    validateQueueName(name);
    await this.exclusive(async () => {
      const entry = this.manifest.queues[name];
      if (entry === undefined) throw new NotFoundError(`queue ${JSON.stringify(name)} does not exist`, "QUEUE_NOT_FOUND");
      const cached = this.cores.get(name);
      this.cores.delete(name);
      if (cached) await (await cached.catch(() => null))?.close();
      delete this.manifest.queues[name];
      await this.saveManifest();
      await this.fs.rm(join(this.root, entry.incarnation));
      await this.fs.fsyncDir(this.root);
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.lock;
    this.closed = true;
    const cores = [...this.cores.values()];
    this.cores.clear();
    for (const c of cores) {
      const core = await c.catch(() => null);
      await core?.close();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The embedded `Queue<T>`: a thin handle resolving its core lazily. */
export class QueueHandle<T> implements Queue<T> {
  private configApplied = false;
  constructor(private readonly mgr: QueueManager, readonly name: string, private readonly config: QueueConfig | undefined) {}

  private core(): Promise<QueueCore> {
    if (!this.configApplied && this.config !== undefined) {
      this.configApplied = true;
      return this.mgr.core(this.name, this.config);
    }
    return this.mgr.core(this.name);
  }

  async enqueue(data: T & PublishValue, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const core = await this.core();
    const job = core.prepare({ ...opts, data });
    const [r] = await core.enqueuePrepared([job], opts.signal);
    return r;
  }

  async enqueueBatch(items: EnqueueItem[], opts: { signal?: AbortSignal } = {}): Promise<EnqueueResult[]> {
    if (!Array.isArray(items)) throw new ValidationError("enqueueBatch needs an array");
    const core = await this.core();
    return core.enqueuePrepared(items.map((it) => core.prepare(it)), opts.signal);
  }

  /**
   * Enqueues jobs whose values are already bytes of a known kind (the network server: the
   * client's encoding is stored as is, no decode and re-encode). Same checks as enqueueBatch.
   */
  async enqueueRaw(
    items: { value: Buffer | null; valueKind: ValueKind; opts: Omit<EnqueueItem, "data"> }[],
    opts: { signal?: AbortSignal; compact?: boolean; idem?: EnqueueIdentity } = {},
  ): Promise<EnqueueResult[] | { first: number; n: number }> {
    const core = await this.core();
    const now = Date.now();
    const jobs = items.map((it) => core.prepareRaw(it.value, it.valueKind, it.opts, null, now));
    // compact: {first, n} when every job is new (no per-job result objects).
    return opts.compact === true ? core.enqueuePreparedCompact(jobs, opts.signal, opts.idem) : core.enqueuePrepared(jobs, opts.signal, opts.idem);
  }

  /**
   * One network enqueue request holding several of the client's enqueue calls (`calls`: their
   * job counts, in order). Each call is validated on its own, so a bad job fails only its own
   * call; the jobs of the valid calls are stored as one request (one identity, one group).
   * Answers `{first, n}` when every job is new and no call failed, else one result per job
   * (null for the jobs of failed calls) and the failed calls' errors.
   */
  async enqueueCalls(
    items: { value: Buffer | null; valueKind: ValueKind; opts: Omit<EnqueueItem, "data"> }[],
    calls: readonly number[],
    opts: { signal?: AbortSignal; idem?: EnqueueIdentity } = {},
  ): Promise<{ first: number; n: number } | { results: (EnqueueResult | null)[]; errors: [number, unknown][] }> {
    let total = 0;
    for (const c of calls) {
      if (!Number.isSafeInteger(c) || c < 0) throw new ValidationError("calls must be job counts");
      total += c;
    }
    if (total !== items.length) throw new ValidationError(`calls count ${total} jobs, the request has ${items.length}`);
    const core = await this.core();
    const now = Date.now();
    const jobs: PreparedJob[] = [];
    const errors: [number, unknown][] = [];
    /** Per call: index of its first job in `jobs`, or -1 when it failed. */
    const starts: number[] = new Array(calls.length);
    let i = 0;
    for (let c = 0; c < calls.length; c++) {
      const from = jobs.length;
      try {
        for (let k = 0; k < calls[c]; k++) {
          const it = items[i + k];
          jobs.push(core.prepareRaw(it.value, it.valueKind, it.opts, null, now));
        }
        starts[c] = from;
      } catch (e) {
        jobs.length = from;
        starts[c] = -1;
        errors.push([c, e]);
      }
      i += calls[c];
    }
    const r = jobs.length === 0 ? [] : await core.enqueuePreparedCompact(jobs, opts.signal, opts.idem);
    if (errors.length === 0 && !Array.isArray(r)) return r;
    const stored = Array.isArray(r) ? r : Array.from({ length: r.n }, (_, k): EnqueueResult => ({ id: String(r.first + k), duplicate: false }));
    const results: (EnqueueResult | null)[] = new Array(items.length).fill(null);
    i = 0;
    for (let c = 0; c < calls.length; c++) {
      if (starts[c] >= 0) for (let k = 0; k < calls[c]; k++) results[i + k] = stored[starts[c] + k];
      i += calls[c];
    }
    return { results, errors };
  }

  work(opts: WorkOptions = {}): Worker<T> {
    return new WorkerImpl<T>(this.core(), opts);
  }

  async process(fn: (job: Job<T>) => Promise<unknown> | unknown, opts: ProcessOptions = {}): Promise<void> {
    const concurrency = opts.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_PREFETCH)
      throw new ValidationError(`concurrency must be an integer in [1, ${MAX_PREFETCH}]`);
    // The worker's signal is separate: on shutdown we stop receiving but let handlers settle.
    const { signal, ...rest } = opts;
    const worker = new WorkerImpl<T>(this.core(), { ...rest, prefetch: concurrency });
    let running = 0;
    let drained: (() => void) | null = null;
    const finish = (): void => {
      if (--running === 0 && drained !== null) drained();
    };
    const fail = (job: Job<T>, e: unknown): void => {
      let p: Promise<void>;
      try {
        if (e instanceof PermanentError) p = job.nack({ requeue: false, error: e });
        else if (signal?.aborted && job.signal.aborted) p = job.nack({ delayMs: 0, reason: "shutdown" });
        else p = job.nack({ error: e });
      } catch {
        p = Promise.resolve();
      }
      // A LeaseExpiredError here means the job is someone else's now: nothing to do.
      p.then(finish, finish);
    };
    const ok = (job: Job<T>): void => {
      // LeaseExpiredError: redelivered elsewhere; idempotent handlers make this safe.
      job.ack().then(finish, finish);
    };
    // Push mode: no iterator promise per job; `prefetch = concurrency` bounds running handlers.
    worker.onJob = (job) => {
      running++;
      let r: unknown;
      try {
        r = fn(job);
      } catch (e) {
        fail(job, e);
        return;
      }
      if (r !== null && typeof r === "object" && typeof (r as PromiseLike<unknown>).then === "function")
        (r as PromiseLike<unknown>).then(
          () => ok(job),
          (e) => fail(job, e),
        );
      else ok(job);
    };
    // Shutdown: stop receiving and abort running jobs' signals; their handlers may still settle.
    const onAbort = (): void => {
      worker.stopReceiving();
      worker.abortSignals(new AbortedError("worker shutting down", signal?.reason));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) onAbort();
    try {
      await worker.whenStopped();
    } finally {
      signal?.removeEventListener("abort", onAbort);
      if (running > 0) await new Promise<void>((r) => (drained = r));
      await worker.close();
    }
    if (worker.error !== null && !signal?.aborted) throw worker.error;
  }

  async stats(): Promise<QueueStats> {
    return (await this.core()).stats();
  }

  async purge(): Promise<number> {
    return (await this.core()).purge();
  }

  async redrive(opts?: RedriveOptions): Promise<RedriveResult> {
    return (await this.core()).redrive(opts);
  }

  /** Waits for background recovery (resumed dead-letter moves / redrive) to finish. Embedded only. */
  async whenIdle(): Promise<void> {
    await (await this.core()).whenIdle();
  }
}
