// SPDX-License-Identifier: Apache-2.0
/**
 * `queue.process(fn, opts)`: one implementation for the embedded queue and the network
 * client's, over the worker interface both implement. Its shutdown semantics (docs/queues.md,
 * "Shutting down process()"), PROC-1:
 *
 *  1. When `signal` aborts, the worker stops receiving: no new job is delivered, and jobs
 *     delivered but not yet handed to `fn` go back without counting an attempt.
 *  2. The `job.signal` of every running handler aborts (AbortedError, cause: the signal's reason).
 *  3. Handlers run to completion and their outcome settles as usual (return = ack,
 *     PermanentError = dead letter), except a failure after the shutdown began: that job is not
 *     nacked (no failure record, no backoff); it stays leased until step 4.
 *  4. `process()` resolves once every handler has finished and its settlement is done; then the
 *     worker closes, releasing unsettled jobs (visible again at once; the delivery counts as an
 *     attempt) unless `onUnsettled: "error"`, which leaves them leased until their lease ends.
 * If the worker ends by itself (the queue could not be opened, the broker or client closed,
 * the queue was deleted), running handlers' signals abort, and `process()` rejects with that
 * error (BrokerClosedError when none was given) once they are done.
 */
import { AbortedError, BrokerClosedError, PermanentError, RateLimitedError, ValidationError } from "../errors.js";
import { DEFAULT_PROCESS_CONCURRENCY, prefetchOption } from "./config.js";
import type { Job, ProcessOptions, WorkOptions } from "./types.js";

/** What `process()` needs from a worker (embedded: QueueWorker; remote: client RemoteWorker). */
export interface ProcessWorker<T> {
  /** Push mode: each delivered job goes to this callback (no iterator promise per job). */
  onJob: ((job: Job<T>) => void) | null;
  /** Resolves once the worker stopped receiving (stopReceiving, close, or it ended itself). */
  whenStopped(): Promise<void>;
  /** No more deliveries; delivered jobs not yet handed out go back without counting an attempt. */
  stopReceiving(): void | Promise<void>;
  /** Aborts the `job.signal` of every job it holds, leaving the leases. */
  abortSignals(reason: Error): void;
  /** Closes; unsettled jobs are released per `onUnsettled`. */
  close(): Promise<void>;
  /** The error that ended the worker, if any. */
  takeError(): Error | null;
  /** Whether the queue keeps results: only then does a handler's return value go with the ack. */
  readonly keepsResults: boolean;
}

export type Handler<T> = (job: Job<T>) => Promise<unknown> | unknown;

/** Validates `opts` and splits them: the worker's options (prefetch = concurrency) and the signal. */
export function processWorkerOptions(opts: ProcessOptions): { work: WorkOptions; signal: AbortSignal | undefined } {
  const { signal, concurrency, ...rest } = opts;
  const prefetch = prefetchOption(concurrency, "concurrency", DEFAULT_PROCESS_CONCURRENCY);
  // The worker gets no signal: on shutdown it stops receiving, but handlers may still settle.
  return { work: { ...rest, prefetch }, signal };
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === "object" || typeof v === "function") && typeof (v as { then?: unknown }).then === "function";
}

/** Runs `fn` for each job the worker receives until `signal` aborts or the worker ends (PROC-1). */
export async function runProcess<T>(worker: ProcessWorker<T>, fn: Handler<T>, signal: AbortSignal | undefined): Promise<void> {
  let running = 0;
  let stopping = false;
  let drained: (() => void) | null = null;
  const finish = (): void => {
    if (--running === 0 && drained !== null) drained();
  };
  // A failed settlement means the lease was lost meanwhile: the job is someone else's now (at
  // least once; idempotent handlers make that safe). Job methods never throw synchronously, and
  // their promises never reject unhandled. A handler counts as finished once its settlement is
  // issued: `worker.close()` (step 4) waits until every settlement issued through the worker is
  // durable or failed, so no reaction per job is needed here (one promise and one microtask
  // less per job); `maxPendingSettlements` bounds those not yet durable meanwhile.
  const ok = (job: Job<T>, result: unknown): void => {
    if (result === undefined || !worker.keepsResults) {
      void job.ack();
      finish();
      return;
    }
    // A return value the queue cannot keep (not JSON, too large) fails the attempt: the ack is
    // refused before anything is written, and the job is nacked with that error (its history
    // shows why), rather than completed with its result silently dropped.
    job.ack(result).then(finish, (e: unknown) => {
      if (e instanceof ValidationError) void job.nack({ error: e });
      finish();
    });
  };
  const fail = (job: Job<T>, e: unknown): void => {
    if (e instanceof PermanentError) void job.nack({ requeue: false, error: e });
    else if (e instanceof RateLimitedError) void job.retryAfter(e.retryAfterMs);
    else if (!(stopping && job.signal.aborted)) void job.nack({ error: e });
    // else interrupted by the shutdown: not nacked, released on close
    finish();
  };
  worker.onJob = (job) => {
    running++;
    let r: unknown;
    try {
      r = fn(job);
    } catch (e) {
      fail(job, e);
      return;
    }
    if (isThenable(r))
      r.then(
        (v) => ok(job, v),
        (e) => fail(job, e),
      );
    else ok(job, r);
  };
  const onAbort = (): void => {
    stopping = true;
    void worker.stopReceiving();
    worker.abortSignals(new AbortedError("worker shutting down", signal?.reason));
  };
  signal?.addEventListener("abort", onAbort, { once: true });
  if (signal?.aborted) onAbort();
  let ended: Error | null = null;
  try {
    await worker.whenStopped();
    if (!stopping) {
      // The worker ended by itself (not our signal): running handlers are told, then we report it.
      ended = worker.takeError() ?? new BrokerClosedError("the worker was closed while process() was running");
      worker.abortSignals(ended);
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    if (running > 0) await new Promise<void>((r) => (drained = r));
    await worker.close();
  }
  if (ended !== null) throw ended;
}
