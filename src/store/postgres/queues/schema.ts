// SPDX-License-Identifier: Apache-2.0
/**
 * The tables of the PostgreSQL engine's work queues (migration version 2, migrations.ts).
 *
 * Why this layout: on PostgreSQL a job is a row, not a journal entry. `queues` holds one row
 * per incarnation (a delete removes the row and, by cascade, its jobs in one transaction; a
 * re-created name gets a new `queue_id`, so old jobs never come back) and is the queue's lock: every transaction that changes the queue's jobs takes that row first (FOR UPDATE), so
 * job ids, event positions and the admission counters (`live_jobs`, `live_bytes`) are
 * allocated in commit order and never race, and lock order is always queue row, then job rows.
 *
 * `jobs.state`: `waiting` (grantable from `visible_at`: ready or delayed), `children` (a flow
 * parent waiting for its children, flows.ts), `leased`, `done`
 * (acked, kept while `resultRetentionMs` runs) and `dead` (dead-lettered or expired, kept
 * likewise). The partial indexes serve the grant query (`jobs_grant`), the per-key FIFO check
 * (`jobs_key`, KEY-1), lease expiry (`jobs_leased`), singleton keys (`jobs_singleton`), job
 * expiry (`jobs_expiring`) and result retention (`jobs_finished`).
 */
import type { Tables } from "../database.js";

/** Migration 2: queues and jobs, then the tables beside them. */
export function queueTables(t: Tables): string[] {
  return [
    `CREATE TABLE ${t.queues} (
      queue_id uuid PRIMARY KEY,
      name text NOT NULL,
      config jsonb NOT NULL,
      created_at bigint NOT NULL,
      next_id bigint NOT NULL DEFAULT 0,
      next_event bigint NOT NULL DEFAULT 1,
      live_jobs bigint NOT NULL DEFAULT 0,
      live_bytes bigint NOT NULL DEFAULT 0,
      completed bigint NOT NULL DEFAULT 0,
      dead_lettered bigint NOT NULL DEFAULT 0,
      retries bigint NOT NULL DEFAULT 0,
      redeliveries bigint NOT NULL DEFAULT 0)`,
    `CREATE UNIQUE INDEX queues_live_name ON ${t.queues} (name)`,
    `CREATE TABLE ${t.jobs} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      id bigint NOT NULL,
      key text,
      value bytea,
      value_kind smallint NOT NULL,
      headers jsonb,
      priority int NOT NULL DEFAULT 0,
      state text NOT NULL,
      visible_at bigint NOT NULL,
      attempts int NOT NULL DEFAULT 0,
      lease_token text,
      lease_deadline bigint,
      leased_at bigint,
      enqueued_at bigint NOT NULL,
      stored_at bigint NOT NULL,
      size bigint NOT NULL,
      redrive_count int NOT NULL DEFAULT 0,
      first_enqueued_at bigint NOT NULL,
      dead_letter jsonb,
      expires_at bigint,
      singleton text,
      grp text,
      parent_id bigint,
      pending_children int,
      child_policy text,
      children jsonb,
      history jsonb,
      progress text,
      result text,
      last_error text,
      finished_at bigint,
      PRIMARY KEY (queue_id, id))`,
    `ALTER TABLE ${t.jobs} ALTER COLUMN value SET STORAGE EXTERNAL`,
    `CREATE INDEX jobs_grant ON ${t.jobs} (queue_id, priority DESC, id) WHERE state = 'waiting'`,
    `CREATE INDEX jobs_key ON ${t.jobs} (queue_id, key, id) WHERE key IS NOT NULL AND state IN ('waiting', 'leased')`,
    `CREATE INDEX jobs_leased ON ${t.jobs} (queue_id, lease_deadline) WHERE state = 'leased'`,
    `CREATE INDEX jobs_singleton ON ${t.jobs} (queue_id, singleton) WHERE singleton IS NOT NULL AND state IN ('waiting', 'leased')`,
    `CREATE INDEX jobs_expiring ON ${t.jobs} (queue_id, expires_at) WHERE expires_at IS NOT NULL AND state = 'waiting' AND attempts = 0`,
    `CREATE INDEX jobs_finished ON ${t.jobs} (queue_id, finished_at) WHERE state IN ('done', 'dead')`,
    ...sideTables(t),
  ];
}

/** Dedupe entries, idempotent requests, lifecycle events, rate windows, group turns, schedules. */
function sideTables(t: Tables): string[] {
  return [
    `CREATE TABLE ${t.queueDedupe} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      dedupe_id text NOT NULL,
      job_id bigint NOT NULL,
      expires_at bigint NOT NULL,
      PRIMARY KEY (queue_id, dedupe_id))`,
    `CREATE TABLE ${t.queueRequests} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      producer_id bigint NOT NULL,
      sequence bigint NOT NULL,
      answer jsonb NOT NULL,
      PRIMARY KEY (queue_id, producer_id, sequence))`,
    `CREATE TABLE ${t.queueEvents} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      seq bigint NOT NULL,
      at bigint NOT NULL,
      body jsonb NOT NULL,
      PRIMARY KEY (queue_id, seq))`,
    // RATE-1: the grant rounds of a rate-limited queue's current window (rate-limit.ts).
    `CREATE TABLE ${t.queueGrants} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      grp text,
      at bigint NOT NULL,
      n int NOT NULL)`,
    `CREATE INDEX queue_grants_window ON ${t.queueGrants} (queue_id, at)`,
    // GRP-Q1: each job group's turn in the round-robin ('' for ungrouped jobs), groups.ts.
    `CREATE TABLE ${t.queueGroupTurns} (
      queue_id uuid NOT NULL REFERENCES ${t.queues} (queue_id) ON DELETE CASCADE,
      grp text NOT NULL,
      turn bigint NOT NULL,
      PRIMARY KEY (queue_id, grp))`,
    // Job schedules: the scheduler's one document (schedules.ts).
    `CREATE TABLE ${t.queueSchedules} (
      id boolean PRIMARY KEY DEFAULT true CHECK (id),
      doc jsonb NOT NULL)`,
  ];
}
