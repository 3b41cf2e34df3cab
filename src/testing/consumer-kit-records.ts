// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer test kit's default record set (`kitRecordSet()`): deterministic for a seed, and
 * holding what a real stream holds sooner or later, so a handler is tested against all of it.
 */
import type { PublishRecord } from "../types.js";
import { prng } from "./helpers.js";

/** A well-formed event of the default record set (the value of its records, as JSON). */
export interface KitEvent {
  /** Message id: unique per event; an exact duplicate repeats it. */
  id: string;
  /** The entity, also the record's key. */
  entity: string;
  /** Per-entity version: 1, 2, 3... with one gap, and conflicting duplicates of some. */
  version: number;
  amount: number;
}

export interface KitRecordSetOptions {
  /** Events before duplicates and malformed records are added. Default 80 (at least 20). */
  events?: number;
  /** Entities (keys), the hot one included. Default 6 (at least 3). */
  entities?: number;
  /** Share of the events on the hot key `acct-hot`. Default 0.4. */
  hotShare?: number;
  seed?: number;
}

/**
 * Records keyed by entity, `{ id, entity, version, amount }` values, in this order per key:
 *
 * - several keys, one of them deliberately hot (`acct-hot`, `hotShare` of the events);
 * - exact duplicates (a producer retry: the same id, version and amount again, later);
 * - conflicting duplicates (an entity's version seen before, with another id and amount);
 * - a version gap (`acct-1` goes from version 2 to 4);
 * - malformed payloads (a string that is not JSON, raw bytes, an object without a version,
 *   a version that is not a number), after the first events so every key starts well-formed.
 *
 * A correct handler validates the payload, deduplicates by id, applies versions in order and
 * records (not hides) conflicts, gaps and malformed records; the kit checks it does so alike
 * in every run.
 */
export function kitRecordSet(opts: KitRecordSetOptions = {}): PublishRecord[] {
  const events = Math.max(20, opts.events ?? 80);
  const entities = Math.max(3, opts.entities ?? 6);
  const hotShare = opts.hotShare ?? 0.4;
  const rnd = prng(opts.seed ?? 7);
  const cold = Array.from({ length: entities - 1 }, (_, i) => `acct-${i}`);
  const versions = new Map<string, number>();
  const out: PublishRecord[] = [];
  const valid: KitEvent[] = [];
  for (let i = 0; i < events; i++) {
    const entity = rnd() < hotShare ? "acct-hot" : cold[Math.floor(rnd() * cold.length)];
    let version = (versions.get(entity) ?? 0) + 1;
    if (entity === "acct-1" && version === 3) version = 4; // the gap
    versions.set(entity, version);
    const ev: KitEvent = { id: `ev-${i}`, entity, version, amount: 1 + Math.floor(rnd() * 100) };
    valid.push(ev);
    out.push({ key: entity, value: ev });
    // A producer retry every 9 events: an earlier event again, byte for byte.
    if (i % 9 === 8) out.push({ key: valid[i - 4].entity, value: valid[i - 4] });
    // A conflicting duplicate twice: a version already applied, other id and amount.
    if (i === Math.floor(events / 3) || i === Math.floor((2 * events) / 3)) {
      const earlier = valid[i - 2];
      out.push({ key: earlier.entity, value: { ...earlier, id: `${earlier.id}-conflict`, amount: earlier.amount + 1000 } });
    }
    if (i === Math.floor(events / 2)) {
      out.push({ key: "acct-hot", value: "not json {" });
      out.push({ key: cold[0], value: Uint8Array.from([0xff, 0x00, 0x13]) });
      out.push({ key: cold[1], value: { id: "bad-no-version", entity: cold[1], amount: 5 } });
      out.push({ key: "acct-hot", value: { id: "bad-version", entity: "acct-hot", version: "two", amount: 5 } });
    }
  }
  return out;
}
