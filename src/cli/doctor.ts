// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice doctor --data DIR`: reads every record of every partition back through the broker,
 * which verifies each batch's checksum and structure, and reports each damaged batch with its
 * file and position. Exit 0 when everything verified, 1 when something is damaged.
 */
import { BrokerError, CorruptRecordError } from "../errors.js";
import { TARGET_OPTIONS, TARGET_USAGE, parse } from "./args.js";
import { Progress, printJson, say } from "./output.js";
import { withBroker, type CliBroker } from "./target.js";

export const DOCTOR_USAGE = `Usage: sluice doctor (--data DIR | --url URL) [--json]

Reads back every record of every topic partition and verifies each stored batch (checksums and
structure). Prints one line per partition, and each damaged batch with its segment file and
byte position. Exit status: 0 all verified, 1 damage found (the damaged files are named), 2 usage.
Progress is shown on a terminal.

${TARGET_USAGE}`;

interface Damage {
  topic: string;
  partition: number;
  offset: number;
  file: string;
  position: number;
  message: string;
}

interface PartitionReport {
  topic: string;
  partition: number;
  logStartOffset: number;
  highWatermark: number;
  records: number;
  damaged: number;
}

async function checkPartition(b: CliBroker, topic: string, p: { partition: number; logStartOffset: number; highWatermark: number }, damage: Damage[], progress: Progress): Promise<PartitionReport> {
  let off = p.logStartOffset;
  let records = 0;
  let damaged = 0;
  while (off < p.highWatermark) {
    try {
      const r = await b.fetch(topic, p.partition, off, { maxBytes: 4 * 1024 * 1024 });
      records += r.records.length;
      if (r.nextOffset <= off) break;
      off = r.nextOffset;
      progress.update(`${topic}/${p.partition}: ${off - p.logStartOffset} of ${p.highWatermark - p.logStartOffset} offsets`);
    } catch (e) {
      if (!(e instanceof CorruptRecordError)) throw e;
      damaged++;
      damage.push({ topic, partition: p.partition, offset: e.offset, file: e.file, position: e.position, message: e.message });
      // Past the damaged batch when the broker knows where the next one starts; else give up on this partition.
      if (e.nextOffset === undefined || e.nextOffset <= off) break;
      off = e.nextOffset;
    }
  }
  return { topic, partition: p.partition, logStartOffset: p.logStartOffset, highWatermark: p.highWatermark, records, damaged };
}

export async function doctorCommand(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: DOCTOR_USAGE, options: { ...TARGET_OPTIONS, json: { type: "boolean" } }, maxPositionals: 0 });
  const progress = new Progress(values.json);
  const damage: Damage[] = [];
  const reports: PartitionReport[] = [];
  await withBroker(values, { readOnly: true }, async (b) => {
    for (const t of await b.listTopics()) {
      const d = await b.describeTopic(t);
      for (const p of d.partitions) {
        const r = await checkPartition(b, t, p, damage, progress);
        reports.push(r);
        progress.done();
        if (!values.json) say(`${r.damaged === 0 ? "ok" : "DAMAGED"} ${t}/${p.partition}: ${r.records} records verified [${p.logStartOffset}, ${p.highWatermark})${r.damaged ? `, ${r.damaged} damaged batch(es)` : ""}`);
      }
    }
  });
  progress.done();
  if (values.json) printJson({ ok: damage.length === 0, partitions: reports, damaged: damage });
  else for (const x of damage) say(`  damaged: ${x.topic}/${x.partition} offset ${x.offset} in ${x.file} @${x.position}`);
  if (damage.length > 0) {
    const files = [...new Set(damage.map((x) => x.file))].join(", ");
    throw new BrokerError("CORRUPT_RECORD", `${damage.length} damaged batch(es) in ${files}`);
  }
}
