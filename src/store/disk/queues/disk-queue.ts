// SPDX-License-Identifier: Apache-2.0
/**
 * A disk queue as callers hold it (`StoredQueue`): a stable object over the queue's current
 * open instance (queue-instance.ts), which it replaces when a storage fault stops it.
 *
 * Q-7 (docs/ARCHITECTURE.md): a queue whose write failed reopens itself from disk, as a
 * faulted partition does (DiskEngine.scheduleRecovery): the failed instance is closed without
 * a snapshot and the queue is recovered from its logs (recovery.ts), retried with backoff while
 * the disk keeps failing. Meanwhile every call gets a retriable StorageError. Leases of the
 * failed instance are lost (their holders were told, LEASE-2); the jobs they held are restored
 * as leases "before restart" from the journal and expire at their stored deadline. Listeners
 * (the policy's dispatchers) stay attached and hear `available` once the queue is back.
 */
import { BrokerClosedError, StorageError } from "../../../errors.js";
import type { AttemptRecord, QueueStats, RedriveOptions, RedriveResult } from "../../../queues/types.js";
import type {
  EnqueueOutcome,
  EnqueueRequestOptions,
  GrantedJob,
  GrantRequest,
  Lease,
  NewJob,
  QueueListener,
  QueueSettings,
  StoredBrowsePage,
  StoredBrowseRequest,
  StoredEventsPage,
  StoredEventsRequest,
  StoredJobInfo,
  StoredQueue,
} from "../../queue-store.js";
import { nextRecoveryDelay, RECOVERY_MIN_DELAY_MS } from "../recovery-backoff.js";
import { readEvents } from "./event-reader.js";
import { QueueInstance, type InstanceOptions, type QueueFiles } from "./queue-instance.js";

export class DiskQueue implements StoredQueue {
  readonly name: string;
  readonly incarnation: string;
  private current: QueueInstance | null = null;
  /** An array, not a Set: `notify` runs on every settlement and must not allocate an iterator. */
  private listeners: QueueListener[] = [];
  private recovering: Promise<void> | null = null;
  private wakeRecovery: (() => void) | null = null;
  private closed = false;
  private _settings: QueueSettings;

  private constructor(private readonly o: QueueFiles) {
    this.name = o.name;
    this.incarnation = o.incarnation;
    this._settings = o.settings;
  }

  static async open(o: QueueFiles): Promise<DiskQueue> {
    const q = new DiskQueue(o);
    q.current = await QueueInstance.open(q.instanceOptions());
    return q;
  }

  get settings(): QueueSettings {
    return this._settings;
  }

  get hasFlows(): boolean {
    return this.current?.hasFlows ?? false;
  }

  /** New settings (the stored config changed); log-level ones apply from the next open. */
  configure(s: QueueSettings): void {
    this._settings = s;
    if (this.current) this.current.settings = s;
  }

  private instanceOptions(): InstanceOptions {
    return {
      name: this.name,
      incarnation: this.incarnation,
      dir: this.o.dir,
      fs: this.o.fs,
      settings: this._settings,
      telemetry: this.o.telemetry,
      peer: this.o.peer,
      keyring: this.o.keyring,
      available: () => this.notify(),
      beforeWrite: () => {
        const ls = this.listeners;
        for (let i = 0; i < ls.length; i++) ls[i].beforeWrite?.();
      },
      onFault: () => this.scheduleRecovery(),
    };
  }

  private notify(): void {
    const ls = this.listeners;
    for (let i = 0; i < ls.length; i++) ls[i].available();
  }

  /** The instance to work on (it checks its own health), or the reason there is none right now. */
  private live(): QueueInstance {
    const q = this.current;
    if (q !== null) return q;
    if (this.closed) throw new BrokerClosedError(`queue ${this.name} is closed`);
    throw new StorageError(`queue ${this.name} is being reopened after a storage failure; retry shortly`);
  }

  /** reopens the queue from disk, with backoff while that fails. */
  private scheduleRecovery(): void {
    if (this.recovering || this.closed) return;
    const failed = this.current;
    this.recovering = (async () => {
      await failed?.close().catch(() => {});
      this.current = null;
      let delay = RECOVERY_MIN_DELAY_MS;
      for (;;) {
        await new Promise<void>((resolve) => {
          // Unref'd: a queue nobody uses does not keep the process alive to recover.
          const timer = setTimeout(done, delay);
          timer.unref();
          function done(): void {
            clearTimeout(timer);
            resolve();
          }
          this.wakeRecovery = done;
        });
        this.wakeRecovery = null;
        if (this.closed) return;
        try {
          const q = await QueueInstance.open(this.instanceOptions());
          if (this.closed) {
            await q.close();
            return;
          }
          this.current = q;
          this.o.telemetry.logger.info({ queue: this.name }, "queue recovered from disk after a storage failure");
          this.notify();
          return;
        } catch (e) {
          delay = nextRecoveryDelay(delay);
          this.o.telemetry.logger.warn({ err: e, queue: this.name, retryInMs: delay }, "queue recovery failed; retrying");
        }
      }
    })().finally(() => {
      this.recovering = null;
    });
  }

  enqueue(jobs: readonly NewJob[], opts?: EnqueueRequestOptions): Promise<EnqueueOutcome> {
    try {
      return this.live().enqueue(jobs, opts);
    } catch (e) {
      return Promise.reject(e);
    }
  }
  grant(requests: readonly GrantRequest[]): Promise<GrantedJob[][]> {
    return this.live().grant(requests);
  }
  ack(lease: Lease, result?: string): Promise<void> {
    return this.live().ack(lease, result);
  }
  retry(lease: Lease, visibleAt: number, failure: AttemptRecord): Promise<void> {
    return this.live().retry(lease, visibleAt, failure);
  }
  giveBack(lease: Lease, visibleAt: number): Promise<void> {
    return this.live().giveBack(lease, visibleAt);
  }
  deadLetter(lease: Lease, failure: AttemptRecord): Promise<void> {
    return this.live().deadLetter(lease, failure);
  }
  extend(lease: Lease, ms: number): Promise<void> {
    return this.live().extend(lease, ms);
  }
  progress(lease: Lease, json: string): Promise<void> {
    return this.live().progress(lease, json);
  }
  /** Reads through whichever instance is current (the logs are the same files after a reopen). */
  async readEvents(req: StoredEventsRequest): Promise<StoredEventsPage> {
    return readEvents(() => this.live().eventSource(), req);
  }
  release(lease: Lease, counted: boolean): void {
    this.current?.release(lease, counted);
  }
  restartLease(lease: Lease): void {
    this.current?.restartLease(lease);
  }
  async stats(): Promise<QueueStats> {
    return this.live().stats();
  }
  async getJob(id: string): Promise<StoredJobInfo | null> {
    return this.live().getJob(id);
  }
  async browse(req: StoredBrowseRequest): Promise<StoredBrowsePage> {
    return this.live().browse(req);
  }
  async remove(id: string): Promise<boolean> {
    return this.live().remove(id);
  }

  async purge(): Promise<number> {
    return this.live().purge();
  }
  async redrive(opts: RedriveOptions): Promise<RedriveResult> {
    return this.live().redrive(opts);
  }
  listen(listener: QueueListener): () => void {
    this.listeners = [...this.listeners, listener];
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }
  async whenIdle(): Promise<void> {
    await this.current?.whenIdle();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.wakeRecovery?.();
    await this.recovering;
    // The instance stays reachable while it closes: releases of grants still in flight land in
    // its journal before the final snapshot (their holders are gone).
    await this.current?.close();
    this.current = null;
  }
}
