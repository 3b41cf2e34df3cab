// SPDX-License-Identifier: Apache-2.0
/**
 * A topology plan as text, one line per entry: `+` create, `~` change (old → new), `!` refused.
 * Used by `sluice apply` and `sluice serve --topology`.
 */
import { type FieldChange, type PlanEntry, type TopologyPlan } from "./plan.js";

function value(v: unknown): string {
  return typeof v === "string" ? v : JSON.stringify(v);
}

/** `field=value, ...` of the settings a file gives (flattened: `backoff.minDelayMs=1000`). */
function settings(config: object, prefix = ""): string {
  return Object.entries(config)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => (v !== null && typeof v === "object" && !Array.isArray(v) ? settings(v, `${prefix}${k}.`) : `${prefix}${k}=${value(v)}`))
    .join(", ");
}

function changes(cs: FieldChange[]): string {
  return cs.map((c) => `${c.field} ${value(c.from)} → ${value(c.to)}`).join(", ");
}

export function formatEntry(e: PlanEntry): string {
  switch (e.op) {
    case "create": {
      if (e.kind === "group") return `+ group ${e.name} on topic ${e.topic} (offsets start at ${e.start})`;
      const s = settings(e.config);
      const dl = e.kind === "queue" && e.deadLetter !== null ? `; its dead-letter queue ${e.deadLetter} is created with it` : "";
      return `+ ${e.kind} ${e.name}${s || dl ? ` (${s || "defaults"}${dl})` : ""}`;
    }
    case "change":
      return `~ ${e.kind} ${e.name}: ${changes(e.changes)}`;
    case "refuse":
      return `! topic ${e.name}: ${changes(e.changes)} (refused: ${e.reason})`;
  }
}

/** Counts per kind of entry. */
export function planCounts(plan: TopologyPlan): { create: number; change: number; refuse: number } {
  const n = { create: 0, change: 0, refuse: 0 };
  for (const e of plan.entries) n[e.op]++;
  return n;
}

/**
 * The plan's lines, then a summary: `no changes` when there is nothing to do, else what was
 * applied (`applied`), would be (`dry-run`), or was not because of the plan's errors.
 */
export function formatPlan(plan: TopologyPlan, mode: "applied" | "dry-run"): string[] {
  const lines = plan.entries.map(formatEntry);
  const n = planCounts(plan);
  const done = mode === "applied" && plan.errors.length === 0;
  if (n.create + n.change === 0) lines.push(n.refuse === 0 ? "no changes" : `no changes (${n.refuse} refused)`);
  else {
    const what = [n.create > 0 ? `${n.create} ${done ? "created" : "to create"}` : "", n.change > 0 ? `${n.change} ${done ? "changed" : "to change"}` : "", n.refuse > 0 ? `${n.refuse} refused` : ""];
    const head = done ? "applied" : mode === "dry-run" ? "dry run, nothing changed" : "nothing applied";
    lines.push(`${head}: ${what.filter(Boolean).join(", ")}`);
  }
  return lines;
}
