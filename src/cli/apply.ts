// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice apply -f topology.yaml [--dry-run]`: makes the broker match a topology file (queues,
 * topics, groups; docs/topology.md). Prints the plan (`+` create, `~` change old → new,
 * `!` refused), applies it unless --dry-run, and prints "no changes" when there is nothing to do.
 */
import { ValidationError } from "../errors.js";
import { applyTopology, formatPlan, loadTopology, planIsEmpty, planTopology } from "../topology/index.js";
import { TARGET_OPTIONS, TARGET_USAGE, UsageError, parse } from "./args.js";
import { printJson, say } from "./output.js";
import { withBroker } from "./target.js";

export const APPLY_USAGE = `Usage: sluice apply -f FILE [--dry-run] [--json] (--url URL | --data DIR)

Makes the broker match a topology file (YAML; see docs/topology.md): creates missing topics,
queues and consumer groups, and re-declares queues whose config differs. Never deletes
anything. A topic's config cannot be changed once it exists: a different partition count is
an error (nothing is applied), other differences are reported as refused (!).

Options:
  -f, --file FILE   the topology file
  --dry-run         print the plan, change nothing
  --json            print the plan (and what was applied) as JSON

Output: + create, ~ change (old → new), ! refused; "no changes" when the broker matches.

${TARGET_USAGE}`;

const OPTS = { ...TARGET_OPTIONS, file: { type: "string", short: "f" }, "dry-run": { type: "boolean" }, json: { type: "boolean" } } as const;

export async function applyCommand(argv: string[]): Promise<void> {
  const { values } = parse(argv, { usage: APPLY_USAGE, options: OPTS, maxPositionals: 0 });
  if (values.file === undefined) throw new UsageError("missing -f FILE (the topology file; see sluice apply --help)");
  const dryRun = values["dry-run"] === true;
  // The file is checked before any broker is opened: a bad file changes nothing anywhere.
  const topology = await loadTopology(values.file);
  await withBroker(values, { readOnly: dryRun }, async (b) => {
    const plan = await planTopology(b, topology);
    const apply = !dryRun && plan.errors.length === 0 && !planIsEmpty(plan);
    const result = apply ? await applyTopology(b, plan) : null;
    if (values.json) printJson({ dryRun, applied: result !== null, entries: plan.entries, errors: plan.errors, skippedGroups: result?.skippedGroups ?? [] });
    else {
      for (const line of formatPlan(plan, dryRun ? "dry-run" : "applied")) say(line);
      for (const g of result?.skippedGroups ?? []) say(`note: group ${g} has members now; left at their position`);
    }
    if (plan.errors.length > 0) throw new ValidationError(`${plan.errors.join("; ")} (nothing was applied)`);
  });
}
