// SPDX-License-Identifier: Apache-2.0
/**
 * Idempotent producers on PostgreSQL: producer ids and epochs (`producers`), and per
 * partition each producer's sequence state (`producer_state`, the same ProducerEntry the
 * disk engine keeps: epoch, last sequence, its last PRODUCER_BATCHES_KEPT batches).
 *
 * Why in the append transaction: the check (duplicate, gap, fenced epoch) and the update run
 * in the transaction that inserts the batch, under the partition row's lock, so the state
 * never claims a batch that was not stored and never misses one that was (PROD-1 without a
 * separate snapshot). The rules themselves are the disk engine's (ProducerStateManager.check,
 * applied to the stored entry), so both engines answer a retry the same way. Epoch fencing
 * reads the producer row FOR SHARE: a bump (allocate with an id) waits for appends of the old
 * epoch in flight, and every later append of that epoch is refused on every partition.
 */
import { ProducerFencedError, ValidationError } from "../../errors.js";
import { MAX_PRODUCER_EPOCH, ProducerStateManager, type ProducerEntry } from "../../log/producer-state.js";
import type { ProducerInfo } from "../../log/record-batch.js";
import { num, type Db, type Queryable } from "./database.js";

export async function allocateProducer(db: Db, producerId?: number): Promise<{ producerId: number; producerEpoch: number }> {
  const t = db.t;
  if (producerId === undefined) {
    const r = await db.query<{ producer_id: string }>(`INSERT INTO ${t.producers} (producer_id, epoch) VALUES (nextval('${t.producerIds}'), 0) RETURNING producer_id`);
    return { producerId: num(r.rows[0].producer_id), producerEpoch: 0 };
  }
  if (!Number.isSafeInteger(producerId) || producerId < 0) throw new ValidationError(`unknown producer id ${producerId}`);
  return db.tx(async (c) => {
    const r = await c.query<{ epoch: number }>(`SELECT epoch FROM ${t.producers} WHERE producer_id = $1 FOR UPDATE`, [producerId]);
    if (r.rowCount === 0) throw new ValidationError(`unknown producer id ${producerId}`);
    const epoch = r.rows[0].epoch + 1;
    if (epoch > MAX_PRODUCER_EPOCH) throw new ValidationError(`producer ${producerId} has exhausted its epochs; allocate a new id`);
    await c.query(`UPDATE ${t.producers} SET epoch = $2 WHERE producer_id = $1`, [producerId, epoch]);
    return { producerId, producerEpoch: epoch };
  });
}

/** Fencing across partitions (as DiskEngine.checkProducerEpoch), inside the append transaction. */
export async function checkProducerEpoch(c: Queryable, db: Db, p: ProducerInfo): Promise<void> {
  const r = await c.query<{ epoch: number }>(`SELECT epoch FROM ${db.t.producers} WHERE producer_id = $1 FOR SHARE`, [p.producerId]);
  if (r.rowCount === 0) throw new ValidationError(`unknown producer id ${p.producerId}; call initProducer() first`);
  const current = r.rows[0].epoch;
  if (p.producerEpoch < current) throw new ProducerFencedError(`producer ${p.producerId} epoch ${p.producerEpoch} is fenced by epoch ${current}`);
  if (p.producerEpoch > current) throw new ValidationError(`producer ${p.producerId} epoch ${p.producerEpoch} was never issued`);
}

/** What the sequence check decided: store the batch (then `record` it), or the original's offset. */
export type SequenceOutcome = { duplicate: true; baseOffset: number } | { duplicate: false; record(baseOffset: number, ts: number): Promise<void> };

/**
 * Checks a batch of `count` records against the partition's state of its producer (the
 * partition row is locked by the caller). Throws OutOfOrderSequenceError or
 * ProducerFencedError exactly as the disk engine does.
 */
export async function checkSequence(c: Queryable, db: Db, topicId: string, partition: number, p: ProducerInfo, count: number): Promise<SequenceOutcome> {
  const t = db.t;
  const r = await c.query<{ state: ProducerEntry }>(`SELECT state FROM ${t.producerState} WHERE topic_id = $1 AND partition = $2 AND producer_id = $3`, [topicId, partition, p.producerId]);
  const stored = r.rowCount === 0 ? null : r.rows[0].state;
  const m = new ProducerStateManager();
  if (stored !== null) m.load({ offset: 0, producers: [[p.producerId, stored]] });
  const check = m.check(p, count);
  if (check.duplicate) return { duplicate: true, baseOffset: check.batch.baseOffset };
  return {
    duplicate: false,
    record: async (baseOffset, ts) => {
      m.replay(p.producerId, p.producerEpoch, p.baseSequence, count, baseOffset, ts);
      // snapshot() leaves out producers silent for PRODUCER_EXPIRY_MS before `now`; with
      // now = -Infinity none is left out: this is the entry the batch just produced.
      const entry = m.snapshot(0, Number.NEGATIVE_INFINITY).producers[0][1];
      await c.query(
        `INSERT INTO ${t.producerState} (topic_id, partition, producer_id, state) VALUES ($1, $2, $3, $4)
         ON CONFLICT (topic_id, partition, producer_id) DO UPDATE SET state = EXCLUDED.state`,
        [topicId, partition, p.producerId, JSON.stringify(entry)],
      );
    },
  };
}
