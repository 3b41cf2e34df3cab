// SPDX-License-Identifier: Apache-2.0
/**
 * Quotas per tenant or principal (docs/security.md#quotas): publish and consume bytes per
 * second and requests per second, enforced by delaying (as Kafka does: the connection stops
 * being read until the debt is paid), never by disconnecting; and a bound on connections,
 * refused at login; and a bound on a tenant's stored bytes, refused at publish (QUO-2,
 * src/security/acl/storage-usage.ts). QUO-1 in docs/ARCHITECTURE.md.
 *
 * A rate is a token bucket holding at most one second of its rate. A request is never refused
 * for its size: it takes what it needs, the bucket goes into debt, and the connection waits
 * until the debt is paid. Over time the entity gets exactly its rate; other entities' buckets
 * are untouched, so a runaway producer slows down alone.
 */
import { ValidationError } from "../../errors.js";

export interface QuotaSpec {
  publishBytesPerSec?: number;
  consumeBytesPerSec?: number;
  requestsPerSec?: number;
  connections?: number;
  /** Tenants only: bytes of retained records in the tenant's topics and of live jobs in its queues. */
  storageBytes?: number;
}

export type QuotaKind = "publishBytesPerSec" | "consumeBytesPerSec" | "requestsPerSec";
export const QUOTA_FIELDS = ["publishBytesPerSec", "consumeBytesPerSec", "requestsPerSec", "connections", "storageBytes"] as const;
export const TENANT_PREFIX = "tenant:";
const KEY_RE = /^(?:tenant:[a-z0-9][a-z0-9-]{0,62}|[A-Za-z0-9._@-]{1,128})$/;
/** Longest a connection is held for one request's debt: a huge request on a tiny quota waits at most this at a time. */
export const MAX_THROTTLE_MS = 30_000;

export function validateQuota(key: string, q: QuotaSpec): void {
  if (!KEY_RE.test(key)) throw new ValidationError(`quota key ${JSON.stringify(key)}: a principal or tenant:NAME`);
  if (q === null || typeof q !== "object") throw new ValidationError(`quota ${key} must be an object`);
  for (const [k, v] of Object.entries(q)) {
    if (!(QUOTA_FIELDS as readonly string[]).includes(k)) throw new ValidationError(`quota ${key}: unknown field ${k} (one of ${QUOTA_FIELDS.join(", ")})`);
    if (!Number.isSafeInteger(v) || (v as number) < 1) throw new ValidationError(`quota ${key}: ${k} must be a positive integer`);
  }
  // Storage belongs to names, and names to tenants: a principal has no storage of its own.
  if (q.storageBytes !== undefined && !key.startsWith(TENANT_PREFIX)) throw new ValidationError(`quota ${key}: storageBytes applies to tenants only (tenant:NAME)`);
}

class Bucket {
  private tokens: number;
  private at: number;
  constructor(
    private rate: number,
    now: number,
  ) {
    this.tokens = rate;
    this.at = now;
  }
  /** Takes `n`; returns how long (ms) until the bucket is out of debt (0: none). */
  take(n: number, rate: number, now: number): number {
    if (rate !== this.rate) this.rate = rate;
    this.tokens = Math.min(this.rate, this.tokens + ((now - this.at) * this.rate) / 1000);
    this.at = now;
    this.tokens -= n;
    return this.tokens >= 0 ? 0 : Math.min(MAX_THROTTLE_MS, Math.ceil((-this.tokens * 1000) / this.rate));
  }
}

/** Rates and connection counts of every entity with a quota (one per server). */
export class QuotaTracker {
  private readonly buckets = new Map<string, Bucket>();
  private readonly conns = new Map<string, number>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** Charges `n` of `kind` to `entity` under `spec`; the ms to hold the connection (0: none). */
  charge(entity: string, spec: QuotaSpec, kind: QuotaKind, n: number): number {
    const rate = spec[kind];
    if (rate === undefined || n <= 0) return 0;
    const key = `${entity}\u0000${kind}`;
    const now = this.now();
    let b = this.buckets.get(key);
    if (b === undefined) {
      b = new Bucket(rate, now);
      this.buckets.set(key, b);
    }
    return b.take(n, rate, now);
  }

  /** Counts a connection of `entity`; false (nothing counted) when it is at its bound. */
  openConnection(entity: string, spec: QuotaSpec): boolean {
    const n = this.conns.get(entity) ?? 0;
    if (spec.connections !== undefined && n >= spec.connections) return false;
    this.conns.set(entity, n + 1);
    return true;
  }

  closeConnection(entity: string): void {
    const n = (this.conns.get(entity) ?? 1) - 1;
    if (n <= 0) this.conns.delete(entity);
    else this.conns.set(entity, n);
  }
}
