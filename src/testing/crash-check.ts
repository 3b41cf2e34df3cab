// SPDX-License-Identifier: Apache-2.0
/**
 * Invariant checks of the crash-point enumeration: given the ledger of what the workload saw
 * acknowledged before the crash and a broker reopened on the power-lost data dir, report
 * every way the recovered state breaks a promise (see crash-points.ts for the list).
 */
import { CorruptRecordError } from "../errors.js";
import type { EmbeddedBroker } from "../broker/broker.js";
import type { Job, Queue } from "../queues/types.js";
import { tagOf, type BatchEntry, type JobEntry, type JobState, type Ledger, type ProducerEntry } from "./crash-ledger.js";
import { CP_DLQ, CP_GROUP, CP_QUEUE, CP_QUEUE_CONFIG, CP_RETAINED, CP_TOPIC } from "./crash-workload.js";
import { withTimeout } from "./helpers.js";

export interface Problem {
  /** Short name of the broken invariant. */
  invariant: string;
  detail: string;
}

interface Scan {
  start: number;
  hwm: number;
  recs: Map<number, string>;
  corrupt: [number, number][];
}

const RETRY_TIMEOUT_MS = 400;

function short(v: string | undefined | null): string {
  if (v === undefined || v === null) return String(v);
  return v.length > 24 ? `${v.slice(0, 24)}…(${v.length} chars)` : v;
}

export class RecoveryChecker {
  problems: Problem[] = [];
  notes: string[] = [];
  private scans = new Map<string, Scan>();
  /** Offsets the checker itself appended (retries, new sequences): offset → value. */
  private written = new Map<string, Map<number, string>>();

  constructor(private b: EmbeddedBroker, private L: Ledger) {}

  private fail(invariant: string, detail: string): void {
    this.problems.push({ invariant, detail });
  }

  async run(): Promise<void> {
    const topics = await this.b.listTopics();
    for (const [name, status] of this.L.topics) if (status === "acked" && !topics.includes(name)) this.fail("topic-lost", `topic ${name} was created (acknowledged) but is missing after recovery`);
    const parts: [string, number][] = [];
    if (topics.includes(CP_TOPIC)) parts.push([CP_TOPIC, 0], [CP_TOPIC, 1]);
    if (topics.includes(CP_RETAINED)) parts.push([CP_RETAINED, 0]);
    for (const [t, p] of parts) {
      const s = await this.scan(t, p);
      this.scans.set(`${t}|${p}`, s);
      this.checkRecords(t, p, s);
    }
    if (topics.includes(CP_TOPIC)) {
      for (const p of this.L.producers) await this.checkProducer(p);
      for (const p of [0, 1]) await this.checkNothingRewritten(p);
      await this.checkCommits();
    }
    if (topics.includes(CP_RETAINED)) this.checkRetention();
    await this.checkQueues();
  }

  /** Nothing read before (nor appended by the checker) may have changed: an offset is never reused. */
  private async checkNothingRewritten(p: number): Promise<void> {
    const before = this.scans.get(`${CP_TOPIC}|${p}`)!;
    const after = await this.scan(CP_TOPIC, p);
    for (const [o, v] of before.recs) {
      const now = after.recs.get(o);
      if (now !== v) this.fail("offset-reused", `${CP_TOPIC}/${p} offset ${o} held ${short(v)} and now holds ${short(now)}`);
    }
    for (const [o, v] of this.written.get(`${CP_TOPIC}|${p}`) ?? []) {
      const now = after.recs.get(o);
      if (now !== v) this.fail("append-after-recovery-lost", `${CP_TOPIC}/${p} offset ${o}: the checker's append ${short(v)} reads back as ${short(now)}`);
    }
  }

  // ───────────── logs ─────────────

  private async scan(topic: string, p: number): Promise<Scan> {
    const d = await this.b.describeTopic(topic);
    const { logStartOffset: start, highWatermark: hwm } = d.partitions[p];
    const s: Scan = { start, hwm, recs: new Map(), corrupt: [] };
    let off = start;
    while (off < hwm) {
      try {
        const r = await this.b.fetch(topic, p, off, { maxBytes: 1 << 20 });
        if (r.records.length === 0 && r.nextOffset <= off) {
          this.fail("log-unreadable", `${topic}/${p}: fetch at ${off} (< high watermark ${hwm}) returned nothing`);
          break;
        }
        for (const rec of r.records) {
          if (rec.offset !== off) this.fail("offsets-not-contiguous", `${topic}/${p}: expected offset ${off}, read ${rec.offset}`);
          s.recs.set(rec.offset, typeof rec.value === "string" ? rec.value : JSON.stringify(rec.value));
          off = rec.offset + 1;
        }
        if (r.records.length === 0) off = r.nextOffset;
      } catch (e) {
        if (e instanceof CorruptRecordError && e.nextOffset !== undefined && e.nextOffset > off) {
          s.corrupt.push([off, e.nextOffset]);
          off = e.nextOffset;
          continue;
        }
        this.fail("log-unreadable", `${topic}/${p}: fetch at ${off}: ${(e as Error).message}`);
        break;
      }
    }
    if (s.corrupt.length > 0) this.notes.push(`${topic}/${p}: corrupt ranges ${s.corrupt.map(([a, z]) => `[${a}, ${z})`).join(" ")} (unacknowledged writes that reached the disk out of order?)`);
    return s;
  }

  private checkRecords(topic: string, p: number, s: Scan): void {
    const retention = this.L.retention.get(`${topic}|${p}`);
    const inCorrupt = (o: number): boolean => s.corrupt.some(([a, z]) => o >= a && o < z);
    for (const e of this.L.records.values()) {
      if (e.topic !== topic || e.partition !== p || e.status !== "acked" || e.offset === null) continue;
      if (e.offset < s.start) {
        if (!retention?.issued) this.fail("acked-record-below-log-start", `${topic}/${p}: acknowledged ${e.tag} at offset ${e.offset} is below the log start ${s.start}, and no retention ran`);
        continue;
      }
      const got = s.recs.get(e.offset);
      if (got === e.value) continue;
      if (got === undefined)
        this.fail(inCorrupt(e.offset) ? "acked-record-corrupt" : "acked-record-lost", `${topic}/${p}: acknowledged ${e.tag} at offset ${e.offset} is ${inCorrupt(e.offset) ? "unreadable (corrupt range)" : "missing"} (log [${s.start}, ${s.hwm}))`);
      else this.fail("acked-record-changed", `${topic}/${p}: acknowledged ${e.tag} at offset ${e.offset} reads back as ${short(got)}`);
    }
    const where = new Map<string, number>();
    for (const [o, v] of s.recs) {
      const tag = tagOf(v);
      const e = tag === null ? undefined : this.L.records.get(tag);
      if (!e || e.value !== v || e.topic !== topic || e.partition !== p) {
        this.fail("unknown-record", `${topic}/${p} offset ${o} holds ${short(v)}, which the workload never sent there`);
        continue;
      }
      const prev = where.get(tag!);
      if (prev !== undefined) this.fail("record-stored-twice", `${topic}/${p}: ${tag} is stored at offsets ${prev} and ${o}`);
      else where.set(tag!, o);
    }
    // A batch is stored whole, at consecutive offsets, or not at all.
    const batches = new Set<BatchEntry>();
    for (const e of this.L.records.values()) if (e.topic === topic && e.partition === p && e.batch) batches.add(e.batch);
    for (const bt of batches) {
      const offs = bt.tags.map((t) => where.get(t));
      const n = offs.filter((o) => o !== undefined).length;
      if (n === 0 || (n === offs.length && offs.every((o, i) => o === offs[0]! + i))) continue;
      this.fail("batch-torn", `${topic}/${p}: batch ${bt.producer.name} seq ${bt.seq} is stored in part or out of order: offsets ${offs.map((o) => o ?? "-").join(",")}`);
    }
  }

  /** Offset of `batch` in the recovered log (all its records at consecutive offsets), or null. */
  private logOffset(batch: BatchEntry, s: Scan): number | null {
    const first = batch.tags[0];
    for (const [o, v] of s.recs) {
      if (tagOf(v) !== first) continue;
      for (let i = 1; i < batch.tags.length; i++) if (tagOf(s.recs.get(o + i) ?? null) !== batch.tags[i]) return null;
      return o;
    }
    return null;
  }

  private async send(p: ProducerEntry, seq: number, values: string[], timeoutMs = RETRY_TIMEOUT_MS): Promise<{ ok: true; offset: number; duplicate: boolean } | { ok: false; error: unknown; timedOut: boolean }> {
    const signal = AbortSignal.timeout(timeoutMs);
    try {
      const rs = await withTimeout(
        this.b.publishBatch(p.topic, values.map((value) => ({ value, partition: p.partition })), { producerId: p.producerId, producerEpoch: p.epoch, baseSequence: seq, signal }),
        timeoutMs + 2000,
        `publish of ${p.name} seq ${seq}`,
      );
      return { ok: true, offset: rs[0].offset, duplicate: rs[0].duplicate };
    } catch (e) {
      return { ok: false, error: e, timedOut: signal.aborted || /timed out/.test((e as Error)?.message ?? "") };
    }
  }

  private async hwm(topic: string, p: number): Promise<number> {
    return (await this.b.describeTopic(topic)).partitions[p].highWatermark;
  }

  private async readAt(topic: string, p: number, offset: number): Promise<string | null> {
    try {
      const r = await this.b.fetch(topic, p, offset, { maxBytes: 1 });
      const rec = r.records.find((x) => x.offset === offset);
      return rec ? String(rec.value) : null;
    } catch (e) {
      return `(${(e as Error).message})`;
    }
  }

  /**
   * Producer state must match the log: a retry of a stored batch is a duplicate with its
   * offset; a batch that is not in the log is stored fresh (never answered as a duplicate);
   * the next new sequence is accepted.
   */
  private async checkProducer(p: ProducerEntry): Promise<void> {
    const s = this.scans.get(`${p.topic}|${p.partition}`)!;
    const written = this.written.get(`${p.topic}|${p.partition}`) ?? new Map<number, string>();
    this.written.set(`${p.topic}|${p.partition}`, written);
    const present: { bt: BatchEntry; offset: number }[] = [];
    const absent: BatchEntry[] = [];
    for (const bt of [...p.batches].sort((a, z) => a.seq - z.seq)) {
      const o = this.logOffset(bt, s);
      if (o !== null) present.push({ bt, offset: o });
      else absent.push(bt);
    }
    // The last few stored batches are remembered: their retries are duplicates with their offsets.
    for (const { bt, offset } of present.slice(-5)) await this.retryStored(p, bt, offset, written);
    let lastSeq = -1;
    for (const { bt } of present) lastSeq = Math.max(lastSeq, bt.seq + bt.tags.length - 1);
    const lost = await this.retryLost(p, absent, lastSeq, written);
    await this.checkNextSequence(p, lost.anomaly, lost.lastSeq, written);
    // A batch whose retry hung: once later records fill its phantom offsets, what is it answered?
    for (const bt of lost.hung) await this.retryHung(p, bt);
  }

  private values(bt: BatchEntry): string[] {
    return bt.tags.map((t) => this.L.records.get(t)!.value);
  }
  private batchName(p: ProducerEntry, bt: BatchEntry): string {
    return `${p.name} (producer ${p.producerId}) seq ${bt.seq}${bt.tags.length > 1 ? `..${bt.seq + bt.tags.length - 1}` : ""} [${bt.status === "acked" ? "acknowledged" : "never acknowledged"}]`;
  }

  /** A retry of `bt`, stored at `offset`, must be answered duplicate with that offset. */
  private async retryStored(p: ProducerEntry, bt: BatchEntry, offset: number, written: Map<number, string>): Promise<void> {
    const r = await this.send(p, bt.seq, this.values(bt));
    if (!r.ok) this.fail("stored-batch-retry", `retry of ${this.batchName(p, bt)}, stored at offset ${offset}, failed: ${r.timedOut ? "no answer (hangs)" : (r.error as Error)?.message}`);
    else if (!r.duplicate) {
      this.fail("stored-batch-stored-twice", `retry of ${this.batchName(p, bt)}, stored at offset ${offset}, was stored again at offset ${r.offset}`);
      this.values(bt).forEach((v, i) => written.set(r.offset + i, v));
    } else if (r.offset !== offset) this.fail("stored-batch-wrong-offset", `retry of ${this.batchName(p, bt)} answered duplicate at offset ${r.offset}, but it is stored at ${offset}`);
  }

  /**
   * Retries the never-acknowledged batches that are not in the log, in sequence order, until
   * the first anomaly. `lastSeq`: the last sequence stored (a retry that is stored moves it
   * on). Returns it, whether there was an anomaly, and the retries that got no answer.
   */
  private async retryLost(p: ProducerEntry, absent: BatchEntry[], lastSeq: number, written: Map<number, string>): Promise<{ lastSeq: number; anomaly: boolean; hung: BatchEntry[] }> {
    const hung: BatchEntry[] = [];
    let anomaly = false;
    for (const bt of absent) {
      if (bt.status === "acked") continue; // reported as lost already
      if (bt.seq <= lastSeq) {
        await this.retryBehindStored(p, bt, written);
        continue;
      }
      if (anomaly) break;
      const outcome = await this.retryAtEnd(p, bt, written);
      if (outcome === "stored") lastSeq = bt.seq + bt.tags.length - 1;
      else {
        if (outcome === "hung") hung.push(bt);
        anomaly = true;
      }
    }
    return { lastSeq, anomaly, hung };
  }

  /**
   * A later batch of this producer survived while `bt` did not (unsynced writes reaching the
   * disk out of order): the sequence cannot be filled in any more. Its retry must not be
   * answered duplicate of another record.
   */
  private async retryBehindStored(p: ProducerEntry, bt: BatchEntry, written: Map<number, string>): Promise<void> {
    const r = await this.send(p, bt.seq, this.values(bt));
    if (r.ok && r.duplicate) {
      const at = await this.readAt(p.topic, p.partition, r.offset);
      if (tagOf(at) !== bt.tags[0]) this.fail("lost-batch-answered-duplicate", `retry of ${this.batchName(p, bt)}, which is not in the log, was answered duplicate at offset ${r.offset}, which holds ${short(at)}`);
    } else if (r.ok) {
      this.notes.push(`retry of ${this.batchName(p, bt)} behind a later stored batch was stored at ${r.offset}`);
      this.values(bt).forEach((v, i) => written.set(r.offset + i, v));
    } else this.notes.push(`retry of ${this.batchName(p, bt)} behind a later stored batch refused: ${(r.error as Error)?.name}`);
  }

  /** The retry of `bt`, next after the log's last sequence, must be stored fresh at the log end. */
  private async retryAtEnd(p: ProducerEntry, bt: BatchEntry, written: Map<number, string>): Promise<"stored" | "hung" | "anomaly"> {
    const hwm = await this.hwm(p.topic, p.partition);
    const r = await this.send(p, bt.seq, this.values(bt));
    if (!r.ok && r.timedOut) {
      this.fail(
        "lost-batch-answered-duplicate",
        `retry of ${this.batchName(p, bt)}, which is not in the log (log end ${hwm}), got no answer within ${RETRY_TIMEOUT_MS} ms: the producer state names it as stored (duplicate) at an offset the log does not hold`,
      );
      return "hung";
    }
    if (!r.ok) {
      this.fail("lost-batch-retry-refused", `retry of ${this.batchName(p, bt)}, which is not in the log, was refused: ${(r.error as Error)?.name}: ${(r.error as Error)?.message}`);
      return "anomaly";
    }
    if (r.duplicate) {
      const at = await this.readAt(p.topic, p.partition, r.offset);
      this.fail("lost-batch-answered-duplicate", `retry of ${this.batchName(p, bt)}, which is not in the log (log end ${hwm}), was answered duplicate: true at offset ${r.offset}, which holds ${short(at)}`);
      return "anomaly";
    }
    if (r.offset !== hwm) this.fail("retry-stored-off-end", `retry of ${this.batchName(p, bt)} was stored at offset ${r.offset}, the log end was ${hwm}`);
    this.values(bt).forEach((v, i) => written.set(r.offset + i, v));
    return "stored";
  }

  /** The next new sequence is accepted at the log end (refused after an anomaly: a gap). */
  private async checkNextSequence(p: ProducerEntry, anomaly: boolean, lastSeq: number, written: Map<number, string>): Promise<void> {
    const seq = p.nextSeq;
    const tag = `${p.name}.${seq}`;
    const value = `${tag}|after-recovery`;
    this.L.records.set(tag, { tag, topic: p.topic, partition: p.partition, value, status: "pending", offset: null, batch: null });
    const hwm = await this.hwm(p.topic, p.partition);
    const r = await this.send(p, seq, [value]);
    if (r.ok && !r.duplicate) {
      written.set(r.offset, value);
      if (anomaly)
        this.fail("sequence-gap-accepted", `${p.name}: new sequence ${seq} was accepted at offset ${r.offset} although the log ends at sequence ${lastSeq} (a batch in between is not stored)`);
      else if (r.offset !== hwm) this.fail("next-sequence-off-end", `${p.name}: new sequence ${seq} stored at offset ${r.offset}, log end was ${hwm}`);
    } else if (r.ok) this.fail("new-sequence-answered-duplicate", `${p.name}: new sequence ${seq} (never sent before) was answered duplicate at offset ${r.offset}`);
    else if (!anomaly) this.fail("next-sequence-refused", `${p.name}: the next sequence ${seq} was refused: ${r.timedOut ? "no answer" : `${(r.error as Error)?.name}: ${(r.error as Error)?.message}`}`);
  }

  /** A duplicate answer for `bt` (which hung before) must point at its own records. */
  private async retryHung(p: ProducerEntry, bt: BatchEntry): Promise<void> {
    const again = await this.send(p, bt.seq, this.values(bt));
    if (again.ok && again.duplicate) {
      const at = await this.readAt(p.topic, p.partition, again.offset);
      if (tagOf(at) !== bt.tags[0])
        this.fail("duplicate-points-at-other-record", `after new appends, retry of ${this.batchName(p, bt)} is answered duplicate: true with offset ${again.offset}, which holds ${short(at)}: the retried records are lost`);
    }
  }

  // ───────────── groups and retention ─────────────

  private async checkCommits(): Promise<void> {
    const lag = await this.b.groupLag(CP_GROUP, CP_TOPIC);
    for (const c of this.L.commits.values()) {
      const part = lag.partitions[c.partition];
      const got = part.committedOffset;
      const what = `group ${c.group} ${c.topic}/${c.partition}: committed ${got}, acknowledged ${c.acked}, highest issued ${c.issued}, log end ${part.highWatermark}`;
      if (c.acked !== null && (got === null || got < c.acked)) this.fail("commit-went-back", what);
      if (got !== null && (c.issued === null || got > c.issued)) this.fail("commit-beyond-issued", what);
      if (got !== null && got > part.highWatermark) this.fail("commit-beyond-log-end", what);
    }
  }

  private checkRetention(): void {
    const s = this.scans.get(`${CP_RETAINED}|0`)!;
    const r = this.L.retention.get(`${CP_RETAINED}|0`);
    if (!r) {
      if (s.start !== 0) this.fail("log-start-moved", `${CP_RETAINED}/0 starts at ${s.start}, no retention ran`);
      return;
    }
    if (s.start < r.acked) this.fail("log-start-went-back", `${CP_RETAINED}/0 starts at ${s.start}, retention had moved it to ${r.acked} (acknowledged)`);
    if (s.start > r.bound) this.fail("log-start-beyond-retention", `${CP_RETAINED}/0 starts at ${s.start}, beyond the high watermark ${r.bound} when retention ran`);
  }

  // ───────────── queues ─────────────

  private async checkQueues(): Promise<void> {
    const names = await this.b.listQueues();
    if (this.L.queues.get(CP_QUEUE) === "acked" && !names.includes(CP_QUEUE)) {
      this.fail("queue-lost", `queue ${CP_QUEUE} had acknowledged enqueues but is missing after recovery`);
      return;
    }
    if (!names.includes(CP_QUEUE)) return;
    const seen = await this.drainQueues();
    // Per job: where it may be, given what was acknowledged.
    const byTag = new Map<string, Seen[]>();
    for (const x of seen) {
      const e = x.tag === null ? undefined : this.L.jobs.get(x.tag);
      if (!e || e.data !== x.data) {
        this.fail("unknown-job", `${x.queue} delivered job ${x.id} with data ${short(x.data)}, which the workload never enqueued`);
        continue;
      }
      byTag.get(x.tag!)?.push(x) ?? byTag.set(x.tag!, [x]);
    }
    for (const e of this.L.jobs.values()) this.checkJob(e, byTag.get(e.tag) ?? []);
  }

  /**
   * Drains the source and the DLQ (which an interrupted dead-letter move, resumed when the
   * source opens, may create only now) until both stay empty; returns every job delivered.
   */
  private async drainQueues(): Promise<Seen[]> {
    const seen: Seen[] = [];
    const drains: Drain[] = [await this.openDrain(CP_QUEUE)];
    const deadline = Date.now() + 15_000;
    let quiet = 0;
    try {
      while (quiet < 3) {
        if (drains.length < 2 && (await this.b.listQueues()).includes(CP_DLQ)) drains.push(await this.openDrain(CP_DLQ));
        if (Date.now() > deadline) {
          const st = await Promise.all(drains.map((d) => this.b.queue(d.queue).stats()));
          this.fail("queue-drain-timeout", `queues did not drain after recovery: ${st.map((x) => `${x.name} depth ${x.depth} (waiting ${x.waiting}, delayed ${x.delayed}, in flight ${x.inFlight}, blocked ${x.blockedByKey})`).join("; ")}`);
          break;
        }
        const tick = new Promise<"tick">((r) => setTimeout(() => r("tick"), 20));
        const got = await Promise.race([tick, ...drains.map((d, i) => d.next.then((r) => ({ i, r })))]);
        if (got === "tick") {
          const st = await Promise.all(drains.map((d) => this.b.queue(d.queue).stats()));
          quiet = st.every((x) => x.depth === 0) ? quiet + 1 : 0;
          continue;
        }
        quiet = 0;
        const { i, r } = got;
        const d = drains[i];
        if (r.done) {
          this.fail("queue-worker-ended", `worker of ${d.queue} ended while draining`);
          break;
        }
        d.next = d.it.next();
        seen.push(seenJob(d.queue, r.value));
        await r.value.ack();
      }
    } finally {
      for (const d of drains) await d.worker.close().catch(() => {});
    }
    return seen;
  }

  /** Opens `queue` (resuming interrupted dead-letter moves and redrives) and a worker on it. */
  private async openDrain(queue: string): Promise<Drain> {
    const q = this.b.queue<string>(queue);
    await q.stats(); // opens it: resumes interrupted dead-letter moves and redrives
    if (queue === CP_DLQ) await q.redrive({ limit: 0 }); // waits for a redrive resumed on open
    const worker = q.work({ prefetch: 64, consumerId: `cp-check-${queue}` });
    const it = worker[Symbol.asyncIterator]();
    return { queue, worker, it, next: it.next() };
  }

  /** Job `e` is where its acknowledged (or pending) state allows, once, with attempts that never went back. */
  private checkJob(e: JobEntry, got: Seen[]): void {
    const inQ = got.filter((x) => x.queue === CP_QUEUE);
    const inD = got.filter((x) => x.queue === CP_DLQ);
    const lives = e.lives.map((l) => `${l.queue}#${l.id ?? "?"} attempts ${l.attempts.join(",") || "-"}`).join("; ");
    const what = `job ${e.tag} (${lives}; acknowledged state ${e.acked}${e.pending ? `, unacknowledged ${e.pending}` : ""}): after recovery ${got.map((x) => `${x.queue}#${x.id} attempt ${x.attempt}${x.sourceId ? ` from #${x.sourceId}` : ""}`).join(", ") || "nowhere"}`;
    if (inQ.length > 1) this.fail("job-twice-in-source", what);
    if (inD.length > 1) this.fail("dead-letter-stored-twice", what);
    if (inQ.length > 0 && inD.length > 0) this.fail("job-in-source-and-dlq", what);
    const obs: JobState = inQ.length > 0 ? "Q" : inD.length > 0 ? "DLQ" : "none";
    if (!allowedStates(e).has(obs)) this.fail(jobInvariant(e, obs), what);
    for (const x of inQ) {
      const life = e.lives.find((l) => l.queue === CP_QUEUE && l.id === x.id);
      if (life && life.attempts.length > 0 && x.attempt <= Math.max(...life.attempts)) this.fail("attempts-went-back", `${what}: delivered attempt ${x.attempt} after attempt ${Math.max(...life.attempts)} was handed out`);
      if (x.redriveCount > 0 && e.redrives.issued === 0) this.fail("unexpected-redrive", `${what}: redrive count ${x.redriveCount}, never redriven`);
      if (e.redrives.acked > 0 && x.redriveCount === 0) this.fail("dead-lettered-job-delivered-from-source", `${what}: delivered without its redrive count after an acknowledged redrive (the original, dead-lettered copy?)`);
    }
    for (const x of inD) {
      const life = e.lives.find((l) => l.queue === CP_QUEUE && l.id === x.sourceId);
      if (!life && e.lives.every((l) => l.id !== null)) this.fail("dead-letter-wrong-source", `${what}: DLQ entry names source #${x.sourceId}`);
      if (life && life.attempts.length > 0 && x.dlAttempts < Math.max(...life.attempts)) this.fail("attempts-went-back", `${what}: DLQ entry records ${x.dlAttempts} attempts, ${Math.max(...life.attempts)} were handed out`);
    }
  }
}

/** A job delivered while draining after recovery. */
interface Seen {
  queue: string;
  id: string;
  tag: string | null;
  data: string;
  attempt: number;
  redriveCount: number;
  sourceId: string | null;
  dlAttempts: number;
}

interface Drain {
  queue: string;
  worker: ReturnType<Queue<string>["work"]>;
  it: AsyncIterator<Job<string>>;
  next: Promise<IteratorResult<Job<string>>>;
}

function seenJob(queue: string, job: Job<string>): Seen {
  const data = typeof job.data === "string" ? job.data : JSON.stringify(job.data);
  return {
    queue,
    id: job.id,
    tag: tagOf(data),
    data,
    attempt: job.attempt,
    redriveCount: job.redriveCount,
    sourceId: job.deadLetter?.sourceId ?? null,
    dlAttempts: job.deadLetter?.attempts ?? 0,
  };
}

/** Where job `e` may be after recovery ("none": done or never enqueued), given what was acknowledged or issued. */
function allowedStates(e: JobEntry): Set<JobState> {
  const allowed = new Set<JobState>();
  for (const st of [e.acked, e.pending]) if (st !== null) allowed.add(st === "done" ? "none" : st);
  const last = e.lives[e.lives.length - 1];
  const maxSeen = Math.max(0, ...last.attempts);
  // A delivery the workload never saw may have counted an attempt; its lease expires on recovery.
  if (allowed.has("Q") && maxSeen + 1 >= CP_QUEUE_CONFIG.maxAttempts!) allowed.add("DLQ");
  return allowed;
}

/** The name of the invariant broken when job `e` is found in state `obs`, which its ledger entry does not allow. */
function jobInvariant(e: JobEntry, obs: JobState): string {
  if (e.acked === "done" && obs === "Q") return "acked-job-delivered-again";
  if (e.acked === "DLQ" && obs === "none") return "acked-dead-letter-missing";
  if (e.acked === "DLQ" && obs === "Q") return "dead-lettered-job-delivered-from-source";
  if (e.acked === "Q" && obs === "none") return e.redrives.acked > 0 ? "acked-redrive-missing" : "acked-enqueue-lost";
  if (e.acked === "Q" && obs === "DLQ" && e.redrives.acked > 0) return "acked-redrive-undone";
  return "job-state";
}
