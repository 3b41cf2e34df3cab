// SPDX-License-Identifier: Apache-2.0
/**
 * Authorization in force (docs/security.md#authorization): the policy, the check made before
 * an operation runs, list filtering, denied operations audited, and applying a changed policy
 * to live subscriptions and workers (ACL-3). The server's ports use it (src/server/, with the
 * quotas), and so does the embedded principal view (src/broker/principal-view.ts, ACL-5).
 *
 * A null principal is not checked: a server without credentials has no principals, so it runs
 * open (and only on loopback unless told otherwise, AUTH-3).
 */
import { Authorizer, emptyPolicy, type Need, type ResourceType } from "./model.js";
import { POLICY_POLL_MS, type PolicyStore } from "./policy-store.js";
import type { Logger } from "../../observability/telemetry.js";
import { deniedError, firstDenied } from "./needs.js";
import type { AuditActor } from "../audit/record.js";
import { ValidationError } from "../../errors.js";
import { QuotaTracker, type QuotaKind } from "./quotas.js";
import type { AuditTarget } from "../audit/auditor.js";
import { StorageUsage, type UsageSource } from "./storage-usage.js";
import { policySha, type ChangeBaseline } from "../audit/change-baseline.js";

/** Writes one audit record (the broker's `recordAudit`). */
export type RecordAudit = (actor: AuditActor, target: AuditTarget, error?: unknown) => Promise<void>;

/** A denied request is audited once per (principal, source, operation, resource) per window, with a count. */
const DENIED_WINDOW_MS = 60_000;
const MAX_DENIED_KEYS = 10_000;

/** What a connection, an HTTP request or an embedded principal view is checked as. */
export interface Gate {
  /** Throws the request's error (ACL-4) when `principal` may not do every one of `needs`. */
  check(principal: string | null, needs: readonly Need[], actor?: AuditActor): void;
  /** Keeps the names `principal` may see (ACL-4: the others are not listed). */
  visible<T>(principal: string | null, type: ResourceType, items: readonly T[], name: (item: T) => string): T[];
  /** Whether `principal` may do `need` (null: the server runs without credentials). */
  allows(principal: string | null, need: Need): boolean;
  /**
   * An HTTP request's quotas (QUO-1, QUO-2): charges one request, and `bytes` of publishing or
   * consuming when `needs` says it does either; throws QuotaExceededError for a write of a
   * tenant at its storage quota. Returns how long to delay the request (0: not at all).
   */
  chargeHttp(principal: string | null, needs: readonly Need[], kind: "request" | "reply", bytes: number): number;
  /** The tenant `principal` belongs to (ACL-2), or null. */
  tenantOf(principal: string): string | null;
}

/** Called for every live connection when the policy changes, to end what is no longer allowed. */
export type Reauthorize = () => void;

export class PolicyAuthorization implements Gate {
  private timer: NodeJS.Timeout | null = null;
  private polling = false;
  private readonly listeners = new Set<Reauthorize>();
  private readonly quotas = new QuotaTracker();
  /** Denials audited in the current window: key -> [window start, denials since the record]. */
  private readonly denied = new Map<string, [number, number]>();
  /** Tenants' stored bytes (QUO-2); null without a broker to measure. */
  readonly storage: StorageUsage | null;

  constructor(
    private readonly store: PolicyStore | null,
    private readonly logger: Logger,
    private readonly audit: RecordAudit | null = null,
    usage: UsageSource | null = null,
    /** What the audit log last recorded of the policy (AUD-5); null: changes are recorded as seen. */
    private readonly baseline: ChangeBaseline | null = null,
  ) {
    this.storage = usage === null ? null : new StorageUsage(usage, () => this.authorizer.policy.quotas, logger);
  }

  /** The decisions in force. Without a policy store (no data dir) nothing is allowed. */
  get authorizer(): Authorizer {
    return this.store?.authorizer ?? DENY_ALL;
  }

  /** Re-reads the policy every POLICY_POLL_MS (ACL-3) until `stop()`. */
  start(): void {
    if (this.store === null || this.timer !== null) return;
    if (this.store.error !== null) this.logger.error({ err: this.store.error }, "authorization policy refused: every request of a logged-in principal is denied until it is fixed");
    this.timer = setInterval(() => void this.poll(), POLICY_POLL_MS);
    this.timer.unref();
    this.storage?.start();
    // AUD-5: a policy edited while no server ran is recorded by the next one to start.
    if (this.baseline !== null && this.store.error === null && policySha(this.store.policy) !== this.baseline.state.policySha) this.recordPolicyChange();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.storage?.stop();
  }

  /** Registers a live connection's re-check; returns its removal. */
  onChange(fn: Reauthorize): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** Re-reads the policy now (tests, and the poll). */
  async poll(): Promise<void> {
    if (this.store === null || this.polling) return;
    this.polling = true;
    try {
      if (!(await this.store.refresh())) return;
      if (this.store.error !== null) this.logger.error({ err: this.store.error }, "authorization policy refused: every request of a logged-in principal is denied until it is fixed");
      else this.logger.info({ rules: this.store.policy.rules.length, tenants: Object.keys(this.store.policy.tenants).length }, "authorization policy reloaded");
      this.recordPolicyChange();
      for (const fn of this.listeners) fn();
    } catch (err) {
      this.logger.error({ err }, "authorization policy could not be re-read");
    } finally {
      this.polling = false;
    }
  }

  /** QUO-1: charges `n` of `kind` to the principal's quotas; how long to hold its connection (0: not at all). */
  throttle(principal: string, kind: QuotaKind, n: number): number {
    let ms = 0;
    for (const { entity, spec } of this.authorizer.quotasOf(principal)) ms = Math.max(ms, this.quotas.charge(entity, spec, kind, n));
    return ms;
  }

  /** QUO-2: throws QuotaExceededError when a tenant of `principal` is at its storage quota (before a write of `bytes` is let through). */
  checkStorage(principal: string, bytes: number): void {
    if (this.storage === null) return;
    for (const { entity, spec } of this.authorizer.quotasOf(principal)) this.storage.check(entity, spec, bytes);
  }

  /** Counts a connection of `principal` against its connection quotas; its release, or null when one is full. */
  admitConnection(principal: string): (() => void) | null {
    const taken: string[] = [];
    for (const { entity, spec } of this.authorizer.quotasOf(principal)) {
      if (!this.quotas.openConnection(entity, spec)) {
        for (const e of taken) this.quotas.closeConnection(e);
        return null;
      }
      taken.push(entity);
    }
    return () => {
      for (const e of taken) this.quotas.closeConnection(e);
    };
  }

  /**
   * A changed policy file is audited when the server takes it into force (`acl.change`, with
   * its size and a hash of its contents). `sluice acl` edits the file directly, so the record
   * names the data directory as its source, not a logged-in principal.
   */
  private recordPolicyChange(): void {
    if (this.audit === null || this.store === null) return;
    const p = this.store.policy;
    const sha = policySha(p);
    const details = { rules: p.rules.length, groups: Object.keys(p.groups).length, tenants: Object.keys(p.tenants).length, quotas: Object.keys(p.quotas).length, sha256: sha };
    const err = this.store.error === null ? undefined : new ValidationError(this.store.error);
    this.audit({ principal: "data-dir", source: "acl.json" }, { op: "acl.change", resourceType: "server", resource: "acl.json", details }, err)
      // AUD-5: the baseline moves only once the record is durable, and only to a policy in force.
      .then(() => (err === undefined ? this.baseline?.save({ policySha: sha }) : undefined))
      .catch((e: unknown) => this.logger.error({ err: e }, "audit record of a policy change not written"));
  }

  check(principal: string | null, needs: readonly Need[], actor?: AuditActor): void {
    if (principal === null || needs.length === 0) return;
    const authz = this.authorizer;
    const denied = firstDenied(authz, principal, needs);
    if (denied === null) return;
    const err = deniedError(authz, principal, denied);
    this.recordDenied(actor ?? { principal, source: "unknown" }, denied, err);
    throw err;
  }

  /**
   * Every denied request is audited (docs/security.md "Audit log"), but a client retrying in a
   * loop must not grow the audit log without bound: the first denial of a (principal, source
   * address, operation, resource) is written at once, later ones in the same minute are
   * counted into the next record of that key. Written in the background: a refused request
   * never waits on the disk.
   */
  private recordDenied(actor: AuditActor, need: Need, err: Error): void {
    if (this.audit === null) return;
    const now = Date.now();
    const host = actor.source.replace(/:\d+$/, "");
    const key = `${actor.principal}\u0000${host}\u0000${need.op}\u0000${need.type}\u0000${need.name}`;
    const seen = this.denied.get(key);
    if (seen !== undefined && now - seen[0] < DENIED_WINDOW_MS) {
      seen[1]++;
      return;
    }
    if (this.denied.size >= MAX_DENIED_KEYS) this.denied.clear();
    const count = (seen?.[1] ?? 0) + 1;
    this.denied.set(key, [now, 0]);
    const resourceType = need.type === "dlq" ? "queue" : need.type === "cluster" ? "server" : need.type;
    const details = { operation: need.op, kind: need.type, count };
    this.audit(actor, { op: "acl.denied", resourceType, resource: need.name, details }, err).catch((e: unknown) => this.logger.error({ err: e }, "audit record of a denied request not written"));
  }

  visible<T>(principal: string | null, type: ResourceType, items: readonly T[], name: (item: T) => string): T[] {
    if (principal === null) return [...items];
    const authz = this.authorizer;
    return items.filter((it) => authz.canSee(principal, type, name(it)));
  }

  allows(principal: string | null, need: Need): boolean {
    return principal === null || this.authorizer.allows(principal, need);
  }

  chargeHttp(principal: string | null, needs: readonly Need[], kind: "request" | "reply", bytes: number): number {
    if (principal === null) return 0;
    if (kind === "reply") return needs.some((n) => n.op === "consume") ? this.throttle(principal, "consumeBytesPerSec", bytes) : 0;
    let ms = this.throttle(principal, "requestsPerSec", 1);
    if (needs.some((n) => n.op === "publish")) {
      this.checkStorage(principal, bytes);
      ms = Math.max(ms, this.throttle(principal, "publishBytesPerSec", bytes));
    }
    return ms;
  }

  tenantOf(principal: string): string | null {
    return this.authorizer.tenantOf(principal);
  }
}

const DENY_ALL = new Authorizer(emptyPolicy());
