// SPDX-License-Identifier: Apache-2.0
/**
 * The search group: a projection "learner → courses completed, with search terms" in SQLite.
 * Records of one learner apply in order, learners in parallel (processOrdered); the inbox makes
 * each fact apply once; a fact the indexer can never handle is a PermanentError, which the
 * poison policy publishes to the dead-letter topic instead of blocking the learner forever.
 * The projection can be rebuilt from the retained topic (rebuildProjection) and compared with
 * the live one by checksum before switching over.
 */
import Database from "better-sqlite3";
import { Inbox, orderedProcessor, PermanentError, projectionChecksum, rebuildProjection, SqliteInboxStore, type Broker, type ConsumedRecord, type SqliteDatabase } from "sluice";
import type { Completion, Names } from "./runtime.js";

/** learnerId → courseId → document. */
export type SearchState = Record<string, Record<string, { title: string; terms: string[] }>>;

/**
 * Search terms of a title. Version 1 only knew ASCII and refused anything else as unindexable (a
 * permanent failure: retrying cannot help). Version 2, the fix, folds accents first.
 */
export function termsOf(title: string, version: 1 | 2): string[] {
  if (version === 1 && /[^\x20-\x7e]/.test(title)) throw new PermanentError(`indexer v1 cannot tokenize non-ASCII title ${JSON.stringify(title)}`);
  const folded = title.normalize("NFKD").replace(/\p{M}/gu, "").toLowerCase();
  return [...new Set(folded.split(/[^a-z0-9]+/).filter((t) => t.length > 2))].sort();
}

export class SearchProjection {
  readonly counts = { applied: 0, duplicates: 0, deadLettered: 0 };
  private readonly inbox: Inbox<SqliteDatabase>;

  constructor(
    private readonly db: Database.Database,
    private readonly broker: Broker,
    private readonly names: Names,
  ) {
    db.pragma("journal_mode = WAL");
    db.exec("CREATE TABLE IF NOT EXISTS search_docs (learner_id TEXT, course_id TEXT, title TEXT NOT NULL, terms TEXT NOT NULL, PRIMARY KEY (learner_id, course_id))");
    this.inbox = new Inbox(new SqliteInboxStore(db), { consumer: "search" });
  }

  /** One member of group "search" running indexer `version`, until `signal` aborts. */
  async run(version: 1 | 2, signal: AbortSignal): Promise<void> {
    const sub = this.broker.subscribe<Completion>(this.names.completions, { group: "search", start: "earliest", signal });
    const deadLetter = { broker: this.broker, topic: this.names.searchDlq, codeVersion: `search-indexer-${version}` };
    const countingBroker = { publish: (...a: Parameters<Broker["publish"]>) => (this.counts.deadLettered++, this.broker.publish(...a)) };
    const processor = orderedProcessor(
      sub,
      async (msg) => {
        const c = msg.value;
        const r = await this.inbox.handle(msg, (db) => {
          const terms = termsOf(c.courseTitle, version); // throws inside the transaction: nothing is written
          db.prepare("INSERT OR REPLACE INTO search_docs (learner_id, course_id, title, terms) VALUES (?, ?, ?, ?)").run(c.learnerId, c.courseId, c.courseTitle, JSON.stringify(terms));
        });
        if (r.duplicate) this.counts.duplicates++;
        else this.counts.applied++;
      },
      { concurrency: 4, maxAttempts: 3, minDelayMs: 10, maxDelayMs: 50, signal, poison: { deadLetter: { ...deadLetter, broker: countingBroker } } },
    );
    try {
      await processor.done;
    } finally {
      await sub.close();
    }
  }

  /** Message ids in the inbox of consumer "search". */
  processed(): number {
    return (this.db.prepare("SELECT count(*) AS n FROM processed_messages WHERE consumer_name = 'search'").get() as { n: number }).n;
  }

  /** The live projection, in the shape the rebuild produces. */
  liveState(): SearchState {
    const state: SearchState = {};
    const rows = this.db.prepare("SELECT learner_id, course_id, title, terms FROM search_docs").all() as { learner_id: string; course_id: string; title: string; terms: string }[];
    for (const r of rows) (state[r.learner_id] ??= {})[r.course_id] = { title: r.title, terms: JSON.parse(r.terms) as string[] };
    return state;
  }
}

/**
 * Rebuilds the projection from the retained topic with the fixed indexer. A redriven fact
 * appears twice in the topic (the original and its redrive): applying a fact is an upsert, so
 * the second is a no-op, as the inbox makes it in the live projection.
 */
export async function rebuildSearch(broker: Broker, names: Names): Promise<{ state: SearchState; records: number; checksum: string }> {
  const r = await rebuildProjection<SearchState>({
    broker,
    topic: names.completions,
    initial: () => ({}),
    apply: (state, rec: ConsumedRecord) => {
      const c = rec.value as Completion;
      (state[c.learnerId] ??= {})[c.courseId] = { title: c.courseTitle, terms: termsOf(c.courseTitle, 2) };
    },
  });
  return { state: r.state, records: r.records, checksum: projectionChecksum(r.state) };
}

export const checksumOf = (s: SearchState): string => projectionChecksum(s);
