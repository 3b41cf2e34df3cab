// SPDX-License-Identifier: Apache-2.0
/** Appends N 100-byte records, reads them all back, and reports RSS at stages. */
import { openBroker } from "../src/index.js";

const [dir, nStr] = process.argv.slice(2);
const total = Number(nStr);
const b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
await b.createTopic("rss", { partitions: 4 });
const value = Buffer.alloc(100, 0x62);
const batch = Array.from({ length: 1000 }, () => ({ value }));
let written = 0;
let nextStage = total / 10;
const stage = (name: string): void => void process.stdout.write(`STAGE ${name} ${process.memoryUsage().rss}\n`);
await Promise.all(
  Array.from({ length: 8 }, async () => {
    while (written < total) {
      written += batch.length;
      await b.publishBatch("rss", batch);
      if (written >= nextStage) {
        stage(`written${Math.round((written / total) * 100)}%`);
        nextStage += total / 10;
      }
    }
  }),
);
stage("written");
let read = 0;
for (let p = 0; p < 4; p++) {
  let off = 0;
  const hwm = (await b.describeTopic("rss")).partitions[p].highWatermark;
  while (off < hwm) {
    const r = await b.fetch("rss", p, off, { maxBytes: 1024 * 1024 }); // the default fetch size of subscribe()
    read += r.records.length;
    off = r.nextOffset;
  }
}
stage("read-all");
await b.close();
await new Promise((r) => setTimeout(r, 50));
process.stdout.write(`RSS_BYTES=${process.memoryUsage().rss}\nREAD ${read}\n`);
