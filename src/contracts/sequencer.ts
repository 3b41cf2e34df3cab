// SPDX-License-Identifier: Apache-2.0
/**
 * Per-entity version sequencing: records carry `(entityId, version)`; the sequencer applies
 * version n+1 only after n, in the application's database transaction (SEQ-1 in
 * docs/ARCHITECTURE.md):
 *
 * - the next version is applied, then any parked successors, in that transaction;
 * - an exact duplicate of an applied version (same content hash) is ignored;
 * - a conflicting duplicate (same version, other content) is recorded in `version_conflicts`
 *   and reported, never applied;
 * - a gap parks the record durably in `parked_messages`: later versions of that entity only are
 *   held until the missing one arrives, or an operator supplies it (`repair`) or skips past it
 *   (`skipTo`). Parked entities are listable with their age (`listParked`).
 *
 * Because parked records live in the database, the broker position may move past them: commit
 * (or ack) after `handle()` resolves.
 */
import { createHash } from "node:crypto";
import { ValidationError } from "../errors.js";
import type { SqlDatabase, SqlRunner } from "./stores/sql.js";

export interface VersionedRecord<V = unknown> {
  entityId: string;
  version: number;
  value: V;
  /** Text headers of the record (byte headers are decoded as UTF-8). */
  headers: Record<string, string>;
}

export type SequenceOutcome = "applied" | "duplicate" | "conflict" | "parked";

export interface SequenceResult {
  outcome: SequenceOutcome;
  /** Versions applied by this call: the record's and any parked successors', in order. */
  applied: number[];
}

export interface SequencerOptions<M> {
  /** The consumer's name: each consumer keeps its own versions. */
  consumer: string;
  /** Entity id and version of a message. */
  entityOf: (msg: M) => { entityId: string; version: number };
  /** The first version of every entity. Default 1. */
  firstVersion?: number;
  now?: () => number;
}

export interface ParkedEntity {
  entityId: string;
  /** The version the entity waits for (the applied one + 1). */
  waitingFor: number;
  parkedVersions: number[];
  oldestParkedAt: number;
  ageMs: number;
}

export const SEQUENCER_SCHEMA = `
CREATE TABLE IF NOT EXISTS entity_versions (
  consumer_name TEXT NOT NULL, entity_id TEXT NOT NULL, version BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY (consumer_name, entity_id));
CREATE TABLE IF NOT EXISTS entity_version_hashes (
  consumer_name TEXT NOT NULL, entity_id TEXT NOT NULL, version BIGINT NOT NULL, content_hash TEXT NOT NULL,
  PRIMARY KEY (consumer_name, entity_id, version));
CREATE TABLE IF NOT EXISTS parked_messages (
  consumer_name TEXT NOT NULL, entity_id TEXT NOT NULL, version BIGINT NOT NULL, content_hash TEXT NOT NULL,
  record TEXT NOT NULL, parked_at BIGINT NOT NULL,
  PRIMARY KEY (consumer_name, entity_id, version));
CREATE TABLE IF NOT EXISTS version_conflicts (
  consumer_name TEXT NOT NULL, entity_id TEXT NOT NULL, version BIGINT NOT NULL, content_hash TEXT NOT NULL,
  existing_hash TEXT NOT NULL, record TEXT NOT NULL, seen_at BIGINT NOT NULL,
  PRIMARY KEY (consumer_name, entity_id, version, content_hash));`;

type Apply<Tx, V> = (tx: Tx, rec: VersionedRecord<V>) => Promise<unknown> | unknown;

const hashOf = (value: unknown): string => createHash("sha256").update(JSON.stringify(value ?? null)).digest("hex");

function textHeaders(h: Record<string, string | Uint8Array> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(h ?? {})) out[k] = typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
  return out;
}

export class VersionSequencer<Tx, M extends { value: unknown; headers?: Record<string, string | Uint8Array> }> {
  private ready: Promise<void> | null = null;
  private readonly first: number;

  constructor(
    private readonly db: SqlDatabase<Tx>,
    private readonly opts: SequencerOptions<M>,
  ) {
    if (typeof opts?.consumer !== "string" || !/^[A-Za-z0-9._:-]{1,200}$/.test(opts.consumer)) throw new ValidationError("sequencer consumer name must be 1-200 characters of [A-Za-z0-9._:-]");
    this.first = opts.firstVersion ?? 1;
  }

  /** Sequences one message (see the file comment); `apply` writes it in the transaction. */
  async handle(msg: M, apply: Apply<Tx, M["value"]>): Promise<SequenceResult> {
    const { entityId, version } = this.opts.entityOf(msg);
    if (typeof entityId !== "string" || entityId.length === 0 || entityId.length > 512) throw new ValidationError("entityId must be a string of 1-512 characters");
    if (!Number.isSafeInteger(version) || version < this.first) throw new ValidationError(`version must be an integer >= ${this.first}, got ${String(version)}`);
    return this.sequence({ entityId, version, value: msg.value, headers: textHeaders(msg.headers) }, apply);
  }

  /** Operator repair: supplies an entity's missing version; it and its parked successors are applied. */
  repair(rec: VersionedRecord<M["value"]>, apply: Apply<Tx, M["value"]>): Promise<SequenceResult> {
    return this.sequence({ ...rec, headers: rec.headers ?? {} }, apply);
  }

  private async sequence(rec: VersionedRecord<M["value"]>, apply: Apply<Tx, M["value"]>): Promise<SequenceResult> {
    const { entityId, version } = rec;
    await this.ensureSchema();
    // SEQ-1: the version check, the apply and the version update share one transaction.
    return this.db.transaction(async (sql, tx) => {
      const current = await this.lockEntity(sql, entityId);
      const hash = hashOf(rec.value);
      if (version <= current) {
        const known = await sql.all("SELECT content_hash FROM entity_version_hashes WHERE consumer_name = ? AND entity_id = ? AND version = ?", [this.opts.consumer, entityId, version]);
        const existing = known[0]?.content_hash as string | undefined;
        if (existing === undefined || existing === hash) return { outcome: "duplicate", applied: [] };
        await this.conflict(sql, rec, hash, existing);
        return { outcome: "conflict", applied: [] };
      }
      if (version > current + 1) {
        const parked = await sql.all("SELECT content_hash FROM parked_messages WHERE consumer_name = ? AND entity_id = ? AND version = ?", [this.opts.consumer, entityId, version]);
        const existing = parked[0]?.content_hash as string | undefined;
        if (existing === hash) return { outcome: "parked", applied: [] };
        if (existing !== undefined) {
          await this.conflict(sql, rec, hash, existing);
          return { outcome: "conflict", applied: [] };
        }
        await sql.run("INSERT INTO parked_messages (consumer_name, entity_id, version, content_hash, record, parked_at) VALUES (?, ?, ?, ?, ?, ?)", [this.opts.consumer, entityId, version, hash, JSON.stringify(rec), this.now()]);
        return { outcome: "parked", applied: [] };
      }
      const applied = await this.applyFrom(sql, tx, rec, hash, apply);
      return { outcome: "applied", applied };
    });
  }

  /** Entities holding parked records, oldest first. */
  async listParked(): Promise<ParkedEntity[]> {
    await this.ensureSchema();
    const rows = await this.db.runner.all(
      "SELECT p.entity_id AS entity_id, p.version AS version, p.parked_at AS parked_at, v.version AS current FROM parked_messages p LEFT JOIN entity_versions v ON v.consumer_name = p.consumer_name AND v.entity_id = p.entity_id WHERE p.consumer_name = ? ORDER BY p.entity_id, p.version",
      [this.opts.consumer],
    );
    const byEntity = new Map<string, ParkedEntity>();
    const now = this.now();
    for (const r of rows) {
      const id = String(r.entity_id);
      let e = byEntity.get(id);
      if (!e) byEntity.set(id, (e = { entityId: id, waitingFor: (r.current === null || r.current === undefined ? this.first - 1 : Number(r.current)) + 1, parkedVersions: [], oldestParkedAt: Number(r.parked_at), ageMs: 0 }));
      e.parkedVersions.push(Number(r.version));
      e.oldestParkedAt = Math.min(e.oldestParkedAt, Number(r.parked_at));
      e.ageMs = Math.max(0, now - e.oldestParkedAt);
    }
    return [...byEntity.values()].sort((a, b) => a.oldestParkedAt - b.oldestParkedAt);
  }

  /** Conflicting duplicates seen (same version, other content). */
  async listConflicts(): Promise<{ entityId: string; version: number; seenAt: number; record: VersionedRecord }[]> {
    await this.ensureSchema();
    const rows = await this.db.runner.all("SELECT entity_id, version, seen_at, record FROM version_conflicts WHERE consumer_name = ? ORDER BY seen_at", [this.opts.consumer]);
    return rows.map((r) => ({ entityId: String(r.entity_id), version: Number(r.version), seenAt: Number(r.seen_at), record: JSON.parse(String(r.record)) as VersionedRecord }));
  }

  /** The applied version of an entity (`firstVersion - 1` when none). */
  async currentVersion(entityId: string): Promise<number> {
    await this.ensureSchema();
    const rows = await this.db.runner.all("SELECT version FROM entity_versions WHERE consumer_name = ? AND entity_id = ?", [this.opts.consumer, entityId]);
    return rows.length === 0 ? this.first - 1 : Number(rows[0].version);
  }

  /**
   * Operator skip: treats every version below `version` as applied (they are lost or not
   * wanted), then applies the parked record at `version` and its successors, if present.
   */
  async skipTo(entityId: string, version: number, apply: Apply<Tx, M["value"]>): Promise<SequenceResult> {
    await this.ensureSchema();
    return this.db.transaction(async (sql, tx) => {
      const current = await this.lockEntity(sql, entityId);
      if (version <= current + 1) return { outcome: "duplicate", applied: [] };
      await this.setVersion(sql, entityId, version - 1);
      const applied = await this.drainParked(sql, tx, entityId, version - 1, apply);
      return { outcome: "applied", applied };
    });
  }

  private async applyFrom(sql: SqlRunner, tx: Tx, rec: VersionedRecord<M["value"]>, hash: string, apply: Apply<Tx, M["value"]>): Promise<number[]> {
    await apply(tx, rec);
    await sql.run("INSERT INTO entity_version_hashes (consumer_name, entity_id, version, content_hash) VALUES (?, ?, ?, ?)", [this.opts.consumer, rec.entityId, rec.version, hash]);
    await this.setVersion(sql, rec.entityId, rec.version);
    return [rec.version, ...(await this.drainParked(sql, tx, rec.entityId, rec.version, apply))];
  }

  /** Applies parked successors of `from` in order, while they are contiguous. */
  private async drainParked(sql: SqlRunner, tx: Tx, entityId: string, from: number, apply: Apply<Tx, M["value"]>): Promise<number[]> {
    const applied: number[] = [];
    for (let next = from + 1; ; next++) {
      const rows = await sql.all("SELECT content_hash, record FROM parked_messages WHERE consumer_name = ? AND entity_id = ? AND version = ?", [this.opts.consumer, entityId, next]);
      if (rows.length === 0) break;
      const rec = JSON.parse(String(rows[0].record)) as VersionedRecord<M["value"]>;
      await apply(tx, rec);
      await sql.run("DELETE FROM parked_messages WHERE consumer_name = ? AND entity_id = ? AND version = ?", [this.opts.consumer, entityId, next]);
      await sql.run("INSERT INTO entity_version_hashes (consumer_name, entity_id, version, content_hash) VALUES (?, ?, ?, ?)", [this.opts.consumer, entityId, next, String(rows[0].content_hash)]);
      await this.setVersion(sql, entityId, next);
      applied.push(next);
    }
    return applied;
  }

  /** The entity's applied version, with its row locked for this transaction (PostgreSQL). */
  private async lockEntity(sql: SqlRunner, entityId: string): Promise<number> {
    await sql.run("INSERT INTO entity_versions (consumer_name, entity_id, version, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", [this.opts.consumer, entityId, this.first - 1, this.now()]);
    const lock = this.db.dialect === "pg" ? " FOR UPDATE" : "";
    const rows = await sql.all(`SELECT version FROM entity_versions WHERE consumer_name = ? AND entity_id = ?${lock}`, [this.opts.consumer, entityId]);
    return Number(rows[0].version);
  }

  private async setVersion(sql: SqlRunner, entityId: string, version: number): Promise<void> {
    await sql.run("UPDATE entity_versions SET version = ?, updated_at = ? WHERE consumer_name = ? AND entity_id = ?", [version, this.now(), this.opts.consumer, entityId]);
  }

  private async conflict(sql: SqlRunner, rec: VersionedRecord, hash: string, existing: string): Promise<void> {
    await sql.run("INSERT INTO version_conflicts (consumer_name, entity_id, version, content_hash, existing_hash, record, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", [this.opts.consumer, rec.entityId, rec.version, hash, existing, JSON.stringify(rec), this.now()]);
  }

  private now(): number {
    return (this.opts.now ?? Date.now)();
  }

  private ensureSchema(): Promise<void> {
    this.ready ??= this.db.exec(SEQUENCER_SCHEMA).catch((e: unknown) => {
      this.ready = null;
      throw e;
    });
    return this.ready;
  }
}
