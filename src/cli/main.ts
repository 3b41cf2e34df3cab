#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice <command>`: one module per command group (topics.ts, groups.ts, queues.ts, dlq.ts, explain.ts, pub.ts,
 * tail.ts, doctor.ts, archive.ts, audit.ts, serve.ts, schema.ts, demo.ts, users.ts, tokens.ts, acl.ts), sharing args.ts (parsing, usage errors)
 * and output.ts (tables, --json, one-line errors). Exit status: 0 success, 1 failure, 2 usage.
 */
import { UsageError, helpIfAsked, parse, suggest } from "./args.js";
import { runCommand, say } from "./output.js";

const HELP = `sluice - durable queues, streams and logs

Usage: sluice <command> [options]      (sluice <command> --help for each)

Commands:
  serve   --data DIR [--port N] [--http-port N]     run the broker server
  topics  list | describe NAME | create NAME | delete NAME
  groups  list | describe GROUP | reset GROUP TOPIC --to-... [--execute]
  queues  list | stats NAME | purge NAME
  dlq     list | show | redrive | purge QUEUE       a queue's dead-letter queue (browsing counts no attempt)
  explain queue | group | topic NAME                troubleshooting walk: one ok/warn line per step
  apply   -f FILE [--dry-run]                       make the broker match a topology file (YAML)
  pub     TOPIC [VALUE ...]                         publish values (or stdin lines)
  tail    TOPIC [--from ...] [--group G] [--max N]  print records as they arrive
  doctor  --data DIR                                verify every stored batch
  archive list | verify --dir DIR                   segments archived by topics with an archive
  audit   list | verify --data DIR                  the audit log of administrative operations
  schema  check OLD.json NEW.json                   backward compatibility of two JSON Schemas
  demo    [--data DIR]                              embedded demo
  users   add | remove NAME | list --data DIR        users who log in with a password
  tokens  create PRINCIPAL | revoke ID | list --data DIR   bearer tokens
  acl     add | remove | list | group | tenant --data DIR  who may do what

Target: --url sluice://host:port (a running server; env SLUICE_URL) or --data DIR (a data
directory no server holds). Read commands take --json.
Exit status: 0 success, 1 failure (error [CODE]: message), 2 usage error.`;

type Command = (argv: string[]) => Promise<void>;

const COMMANDS: Record<string, () => Promise<Command>> = {
  serve: async () => serve,
  topics: async () => (await import("./topics.js")).topicsCommand,
  groups: async () => (await import("./groups.js")).groupsCommand,
  group: async () => (await import("./groups.js")).legacyGroupCommand,
  queues: async () => (await import("./queues.js")).queuesCommand,
  dlq: async () => (await import("./dlq.js")).dlqCommand,
  explain: async () => (await import("./explain.js")).explainCommand,
  apply: async () => (await import("./apply.js")).applyCommand,
  pub: async () => (await import("./pub.js")).pubCommand,
  tail: async () => (await import("./tail.js")).tailCommand,
  doctor: async () => (await import("./doctor.js")).doctorCommand,
  archive: async () => (await import("./archive.js")).archiveCommand,
  audit: async () => (await import("./audit.js")).auditCommand,
  schema: async () => (await import("./schema.js")).schemaCommand,
  demo: async () => (await import("./demo.js")).demoCommand,
  users: async () => (await import("./users.js")).usersCommand,
  tokens: async () => (await import("./tokens.js")).tokensCommand,
  acl: async () => (await import("./acl.js")).aclCommand,
};

/** `serve`: its usage and unknown flags are handled here; the rest by serveCommand. */
async function serve(argv: string[]): Promise<void> {
  const mod = await import("./serve.js");
  helpIfAsked(argv, mod.SERVE_HELP);
  parse(argv, { usage: mod.SERVE_HELP, options: Object.fromEntries(mod.SERVE_FLAGS.map((f) => [f, { type: mod.SERVE_BOOLEAN_FLAGS.includes(f) ? "boolean" : "string" } as const])), maxPositionals: 0 });
  await mod.serveCommand(argv);
}

async function main(): Promise<void> {
  const [cmd, ...rest] = process.argv.slice(2);
  if (cmd === undefined || cmd === "help" || cmd === "--help" || cmd === "-h") return say(HELP);
  const load = Object.hasOwn(COMMANDS, cmd) ? COMMANDS[cmd] : undefined;
  if (!load) {
    const guess = suggest(cmd, Object.keys(COMMANDS));
    throw new UsageError(`unknown command ${JSON.stringify(cmd)}${guess ? ` (did you mean ${guess}?)` : ""}; run sluice --help`);
  }
  await (await load())(rest);
}

void runCommand(main).then(() => {
  // A one-shot command owns its process: stray handles (a client's timers) must not keep it alive.
  if (process.argv[2] !== "serve") setImmediate(() => process.exit(process.exitCode ?? 0)).unref();
});
