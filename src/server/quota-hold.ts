// SPDX-License-Identifier: Apache-2.0
/**
 * How a protocol connection pays a quota debt (QUO-1): it stops being read until then, as
 * Kafka mutes a throttled channel. The client's requests wait in its socket, its rate falls to
 * the quota, nobody else is slowed, and nothing is refused or disconnected. What a request is
 * charged is decided here too, so the connection only asks and holds.
 */
import { Op } from "../wire/ops.js";
import type { ServerAuthorization } from "./authorization.js";

export class QuotaHold {
  /** performance.now() ms until which the connection is held. */
  private until = 0;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;

  constructor(
    /** Stops reading the connection. */
    private readonly pause: () => void,
    /** The debt is paid: resume what can resume. */
    private readonly wake: () => void,
  ) {}

  /** True while a debt is being paid (the connection reports itself not writable). */
  get held(): boolean {
    return performance.now() < this.until;
  }

  /** Holds the connection `ms` longer than now (0: not at all). */
  hold(ms: number): void {
    if (ms <= 0 || this.stopped) return;
    this.until = Math.max(this.until, performance.now() + ms);
    this.pause();
    if (this.timer !== null) return;
    const check = (): void => {
      const left = this.until - performance.now();
      if (left > 0) {
        this.timer = setTimeout(check, Math.ceil(left));
        return;
      }
      this.timer = null;
      this.wake();
    };
    this.timer = setTimeout(check, ms);
  }

  /** The connection closed: no more holds, no timer left behind. */
  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }
}

/**
 * QUO-1: charges a request of `principal` to its rate quotas (one request; its bytes for a
 * publish or enqueue) and returns how long to hold the connection. QUO-2: throws
 * QuotaExceededError for a write of a tenant at its storage quota, before anything is written.
 */
export function chargeRequest(authz: ServerAuthorization, principal: string, op: number, size: number): number {
  let ms = authz.throttle(principal, "requestsPerSec", 1);
  if (op === Op.Publish || op === Op.PublishEncoded || op === Op.QueueEnqueue) {
    authz.checkStorage(principal, size);
    ms = Math.max(ms, authz.throttle(principal, "publishBytesPerSec", size));
  }
  return ms;
}
