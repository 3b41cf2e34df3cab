// SPDX-License-Identifier: Apache-2.0
/**
 * What `sluice` prints: aligned tables for people, JSON for scripts (`--json`), and errors as
 * ONE line on stderr, `error [CODE]: message`, never a stack trace. Exit status: 0 success,
 * 1 failure (the broker refused, something is damaged or missing), 2 usage (a mistake in the
 * command line). Progress goes to stderr, and only when stderr is a terminal and not in `--json`.
 */
import { createInterface } from "node:readline";
import { BrokerError, DataDirLockedError } from "../errors.js";
import { HelpShown, UsageError } from "./args.js";

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;

/** Prints rows as a table whose columns are padded to their widest cell. */
export function printTable(headers: readonly string[], rows: readonly (readonly unknown[])[]): void {
  const cells = rows.map((r) => r.map((c) => (c === null || c === undefined ? "-" : String(c))));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => r[i]?.length ?? 0)));
  const line = (r: readonly string[]): string =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i])))
      .join("  ")
      .trimEnd();
  process.stdout.write([line(headers), ...cells.map(line)].join("\n") + "\n");
}

/** Prints `key  value` pairs aligned on the keys. */
export function printPairs(pairs: readonly (readonly [string, unknown])[]): void {
  const w = Math.max(...pairs.map(([k]) => k.length));
  process.stdout.write(pairs.map(([k, v]) => `${k.padEnd(w)}  ${v === null || v === undefined ? "-" : String(v)}`).join("\n") + "\n");
}

export function printJson(v: unknown): void {
  process.stdout.write(JSON.stringify(v, null, 2) + "\n");
}

/** One JSON value per line (streams: `tail --json`, `pub --json`). */
export function printJsonLine(v: unknown): void {
  process.stdout.write(JSON.stringify(v) + "\n");
}

export function say(text: string): void {
  process.stdout.write(text + "\n");
}

/** A progress line on a terminal (overwritten in place); nothing otherwise. */
export class Progress {
  private readonly on: boolean;
  private shown = false;
  constructor(json: boolean | undefined) {
    this.on = process.stderr.isTTY === true && !json;
  }
  update(text: string): void {
    if (!this.on) return;
    process.stderr.write(`\r\x1b[K${text}`);
    this.shown = true;
  }
  done(): void {
    if (this.on && this.shown) process.stderr.write("\r\x1b[K");
    this.shown = false;
  }
}

/** Human sizes: 1536 → "1.5 KiB". */
export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** Milliseconds as seconds with one decimal: 1530 → "1.5". */
export function seconds(ms: number): string {
  return (ms / 1000).toFixed(1);
}

/**
 * Asks a yes/no question on the terminal (stdin and stderr must be TTYs). A destructive command
 * run without a terminal must be given `--yes` instead: the caller checks `canAsk()` first.
 */
export function canAsk(): boolean {
  return process.stdin.isTTY === true && process.stderr.isTTY === true;
}

export async function confirm(question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    const answer = await new Promise<string>((resolve) => rl.question(`${question} [y/N] `, resolve));
    return /^y(es)?$/i.test(answer.trim());
  } finally {
    rl.close();
  }
}

/** Refuses a destructive action unless confirmed (`--yes`, or "y" on a terminal). */
export async function requireConfirmation(yes: boolean | undefined, question: string, flagHint: string): Promise<void> {
  if (yes) return;
  if (!canAsk()) throw new UsageError(`${flagHint} is destructive: add --yes to confirm (no terminal to ask on)`);
  if (!(await confirm(question))) throw new BrokerError("ABORTED", "not confirmed; nothing changed");
}

/** The one line printed for an error, and the exit status that goes with it. */
export function describeError(e: unknown): { line: string; exit: number } {
  if (e instanceof DataDirLockedError) {
    // Usually a running server; it may be another embedded process (a CLI tail, an app).
    const who = e.pid === null ? "" : ` (pid ${e.pid}${e.host ? ` on ${e.host}` : ""}; or another process using it embedded)`;
    return { line: `error [${e.code}]: a server holds ${e.dataDir}${who}; use --url sluice://host:port to talk to it`, exit: EXIT_FAILURE };
  }
  if (e instanceof BrokerError) {
    const first = e.message.split("\n").find((l) => l.trim() !== "") ?? e.code;
    return { line: `error [${e.code}]: ${first}`, exit: e instanceof UsageError ? EXIT_USAGE : EXIT_FAILURE };
  }
  const err = e as NodeJS.ErrnoException | undefined;
  const code = typeof err?.code === "string" ? err.code : "INTERNAL";
  const msg = (err?.message ?? String(e)).split("\n")[0];
  return { line: `error [${code}]: ${msg}`, exit: EXIT_FAILURE };
}

/** Runs a command's body; prints failures as one line and sets the exit status. */
export async function runCommand(body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (e) {
    if (e instanceof HelpShown) {
      process.exitCode = EXIT_OK;
      return;
    }
    const { line, exit } = describeError(e);
    process.stderr.write(line + "\n");
    if (process.env.SLUICE_DEBUG && e instanceof Error && e.stack) process.stderr.write(e.stack + "\n");
    process.exitCode = exit;
  }
}

/** `sluice … | head`: a closed stdout ends the command quietly instead of an EPIPE trace. */
export function exitQuietlyOnClosedStdout(): void {
  process.stdout.on("error", (e: NodeJS.ErrnoException) => {
    if (e.code === "EPIPE") process.exit(process.exitCode ?? 0);
  });
}
