// SPDX-License-Identifier: Apache-2.0
/**
 * The work-queue half of what the server needs from a broker (`BrokerHost` in
 * src/broker/host.ts), which the embedded broker implements (src/queues/manager.ts). Besides
 * the user-facing `Queue<T>`, a queue the server works on offers what its network operations
 * need, so src/server/remote-queue.ts needs no casts or `instanceof` probes:
 *  - enqueues of decoded wire records (the client's value bytes stored as they are), several
 *    client calls in one idempotent request (`enqueueCalls`);
 *  - push-mode workers (`pushWorker`): jobs arrive in whole hand-out rounds, carry a delivery
 *    tag the server attaches, report lease loss through a callback, expose their stored bytes
 *    for forwarding, and can be given back without counting an attempt (`unstart`).
 */
import type { ValueKind } from "../log/record-batch.js";
import type { EnqueueIdentity } from "./idempotence.js";
import type { EnqueueItemOptions } from "./prepare.js";
import type { EnqueueResult, Job, Queue, QueueConfig, QueueEvent, WorkOptions } from "./types.js";
import type { QueueSettings } from "../store/queue-store.js";
import type { AuditActor } from "../security/audit/record.js";

export interface QueueHostApi {
  /** A handle on a queue, created on first use; its administrative operations are audited as `actor`. */
  queue<T = unknown>(name: string, config?: QueueConfig, actor?: AuditActor): HostQueue<T>;
  listQueues(): Promise<string[]>;
  /** Durably deletes a queue and its jobs; `QueueNotFoundError` if there is none. */
  deleteQueue(name: string, actor?: AuditActor): Promise<void>;
}

/** A job of a network enqueue request: the value's bytes and kind as the client encoded them. */
export interface RawEnqueueItem {
  value: Buffer | null;
  valueKind: ValueKind;
  opts: EnqueueItemOptions;
}

/** The answer to a network enqueue request. */
export type EnqueueCallsOutcome =
  /** Every job new and every call valid: ids `first .. first + count - 1`. */
  | { first: number; count: number }
  /** One result per job (null for the jobs of failed calls) and the failed calls' errors. */
  | { results: (EnqueueResult | null)[]; errors: [number, unknown][] };

export interface HostQueue<T = unknown> extends Queue<T> {
  /**
   * One network enqueue request holding several of the client's enqueue calls (`calls`: their
   * job counts, in order; absent: one call). Each call is validated on its own, so a bad job
   * fails only its own call; the jobs of the valid calls are stored as one request (one
   * identity, admitted together).
   */
  enqueueCalls(items: readonly RawEnqueueItem[], calls: readonly number[] | undefined, opts: { signal?: AbortSignal; identity?: EnqueueIdentity }): Promise<EnqueueCallsOutcome>;
  /** A worker that pushes jobs to `opts.onJobs` in whole hand-out rounds. */
  pushWorker(opts: PushWorkerOptions): PushWorker;
  /** The queue's stored config, defaults filled in (QueueNotFoundError when it does not exist). */
  settings(): Promise<QueueSettings>;
  /** One page of `events()` after `from` (QUEUE_EVENTS): at most `max`, waiting up to `maxWaitMs` for one. */
  readEvents(from: string, max: number, maxWaitMs: number, signal?: AbortSignal): Promise<{ events: QueueEvent[]; position: string }>;
}

/** A delivered job as the server handles it. */
export interface DeliveredJob extends Job<unknown> {
  /** The server's delivery tag for this job (opaque to the queue). */
  tag: number;
  /** The stored value's bytes and kind, and the user headers, for forwarding without a decode. */
  readonly stored: { readonly value: Buffer | null; readonly valueKind: ValueKind; readonly headers: [string, Buffer][] | null };
  /** False once the lease ended (settled, expired, purged, released). */
  readonly leaseHeld: boolean;
  /** Gives the job back: it never reached a consumer, so this delivery is not an attempt. */
  unstart(): void;
  /** The lease clock restarts now (same length): the consumer gets the whole lease. */
  restartLease(): void;
}

export interface PushWorkerOptions extends Omit<WorkOptions, "signal"> {
  /** The jobs of one hand-out round, durable; they count against `prefetch` until settled. */
  onJobs(jobs: DeliveredJob[]): void;
  /** A lease of a delivered job ended without a settlement through it (LEASE-2). */
  onLeaseLost(job: DeliveredJob, reason: unknown): void;
}

export interface PushWorker {
  /** The lease length of this worker's jobs. Known once the queue is open (`whenOpen`). */
  readonly visibilityTimeoutMs: number;
  /** Whether the queue keeps acks' results (`resultRetentionMs`); false until it is open. */
  readonly keepsResults: boolean;
  /** Whether the queue is encrypted at rest: its failure reasons stay out of the server's log (ENC-3). */
  readonly encrypted: boolean;
  /** Resolves once the queue is open (or failed to open: see `openError`). */
  whenOpen(): Promise<void>;
  /** Changes how many unsettled jobs it may hold (more: granted on the next round; 0: none). */
  setPrefetch(n: number): void;
  /** Grants now instead of on the next event-loop turn (after a batch of settlements). */
  grantNow(): void;
  /** Resolves once the worker stopped (closed, or the queue could not be opened, or closed). */
  whenStopped(): Promise<void>;
  /** Why the worker could not start (the queue could not be opened), if so. */
  readonly openError: Error | null;
  /** Stops; unsettled jobs are released per `onUnsettled`. */
  close(): Promise<void>;
}
