// SPDX-License-Identifier: Apache-2.0
/**
 * Two of the three consumer groups on the course-completed topic:
 * - notifications (SQLite): records the notification through an inbox, sends the
 *   congratulation e-mail through an effect gate (sent once, even when the fact is redelivered
 *   or redriven), and enqueues the certificate job with a dedupe id.
 * - analytics (PostgreSQL): per-course completion counts through an inbox. Its members may run
 *   in other processes (the crash scenario SIGKILLs one), so a member is a function of a broker
 *   and a pool only.
 */
import Database from "better-sqlite3";
import type pg from "pg";
import { causedBy, EffectGate, Inbox, PgInboxStore, readEnvelope, sqliteDatabase, SqliteInboxStore, type Broker, type SqliteDatabase, type SubscriptionStatus } from "sluice";
import type { Completion, Names } from "./runtime.js";
import { QUEUE_CONFIG, type CertificateJob } from "./workers.js";

export interface ConsumerCounts {
  applied: number;
  duplicates: number;
}

/** A stand-in for an e-mail provider: remembers what it sent, per effect id. */
export class FakeMailer {
  readonly sent = new Map<string, number>();
  send(effectId: string): void {
    this.sent.set(effectId, (this.sent.get(effectId) ?? 0) + 1);
  }
}

export class Notifications {
  readonly counts: ConsumerCounts = { applied: 0, duplicates: 0 };
  private readonly inbox: Inbox<SqliteDatabase>;
  private readonly effects: EffectGate<Database.Database>;

  constructor(
    private readonly db: Database.Database,
    private readonly broker: Broker,
    private readonly names: Names,
    readonly mailer: FakeMailer,
  ) {
    db.pragma("journal_mode = WAL");
    db.exec("CREATE TABLE IF NOT EXISTS notifications (message_id TEXT PRIMARY KEY, learner_id TEXT, course_id TEXT, text TEXT)");
    this.inbox = new Inbox(new SqliteInboxStore(db), { consumer: "notifications" });
    this.effects = new EffectGate(sqliteDatabase(db), { consumer: "notifications" });
  }

  /** One member of group "notifications", until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    const certificates = this.broker.queue<CertificateJob>(this.names.certificates, QUEUE_CONFIG);
    const sub = this.broker.subscribe<Completion>(this.names.completions, { group: "notifications", start: "earliest", signal });
    try {
      for await (const msg of sub) {
        const c = msg.value;
        const env = readEnvelope(msg.headers)!;
        const r = await this.inbox.handle(msg, (db) => db.prepare("INSERT INTO notifications (message_id, learner_id, course_id, text) VALUES (?, ?, ?, ?)").run(env.messageId, c.learnerId, c.courseId, `Well done, ${c.learnerId}: ${c.courseTitle} (${c.score}%)`));
        if (r.duplicate) this.counts.duplicates++;
        else this.counts.applied++;
        // Outside the database: the gate's ledger makes the e-mail go out once per fact.
        await this.effects.perform(`congrats:${env.messageId}`, () => this.mailer.send(`congrats:${env.messageId}`));
        // The queue's dedupe id makes a repeated enqueue (a redelivery) return the first job.
        await certificates.enqueue({ learnerId: c.learnerId, courseId: c.courseId, courseTitle: c.courseTitle }, { key: c.learnerId, dedupeId: `certificate:${env.messageId}`, headers: causedBy(env, { type: "GenerateCertificate", kind: "command" }) });
        void msg.commit();
      }
    } finally {
      await sub.close();
    }
  }

  rows(): number {
    return (this.db.prepare("SELECT count(*) AS n FROM notifications").get() as { n: number }).n;
  }

  /** Message ids in the inbox of consumer "notifications". */
  processed(): number {
    return (this.db.prepare("SELECT count(*) AS n FROM processed_messages WHERE consumer_name = 'notifications'").get() as { n: number }).n;
  }
}

export async function initAnalytics(pool: pg.Pool): Promise<void> {
  await pool.query("CREATE TABLE IF NOT EXISTS course_stats (course_id text PRIMARY KEY, completions integer NOT NULL, score_sum integer NOT NULL)");
}

export interface MemberOptions {
  name: string;
  signal: AbortSignal;
  counts: ConsumerCounts;
  onRebalance?: (e: SubscriptionStatus) => void;
  /** Crash drill: after this many records are applied, stop before committing the last one and call `onCrashPoint`. */
  crashAfter?: number;
  onCrashPoint?: (msg: { partition: number; offset: number }) => void;
  /** Called before each record; a member may wait here (e.g. for another member to join). */
  beforeEach?: () => Promise<void>;
}

/** One member of group "analytics": counts completions per course, once per fact (inbox). */
export async function analyticsMember(broker: Broker, pool: pg.Pool, topic: string, o: MemberOptions): Promise<void> {
  const inbox = new Inbox(new PgInboxStore(pool), { consumer: "analytics" });
  const sub = broker.subscribe<Completion>(topic, { group: "analytics", start: "earliest", signal: o.signal, onRebalance: o.onRebalance });
  try {
    for await (const msg of sub) {
      await o.beforeEach?.();
      // The partition may have moved to another member meanwhile: that member gets the record.
      if (msg.signal.aborted) continue;
      const c = msg.value;
      const r = await inbox.handle(msg, (tx) => tx.query("INSERT INTO course_stats (course_id, completions, score_sum) VALUES ($1, 1, $2) ON CONFLICT (course_id) DO UPDATE SET completions = course_stats.completions + 1, score_sum = course_stats.score_sum + $2", [c.courseId, c.score]));
      if (r.duplicate) o.counts.duplicates++;
      else o.counts.applied++;
      if (o.crashAfter !== undefined && o.counts.applied >= o.crashAfter) {
        // The database transaction is committed, the group's position is not: the window a
        // crash exposes. The process is SIGKILLed while it waits here.
        o.onCrashPoint?.(msg);
        await new Promise(() => {});
      }
      await msg.commit();
    }
  } finally {
    await sub.close();
  }
}

/** Sums of the analytics projection: completions counted and per course. */
export async function analyticsTotals(pool: pg.Pool): Promise<{ completions: number; perCourse: Record<string, number> }> {
  const rows = (await pool.query("SELECT course_id, completions FROM course_stats ORDER BY course_id")).rows as { course_id: string; completions: number }[];
  return { completions: rows.reduce((s, r) => s + r.completions, 0), perCourse: Object.fromEntries(rows.map((r) => [r.course_id, r.completions])) };
}
