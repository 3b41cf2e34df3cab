// SPDX-License-Identifier: Apache-2.0
/**
 * docs/ARCHITECTURE.md stays true about invariants: every invariant id cited in src/ is defined
 * in its table, and every id the table defines is cited at the code that keeps it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const ID = /\b(LOG|IDX|META|TOPIC|FS|GRP|PROD|Q|JRN|LEASE|KEY|TBL|IDEM|REC|PROC|JOB|RATE|COMMIT|ORD|INBOX|OUTBOX|SEQ|EFFECT|SCHED|ARC|CMP|FLOW|AUD|AUTH|PG)-\d+\b/g;

function sources(dir: string, out: string[] = []): string[] {
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) sources(p, out);
    else if (n.endsWith(".ts")) out.push(p);
  }
  return out;
}

test("every invariant id cited in src/ is defined in docs/ARCHITECTURE.md's table, and every defined id is cited", () => {
  const cited = new Map<string, string>();
  for (const f of sources(join(root, "src"))) for (const m of readFileSync(f, "utf8").matchAll(ID)) if (!cited.has(m[0])) cited.set(m[0], f);
  const doc = readFileSync(join(root, "docs", "ARCHITECTURE.md"), "utf8");
  const defined = new Set([...doc.matchAll(/^\| ((?:LOG|IDX|META|TOPIC|FS|GRP|PROD|Q|JRN|LEASE|KEY|TBL|IDEM|REC|PROC|JOB|RATE|COMMIT|ORD|INBOX|OUTBOX|SEQ|EFFECT|SCHED|ARC|CMP|FLOW|AUD|AUTH|PG)-\d+) \|/gm)].map((m) => m[1]));
  const undefinedIds = [...cited].filter(([id]) => !defined.has(id)).map(([id, f]) => `${id} (cited in ${f.slice(root.length + 1)})`);
  assert.deepEqual(undefinedIds, [], "cited but not defined in the invariants table");
  const uncited = [...defined].filter((id) => !cited.has(id));
  assert.deepEqual(uncited, [], "defined but cited nowhere in src/");
});
