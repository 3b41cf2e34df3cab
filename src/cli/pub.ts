// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice pub TOPIC [VALUE...]`: publishes the values given, or one record per stdin line when
 * none are. A value that parses as JSON is sent as that JSON value, anything else as a string
 * (`--string` sends every value as a string). Each call is acknowledged durably before the
 * receipt is printed.
 */
import { createInterface } from "node:readline";
import type { PublishRecord, PublishReceipt, PublishValue } from "../types.js";
import { TARGET_OPTIONS, TARGET_USAGE, UsageError, need, optInt, parse } from "./args.js";
import { Progress, printJsonLine, say } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const PUB_USAGE = `Usage: sluice pub TOPIC [VALUE ...] [options] (--url URL | --data DIR)

Publishes each VALUE as one record; with no VALUE, one record per line of stdin (blank lines
are skipped). A value that is valid JSON is sent as JSON (42, {"a":1}, "text"), anything else
as a string.

Options:
  --key K               record key (same key → same partition)
  --partition P         publish to this partition
  --header k=v          a header (repeatable)
  --string              send every value as a string, even if it parses as JSON
  --json                print one receipt per record as a JSON line
Without --json: a receipt per record for VALUE arguments, a count per partition for stdin.

${TARGET_USAGE}`;

const OPTS = {
  ...TARGET_OPTIONS,
  key: { type: "string" },
  partition: { type: "string" },
  header: { type: "string", multiple: true },
  string: { type: "boolean" },
  json: { type: "boolean" },
} as const;

/** Records per publishBatch call when reading stdin. */
const STDIN_BATCH = 500;

function headersOf(raw: string[] | undefined): Record<string, string> | undefined {
  if (!raw || raw.length === 0) return undefined;
  const h: Record<string, string> = {};
  for (const kv of raw) {
    const i = kv.indexOf("=");
    if (i <= 0) throw new UsageError(`--header must be k=v, got ${JSON.stringify(kv)}`);
    h[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return h;
}

function valueOf(text: string, asString: boolean | undefined): PublishValue {
  if (asString) return text;
  try {
    return JSON.parse(text) as PublishValue;
  } catch {
    return text;
  }
}

export async function pubCommand(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: PUB_USAGE, options: OPTS });
  const topic = need(positionals, 0, "topic name", "sluice pub TOPIC [VALUE ...]");
  const base: Omit<PublishRecord, "value"> = {};
  if (values.key !== undefined) base.key = values.key;
  const partition = optInt(values.partition, "--partition", { min: 0 });
  if (partition !== undefined) base.partition = partition;
  const headers = headersOf(values.header);
  if (headers) base.headers = headers;
  const args = positionals.slice(1);
  await withBroker(values, { readOnly: true }, async (b) => {
    await b.describeTopic(topic); // TOPIC_NOT_FOUND before reading stdin
    if (args.length > 0) {
      const receipts = await b.publishBatch(topic, args.map((a) => ({ ...base, value: valueOf(a, values.string) })));
      for (const r of receipts) {
        if (values.json) printJsonLine(receipt(r));
        else say(`published ${topic} partition ${r.partition} offset ${r.offset}`);
      }
      return;
    }
    await fromStdin(b, topic, base, values);
  });
}

function receipt(r: PublishReceipt): { topic: string; partition: number; offset: number } {
  return { topic: r.topic, partition: r.partition, offset: r.offset };
}

async function fromStdin(b: CliBroker, topic: string, base: Omit<PublishRecord, "value">, values: { string?: boolean; json?: boolean }): Promise<void> {
  if (process.stdin.isTTY) process.stderr.write("reading records from stdin, one per line (Ctrl-D to end)\n");
  const progress = new Progress(values.json);
  const perPartition = new Map<number, number>();
  let total = 0;
  let batch: PublishRecord[] = [];
  const flush = async (): Promise<void> => {
    if (batch.length === 0) return;
    const receipts = await b.publishBatch(topic, batch);
    batch = [];
    for (const r of receipts) {
      perPartition.set(r.partition, (perPartition.get(r.partition) ?? 0) + 1);
      if (values.json) printJsonLine(receipt(r));
    }
    total += receipts.length;
    progress.update(`published ${total} records`);
  };
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (line.trim() === "") continue;
    batch.push({ ...base, value: valueOf(line, values.string) });
    if (batch.length >= STDIN_BATCH) await flush();
  }
  await flush();
  progress.done();
  if (values.json) return;
  const parts = [...perPartition.entries()].sort((a, c) => a[0] - c[0]).map(([p, n]) => `p${p}=${n}`);
  say(`published ${total} record${total === 1 ? "" : "s"} to ${topic}${parts.length > 0 ? ` (${parts.join(" ")})` : ""}`);
}
