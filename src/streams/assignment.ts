// SPDX-License-Identifier: Apache-2.0
/** Partition assignment strategies. Members are given in a stable order (join order). */
export type AssignmentStrategy = "range" | "roundrobin";

export function assignPartitions(members: readonly string[], numPartitions: number, strategy: AssignmentStrategy): Map<string, number[]> {
  const out = new Map<string, number[]>(members.map((m) => [m, []]));
  const n = members.length;
  if (n === 0) return out;
  if (strategy === "roundrobin") {
    for (let p = 0; p < numPartitions; p++) out.get(members[p % n])!.push(p);
    return out;
  }
  // Range, as Kafka's RangeAssignor: contiguous runs, the first (P mod M) members get one extra.
  const per = Math.floor(numPartitions / n);
  const extra = numPartitions % n;
  let p = 0;
  for (let i = 0; i < n; i++) {
    const count = per + (i < extra ? 1 : 0);
    for (let k = 0; k < count; k++) out.get(members[i])!.push(p++);
  }
  return out;
}
