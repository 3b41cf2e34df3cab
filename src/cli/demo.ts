// SPDX-License-Identifier: Apache-2.0
/** `sluice demo --data DIR`: embedded demo: produce to a topic, consume as a group, show lag. */
import { openBroker } from "../broker/broker.js";
import { parse } from "./args.js";
import { say } from "./output.js";

export const DEMO_USAGE = `Usage: sluice demo [--data DIR]

Embedded demo in DIR (default ./data): creates topic "demo" (3 partitions), publishes 9
records, consumes them as group "demo-readers" and shows the lag. Run it again: offsets continue
and the group resumes where it committed.`;

export async function demoCommand(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: DEMO_USAGE, options: { data: { type: "string" } }, maxPositionals: 0 });
  const dir = values.data ?? "./data";
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    if (!(await broker.listTopics()).includes("demo")) await broker.createTopic("demo", { partitions: 3 });
    const receipts = await broker.publishBatch(
      "demo",
      Array.from({ length: 9 }, (_, i) => ({ key: `customer-${i % 3}`, value: { order: i, at: new Date().toISOString() } })),
    );
    say(`published ${receipts.length} records durably (fsync before ack) to topic "demo":`);
    for (const r of receipts) say(`  partition ${r.partition} offset ${r.offset}`);
    const sub = broker.subscribe<{ order: number }>("demo", { group: "demo-readers", start: "earliest" });
    let seen = 0;
    for await (const msg of sub) {
      await msg.commit();
      seen++;
      if ((await broker.groupLag("demo-readers", "demo")).totalRecords === 0) break;
    }
    await sub.close();
    const lag = await broker.groupLag("demo-readers", "demo");
    say(`group "demo-readers" consumed ${seen} records; lag now ${lag.totalRecords} records`);
    const d = await broker.describeTopic("demo");
    say(`topic "demo": ${d.partitions.map((p) => `p${p.partition}=[${p.logStartOffset},${p.highWatermark})`).join(" ")}`);
    say(`data dir: ${dir} (run again: offsets continue; the group resumes where it committed)`);
  } finally {
    await broker.close();
  }
}
