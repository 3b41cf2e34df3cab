// SPDX-License-Identifier: Apache-2.0
/**
 * Audit records of authentication results (`auth.login`, docs/security.md "Audit log", AUD-4),
 * bounded so that nobody can grow the audit log just by trying to log in:
 *
 * - a protocol login that succeeds is recorded, durably, before the connection is told so;
 * - HTTP authenticates every request: the first success of a principal from an address is
 *   recorded before the request runs, repeats within `successWindowMs` are counted and
 *   written as one record with their `count` when the window ends;
 * - failures are aggregated per source address (and interface) the same way over
 *   `failureWindowMs`: the first one is written at once, the rest of the window as one
 *   record with their `count`, so a flood from one address costs one record per window.
 *
 * Failure records are not awaited: the refused peer gets its answer at once and cannot make
 * the server wait on the disk. No record holds a password, a token or a SCRAM proof: callers
 * pass the attempted name, the mechanism and a fixed reason only.
 */
import { AuthenticationError, StorageError } from "../../errors.js";
import type { Logger } from "../../observability/telemetry.js";
import type { AuditTarget } from "./auditor.js";
import type { AuditActor, AuditDetails } from "./record.js";

/** Writes one record durably (the broker's auditor: `BrokerHost.recordAudit`). */
export type AuditSink = (actor: AuditActor, target: AuditTarget, error?: unknown) => Promise<void>;

/** One authentication attempt, as the server saw it. Never carries a secret. */
export interface AuthAttempt {
  /** The interface: "protocol" (the binary protocol's handshake) or "http". */
  via: "protocol" | "http";
  /** The peer's address without its port: the unit of aggregation. */
  source: string;
  /** The peer's `host:port`, recorded on the records of single attempts. */
  remote: string;
  /** The authenticated principal, the user name tried, or "anonymous" when none was named. */
  principal: string;
  /** "SCRAM-SHA-256", "BEARER", "BASIC", "TLS" (a client certificate), or "none" (no usable credentials). */
  mechanism: string;
}

export interface AuthAuditOptions {
  /** Failures from one address within this window share one record. Default 1000 ms. */
  failureWindowMs?: number;
  /** HTTP successes of one principal from one address within this window share one record. Default 60 000 ms. */
  successWindowMs?: number;
  /** Aggregation windows open at most; beyond, new keys share one overflow window. Default 10 000. */
  maxWindows?: number;
}

interface Window {
  attempt: AuthAttempt;
  failed: boolean;
  /** Attempts since the last record. */
  count: number;
  /** Distinct principals, mechanisms and reasons among them (each capped at MAX_DISTINCT). */
  principals: Set<string>;
  /** Addresses (more than one only in the overflow window). */
  sources: Set<string>;
  mechanisms: Set<string>;
  reasons: Set<string>;
  timer: NodeJS.Timeout;
}

const OVERFLOW = "\u0000overflow";
/** Distinct values listed in an aggregate record's details; beyond, "…" says there were more. */
const MAX_DISTINCT = 4;

export class AuthAudit {
  private readonly windows = new Map<string, Window>();
  private readonly pending = new Set<Promise<void>>();
  private readonly failureWindowMs: number;
  private readonly successWindowMs: number;
  private readonly maxWindows: number;

  constructor(
    private readonly sink: AuditSink,
    private readonly logger: Logger,
    opts: AuthAuditOptions = {},
  ) {
    this.failureWindowMs = opts.failureWindowMs ?? 1000;
    this.successWindowMs = opts.successWindowMs ?? 60_000;
    this.maxWindows = opts.maxWindows ?? 10_000;
  }

  /** A login succeeded: resolves once it is recorded (or counted in an open window). */
  succeeded(a: AuthAttempt): Promise<void> {
    if (a.via === "protocol") return this.write(a, false, "", 1, a.remote);
    return this.event(`ok\u0000${a.via}\u0000${a.source}\u0000${a.principal}`, a, false, "", this.successWindowMs);
  }

  /** A login failed for `reason` (a fixed phrase, never a secret). Recorded in the background. */
  failed(a: AuthAttempt, reason: string): void {
    void this.event(`fail\u0000${a.via}\u0000${a.source}`, a, true, reason, this.failureWindowMs).catch(() => {});
  }

  /** Writes the counts of every open window and waits for all records in flight. */
  async flush(): Promise<void> {
    for (const [key, w] of this.windows) {
      clearTimeout(w.timer);
      this.windows.delete(key);
      if (w.count > 0) this.summarise(w);
    }
    await Promise.allSettled([...this.pending]);
  }

  private event(key: string, a: AuthAttempt, failed: boolean, reason: string, windowMs: number): Promise<void> {
    if (!this.windows.has(key) && this.windows.size >= this.maxWindows) key = OVERFLOW + (failed ? "fail" : "ok");
    const open = this.windows.get(key);
    if (open) {
      open.count++;
      note(open.principals, a.principal);
      note(open.sources, a.source);
      note(open.mechanisms, a.mechanism);
      note(open.reasons, reason);
      return Promise.resolve();
    }
    const w: Window = { attempt: a, failed, count: 0, principals: new Set(), sources: new Set(), mechanisms: new Set(), reasons: new Set(), timer: setTimeout(() => this.tick(key, w, windowMs), windowMs) };
    w.timer.unref();
    this.windows.set(key, w);
    return this.write(a, failed, reason, 1, a.remote);
  }

  /** End of a window: one record for what it counted, and a new window while attempts go on. */
  private tick(key: string, w: Window, windowMs: number): void {
    if (w.count === 0) {
      this.windows.delete(key);
      return;
    }
    this.summarise(w);
    w.count = 0;
    for (const set of [w.principals, w.sources, w.mechanisms, w.reasons]) set.clear();
    w.timer = setTimeout(() => this.tick(key, w, windowMs), windowMs);
    w.timer.unref();
  }

  private summarise(w: Window): void {
    const a = { ...w.attempt, principal: w.principals.size === 1 ? [...w.principals][0] : "various", mechanism: list(w.mechanisms) };
    // Many ports: the record names the address ("various" in the overflow window, which lists them).
    const source = w.sources.size === 1 ? [...w.sources][0] : "various";
    const extra: AuditDetails = {};
    if (w.principals.size > 1) extra.principals = list(w.principals);
    if (w.sources.size > 1) extra.sources = list(w.sources);
    void this.write(a, w.failed, list(w.reasons), w.count, source, extra).catch(() => {});
  }

  private write(a: AuthAttempt, failed: boolean, reason: string, count: number, source: string, extra: AuditDetails = {}): Promise<void> {
    const details: AuditDetails = { mechanism: a.mechanism, count, ...extra };
    if (failed) details.reason = reason;
    const target: AuditTarget = { op: "auth.login", resourceType: "server", resource: a.via, details };
    const p = this.sink({ principal: a.principal, source }, target, failed ? new AuthenticationError() : undefined).catch((err: unknown) => {
      this.logger.error({ err, via: a.via, source, failed }, "audit record of a login not written");
      // A success is not acted on without its record (AUD-4): the login fails, retriably.
      // (A failure's record is not awaited: this error goes nowhere.)
      throw new StorageError(`a login over ${a.via} succeeded, but its audit record could not be written`, err);
    });
    const tracked = p.catch(() => {});
    this.pending.add(tracked);
    void tracked.finally(() => this.pending.delete(tracked));
    return p;
  }
}

function note(set: Set<string>, v: string): void {
  if (set.size <= MAX_DISTINCT) set.add(v);
}

/** The distinct values a window saw, "; "-separated; "…" when there were more. */
function list(set: Set<string>): string {
  const values = [...set].slice(0, MAX_DISTINCT);
  return values.join("; ") + (set.size > MAX_DISTINCT ? "; …" : "");
}
