// SPDX-License-Identifier: Apache-2.0
/**
 * Cutting a chunk of stored batches (a raw read) at a batch boundary, so a chunk read ahead of
 * the client's credit is pushed only as far as the credit reaches: the push rule stays "no
 * batch past the one that reaches the credit" however the chunk was read.
 */
import { readBatchLength, readHeader } from "../log/record-batch.js";
import type { RawChunk } from "../streams/subscription.js";

/**
 * The whole batches of `chunk` up to and including the one whose records reach `credit`
 * (at least one batch), and the batches after them (null if none). `credit` must be positive.
 * Both parts are views of the chunk's bytes: nothing is copied or decoded.
 */
export function splitRawChunk(chunk: RawChunk, credit: number): { head: RawChunk; rest: RawChunk | null } {
  if (!(credit > 0)) throw new Error(`splitRawChunk: credit ${credit} must be positive`);
  if (chunk.records <= credit) return { head: chunk, rest: null };
  const { data, from } = chunk;
  let pos = 0;
  let records = 0;
  let end = from;
  while (pos < data.length && records < credit) {
    const h = readHeader(data, pos);
    const batchEnd = h.baseOffset + h.count;
    records += Math.max(0, batchEnd - Math.max(h.baseOffset, from));
    end = batchEnd;
    pos += readBatchLength(data, pos);
  }
  if (pos >= data.length) return { head: chunk, rest: null };
  const head: RawChunk = { ...chunk, data: data.subarray(0, pos), nextOffset: end, records };
  const rest: RawChunk = { ...chunk, from: end, data: data.subarray(pos), records: chunk.records - records };
  return { head, rest };
}
