// SPDX-License-Identifier: Apache-2.0
/**
 * The leases this node granted on one PostgreSQL queue, in memory.
 *
 * Why in memory although the lease is a row: the interface needs answers without a round trip.
 * A settlement must throw LeaseExpiredError synchronously for a lease that already ended (Q-3,
 * "errors known at once"), `grant` must know how many leases each consumer holds (`upTo`),
 * and LEASE-1..3 run on a monotonic clock from the hand-out, which only the granting node has.
 * The row holds the durable truth (`lease_token`, `attempts`, `lease_deadline` on the wall
 * clock): every settlement names the token in its WHERE clause, so a lease this node still
 * believes in but that another node expired (a wall-clock deadline passed while this node
 * stalled) affects no row and rejects with LeaseExpiredError.
 */
import type { Lease, LeaseConsumer } from "../../queue-store.js";

export class PgLease implements Lease {
  readonly receipt: string;
  ended = false;
  constructor(
    readonly jobId: string,
    readonly attempt: number,
    /** Wall-clock deadline (informational; also stored in the row). */
    public deadline: number,
    /** The row's `lease_token` while this lease holds it. */
    readonly token: string,
    readonly consumer: LeaseConsumer,
    public startedMono: number,
    public deadlineMono: number,
  ) {
    this.receipt = `${jobId}.${attempt}`;
  }
}

export class LeaseTable {
  private readonly byJob = new Map<string, PgLease>();
  private readonly held = new Map<LeaseConsumer, number>();

  get size(): number {
    return this.byJob.size;
  }

  add(l: PgLease): void {
    this.byJob.set(l.jobId, l);
    this.held.set(l.consumer, (this.held.get(l.consumer) ?? 0) + 1);
  }

  /** The live lease `lease` names, or null when it ended (or never was this node's). */
  current(lease: Lease): PgLease | null {
    const l = this.byJob.get(lease.jobId);
    return l !== undefined && l === lease && !l.ended ? l : null;
  }

  /** Ends `l` (idempotent); true when it was live. */
  end(l: PgLease): boolean {
    if (l.ended || this.byJob.get(l.jobId) !== l) return false;
    l.ended = true;
    this.byJob.delete(l.jobId);
    const n = (this.held.get(l.consumer) ?? 1) - 1;
    if (n <= 0) this.held.delete(l.consumer);
    else this.held.set(l.consumer, n);
    return true;
  }

  heldBy(c: LeaseConsumer): number {
    return this.held.get(c) ?? 0;
  }

  /** Leases whose monotonic deadline passed at `mono`. */
  expired(mono: number): PgLease[] {
    const out: PgLease[] = [];
    for (const l of this.byJob.values()) if (l.deadlineMono <= mono) out.push(l);
    return out;
  }

  nextDeadline(): number {
    let next = Infinity;
    for (const l of this.byJob.values()) if (l.deadlineMono < next) next = l.deadlineMono;
    return next;
  }

  /** Tokens of the live leases (the sweep of other nodes' expired leases leaves these alone). */
  tokens(): string[] {
    return [...this.byJob.values()].map((l) => l.token);
  }

  all(): PgLease[] {
    return [...this.byJob.values()];
  }
}
