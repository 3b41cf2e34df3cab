// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice schema check OLD.json NEW.json [--json]`: is NEW backward compatible with OLD (the
 * check `SchemaRegistry` runs when a version is added; src/contracts/compat.ts)? Exit 0 when
 * compatible, 2 with the problems listed, 1 on bad input. Several OLD files may be given
 * (every earlier version): `sluice schema check v1.json v2.json v3.json` checks v3 against v1 and v2.
 */
import { readFileSync } from "node:fs";
import { ValidationError } from "../errors.js";
import { UsageError, parse } from "./args.js";
import { backwardProblems, type JsonSchema } from "../contracts/compat.js";

export const SCHEMA_HELP = `Usage: sluice schema check OLD.json [OLDER.json ...] NEW.json [--json]
  Checks that NEW (the last file) is backward compatible with every earlier schema:
  new fields optional, no field retyped or reused, no enum value removed.
  Exit status: 0 compatible, 2 incompatible (problems listed on stdout) or a usage error
  (one line on stderr), 1 bad input (a file missing or not a JSON Schema).`;

function load(path: string): JsonSchema {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new ValidationError(`cannot read ${path}: ${(e as Error).message}`);
  }
  try {
    const v = JSON.parse(text) as unknown;
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not a JSON object");
    return v as JsonSchema;
  } catch (e) {
    throw new ValidationError(`${path} is not a JSON Schema object: ${(e as Error).message}`);
  }
}

export async function schemaCommand(argv: string[]): Promise<void> {
  const { values, positionals } = parse(argv, { usage: SCHEMA_HELP, options: { json: { type: "boolean" } } });
  const [sub, ...files] = positionals;
  if (sub !== "check") throw new UsageError(`unknown schema command ${JSON.stringify(sub ?? "")}; usage: sluice schema check OLD.json NEW.json`);
  if (files.length < 2) throw new UsageError("schema check needs at least two files: OLD.json NEW.json");
  const newer = load(files[files.length - 1]);
  const problems = files.slice(0, -1).flatMap((f) => backwardProblems(load(f), newer).map((p) => ({ against: f, problem: p })));
  if (values.json) console.log(JSON.stringify({ compatible: problems.length === 0, problems }, null, 2));
  else if (problems.length === 0) console.log(`${files[files.length - 1]} is backward compatible with ${files.slice(0, -1).join(", ")}`);
  else {
    console.log(`${files[files.length - 1]} is NOT backward compatible:`);
    for (const p of problems) console.log(`  vs ${p.against}: ${p.problem}`);
  }
  if (problems.length > 0) process.exitCode = 2;
}
