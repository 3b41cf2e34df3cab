// SPDX-License-Identifier: Apache-2.0
/**
 * Backward compatibility between two JSON Schemas of one message type: can a consumer that
 * reads with the newer schema read every value written with the older one, and does the newer
 * schema give no existing field another meaning?
 *
 * The rules (docs/patterns.md, "Schemas"), checked recursively through object properties and
 * array items:
 * - a field required by the newer schema was required by the older one (new fields are optional);
 * - a field present in both keeps its type (`integer` may widen to `number`) and, for enums,
 *   keeps every value it had;
 * - a field that `additionalProperties: false` forbade may only appear as optional;
 * - the registry checks a new version against *every* earlier version, so a field removed in
 *   v2 cannot come back in v3 with another type ("no reuse of a field with another meaning").
 *
 * Keywords this check does not understand (`oneOf`, `$ref`, patterns, ranges) are compared as
 * plain JSON: if they changed, it reports them rather than guessing.
 */

export type JsonSchema = { [key: string]: unknown };

/** Keywords compared structurally above; every other keyword must be unchanged. */
const HANDLED = new Set(["type", "properties", "required", "items", "enum", "additionalProperties", "description", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated"]);

/** Problems that make `newer` not backward compatible with `older`; empty when compatible. */
export function backwardProblems(older: JsonSchema, newer: JsonSchema): string[] {
  const problems: string[] = [];
  compare(older, newer, "", problems);
  return problems;
}

function compare(older: JsonSchema, newer: JsonSchema, path: string, out: string[]): void {
  const at = path || "(value)";
  const oldTypes = types(older);
  const newTypes = types(newer);
  if (oldTypes && newTypes) {
    for (const t of oldTypes) {
      const ok = newTypes.has(t) || (t === "integer" && newTypes.has("number"));
      if (!ok) out.push(`${at}: type ${[...oldTypes].join("|")} became ${[...newTypes].join("|")}`);
    }
  } else if (oldTypes && !newTypes) {
    // Dropping a type constraint only widens what is accepted.
  } else if (!oldTypes && newTypes) {
    out.push(`${at}: gained a type constraint (${[...newTypes].join("|")}) it did not have`);
  }
  if (Array.isArray(older.enum) && Array.isArray(newer.enum)) {
    const kept = new Set(newer.enum.map((v) => JSON.stringify(v)));
    for (const v of older.enum) if (!kept.has(JSON.stringify(v))) out.push(`${at}: enum value ${JSON.stringify(v)} was removed`);
  } else if (!Array.isArray(older.enum) && Array.isArray(newer.enum)) {
    out.push(`${at}: gained an enum it did not have`);
  }
  compareObject(older, newer, path, out);
  if (isSchema(older.items) && isSchema(newer.items)) compare(older.items, newer.items, `${path}/*`, out);
  else if (!isSchema(older.items) && isSchema(newer.items) && oldTypes?.has("array")) out.push(`${at}: gained an items schema it did not have`);
  for (const k of new Set([...Object.keys(older), ...Object.keys(newer)])) {
    if (HANDLED.has(k)) continue;
    if (JSON.stringify(older[k]) !== JSON.stringify(newer[k])) out.push(`${at}: keyword "${k}" changed (this check compares it only as a whole)`);
  }
}

function compareObject(older: JsonSchema, newer: JsonSchema, path: string, out: string[]): void {
  const oldProps = props(older);
  const newProps = props(newer);
  const oldRequired = new Set(Array.isArray(older.required) ? (older.required as string[]) : []);
  const newRequired = Array.isArray(newer.required) ? (newer.required as string[]) : [];
  for (const name of newRequired) {
    if (!oldRequired.has(name)) out.push(`${path}/${name}: required now but not before (a new field must be optional)`);
  }
  for (const [name, schema] of Object.entries(newProps)) {
    const before = oldProps[name];
    if (before !== undefined) compare(before, schema, `${path}/${name}`, out);
    else if (isSchema(older.additionalProperties)) compare(older.additionalProperties, schema, `${path}/${name}`, out);
  }
  if (older.additionalProperties === false && newer.additionalProperties !== false) {
    // Wider: accepts what it refused. Values written before never had such fields.
  }
  if (older.additionalProperties !== false && newer.additionalProperties === false) {
    out.push(`${path || "(value)"}: additionalProperties became false (older values may carry fields it now refuses)`);
  }
  for (const name of Object.keys(oldProps)) {
    if (!(name in newProps) && newer.additionalProperties === false) out.push(`${path}/${name}: removed while additionalProperties is false (older values carry it)`);
  }
}

function types(s: JsonSchema): Set<string> | null {
  if (typeof s.type === "string") return new Set([s.type]);
  if (Array.isArray(s.type)) return new Set(s.type as string[]);
  return null;
}

function props(s: JsonSchema): Record<string, JsonSchema> {
  return isSchema(s.properties) ? (s.properties as Record<string, JsonSchema>) : {};
}

function isSchema(v: unknown): v is JsonSchema {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
