// SPDX-License-Identifier: Apache-2.0
/** Declarative topology: a YAML file of queues, topics and groups, planned and applied (docs/topology.md). */
import { readFile } from "node:fs/promises";
import { ValidationError } from "../errors.js";
import { parseTopology, type Topology } from "./parse.js";

export { parseTopology, validateTopology, TopologyValidationError } from "./parse.js";
export type { Topology, QueueDeclaration, TopicDeclaration, GroupDeclaration } from "./parse.js";
export { planTopology, applyTopology, planIsEmpty, readQueueSettings } from "./plan.js";
export type { TopologyPlan, PlanEntry, FieldChange, ApplyResult } from "./plan.js";
export { formatPlan, formatEntry, planCounts } from "./format.js";

/** Reads and validates a topology file; problems are prefixed with the file's name. */
export async function loadTopology(file: string): Promise<Topology> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    throw new ValidationError(`cannot read topology file ${file}: ${(e as Error).message}`);
  }
  try {
    return parseTopology(text, file);
  } catch (e) {
    if (e instanceof ValidationError && !e.message.startsWith(file)) throw new ValidationError(`${file}: ${e.message}`);
    throw e;
  }
}
