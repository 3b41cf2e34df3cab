// SPDX-License-Identifier: Apache-2.0
/**
 * The reference tables in the docs are checked against their single sources: the operation
 * table of docs/protocol.md §4 against src/wire/ops.ts, the error table of docs/errors.md
 * against the registry in src/errors.ts (and every code has its section there).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ERROR_CLASSES } from "../src/errors.js";
import { allOps } from "../src/wire/index.js";

const doc = (name: string): string => readFileSync(new URL(`../../docs/${name}`, import.meta.url), "utf8");

/** The table starting with the line `header` (up to the first line that is not a row). */
function table(text: string, header: string): string[] {
  const lines = text.split("\n");
  const at = lines.indexOf(header);
  assert.ok(at >= 0, `table ${header} is in the document`);
  const rows: string[] = [];
  for (let i = at + 2; i < lines.length && lines[i].startsWith("|"); i++) rows.push(lines[i]);
  return rows;
}

const cell = (s: string): string => s.replace(/\|/g, "\\|");

function opRows(): string[] {
  return allOps().map((op) => {
    const name = op.kind === "push" ? `${op.wireName} (server)` : op.wireName;
    const request = op.kind === "oneway" ? `${op.request} (no response)` : op.request;
    const retry = op.kind !== "request" ? "—" : op.retry === "caller" ? "per call" : op.retry ? "yes" : "no";
    return `| ${op.code} | ${name} | ${cell(request)} | ${cell(op.response)} | ${retry} |`;
  });
}

function errorRows(): string[] {
  return ERROR_CLASSES.map((c) => {
    const { code, retriable, httpStatus } = c.spec;
    const anchor = code.toLowerCase().replace(/_/g, "-");
    return `| [\`${code}\`](#${anchor}) | \`${c.name}\` | ${retriable ? "yes" : "no"} | ${httpStatus} |`;
  });
}

test("docs/protocol.md §4 lists the operation table of src/wire/ops.ts, and names the ops kept for older clients", () => {
  const text = doc("protocol.md");
  assert.deepEqual(table(text, "| op | name | request meta / body | response meta / body | re-sent after a reconnect |"), opRows());
  const kept = text.slice(text.indexOf("**Kept for older clients of version 1.**"));
  for (const op of allOps()) if (op.compat !== undefined) assert.ok(kept.includes(op.wireName), `${op.wireName} is named as kept for older clients`);
});

test("docs/errors.md lists the error registry of src/errors.ts, each code with its section", () => {
  const text = doc("errors.md");
  assert.deepEqual(table(text, "| Code | Class | Retriable | HTTP |"), errorRows());
  for (const c of ERROR_CLASSES) {
    const anchor = c.spec.code.toLowerCase().replace(/_/g, "-");
    assert.ok(text.includes(`<a id="${anchor}"></a>`), `docs/errors.md has a section for ${c.spec.code}`);
  }
});
