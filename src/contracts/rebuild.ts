// SPDX-License-Identifier: Apache-2.0
/**
 * Projection rebuild: restore a snapshot that recorded the partition offsets it reflects,
 * replay the records after them up to fixed end offsets (replay.ts), check that every entity's
 * versions are contiguous, and hand back the state with the offsets to store *in the same
 * transaction* as the state. `projectionChecksum()` is a deterministic digest (canonical JSON:
 * object keys sorted, SHA-256) to compare a rebuilt projection with the live one.
 */
import { createHash } from "node:crypto";
import type { Broker, ConsumedRecord } from "../types.js";
import { replay } from "./replay.js";

export interface ProjectionSnapshot<S> {
  /** Next offset to read per partition (what the snapshot's state reflects). */
  offsets: Record<number, number>;
  state: S;
}

export interface RebuildOptions<S> {
  broker: Pick<Broker, "describeTopic" | "fetch">;
  topic: string;
  /** The snapshot to start from; default: empty state from offset 0 of every partition. */
  snapshot?: ProjectionSnapshot<S>;
  /** The empty state, when there is no snapshot. */
  initial?: () => S;
  /** End offsets (exclusive); default the high watermarks when the rebuild starts. */
  to?: Record<number, number> | "latest";
  apply: (state: S, rec: ConsumedRecord) => S | void | Promise<S | void>;
  /** Entity and version of a record, to verify each entity's versions are contiguous. */
  versionOf?: (rec: ConsumedRecord) => { entityId: string; version: number } | null;
  signal?: AbortSignal;
}

export interface RebuildResult<S> {
  state: S;
  /** Next offset per partition: store it with the state, in one transaction. */
  offsets: Record<number, number>;
  records: number;
  /** Versions that did not follow their entity's previous one (empty when contiguous). */
  gaps: { entityId: string; expected: number; got: number; partition: number; offset: number }[];
}

export async function rebuildProjection<S>(o: RebuildOptions<S>): Promise<RebuildResult<S>> {
  const desc = await o.broker.describeTopic(o.topic);
  let state = o.snapshot ? o.snapshot.state : (o.initial ?? (() => ({}) as S))();
  const offsets: Record<number, number> = {};
  for (const p of desc.partitions) offsets[p.partition] = o.snapshot?.offsets[p.partition] ?? p.logStartOffset;
  const seen = new Map<string, number>();
  const gaps: RebuildResult<S>["gaps"] = [];
  let records = 0;
  // Fixed end offsets, taken once: the offsets returned are exactly what the state reflects.
  const to: Record<number, number> = o.to && o.to !== "latest" ? { ...o.to } : Object.fromEntries(desc.partitions.map((p) => [p.partition, p.highWatermark]));
  for await (const rec of replay(o.broker, o.topic, { from: { ...offsets }, to, partitions: desc.partitions.map((p) => p.partition), signal: o.signal })) {
    const v = o.versionOf?.(rec);
    if (v) {
      const prev = seen.get(v.entityId);
      if (prev !== undefined && v.version !== prev + 1) gaps.push({ entityId: v.entityId, expected: prev + 1, got: v.version, partition: rec.partition, offset: rec.offset });
      seen.set(v.entityId, v.version);
    }
    const next = await o.apply(state, rec);
    if (next !== undefined) state = next as S;
    offsets[rec.partition] = rec.offset + 1;
    records++;
  }
  for (const [p, end] of Object.entries(to)) offsets[Number(p)] = Math.max(offsets[Number(p)] ?? 0, end);
  return { state, offsets, records, gaps };
}

/** SHA-256 of `value` as canonical JSON (object keys sorted at every level; Maps and Sets as sorted arrays). */
export function projectionChecksum(value: unknown): string {
  return createHash("sha256").update(canonical(value)).digest("hex");
}

function canonical(v: unknown): string {
  if (v instanceof Map) return canonical([...v.entries()].sort(([a], [b]) => (String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0)));
  if (v instanceof Set) return canonical([...v].map((x) => canonical(x)).sort());
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const keys = Object.keys(v as object).sort();
    return `{${keys.filter((k) => (v as Record<string, unknown>)[k] !== undefined).map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  return JSON.stringify(v ?? null);
}
