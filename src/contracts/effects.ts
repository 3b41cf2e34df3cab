// SPDX-License-Identifier: Apache-2.0
/**
 * The effect gate: external side effects (an e-mail, a payment call) keyed by a stable effect
 * id and recorded in an effect ledger in the application's database (EFFECT-1 in
 * docs/ARCHITECTURE.md):
 *
 * - an effect whose id the ledger marks done is never performed again (a redelivery after a
 *   crash between the effect and the commit or ack);
 * - the ledger row is written *before* the effect runs (status `started`) and marked `done`
 *   after, so an effect interrupted by a crash is never repeated blindly: the next attempt
 *   finds `started`, does not perform it, and files it for review as `uncertain` (only the
 *   external system can say whether it happened);
 * - in replay mode the gate performs nothing new: it files the intended effect for review
 *   (`deferred`); `reconcile()` later releases only the deferred effects the ledger never
 *   recorded, and marks the others as already performed.
 */
import { ValidationError } from "../errors.js";
import type { SqlDatabase } from "./stores/sql.js";

export type EffectOutcome = "performed" | "skipped" | "deferred" | "uncertain";

export interface PerformOptions {
  /** Replay mode: record the intent for review instead of performing a new effect. */
  replay?: boolean;
  /** What the effect would do (JSON), kept in the review table for people and reconciliation. */
  intent?: unknown;
}

export interface ReviewEntry {
  effectId: string;
  status: "deferred" | "uncertain" | "released" | "already-performed";
  intent: unknown;
  recordedAt: number;
}

export const EFFECTS_SCHEMA = `
CREATE TABLE IF NOT EXISTS effect_ledger (
  consumer_name TEXT NOT NULL, effect_id TEXT NOT NULL, status TEXT NOT NULL, started_at BIGINT NOT NULL,
  done_at BIGINT, result TEXT,
  PRIMARY KEY (consumer_name, effect_id));
CREATE TABLE IF NOT EXISTS effect_review (
  consumer_name TEXT NOT NULL, effect_id TEXT NOT NULL, status TEXT NOT NULL, intent TEXT NOT NULL, recorded_at BIGINT NOT NULL,
  PRIMARY KEY (consumer_name, effect_id));`;

export class EffectGate<Tx = unknown> {
  private ready: Promise<void> | null = null;

  constructor(
    private readonly db: SqlDatabase<Tx>,
    private readonly opts: { consumer: string; now?: () => number },
  ) {
    if (typeof opts?.consumer !== "string" || !/^[A-Za-z0-9._:-]{1,200}$/.test(opts.consumer)) throw new ValidationError("effect gate consumer name must be 1-200 characters of [A-Za-z0-9._:-]");
  }

  /** Performs `fn` once per `effectId` (EFFECT-1, see the file comment); returns what happened. */
  async perform<R>(effectId: string, fn: () => Promise<R> | R, opts: PerformOptions = {}): Promise<{ outcome: EffectOutcome; result?: R }> {
    if (typeof effectId !== "string" || effectId.length === 0 || effectId.length > 512) throw new ValidationError("effectId must be a string of 1-512 characters");
    await this.ensureSchema();
    const c = this.opts.consumer;
    const intent = JSON.stringify(opts.intent ?? null);
    const go = await this.db.transaction(async (sql) => {
      const rows = await sql.all("SELECT status FROM effect_ledger WHERE consumer_name = ? AND effect_id = ?", [c, effectId]);
      const status = rows[0]?.status as string | undefined;
      if (status === "done") return "skipped" as const;
      if (status === "started") {
        // An earlier attempt began the effect and never recorded its end (EFFECT-1).
        await sql.run("INSERT INTO effect_review (consumer_name, effect_id, status, intent, recorded_at) VALUES (?, ?, 'uncertain', ?, ?) ON CONFLICT DO NOTHING", [c, effectId, intent, this.now()]);
        return "uncertain" as const;
      }
      if (opts.replay) {
        await sql.run("INSERT INTO effect_review (consumer_name, effect_id, status, intent, recorded_at) VALUES (?, ?, 'deferred', ?, ?) ON CONFLICT DO NOTHING", [c, effectId, intent, this.now()]);
        return "deferred" as const;
      }
      await sql.run("INSERT INTO effect_ledger (consumer_name, effect_id, status, started_at) VALUES (?, ?, 'started', ?)", [c, effectId, this.now()]);
      return "perform" as const;
    });
    if (go !== "perform") return { outcome: go };
    let result: R;
    try {
      result = await fn();
    } catch (e) {
      // It failed (the caller says so by throwing): not performed, so a retry may perform it.
      await this.db.runner.run("DELETE FROM effect_ledger WHERE consumer_name = ? AND effect_id = ? AND status = 'started'", [c, effectId]);
      throw e;
    }
    await this.db.runner.run("UPDATE effect_ledger SET status = 'done', done_at = ?, result = ? WHERE consumer_name = ? AND effect_id = ?", [this.now(), JSON.stringify(result ?? null), c, effectId]);
    return { outcome: "performed", result };
  }

  /**
   * After a replay: each deferred effect the ledger marks done is closed as already performed;
   * each one it never recorded is released through `release(entry)` (performed, once, through
   * the ledger). Uncertain entries stay for a person to resolve (`resolveUncertain`).
   */
  async reconcile(release: (entry: ReviewEntry) => Promise<unknown> | unknown): Promise<{ released: number; alreadyPerformed: number }> {
    await this.ensureSchema();
    let released = 0;
    let alreadyPerformed = 0;
    for (const e of await this.review("deferred")) {
      const r = await this.perform(e.effectId, () => release(e));
      const status = r.outcome === "performed" ? "released" : r.outcome === "uncertain" ? "uncertain" : "already-performed";
      if (r.outcome === "performed") released++;
      else if (r.outcome === "skipped") alreadyPerformed++;
      await this.db.runner.run("UPDATE effect_review SET status = ? WHERE consumer_name = ? AND effect_id = ?", [status, this.opts.consumer, e.effectId]);
    }
    return { released, alreadyPerformed };
  }

  /** A person checked the external system: `performed` closes it as done, otherwise it may run again. */
  async resolveUncertain(effectId: string, performed: boolean): Promise<void> {
    await this.ensureSchema();
    await this.db.transaction(async (sql) => {
      if (performed) await sql.run("UPDATE effect_ledger SET status = 'done', done_at = ? WHERE consumer_name = ? AND effect_id = ?", [this.now(), this.opts.consumer, effectId]);
      else await sql.run("DELETE FROM effect_ledger WHERE consumer_name = ? AND effect_id = ?", [this.opts.consumer, effectId]);
      await sql.run("UPDATE effect_review SET status = ? WHERE consumer_name = ? AND effect_id = ? AND status = 'uncertain'", [performed ? "already-performed" : "released", this.opts.consumer, effectId]);
    });
  }

  /** Review entries, optionally of one status, oldest first. */
  async review(status?: ReviewEntry["status"]): Promise<ReviewEntry[]> {
    await this.ensureSchema();
    const rows = await this.db.runner.all(
      `SELECT effect_id, status, intent, recorded_at FROM effect_review WHERE consumer_name = ?${status ? " AND status = ?" : ""} ORDER BY recorded_at, effect_id`,
      status ? [this.opts.consumer, status] : [this.opts.consumer],
    );
    return rows.map((r) => ({ effectId: String(r.effect_id), status: r.status as ReviewEntry["status"], intent: JSON.parse(String(r.intent)) as unknown, recordedAt: Number(r.recorded_at) }));
  }

  private now(): number {
    return (this.opts.now ?? Date.now)();
  }

  private ensureSchema(): Promise<void> {
    this.ready ??= this.db.exec(EFFECTS_SCHEMA).catch((e: unknown) => {
      this.ready = null;
      throw e;
    });
    return this.ready;
  }
}
