// SPDX-License-Identifier: Apache-2.0
/**
 * Storage quotas of tenants (docs/security.md#quotas, QUO-2): how many bytes each tenant with a
 * `storageBytes` quota holds, measured in the background, and the check a publish or enqueue
 * makes before anything is written.
 *
 * A tenant's storage is what its names hold: the retained bytes of every partition of its
 * topics and the bytes of the live jobs of its queues (dead-letter queues included), all named
 * `<tenant>.…` (ACL-2). It is measured every STORAGE_POLL_MS rather than per request: summing
 * partitions on the hot path would cost a describe per publish. Between measurements the bytes
 * of every write let through are added to the last figure, so a tenant cannot run far past its
 * bound within one poll: the bound is exceeded by at most the one write that crossed it (and
 * what a compression or a failed write makes the estimate overcount until the next
 * measurement). Retention and settled jobs bring a tenant back under.
 */
import { QuotaExceededError } from "../../errors.js";
import type { Logger } from "../../observability/telemetry.js";
import type { Broker } from "../../types.js";
import { TENANT_PREFIX, type QuotaSpec } from "./quotas.js";

export const STORAGE_POLL_MS = 1_000;

/** What usage is measured from: the broker's own listing calls (they create nothing). */
export type UsageSource = Pick<Broker, "listTopics" | "describeTopic" | "listQueues" | "queue">;

export class StorageUsage {
  /** Bytes held, by tenant entity (`tenant:NAME`), as last measured. */
  private readonly used = new Map<string, number>();
  /** Request bytes of writes let through since the running (or last) measurement started. */
  private readonly pending = new Map<string, number>();
  private timer: NodeJS.Timeout | null = null;
  private measuring = false;

  constructor(
    private readonly source: UsageSource,
    /** The quotas in force, keyed by entity (the policy's `quotas`). */
    private readonly quotas: () => Readonly<Record<string, QuotaSpec>>,
    private readonly logger: Logger,
    private readonly pollMs = STORAGE_POLL_MS,
  ) {}

  start(): void {
    if (this.timer !== null) return;
    this.timer = setInterval(() => void this.measure(), this.pollMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /**
   * QUO-2: throws QuotaExceededError when `entity` has a storage quota and holds (last
   * measurement plus writes let through since) at least its bound; otherwise counts `bytes`.
   */
  check(entity: string, spec: QuotaSpec, bytes: number): void {
    const limit = spec.storageBytes;
    if (limit === undefined) return;
    const used = this.usedBy(entity);
    if (used >= limit) throw new QuotaExceededError(entity, used, limit);
    this.pending.set(entity, (this.pending.get(entity) ?? 0) + bytes);
  }

  /** Bytes `entity` is taken to hold: the last measurement plus writes let through since. */
  usedBy(entity: string): number {
    return (this.used.get(entity) ?? 0) + (this.pending.get(entity) ?? 0);
  }

  /** Measures every tenant with a storage quota now (the poll, and tests). */
  async measure(): Promise<void> {
    if (this.measuring) return;
    this.measuring = true;
    try {
      const tenants = Object.entries(this.quotas()).flatMap(([k, q]) => (k.startsWith(TENANT_PREFIX) && q.storageBytes !== undefined ? [k] : []));
      for (const m of [this.used, this.pending]) for (const k of [...m.keys()]) if (!tenants.includes(k)) m.delete(k);
      if (tenants.length === 0) return;
      // Writes let through from here on may or may not be in what is measured: they stay
      // counted (over- rather than under-estimating); those before are in it.
      const before = new Map(this.pending);
      const sums = new Map(tenants.map((k) => [k, 0]));
      const owner = (name: string): string | undefined => tenants.find((k) => name.startsWith(`${k.slice(TENANT_PREFIX.length)}.`));
      for (const topic of await this.source.listTopics()) {
        const k = owner(topic);
        if (k === undefined) continue;
        const d = await this.source.describeTopic(topic).catch(() => null); // deleted meanwhile
        if (d !== null) sums.set(k, sums.get(k)! + d.partitions.reduce((s, p) => s + p.sizeBytes, 0));
      }
      for (const queue of await this.source.listQueues()) {
        const k = owner(queue);
        if (k === undefined) continue;
        const st = await this.source.queue(queue).stats().catch(() => null);
        if (st !== null) sums.set(k, sums.get(k)! + st.bytes);
      }
      for (const [k, v] of sums) {
        this.used.set(k, v);
        const left = (this.pending.get(k) ?? 0) - (before.get(k) ?? 0);
        if (left > 0) this.pending.set(k, left);
        else this.pending.delete(k);
      }
    } catch (err) {
      // Keep the last figures: a failed measurement neither opens nor closes anyone's writes.
      this.logger.warn({ err }, "tenant storage could not be measured; the last figures stay in force");
    } finally {
      this.measuring = false;
    }
  }
}
