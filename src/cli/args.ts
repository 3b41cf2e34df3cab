// SPDX-License-Identifier: Apache-2.0
/**
 * Argument parsing shared by every `sluice` command: a thin wrapper over node:util parseArgs
 * with one option table per command. What it adds, so that no command prints a Node stack trace:
 * `--help`/`-h` anywhere prints the command's usage (exit 0); an unknown or mistyped flag is one
 * line `error [USAGE]: unknown option --parttions (did you mean --partitions?)` (exit 2);
 * numbers are parsed with messages that say what was expected and what was given.
 */
import { parseArgs } from "node:util";
import { BrokerError } from "../errors.js";

/** A mistake in the command line: printed as one line, exit status 2. Not a broker error code. */
export class UsageError extends BrokerError {
  constructor(message: string) {
    super("USAGE", message);
  }
}

/** Thrown after a command printed its usage on request: the process exits 0. */
export class HelpShown extends Error {
  constructor() {
    super("help shown");
  }
}

export interface OptionSpec {
  type: "string" | "boolean";
  short?: string;
  multiple?: boolean;
}

export type OptionTable = Record<string, OptionSpec>;

export interface CommandSpec<O extends OptionTable> {
  /** Full usage text printed by `--help`. */
  usage: string;
  options: O;
  /** Positional arguments: at most this many (default: any number). */
  maxPositionals?: number;
}

type ValueOf<S extends OptionSpec> = S["type"] extends "boolean"
  ? S["multiple"] extends true
    ? boolean[]
    : boolean
  : S["multiple"] extends true
    ? string[]
    : string;

export type Values<O extends OptionTable> = { [K in keyof O]?: ValueOf<O[K]> };

export interface Parsed<O extends OptionTable> {
  values: Values<O>;
  positionals: string[];
}

/** Options every command that reaches a broker accepts. */
export const TARGET_OPTIONS = {
  url: { type: "string" },
  data: { type: "string" },
  "tls-ca": { type: "string" },
  "tls-client-cert": { type: "string" },
  "tls-client-key": { type: "string" },
  user: { type: "string" },
  "password-file": { type: "string" },
  "token-file": { type: "string" },
} as const satisfies OptionTable;

export const TARGET_USAGE = `Target (one of):
  --url sluice://host:port   a running server (or env SLUICE_URL); sluice+tls://host:port for TLS
  --data DIR                 a data directory no server holds (or env SLUICE_DATA)
  --tls-ca FILE              with a sluice+tls:// url: the CA that signed the server's certificate
                             (or env SLUICE_TLS_CA; default: the system's CAs)
  --tls-client-cert FILE --tls-client-key FILE   with a sluice+tls:// url: a client
                             certificate, for a server that requires one (or env
                             SLUICE_TLS_CLIENT_CERT, SLUICE_TLS_CLIENT_KEY)
  --user NAME --password-file FILE   log in to a server with users (or env SLUICE_USER,
                             SLUICE_PASSWORD)
  --token-file FILE          log in with a token (or env SLUICE_TOKEN)`;

/** True when `--help` or `-h` appears before a `--` terminator. */
export function wantsHelp(argv: readonly string[]): boolean {
  for (const a of argv) {
    if (a === "--") return false;
    if (a === "--help" || a === "-h") return true;
  }
  return false;
}

/** Prints `usage` and stops the command (exit 0) when help was asked for. */
export function helpIfAsked(argv: readonly string[], usage: string): void {
  if (wantsHelp(argv)) {
    process.stdout.write(usage.endsWith("\n") ? usage : usage + "\n");
    throw new HelpShown();
  }
}

/**
 * Joins `--opt -5` into `--opt=-5` for string options: parseArgs refuses a value starting with a
 * dash as ambiguous, but `--shift-by -100` is what people type.
 */
function joinNegativeValues(argv: readonly string[], options: OptionTable): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const name = a.startsWith("--") ? a.slice(2) : null;
    if (name !== null && options[name]?.type === "string" && i + 1 < argv.length && /^-\d/.test(argv[i + 1])) {
      out.push(`${a}=${argv[i + 1]}`);
      i++;
    } else out.push(a);
  }
  return out;
}

/** Parses `argv` against the command's option table; usage errors are `UsageError`s. */
export function parse<O extends OptionTable>(argv: readonly string[], spec: CommandSpec<O>): Parsed<O> {
  helpIfAsked(argv, spec.usage);
  let r: { values: Record<string, unknown>; positionals: string[] };
  try {
    r = parseArgs({ args: joinNegativeValues(argv, spec.options), options: spec.options, allowPositionals: true, strict: true }) as typeof r;
  } catch (e) {
    throw translateParseError(e, Object.keys(spec.options));
  }
  if (spec.maxPositionals !== undefined && r.positionals.length > spec.maxPositionals) {
    throw new UsageError(`unexpected argument ${JSON.stringify(r.positionals[spec.maxPositionals])} (see --help)`);
  }
  return { values: r.values as Values<O>, positionals: r.positionals };
}

/** Turns a parseArgs exception (ERR_PARSE_ARGS_*) into one line without its stack. */
export function translateParseError(e: unknown, known: readonly string[]): UsageError {
  const err = e as { code?: string; message?: string };
  const msg = String(err.message ?? e);
  if (err.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") {
    const flag = /'([^']+)'/.exec(msg)?.[1] ?? "?";
    const guess = suggest(flag.replace(/^-+/, "").replace(/=.*$/, ""), known);
    return new UsageError(`unknown option ${flag}${guess ? ` (did you mean --${guess}?)` : ""}`);
  }
  if (err.code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") {
    const flag = /'(-[^' ]+)/.exec(msg)?.[1] ?? "option";
    if (/argument missing/.test(msg)) return new UsageError(`${flag} needs a value`);
    if (/ambiguous/.test(msg)) return new UsageError(`${flag} needs a value (one starting with "-" is written ${flag}=VALUE)`);
    if (/does not take an argument/.test(msg)) return new UsageError(`${flag} takes no value`);
    return new UsageError(`bad value for ${flag}: ${msg.split("\n")[0]}`);
  }
  return new UsageError(msg.split("\n")[0]);
}

/** The known option closest to `name` (edit distance ≤ 2, or a prefix), if any. */
export function suggest(name: string, known: readonly string[]): string | null {
  let best: string | null = null;
  let bestD = Infinity;
  for (const k of known) {
    const d = k.startsWith(name) && name.length >= 2 ? 1 : distance(name, k);
    if (d < bestD) {
      bestD = d;
      best = k;
    }
  }
  return bestD <= Math.max(2, Math.floor(name.length / 4)) ? best : null;
}

function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const tmp = row[j];
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = tmp;
    }
  }
  return row[b.length];
}

/** Parses an integer option value; `what` names it in the message (e.g. "--partitions"). */
export function intValue(raw: string, what: string, opts: { min?: number; max?: number } = {}): number {
  const min = opts.min ?? Number.MIN_SAFE_INTEGER;
  const max = opts.max ?? Number.MAX_SAFE_INTEGER;
  const n = /^[+-]?\d+$/.test(raw.trim()) ? Number(raw.trim()) : NaN;
  const range = min === Number.MIN_SAFE_INTEGER ? "an integer" : max === Number.MAX_SAFE_INTEGER ? `an integer >= ${min}` : `an integer ${min}..${max}`;
  if (!Number.isSafeInteger(n)) throw new UsageError(`${what} must be ${range}, got ${JSON.stringify(raw)}`);
  if (n < min || n > max) {
    const neg = n < 0 && min >= 0 ? " (negative values are refused, not clamped)" : "";
    throw new UsageError(`${what} must be ${range}, got ${raw}${neg}`);
  }
  return n;
}

/** An optional integer option: undefined when absent. */
export function optInt(raw: string | undefined, what: string, opts: { min?: number; max?: number } = {}): number | undefined {
  return raw === undefined ? undefined : intValue(raw, what, opts);
}

/** `--partition 0 --partition 2,3` → [0, 2, 3] (sorted, unique); undefined when absent. */
export function partitionList(raw: string[] | undefined): number[] | undefined {
  if (!raw || raw.length === 0) return undefined;
  const out = new Set<number>();
  for (const item of raw) for (const part of item.split(",")) if (part.trim() !== "") out.add(intValue(part, "--partition", { min: 0 }));
  if (out.size === 0) throw new UsageError("--partition needs a partition number");
  return [...out].sort((a, b) => a - b);
}

/** An ISO-8601 date-time (`2026-12-01T10:00:00Z`, or a date) → ms since the epoch. */
export function isoTime(raw: string, what: string): number {
  const ms = /^\d{4}-\d{2}-\d{2}([T ][\d:.]+)?(Z|[+-]\d{2}:?\d{2})?$/.test(raw.trim()) ? Date.parse(raw.trim()) : NaN;
  if (!Number.isFinite(ms)) throw new UsageError(`${what} must be an ISO-8601 time such as 2026-12-01T10:00:00Z, got ${JSON.stringify(raw)}`);
  return ms;
}

/** The positional at `i`, or a usage error naming what is missing. */
export function need(positionals: readonly string[], i: number, what: string, usage: string): string {
  const v = positionals[i];
  if (v === undefined || v === "") throw new UsageError(`missing ${what} (usage: ${usage})`);
  return v;
}

/** Picks the subcommand: `argv[0]` among `verbs` (a usage error names the known ones). */
export function subcommand(argv: readonly string[], group: string, verbs: readonly string[], usage: string): { verb: string; rest: string[] } {
  const [verb, ...rest] = argv;
  if (verb === "--help" || verb === "-h" || verb === "help") helpIfAsked(["--help"], usage);
  if (verb === undefined) throw new UsageError(`missing ${group} command; one of: ${verbs.join(", ")} (see sluice ${group} --help)`);
  if (!verbs.includes(verb!)) {
    const guess = suggest(verb!, verbs);
    throw new UsageError(`unknown ${group} command ${JSON.stringify(verb)}${guess ? ` (did you mean ${guess}?)` : ""}; one of: ${verbs.join(", ")}`);
  }
  return { verb: verb!, rest };
}
