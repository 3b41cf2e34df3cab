// SPDX-License-Identifier: Apache-2.0
/**
 * The server's side of authorization (docs/security.md#authorization): the policy in force,
 * the check both ports make before a request runs, list filtering, and applying a changed
 * policy to live connections (ACL-3).
 *
 * Only authenticated connections are checked: a server without credentials has no principals,
 * so it runs open (and only on loopback unless told otherwise, AUTH-3).
 */
import { Authorizer, type Need, type ResourceType } from "../security/acl/model.js";
import { POLICY_POLL_MS, type PolicyStore } from "../security/acl/policy-store.js";
import type { Logger } from "../observability/telemetry.js";
import { deniedError, firstDenied } from "./permissions.js";

/** What a connection or HTTP request is checked as. */
export interface Gate {
  /** Throws the request's error (ACL-4) when `principal` may not do every one of `needs`. */
  check(principal: string | null, needs: readonly Need[]): void;
  /** Keeps the names `principal` may see (ACL-4: the others are not listed). */
  visible<T>(principal: string | null, type: ResourceType, items: readonly T[], name: (item: T) => string): T[];
  /** Whether `principal` may do `need` (null: the server runs without credentials). */
  allows(principal: string | null, need: Need): boolean;
}

/** Called for every live connection when the policy changes, to end what is no longer allowed. */
export type Reauthorize = () => void;

export class ServerAuthorization implements Gate {
  private timer: NodeJS.Timeout | null = null;
  private polling = false;
  private readonly listeners = new Set<Reauthorize>();

  constructor(
    private readonly store: PolicyStore | null,
    private readonly logger: Logger,
  ) {}

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
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
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
      for (const fn of this.listeners) fn();
    } catch (err) {
      this.logger.error({ err }, "authorization policy could not be re-read");
    } finally {
      this.polling = false;
    }
  }

  check(principal: string | null, needs: readonly Need[]): void {
    if (principal === null || needs.length === 0) return;
    const authz = this.authorizer;
    const denied = firstDenied(authz, principal, needs);
    if (denied !== null) throw deniedError(authz, principal, denied);
  }

  visible<T>(principal: string | null, type: ResourceType, items: readonly T[], name: (item: T) => string): T[] {
    if (principal === null) return [...items];
    const authz = this.authorizer;
    return items.filter((it) => authz.canSee(principal, type, name(it)));
  }

  allows(principal: string | null, need: Need): boolean {
    return principal === null || this.authorizer.allows(principal, need);
  }
}

const DENY_ALL = new Authorizer({ rules: [], groups: {}, tenants: {} });
