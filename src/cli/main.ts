#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice <command>`: demo, serve, topics, group, doctor. Arguments are parsed with
 * node:util parseArgs; every command prints a clear message and exits non-zero on bad input.
 */
import { parseArgs } from "node:util";
import { openBroker } from "../broker/broker.js";
import { existsSync } from "node:fs";
import { BrokerError, ValidationError } from "../errors.js";

const HELP = `sluice - durable queues, streams and logs

Usage:
  sluice serve  --data DIR [--port N] [--http-port N]   run the broker server
  sluice demo   --data DIR                              embedded demo: produce, consume, show lag
  sluice topics list|describe NAME|create NAME [--partitions N] [--retention-ms N]|delete NAME --data DIR
  sluice group  lag GROUP TOPIC | reset GROUP TOPIC --to earliest|latest|OFFSET [--dry-run] --data DIR
  sluice doctor --data DIR                              verify every segment and index
  sluice schema check OLD.json NEW.json [--json]        backward-compatibility check of two JSON Schemas
`;

/**
 * Runs `fn` on the broker of a data directory. The directory is locked while open (a running
 * server holds it: DataDirLockedError, nothing changed). A command that only reads must not
 * create a broker where there is none: `readOnly` refuses a missing directory.
 */
async function withBroker<T>(data: string | undefined, fn: (b: Awaited<ReturnType<typeof openBroker>>) => Promise<T>, opts: { readOnly?: boolean } = {}): Promise<T> {
  if (!data) throw new BrokerError("USAGE", "--data DIR is required");
  if (opts.readOnly && !existsSync(data)) throw new ValidationError(`data directory ${data} does not exist (nothing to read; this command creates nothing)`);
  const b = await openBroker({ dataDir: data, retentionCheckIntervalMs: 0 });
  try {
    return await fn(b);
  } finally {
    await b.close();
  }
}

async function demo(argv: string[]): Promise<void> {
  const { values } = parseArgs({ args: argv, options: { data: { type: "string", default: "./data" } } });
  await withBroker(values.data, async (broker) => {
    if (!(await broker.listTopics()).includes("demo")) await broker.createTopic("demo", { partitions: 3 });
    const receipts = await broker.publishBatch(
      "demo",
      Array.from({ length: 9 }, (_, i) => ({ key: `customer-${i % 3}`, value: { order: i, at: new Date().toISOString() } })),
    );
    console.log(`published ${receipts.length} records durably (fsync before ack) to topic "demo":`);
    for (const r of receipts) console.log(`  partition ${r.partition} offset ${r.offset}`);
    const sub = broker.subscribe<{ order: number }>("demo", { group: "demo-readers", start: "earliest" });
    let seen = 0;
    const ac = new AbortController();
    for await (const msg of sub) {
      await msg.commit();
      seen++;
      if ((await broker.groupLag("demo-readers", "demo")).totalRecords === 0) break;
    }
    void ac;
    const lag = await broker.groupLag("demo-readers", "demo");
    console.log(`group "demo-readers" consumed ${seen} records; lag now ${lag.totalRecords} records`);
    const d = await broker.describeTopic("demo");
    console.log(`topic "demo": ${d.partitions.map((p) => `p${p.partition}=[${p.logStartOffset},${p.highWatermark})`).join(" ")}`);
    console.log(`data dir: ${values.data} (run again: offsets continue; the group resumes where it committed)`);
  });
}

async function topics(argv: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { data: { type: "string" }, partitions: { type: "string" }, "retention-ms": { type: "string" }, json: { type: "boolean" } },
  });
  const [verb, name] = positionals;
  await withBroker(values.data, async (b) => {
    switch (verb) {
      case "list":
        for (const t of await b.listTopics()) console.log(t);
        return;
      case "describe":
        console.log(JSON.stringify(await b.describeTopic(name), null, 2));
        return;
      case "create": {
        const d = await b.createTopic(name, {
          partitions: values.partitions ? Number(values.partitions) : undefined,
          retentionMs: values["retention-ms"] ? Number(values["retention-ms"]) : undefined,
        });
        console.log(`created ${d.name} (${d.partitions.length} partitions, id ${d.topicId})`);
        return;
      }
      case "delete":
        await b.deleteTopic(name);
        console.log(`deleted ${name}`);
        return;
      default:
        throw new BrokerError("USAGE", `unknown topics verb ${JSON.stringify(verb)}\n${HELP}`);
    }
  }, { readOnly: verb === "list" || verb === "describe" });
}

async function group(argv: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { data: { type: "string" }, to: { type: "string" }, "dry-run": { type: "boolean" } },
  });
  const [verb, g, topic] = positionals;
  await withBroker(values.data, async (b) => {
    if (verb === "lag") console.log(JSON.stringify(await b.groupLag(g, topic), null, 2));
    else if (verb === "reset") {
      const to = values.to === "earliest" || values.to === "latest" ? values.to : { offset: Number(values.to) };
      console.log(JSON.stringify(await b.resetGroup(g, topic, to, { dryRun: values["dry-run"] }), null, 2));
    } else throw new BrokerError("USAGE", `unknown group verb ${JSON.stringify(verb)}`);
  }, { readOnly: verb === "lag" });
}

async function doctor(argv: string[]): Promise<void> {
  const { values } = parseArgs({ args: argv, options: { data: { type: "string" } } });
  let problems = 0;
  await withBroker(values.data, async (b) => {
    for (const t of await b.listTopics()) {
      const d = await b.describeTopic(t);
      for (const p of d.partitions) {
        let off = p.logStartOffset;
        let n = 0;
        while (off < p.highWatermark) {
          try {
            const r = await b.fetch(t, p.partition, off, { maxBytes: 4 * 1024 * 1024 });
            n += r.records.length;
            if (r.nextOffset <= off) break;
            off = r.nextOffset;
          } catch (e) {
            if (e instanceof BrokerError && e.code === "CORRUPT_RECORD") {
              problems++;
              console.log(`CORRUPT ${e.message}`);
              const next = (e as unknown as { nextOffset?: number }).nextOffset;
              if (next === undefined || next <= off) break;
              off = next;
            } else throw e;
          }
        }
        console.log(`ok ${t}/${p.partition}: ${n} records verified [${p.logStartOffset}, ${p.highWatermark})`);
      }
    }
  }, { readOnly: true });
  if (problems > 0) process.exitCode = 2;
}

async function main(): Promise<void> {
  const [cmd, ...rest] = process.argv.slice(2);
  switch (cmd) {
    case "demo":
      return demo(rest);
    case "serve": {
      const serveModule = "./serve.js"; // resolved at run time: the server ships in the same package
      const mod = (await import(serveModule).catch(() => null)) as { serveCommand?: (a: string[]) => Promise<void> } | null;
      if (!mod?.serveCommand) throw new BrokerError("UNAVAILABLE", "the server is not built into this version");
      return mod.serveCommand(rest);
    }
    case "topics":
      return topics(rest);
    case "group":
      return group(rest);
    case "doctor":
      return doctor(rest);
    case "schema":
      return (await import("./schema.js")).schemaCommand(rest);
    case undefined:
    case "help":
    case "--help":
    case "-h":
      console.log(HELP);
      return;
    default:
      throw new BrokerError("USAGE", `unknown command ${JSON.stringify(cmd)}\n${HELP}`);
  }
}

main().catch((e: unknown) => {
  if (e instanceof BrokerError) console.error(`sluice: ${e.message} [${e.code}]`);
  else console.error(`sluice: ${(e as Error)?.stack ?? e}`);
  process.exit(1);
});
