// SPDX-License-Identifier: Apache-2.0
/** What the broker conformance tests (src/testing/conformance*.ts) share: unique names and bounded reads. */
import type { Job, Queue } from "../queues/types.js";
import type { Broker, Message, Subscription } from "../types.js";

/**
 * What a test may do beyond the Broker API. `reopen` (targets with durable storage that can
 * restart, e.g. embedded on a data dir) closes the broker and opens it again on the same
 * storage, returning the new one; absent where the target cannot, and a test then skips the
 * restart.
 */
export interface ConformanceKit {
  reopen?: () => Promise<Broker>;
}

/** Registers one conformance test: `fn` gets a broker from the suite's factory. */
export type DefineTest = (title: string, fn: (b: Broker, kit: ConformanceKit) => Promise<void>, timeoutMs?: number) => void;

let seq = 0;
/** A name no other test uses (a factory may hand out the same broker repeatedly). */
export function uniq(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${++seq}`;
}

/** Reads `n` messages from a subscription (with a deadline), leaving it open. */
export async function take<T>(sub: Subscription<T>, n: number, timeoutMs = 10_000): Promise<Message<T>[]> {
  const out: Message<T>[] = [];
  const it = sub[Symbol.asyncIterator]();
  const deadline = Date.now() + timeoutMs;
  while (out.length < n) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`timed out: got ${out.length} of ${n} messages`);
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), left))),
    ]);
    clearTimeout(timer);
    if (r === "timeout") throw new Error(`timed out: got ${out.length} of ${n} messages`);
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

/** Reads everything from all partitions of a topic via fetch. */
export async function readAll(b: Broker, topic: string): Promise<Map<number, unknown[]>> {
  const d = await b.describeTopic(topic);
  const out = new Map<number, unknown[]>();
  for (const p of d.partitions) {
    const vals: unknown[] = [];
    let off = p.logStartOffset;
    for (;;) {
      const r = await b.fetch(topic, p.partition, off);
      for (const rec of r.records) vals.push(rec.value);
      if (r.records.length === 0 || r.nextOffset >= r.highWatermark) break;
      off = r.nextOffset;
    }
    out.set(p.partition, vals);
  }
  return out;
}

/** The next job a worker delivers (with a deadline). */
export async function nextJob<T>(it: AsyncIterator<Job<T>>, timeoutMs = 10_000): Promise<Job<T>> {
  let timer: NodeJS.Timeout | undefined;
  const r = await Promise.race([
    it.next(),
    new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs))),
  ]);
  clearTimeout(timer);
  if (r === "timeout" || r.done) throw new Error("no job delivered in time");
  return r.value;
}

/** Data of the jobs a fresh worker is handed, in order, each acked (prefetch 1). */
export async function drain<T>(q: Queue<T>, n: number): Promise<T[]> {
  const w = q.work({ prefetch: 1 });
  const it = w[Symbol.asyncIterator]();
  const out: T[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const job = await nextJob(it);
      out.push(job.data);
      await job.ack();
    }
  } finally {
    await w.close();
  }
  return out;
}
