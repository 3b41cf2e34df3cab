// SPDX-License-Identifier: Apache-2.0
/**
 * A bounded replay: reads a topic's records from given start offsets up to given end offsets
 * (exclusive) and stops, without a consumer group. Projection rebuilds use it: restore a
 * snapshot that recorded its offsets, replay from them to the end offsets taken when the
 * rebuild began, then switch to the live group. Partitions are read in turn, one fetch each,
 * so every partition's records come in offset order.
 */
import { StorageError, ValidationError } from "../errors.js";
import type { Broker, ConsumedRecord } from "../types.js";

export interface ReplayOptions {
  /** Start offset per partition, or "earliest" (default) for the log start of each. */
  from?: Record<number, number> | "earliest";
  /** End offset (exclusive) per partition, or "latest" (default): the high watermark when the replay starts. */
  to?: Record<number, number> | "latest";
  /** Partitions to read; default every partition (or those named in `from`/`to` objects). */
  partitions?: number[];
  /** Bytes per fetch. Default 1 MiB. */
  maxBytes?: number;
  signal?: AbortSignal;
}

/** Records of `topic` from `from` to `to` (exclusive), per partition in offset order; then it ends. */
export async function* replay<T = unknown>(broker: Pick<Broker, "describeTopic" | "fetch">, topic: string, opts: ReplayOptions = {}): AsyncGenerator<ConsumedRecord<T>> {
  const desc = await broker.describeTopic(topic);
  const named = new Set<number>([...(typeof opts.from === "object" ? Object.keys(opts.from) : []), ...(typeof opts.to === "object" ? Object.keys(opts.to) : [])].map(Number));
  const parts = opts.partitions ?? (named.size > 0 ? [...named].sort((a, b) => a - b) : desc.partitions.map((p) => p.partition));
  const cursors: { partition: number; next: number; end: number }[] = [];
  for (const p of parts) {
    const d = desc.partitions.find((x) => x.partition === p);
    if (!d) throw new ValidationError(`replay: topic ${JSON.stringify(topic)} has no partition ${p}`);
    const from = typeof opts.from === "object" ? (opts.from[p] ?? d.logStartOffset) : d.logStartOffset;
    const end = typeof opts.to === "object" ? (opts.to[p] ?? d.highWatermark) : d.highWatermark;
    if (!Number.isSafeInteger(from) || from < 0 || !Number.isSafeInteger(end) || end < 0) throw new ValidationError(`replay: partition ${p}: offsets must be integers >= 0`);
    if (end > d.highWatermark) throw new ValidationError(`replay: partition ${p}: end ${end} is beyond the high watermark ${d.highWatermark}`);
    if (from < end) cursors.push({ partition: p, next: from, end });
  }
  while (cursors.length > 0) {
    for (let i = 0; i < cursors.length; i++) {
      opts.signal?.throwIfAborted();
      const c = cursors[i];
      const r = await broker.fetch(topic, c.partition, c.next, { maxBytes: opts.maxBytes ?? 1 << 20, signal: opts.signal });
      for (const rec of r.records) {
        if (rec.offset >= c.end) break;
        yield rec as ConsumedRecord<T>;
      }
      // nextOffset skips gaps (compacted offsets). A fetch below the high watermark returns at
      // least one record, so an empty one that does not move is a broken promise, not an end.
      if (r.records.length === 0 && r.nextOffset <= c.next) throw new StorageError(`replay: partition ${c.partition}: no record at ${c.next} below the end ${c.end}`);
      c.next = r.nextOffset;
      if (c.next >= c.end) cursors.splice(i--, 1);
    }
  }
}
