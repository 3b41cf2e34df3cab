// SPDX-License-Identifier: Apache-2.0
import { decodeValue, type StoredRecord } from "../log/record-batch.js";
import type { ConsumedRecord } from "../types.js";

export function toConsumed<T = unknown>(topic: string, partition: number, r: StoredRecord): ConsumedRecord<T> {
  const headers: Record<string, Uint8Array> = {};
  if (r.headers) for (const [k, v] of r.headers) headers[k] = v;
  return { topic, partition, offset: r.offset, timestamp: r.timestamp, key: r.key, value: decodeValue(r.value, r.valueKind) as T, headers };
}
